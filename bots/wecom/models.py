"""The decrypted WeCom app message (inner XML) → InboundMessage."""

from __future__ import annotations

from bots.base import CallbackRejected, InboundMessage, ReplyTarget
from bots.xml import parse_flat_xml

PLATFORM = "wecom"


def parse_app_message(bot_id: str, plaintext: str, received_at: float) -> InboundMessage | None:
    """Build the normalized message, or None for events (enter_agent, subscribe, …), which need no answer.

    WeCom's rule for dedup: MsgId where there is one, FromUserName + CreateTime for events.
    """
    fields = parse_flat_xml(plaintext.encode("utf-8"))
    msg_type = fields.get("MsgType", "")
    sender = fields.get("FromUserName", "")
    if msg_type == "event":  # before the sender check: a 微信客服 kf_msg_or_event at an app's URL names none
        return None
    if not msg_type or not sender:
        raise CallbackRejected("missing_fields", 400, "MsgType or FromUserName missing")
    msg_id = fields.get("MsgId") or f"{sender}:{fields.get('CreateTime', '')}"
    text = fields.get("Content", "") if msg_type == "text" else fields.get("Recognition", "")
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot_id,
        msg_id=msg_id,
        conversation_id=sender,
        sender_id=sender,
        text=text,
        msg_type="text" if text else msg_type,
        received_at=received_at,
        reply_to=ReplyTarget(user_id=sender),
    )
