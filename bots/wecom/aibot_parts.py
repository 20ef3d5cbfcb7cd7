"""What a WeCom AI bot (智能机器人) message holds: its text and its parts, from the decrypted JSON.

The message types are those of doc 100719 接收消息 (消息推送 and 结构体说明): text (text.content), image (image.url),
mixed (mixed.msg_item[], each text or image, in order), voice (voice.content: WeCom's own recognition, no
recording), file (file.url), and, on text and mixed messages, `quote` (the quoted message: its msgtype and the
structure of that type). image.url and file.url serve the file encrypted with the bot's EncodingAESKey, for five
minutes (bots/wecom/media.py opens it); those URLs came inside the encrypted, signed callback.
"""

from __future__ import annotations

from typing import Any

from bots.base import CallbackRejected
from bots.parts import Media, Part
from bots.safe_json import object_field

READABLE = ("text", "image", "mixed", "voice", "file")  # everything else WeCom may send is answered at once
QUOTED_KIND = {"image": "[图片]", "file": "[文件]"}  # a quoted picture or file: what the WeCom client shows of it


def _items(mixed: dict[str, Any]) -> list[dict[str, Any]]:
    items = mixed.get("msg_item") or []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise CallbackRejected("malformed_fields", 400, "mixed.msg_item must be a list of objects")
    return items


def _content(payload: dict[str, Any], key: str) -> str:
    return str(object_field(payload, key).get("content", ""))


def _media(payload: dict[str, Any], key: str) -> Media | None:
    url = object_field(payload, key).get("url")
    return Media(ref=url.strip()) if isinstance(url, str) and url.strip() else None


def _mixed(payload: dict[str, Any]) -> tuple[str, list[Part]]:
    """A mixed message's text segments joined by lines, and its pictures in order."""
    texts: list[str] = []
    images: list[Part] = []
    for item in _items(object_field(payload, "mixed")):
        kind = item.get("msgtype")
        if kind == "text":
            texts.append(_content(item, "text"))
        elif kind == "image" and (media := _media(item, "image")) is not None:
            images.append(Part(kind="image", media=media))
    return "\n".join(texts), images


def quote_part(payload: dict[str, Any]) -> Part | None:
    """The message the sender quoted, as a quote part: its text, or what kind it was when it had none."""
    quote = object_field(payload, "quote")
    kind = str(quote.get("msgtype", ""))
    if kind in ("text", "voice"):
        quoted = _content(quote, kind)
    elif kind == "mixed":
        quoted, images = _mixed(quote)
        quoted = quoted or (QUOTED_KIND["image"] if images else "")
    else:
        quoted = QUOTED_KIND.get(kind, "")
    return Part(kind="quote", text=quoted) if quoted.strip() else None


def aibot_content(payload: dict[str, Any], msg_type: str) -> tuple[str, tuple[Part, ...]]:
    """(what the sender typed, the other parts in order: the quote first, as it stands above the message)."""
    parts: list[Part] = []
    if (quoted := quote_part(payload)) is not None:
        parts.append(quoted)
    text = ""
    if msg_type == "text":
        text = _content(payload, "text")
    elif msg_type == "voice":
        parts.append(Part(kind="audio", text=_content(payload, "voice")))
    elif msg_type == "mixed":
        text, images = _mixed(payload)
        parts += images
    elif msg_type in ("image", "file") and (media := _media(payload, msg_type)) is not None:
        parts.append(Part(kind=msg_type, media=media))
    return text, tuple(parts)
