"""What the page shows of its own instead of Chainlit's stock: its settings (`.chainlit/config.toml`), the Readme
(`chainlit.md`), the sign-in form's words (translations) and the logo.

Kept in code rather than as data files so that every install of the package carries them (the image installs
botgw without package data), and written into Chainlit's app root (`botgw web --app-root`, a writable directory,
never the cwd) at every start by webchat/serve.py, before Chainlit is imported: Chainlit reads them from there at
import, creates its `.files` there and would write its own defaults there for anything missing. Edits to the
written files are overwritten; change them here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from string import Template

from bots.web.config import WebBotConfig
from bots.web.uploads import MAX_ATTACHMENTS, TYPES

DESCRIPTION = "团队 AI 助手，企业微信、钉钉和网页上同一个助手 · The team's AI assistant, on WeCom, DingTalk and the web"

# $name, $description, $meta_url, $meta_image and $version are filled in at start (TOML basic strings), and the
# uploads' $accept (an inline table), $max_files and $max_size_mb.
CONFIG_TOML = Template("""\
# Written by `botgw web` at every start (webchat/page.py): edits here are overwritten.

[project]
user_env = []
session_timeout = 3600
user_session_timeout = 1296000  # 15 days
cache = false
persist_user_env = false
mask_user_env = true
allow_origins = []  # CORS for Chainlit's HTTP routes only: the socket's Origin check is webchat/guard.py's

[features]
unsafe_allow_html = false  # never: answers and knowledge passages are not trusted HTML
latex = false
user_message_markdown = true
# Off: Chainlit would pin the newest question to the top of the view with a spacer under it, so that everything
# before it (a whole conversation, across settings changes) is scrolled out of sight and only the last exchange
# shows. The view follows the answer instead (assistant_message_autoscroll).
user_message_autoscroll = false
assistant_message_autoscroll = true
auto_tag_thread = true
edit_message = true
allow_thread_sharing = false
favorites = false

[features.slack]
reaction_on_message_received = false

# The attach button: images and documents the worker reads (bots/web/uploads.py), each at most the bot's
# max_media_bytes (the gateway holds the exact bound; webchat/guard.py the request's), a few per message.
[features.spontaneous_file_upload]
    enabled = true
    accept = $accept
    max_files = $max_files
    max_size_mb = $max_size_mb

[features.audio]
    enabled = false
    sample_rate = 24000

[features.mcp]
    enabled = false

    [features.mcp.user_servers]
        enabled = false
        allowed_urls = []

# Chainlit 2.12 sends no telemetry (it has no enable_telemetry any more); the chats go nowhere but the gateway
# (webchat/serve.py drops LITERAL_API_KEY and DATABASE_URL, which would give Chainlit a data layer of its own).
[UI]
name = $name
description = $description
confirm_new_chat = true
cot = "full"
alert_style = "classic"
logo_file_url = ""
default_avatar_file_url = ""
# Chainlit's defaults point the page's link previews at its GitHub and its banner on S3.
custom_meta_url = $meta_url
custom_meta_image_url = $meta_image

[meta]
generated_by = $version
""")

# A paragraph's lines end in a backslash (joined here): the page shows every line break in Markdown as one.
README = """\
# botgw 团队助手 · Team assistant

这是团队的 AI 助手：由部署在本单位服务器上的 ERNIE-4.5 大模型回答，经 botgw 网关转发。\
直接用中文或英文提问即可，它会记住本次对话的上下文。

This is the team's AI assistant: ERNIE-4.5, served on your organisation's own servers, answers through the botgw \
gateway. Ask in plain Chinese or English; it remembers the conversation.

## 命令 · Commands

| 命令 Command | 作用 | What it does |
|---|---|---|
| `/help` | 显示帮助 | show the help |
| `/reset` | 清空对话记忆，重新开始 | forget the conversation and start over |

其他以 `/` 开头的文字按普通问题回答。 · Any other text starting with `/` is answered as a question.

## 设置 · Settings

输入框旁的设置里可以选择任务类型（代码与文档、创意写作、逻辑与数学，决定回答的发散程度），\
以及是否显示回答用到的专家（MoE 模型在 GPU 上运行时）。

The settings next to the message box choose a task preset (code and documents, creative writing, logic and maths: \
how freely it answers) and whether to show which experts answered (the MoE model on a GPU).

## 须知 · Good to know

- 如果助手接入了知识库，依据知识库的回答下方会列出「参考资料」。
  With knowledge bases, an answer drawn from them lists its sources (参考资料) under it.
- 每人每分钟可发的消息数有限，超出时助手会告诉你多久后再试。
  Each person may send a limited number of messages a minute; past it, the assistant says when to try again.
- 通过企业微信或钉钉登录时，你在网页和在对应应用里是同一个人，对话记忆也相同。
  Signed in through WeCom or DingTalk, you are the same person as in that app, with the same conversation memory.
