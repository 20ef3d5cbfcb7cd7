"""`botgw web` runs this: Chainlit's app (bots/web/app.py) on uvicorn, as `chainlit run` would, with three
differences.

- Chainlit's settings are botgw's: `.chainlit/config.toml` under the app root is written at every start (uploads
  off, no HTML in messages, no CORS for other origins), with the login form's message for a refused sign-in in
  every language Chainlit ships. Edits to those files are overwritten; botgw's configuration is the place.
- `bots/web/guard.py` stands in front of the app (it also refuses the chat socket to other origins, which
  Chainlit's socket.io server does not check, and bodies over 1 MB), and uvicorn's own proxy-header handling is
  off: uvicorn would otherwise rewrite the client address from `X-Forwarded-For` for any peer in
  `forwarded_allow_ips` (127.0.0.1 by default) before anything of botgw's could see the real peer.
- The page's HTML loads nothing from elsewhere (Chainlit links Google's fonts and a KaTeX stylesheet from a CDN);
  its inline scripts are allowed by hash in the Content-Security-Policy.

    BOTGW_CONFIG=... BOTGW_WEB_BOT=web CHAINLIT_APP_ROOT=... CHAINLIT_AUTH_SECRET=... \
        python -m bots.web.serve --host 127.0.0.1 --port 8100
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import importlib.util
import json
import logging
import os
import re
from importlib import metadata
from pathlib import Path

from bots.web.config import WebBotConfig

log = logging.getLogger("botgw.web")

APP = Path(__file__).resolve().parent / "app.py"

CHAINLIT_CONFIG = """\
# Written by `botgw web` at every start (bots/web/serve.py): edits here are overwritten.

[project]
user_env = []
session_timeout = 3600
user_session_timeout = 1296000  # 15 days
cache = false
persist_user_env = false
mask_user_env = true
allow_origins = []  # CORS for Chainlit's HTTP routes only: the socket's Origin check is bots/web/guard.py's

[features]
unsafe_allow_html = false  # never: answers and knowledge passages are not trusted HTML
latex = false
user_message_markdown = true
user_message_autoscroll = true
assistant_message_autoscroll = true
auto_tag_thread = true
edit_message = true
allow_thread_sharing = false
favorites = false

[features.slack]
reaction_on_message_received = false

# No botgw bot accepts files yet: off (bots/web/guard.py also refuses POST /project/file). Issue 23 turns
# uploads on, bounded by type, size and count.
[features.spontaneous_file_upload]
    enabled = false
    accept = []
    max_files = 0
    max_size_mb = 0

[features.audio]
    enabled = false
    sample_rate = 24000

[features.mcp]
    enabled = false

    [features.mcp.user_servers]
        enabled = false
        allowed_urls = []

[UI]
name = "Assistant"
confirm_new_chat = true
cot = "full"
alert_style = "classic"
logo_file_url = ""
default_avatar_file_url = ""

[meta]
generated_by = "{version}"
"""

# The login form shows the translation of the refused request's status text (auth.login.errors.<statusText>).
REFUSED_SIGN_IN = {
    "zh-CN": "登录失败次数过多，请稍等几分钟再试。",
    "zh-TW": "登入失敗次數過多，請稍等幾分鐘再試。",
    "": "Too many failed sign-ins. Please wait a few minutes and try again.",
}

REMOTE_LINK = re.compile(r"""<link\b[^>]*\bhref=["']?(?:https?:)?//[^>]*>\s*""", re.IGNORECASE)
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def write_chainlit_files(app_root: Path, chainlit_dir: Path, version: str) -> None:
    """botgw's .chainlit/config.toml and translations under the app root (before Chainlit is imported: it reads
    them at import)."""
    target = app_root / ".chainlit"
    (target / "translations").mkdir(parents=True, exist_ok=True)
    (target / "config.toml").write_text(CHAINLIT_CONFIG.replace("{version}", version), encoding="utf-8")
    for source in sorted((chainlit_dir / "translations").glob("*.json")):
        translation = json.loads(source.read_text(encoding="utf-8"))
        errors = translation.setdefault("auth", {}).setdefault("login", {}).setdefault("errors", {})
        message = REFUSED_SIGN_IN.get(source.stem, REFUSED_SIGN_IN[""])
        errors["Too Many Requests"] = errors["too many requests"] = message
        (target / "translations" / source.name).write_text(
            json.dumps(translation, ensure_ascii=False, indent=4), encoding="utf-8"
        )


