"""The robot messages a simulated person sends, type by type, with DingTalk's fields: the part of the callback that
says what was sent (`msgtype` and its `text` or `content`), merged into the envelope by user.robot_payload.

Every shape is DingTalk's "接收的消息类型" (open-dingtalk/developerpedia docs/learn/bot/message.md), but the
quote: a reply to an earlier message is not in DingTalk's published schema; it is played as public clients read
it (`text.isReplyMsg` + `text.repliedMsg {msgId, msgType, senderId, senderNick, content: {text}}`), UNCONFIRMED.
A picture's `pictureDownloadCode` is a code of its own that messageFiles/download does not take (media.py).
"""

from __future__ import annotations

import secrets
from typing import Any


def text_message(text: str, *, quote: str | None = None, quoted_sender: str = "someone") -> dict[str, Any]:
    """A text message; with `quote`, a reply to an earlier text message that said it."""
    body: dict[str, Any] = {"content": text}
    if quote is not None:
        body["isReplyMsg"] = True
        body["repliedMsg"] = {
            "msgId": "msg" + secrets.token_hex(12),
            "msgType": "text",
            "senderId": "$:LWCP_v1:$" + secrets.token_hex(8),
            "senderNick": quoted_sender,
            "content": {"text": quote},
        }
    return {"msgtype": "text", "text": body}


def picture_message(code: str) -> dict[str, Any]:
    return {"msgtype": "picture", "content": _picture(code)}


def rich_text_message(*items: str | tuple[str]) -> dict[str, Any]:
    """Rich text: each `str` a text segment, each 1-tuple `(downloadCode,)` a picture, in order."""
    rich = [{"text": item} if isinstance(item, str) else {**_picture(item[0]), "type": "picture"} for item in items]
    return {"msgtype": "richText", "content": {"richText": rich}}


def audio_message(code: str, recognition: str = "") -> dict[str, Any]:
    """A voice message: DingTalk's own speech recognition in `recognition` (absent when it has none)."""
    content = {"downloadCode": code}
    if recognition:
        content["recognition"] = recognition
    return {"msgtype": "audio", "content": content}


def video_message(code: str, duration_s: int = 5, video_type: str = "mp4") -> dict[str, Any]:
    return {"msgtype": "video", "content": {"duration": str(duration_s), "videoType": video_type, "downloadCode": code}}


def file_message(code: str, name: str) -> dict[str, Any]:
    content = {"spaceId": str(secrets.randbelow(10**9)), "fileName": name, "downloadCode": code,
               "fileId": str(secrets.randbelow(10**9))}  # fmt: skip
    return {"msgtype": "file", "content": content}


def _picture(code: str) -> dict[str, str]:
    return {"pictureDownloadCode": secrets.token_urlsafe(24), "downloadCode": code}