- 回答由模型生成，可能有误，重要信息请核实。 Answers are generated and can be wrong: check what matters.
"""

# botgw's changes to Chainlit's translations, merged over the file Chainlit ships for the language: the sign-in
# form asks for a user name (Chainlit's says e-mail), and the message for a sign-in refused by login_guard (the form
# shows the translation of the refused request's status text, auth.login.errors.<statusText>).
_TOO_MANY = "Too many failed sign-ins. Please wait a few minutes and try again."
TRANSLATIONS: dict[str, dict] = {
    "zh-CN": {"auth": {"login": {
        "form": {"email": {"label": "用户名", "required": "请输入用户名", "placeholder": ""},
                 "password": {"label": "密码", "required": "请输入密码"}},
        "errors": {"Too Many Requests": "登录失败次数过多，请稍等几分钟再试。"},
    }}},
    "zh-TW": {"auth": {"login": {
        "form": {"email": {"label": "使用者名稱", "required": "請輸入使用者名稱", "placeholder": ""},
                 "password": {"label": "密碼", "required": "請輸入密碼"}},
        "errors": {"Too Many Requests": "登入失敗次數過多，請稍等幾分鐘再試。"},
    }}},
    "en-US": {"auth": {"login": {
        "form": {"email": {"label": "Username", "required": "Please enter your username", "placeholder": ""},
                 "password": {"label": "Password", "required": "Please enter your password"}},
        "errors": {"Too Many Requests": _TOO_MANY},
    }}},
}
# Every other language Chainlit ships: its own words, but not an e-mail address (an English word is right there,
# its "e-mail" would not be) and the refusal in English.
OTHER_LANGUAGES: dict = {"auth": {"login": {
    "form": {"email": {"label": "Username", "required": "Please enter your username", "placeholder": ""}},
    "errors": {"Too Many Requests": _TOO_MANY},
}}}

_BUBBLE = ('<path d="M20 14h56a12 12 0 0 1 12 12v32a12 12 0 0 1-12 12H44l-18 14v-14h-6A12 12 0 0 1 8 58V26'
           'a12 12 0 0 1 12-12z" fill="{fill}"/>'
           '<circle cx="32" cy="42" r="5" fill="{dots}"/><circle cx="48" cy="42" r="5" fill="{dots}"/>'
           '<circle cx="64" cy="42" r="5" fill="{dots}"/>')
_LOGO = ('<svg xmlns="http://www.w3.org/2000/svg" width="300" height="96" viewBox="0 0 300 96">{bubble}'
         '<text x="104" y="64" font-family="system-ui, sans-serif" font-size="46" font-weight="700" '
         'fill="{text}">botgw</text></svg>\n')
PUBLIC = {  # Chainlit serves public/logo_<theme>.* at /logo and public/favicon.* at /favicon
    "logo_light.svg": _LOGO.format(bubble=_BUBBLE.format(fill="#2563eb", dots="#ffffff"), text="#111827"),
    "logo_dark.svg": _LOGO.format(bubble=_BUBBLE.format(fill="#60a5fa", dots="#111827"), text="#f3f4f6"),
    "favicon.svg": '<svg xmlns="http://www.w3.org/2000/svg" width="96" height="96" viewBox="0 0 96 96">'
                   + _BUBBLE.format(fill="#2563eb", dots="#ffffff") + "</svg>\n",
}


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, and without ensure_ascii no surrogate pairs (TOML has none)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def accept_table() -> str:
    """Chainlit's `accept` as a TOML inline table: each type with the extensions a file of it may have."""
    entries = ", ".join(f"{toml_string(mime)} = [{', '.join(map(toml_string, extensions))}]"
                        for mime, (extensions, _) in TYPES.items())
    return "{ " + entries + " }"


def max_size_mb(bot: WebBotConfig) -> int:
    """Chainlit's bound is whole megabytes (MiB): rounded up, the gateway then holds the exact bytes."""
    return -(-bot.max_media_bytes // (1024 * 1024))


def merged(base: dict, changes: dict) -> dict:
    """`base` with `changes` laid over it, nested mappings key by key (the frontend needs every key: whole files)."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def translation(language: str, shipped: dict) -> dict:
    """Chainlit's translation for `language` with botgw's changes; the refusal also under the lower-case status
    text, which some servers send."""
    result = merged(shipped, TRANSLATIONS.get(language, OTHER_LANGUAGES))
    errors = result["auth"]["login"]["errors"]
    errors["too many requests"] = errors["Too Many Requests"]
    return result


def write_app_root(app_root: Path, chainlit_dir: Path, version: str, bot: WebBotConfig,
                   root_path: str = "", public_url: str = "") -> None:
    """Everything Chainlit reads from its app root, botgw's, so that it creates none of its stock files."""
    target = app_root / ".chainlit"
    (target / "translations").mkdir(parents=True, exist_ok=True)
    page_url = f"{public_url.rstrip('/')}{root_path}/"
    (target / "config.toml").write_text(CONFIG_TOML.substitute(
        name=toml_string(bot.title), description=toml_string(DESCRIPTION), meta_url=toml_string(page_url),
        meta_image=toml_string(f"{page_url}logo?theme=light"), version=toml_string(version),
        accept=accept_table(), max_files=MAX_ATTACHMENTS, max_size_mb=max_size_mb(bot),
    ), encoding="utf-8")
    for source in sorted((chainlit_dir / "translations").glob("*.json")):
        text = translation(source.stem, json.loads(source.read_text(encoding="utf-8")))
        (target / "translations" / source.name).write_text(json.dumps(text, ensure_ascii=False, indent=4),
                                                           encoding="utf-8")
    (app_root / "chainlit.md").write_text(README, encoding="utf-8")
    for stale in app_root.glob("chainlit_*.md"):  # a translated Readme would be shown instead of botgw's
        if re.fullmatch(r"chainlit_[A-Za-z-]+\.md", stale.name):
            stale.unlink()
    public = app_root / "public"
    public.mkdir(exist_ok=True)
    for name, svg in PUBLIC.items():
        (public / name).write_text(svg, encoding="utf-8")
