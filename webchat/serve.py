"""`botgw web` runs this: Chainlit's app (webchat/app.py) on uvicorn, as `chainlit run` would, with three
differences.

- Chainlit's settings are botgw's (webchat/page.py): `.chainlit/config.toml`, translations, `chainlit.md` and the
  logo are written into the app root at every start (uploads of the types and sizes the gateway takes, no HTML in
  messages, no CORS for other origins, the page named after the bot's `title`, a sign-in form that asks for a user
  name). The app root is
  CHAINLIT_APP_ROOT (`botgw web --app-root`), else ~/.cache/botgw/web: never the cwd, where Chainlit would
  otherwise create its stock files; Chainlit's `.env` is looked for there too, not in the cwd (and what would give
  Chainlit a data layer of its own, LITERAL_API_KEY or DATABASE_URL, is dropped from it too).
- `webchat/guard.py` stands in front of the app (it also refuses the chat socket to other origins, which
  Chainlit's socket.io server does not check, and bodies over 1 MB but uploads), and uvicorn's own proxy-header
  handling is off: uvicorn would otherwise rewrite the client address from `X-Forwarded-For` for any peer in
  `forwarded_allow_ips` (127.0.0.1 by default) before anything of botgw's could see the real peer.
- The page's HTML loads nothing from elsewhere (Chainlit links Google's fonts and a KaTeX stylesheet from a CDN);
  its inline scripts are allowed by hash in the Content-Security-Policy.

    BOTGW_CONFIG=... BOTGW_WEB_BOT=web CHAINLIT_APP_ROOT=... CHAINLIT_AUTH_SECRET=... \
        python -m webchat.serve --host 127.0.0.1 --port 8100
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import importlib.util
import logging
import os
import re
import sys
from importlib import metadata
from pathlib import Path

from bots.web.config import WebBotConfig
from webchat.page import write_app_root

log = logging.getLogger("botgw.web")

APP = Path(__file__).resolve().parent / "app.py"
DEFAULT_APP_ROOT = "~/.cache/botgw/web"  # as `botgw web --app-root`
# Give Chainlit a data layer of its own (Literal AI's cloud, or a database), which would keep the chats elsewhere.
DATA_LAYER_VARIABLES = ("LITERAL_API_KEY", "DATABASE_URL")
_said: set[str] = set()  # the data-layer variables already warned about

REMOTE_LINK = re.compile(r"""<link\b[^>]*\bhref=["']?(?:https?:)?//[^>]*>\s*""", re.IGNORECASE)
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


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


def app_root() -> Path:
    """Chainlit's app root, set in the environment for Chainlit to read at import: never the cwd."""
    root = Path(os.environ.get("CHAINLIT_APP_ROOT") or DEFAULT_APP_ROOT).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["CHAINLIT_APP_ROOT"] = str(root)
    os.environ.setdefault("CHAINLIT_ENV_FILE", str(root / ".env"))  # Chainlit joins it to the cwd: absolute wins
    return root


def without_data_layer() -> None:
    """The chats go to the gateway only: a variable that would give Chainlit a data layer is dropped, said once.
    Called before Chainlit is imported and once more after: `import chainlit` runs load_dotenv(CHAINLIT_ENV_FILE),
    which would put back what the first call dropped (or bring it from the app root's .env); Chainlit reads the
    variables only later, when it first asks for its data layer."""
    for name in DATA_LAYER_VARIABLES:
        if os.environ.pop(name, None) is not None and name not in _said:
            _said.add(name)
            log.warning("the page ignores %s: it keeps no chats of its own (they are the gateway's)", name)



def load_bot() -> WebBotConfig:
    """The web bot, or one line and exit 2 (as `botgw web` says it) when the configuration is wrong."""
    from gateway.config import ConfigError
    from webchat.bot_settings import page_settings

    try:
        return page_settings().web
    except ConfigError as exc:
        print(f"botgw: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    bot = load_bot()
    root = app_root()
    without_data_layer()
    spec = importlib.util.find_spec("chainlit")
    assert spec is not None and spec.origin, "chainlit is not installed (pip install 'botgw[web]')"
    write_app_root(root, Path(spec.origin).parent, metadata.version("chainlit"), bot,
                   os.environ.get("CHAINLIT_ROOT_PATH", ""), os.environ.get("CHAINLIT_URL", ""))

    import chainlit.cli  # noqa: F401  (what `chainlit run` sets up on import: nest_asyncio, logging)

    without_data_layer()  # again: importing chainlit loaded CHAINLIT_ENV_FILE (the app root's .env) into the env
    import uvicorn
    from chainlit.config import DEFAULT_ROOT_PATH, config, load_module

    root_path = os.environ.get("CHAINLIT_ROOT_PATH", DEFAULT_ROOT_PATH)
    config.run.host, config.run.port, config.run.root_path = args.host, args.port, root_path
    config.run.headless = True

    from chainlit import server  # after root_path: its routes are prefixed with it on import
    from chainlit.auth import ensure_jwt_secret
    from chainlit.cache import init_lc_cache
    from chainlit.markdown import init_markdown

    from gateway.edge.http_bounds import BoundedHttpToolsProtocol
    from webchat.guard import PageGuard, content_security_policy

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
