"""A DingTalk robot message (HTTP body or Stream CALLBACK data; the same JSON) → InboundMessage.

The message types and their fields are DingTalk's "接收的消息类型" (open-dingtalk/developerpedia
docs/learn/bot/message.md; platform-protocols.md §F): `text.content`; `picture` and `richText` pictures with a
`downloadCode` (and a `pictureDownloadCode`); `audio` with `downloadCode` and DingTalk's own `recognition`;
`video` with `downloadCode`, `duration`, `videoType`; `file` with `downloadCode`, `fileName`, `fileId`,
`spaceId`; `unknownMsgType`. A downloadCode is exchanged for the bytes later, in the worker (adapter.download).

A reply to an earlier message is not in DingTalk's published schema: public clients read it as
`text.isReplyMsg` + `text.repliedMsg {msgId, msgType, senderId, senderNick, content: {text} | {richText}}`
(a rich-text reply carries the same under `content`). UNCONFIRMED, so every field of it is optional here.
"""

from __future__ import annotations

import math
from typing import Any

from bots.base import CallbackRejected, InboundMessage, ReplyTarget
from bots.parts import Media, Part
from bots.safe_json import object_field

PLATFORM = "dingtalk"
GROUP = "2"


def parse_robot_message(bot_id: str, payload: dict[str, Any], now: float) -> InboundMessage:
    """Normalize: what the sender typed in `text`, pictures, voice, files and a quote in `parts`."""
    msg_id = str(payload.get("msgId", ""))
    sender = str(payload.get("senderStaffId") or payload.get("senderId") or "")
    # A member of another organisation (a group shared across organisations) is named with it wherever a user is a
    # key (memory, lanes, limits, allow_users): their staffId "alice" is not the robot's organisation's alice. Replies
    # still address the staffId DingTalk gave. Whether DingTalk sends such a sender is UNCONFIRMED: the harsher case.
    sender_corp, robot_corp = str(payload.get("senderCorpId") or ""), str(payload.get("chatbotCorpId") or "")
    outsider = sender and sender_corp and robot_corp and sender_corp != robot_corp
    person = f"{sender_corp}/{sender}" if outsider else sender
    conversation = str(payload.get("conversationId", ""))
    if not msg_id or not sender or not conversation:
        raise CallbackRejected("missing_fields", 400, "msgId, sender or conversationId missing")
    msg_type = str(payload.get("msgtype", ""))
    text, parts = read_content(msg_type, payload)
    group = str(payload.get("conversationType", "1")) == GROUP
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot_id,
        msg_id=msg_id,
        conversation_id=conversation,
        sender_id=person,
        text=text,
        msg_type=msg_type or "unknown",
        parts=parts,
        mentioned_bot=bool(payload.get("isInAtList")) or not group,
        group_id=conversation if group else "",
        received_at=now,
        reply_to=ReplyTarget(
            user_id=sender,
            chat_id=conversation if group else "",
            conversation_id=conversation,  # a card asked in a one-to-one chat brings its taps back here
            webhook_url=str(payload.get("sessionWebhook", "")),
            webhook_expires_at=_epoch_s(payload.get("sessionWebhookExpiredTime"), "sessionWebhookExpiredTime"),
        ),
    )


def read_content(msg_type: str, payload: dict[str, Any]) -> tuple[str, tuple[Part, ...]]:
    """(what the sender typed, the other parts in order) of one message. A video has no part the answer path
    can read: it keeps its type and gets the "what I can read" reply."""
    if msg_type == "text":
        text = object_field(payload, "text")
        return _str(text.get("content")).strip(), _quote(text)
    if msg_type not in ("richText", "picture", "audio", "file"):
        return "", ()
    content = object_field(payload, "content")
    if msg_type == "richText":
        typed, parts = _rich_text(content.get("richText"))
        return typed, (*_quote(content), *parts)
    if msg_type == "picture":
        return "", _picture(content)
    if msg_type == "audio":
        code = _code(content)  # the codec is not named (UNCONFIRMED): the media's bytes tell
        media = Media(ref=code) if code else None
        return "", (Part(kind="audio", text=_str(content.get("recognition")).strip(), media=media),)
    code = _code(content)  # a file
    return "", (Part(kind="file", media=Media(ref=code, name=_str(content.get("fileName")))),) if code else ()


def _rich_text(items: Any) -> tuple[str, tuple[Part, ...]]:
    """The text segments joined with newlines, and the pictures in the order they stand."""
    typed: list[str] = []
    pictures: list[Part] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "picture" or ("text" not in item and _code(item)):
            pictures.extend(_picture(item))
        elif (segment := _str(item.get("text")).strip()):
            typed.append(segment)
    return "\n".join(typed), tuple(pictures)


def _picture(content: dict[str, Any]) -> tuple[Part, ...]:
    code = _code(content)
    return (Part(kind="image", media=Media(ref=code)),) if code else ()


def _code(content: dict[str, Any]) -> str:
    """The code messageFiles/download takes: `downloadCode` (the doc's); `pictureDownloadCode` only when a picture
    lacks it (whether the API takes that one is UNCONFIRMED)."""
    return _str(content.get("downloadCode") or content.get("pictureDownloadCode"))


def _quote(holder: dict[str, Any]) -> tuple[Part, ...]:
    """The quoted message (`isReplyMsg`/`repliedMsg`, UNCONFIRMED: see the module's docstring) as a quote part:
    its text, or its kind in brackets when it has none (a picture, a file)."""
    replied = holder.get("repliedMsg")
    if not isinstance(replied, dict):
        return ()
    kind = _str(replied.get("msgType") or replied.get("msgtype")) or "message"
    content = replied.get("content")
    quoted = ""
    if isinstance(content, dict):
        quoted = _str(content.get("text") or content.get("content")).strip()
        if not quoted and isinstance(content.get("richText"), list):
            quoted = _rich_text(content["richText"])[0]
    elif isinstance(content, str):
        quoted = content.strip()
    return (Part(kind="quote", text=quoted or f"[{kind}]"),)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _epoch_s(value: Any, name: str) -> float:
    """A time in epoch milliseconds (0 or absent: none) as seconds; anything that is not a finite number is refused,
    since the queued message must be read back as a float."""
    try:
        seconds = float(value) / 1000 if value else 0.0
    except (TypeError, ValueError, OverflowError) as exc:
        raise CallbackRejected("malformed_fields", 400, f"{name} is not a time in milliseconds") from exc
    if not math.isfinite(seconds):
        raise CallbackRejected("malformed_fields", 400, f"{name} is not a time in milliseconds")
    return seconds
