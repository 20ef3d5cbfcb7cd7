"""A DingTalk robot message (HTTP body or Stream CALLBACK data; the same JSON) → InboundMessage."""

from __future__ import annotations

import math
from typing import Any

from bots.base import CallbackRejected, InboundMessage, ReplyTarget
from bots.safe_json import object_field

PLATFORM = "dingtalk"
GROUP = "2"


def parse_robot_message(bot_id: str, payload: dict[str, Any], now: float) -> InboundMessage:
    """Normalize; non-text messages keep their type so the worker can answer "text only for now"."""
    msg_id = str(payload.get("msgId", ""))
    sender = str(payload.get("senderStaffId") or payload.get("senderId") or "")
    conversation = str(payload.get("conversationId", ""))
    if not msg_id or not sender or not conversation:
        raise CallbackRejected("missing_fields", 400, "msgId, sender or conversationId missing")
    msg_type = str(payload.get("msgtype", ""))
    text = str(object_field(payload, "text").get("content", "")).strip() if msg_type == "text" else ""
    group = str(payload.get("conversationType", "1")) == GROUP
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot_id,
        msg_id=msg_id,
        conversation_id=conversation,
        sender_id=sender,
        text=text,
        msg_type=msg_type or "unknown",
        mentioned_bot=bool(payload.get("isInAtList")) or not group,
        group_id=conversation if group else "",
        received_at=now,
        reply_to=ReplyTarget(
            user_id=sender,
            chat_id=conversation if group else "",
            webhook_url=str(payload.get("sessionWebhook", "")),
            webhook_expires_at=_epoch_s(payload.get("sessionWebhookExpiredTime"), "sessionWebhookExpiredTime"),
        ),
    )


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