def without_remote_links(html: str) -> str:
    """The page without its stylesheets and preconnects to other hosts (the fonts fall back to the system's)."""
    return REMOTE_LINK.sub("", html)


def inline_script_hashes(html: str) -> list[str]:
    return [
        "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        for script in INLINE_SCRIPT.findall(html)
    ]


def warn_about(bot: WebBotConfig) -> None:
    """Once, at start: a setting that cannot do what it seems to (never a secret's value)."""
    if bot.trusted_header and not bot.trusted_proxies:
        log.warning("web bot %r: trusted_header is set but trusted_proxies is empty, so no one can sign in "
                    "through the header; list the proxy's address in trusted_proxies", bot.id)


def load_bot() -> WebBotConfig:
    from gateway.config import load_settings

    bot = load_settings(os.environ["BOTGW_CONFIG"]).bot(os.environ.get("BOTGW_WEB_BOT", "web"))
    if not isinstance(bot, WebBotConfig):
        raise SystemExit(f"bot {bot.id!r} is not a web bot")
    return bot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    bot = load_bot()
    app_root = Path(os.environ.setdefault("CHAINLIT_APP_ROOT", os.getcwd()))
    spec = importlib.util.find_spec("chainlit")
    assert spec is not None and spec.origin, "chainlit is not installed (pip install 'botgw[web]')"
    write_chainlit_files(app_root, Path(spec.origin).parent, metadata.version("chainlit"))

    import chainlit.cli  # noqa: F401  (what `chainlit run` sets up on import: nest_asyncio, logging)
    import uvicorn
    from chainlit.config import DEFAULT_ROOT_PATH, config, load_module

    root_path = os.environ.get("CHAINLIT_ROOT_PATH", DEFAULT_ROOT_PATH)
    config.run.host, config.run.port, config.run.root_path = args.host, args.port, root_path
    config.run.headless = True

    from chainlit import server  # after root_path: its routes are prefixed with it on import
    from chainlit.auth import ensure_jwt_secret
    from chainlit.cache import init_lc_cache
    from chainlit.markdown import init_markdown

    from bots.web.guard import PageGuard, content_security_policy
    from gateway.http_bounds import BoundedHttpToolsProtocol

    config.run.module_name = str(APP)
    load_module(str(APP))
    ensure_jwt_secret()
    init_markdown(config.root)
    init_lc_cache()

    page = server.get_html_template
    server.get_html_template = lambda root: without_remote_links(page(root))  # the catch-all route calls it
    csp = content_security_policy(inline_script_hashes(server.get_html_template(root_path)))
    warn_about(bot)

    app = PageGuard(server.app, bot, csp, root_path)
    ws_deflate = os.environ.get("UVICORN_WS_PER_MESSAGE_DEFLATE", "true").lower() in ("true", "1", "yes")
    uvicorn_config = uvicorn.Config(  # heads bounded as the gateway's (431 over 64 KiB, unread)
        app, host=args.host, port=args.port, http=BoundedHttpToolsProtocol,
        ws=os.environ.get("UVICORN_WS_PROTOCOL", "auto"),
        ws_per_message_deflate=ws_deflate, log_level="error", proxy_headers=False,
        ssl_keyfile=os.environ.get("CHAINLIT_SSL_KEY"), ssl_certfile=os.environ.get("CHAINLIT_SSL_CERT"),
    )
    asyncio.run(uvicorn.Server(uvicorn_config).serve())  # asyncio's loop, as `chainlit run` (nest_asyncio)


if __name__ == "__main__":
    main()
