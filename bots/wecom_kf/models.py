"""微信客服 payloads → normalized types: the callback (it only says "pull") and the items of kf/sync_msg."""

from __future__ import annotations

import re
import time
from typing import Any

from bots.base import CallbackRejected, InboundMessage, PulledItem, ReplyTarget
from bots.parts import Media, Part
from bots.xml import parse_flat_xml

PLATFORM = "wecom-kf"
PULL_EVENT = "kf_msg_or_event"
CUSTOMER, EVENT, AGENT = 3, 4, 5  # an item's `origin`


def conversation_of(open_kfid: str, customer: str) -> str:
    return f"{open_kfid}:{customer}"


def target_of(open_kfid: str, customer: str) -> ReplyTarget:
    """A customer of one account: `user_id` is their external_userid, `chat_id` the account's open_kfid."""
    return ReplyTarget(user_id=customer, chat_id=open_kfid)


def parse_pull_callback(bot_id: str, plaintext: str, received_at: float) -> InboundMessage | None:
    """The decrypted callback → a pull request (msg_type "pull", the callback's Token as text), or None for
    an event that is not kf_msg_or_event. WeCom resends an unacknowledged callback with the same Token, so
    the Token is what deduplicates it."""
    fields = parse_flat_xml(plaintext.encode("utf-8"))
    if fields.get("MsgType") != "event" or fields.get("Event") != PULL_EVENT:
        return None
    token, open_kfid = fields.get("Token", ""), fields.get("OpenKfId", "")
    if not token or not open_kfid:
        raise CallbackRejected("missing_fields", 400, "kf_msg_or_event without Token or OpenKfId")
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot_id,
        msg_id=f"pull:{open_kfid}:{token}",
        conversation_id=open_kfid,
        sender_id=open_kfid,
        text=token,
        msg_type="pull",
        received_at=received_at,
        reply_to=ReplyTarget(chat_id=open_kfid),
    )


def number_or_zero(value: object) -> float:
    """A number from the platform's JSON; anything else (a string, null, a list) counts as 0."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return number if number == number and abs(number) != float("inf") else 0.0


# The sync_msg items that carry media name it by `media_id` alone (image, voice, video, file: silenceper/wechat
# work/kf/syncmsg/message.go, wecom-kf.md §2); no name, type or size comes with it: the file's name comes with
# media/get's answer. Voice arrives as AMR because sync_msg asks for `voice_format` 0 (wecom-kf.md §2, client.py).
# A video, location, link, business card, mini program or menu click has nothing the engine reads: its msgtype
# alone, no parts (the worker's parts stage says what the bot can read). The documents show no quoted-message field
# in a 微信客服 item, so a quote never arrives from here.
_MEDIA_PARTS = {"image": "image", "voice": "audio", "file": "file"}
VOICE_FORMAT = "amr"


def _content_of(item: dict[str, Any]) -> tuple[str, tuple[Part, ...]]:
    """(what the customer typed, the parts to read) of one item."""
    msgtype = str(item.get("msgtype", ""))
    body = item.get(msgtype)
    if not isinstance(body, dict):
        return "", ()
    if msgtype == "text":
        return str(body.get("content", "")), ()
    kind = _MEDIA_PARTS.get(msgtype)
    media_id = body.get("media_id")
    if kind is None or not isinstance(media_id, str) or not media_id:
        return "", ()
    media = Media(ref=media_id, format=VOICE_FORMAT if kind == "audio" else "")
    return "", (Part(kind=kind, media=media),)  # type: ignore[arg-type]


def parse_item(bot_id: str, item: dict[str, Any]) -> PulledItem | None:
    """One sync_msg item; None for what the bot has no use for (an item without a customer or msgid)."""
    event = item.get("event") if isinstance(item.get("event"), dict) else {}
    # An event names its account and customer inside `event` (whether the top level has them too is UNCONFIRMED).
    msgid = str(item.get("msgid", ""))
    open_kfid = str(item.get("open_kfid") or event.get("open_kfid") or "")
    customer = str(item.get("external_userid") or event.get("external_userid") or "")
    if not msgid or not open_kfid or not customer:
        return None
    origin = item.get("origin")
    text, parts = _content_of(item)
    kind = {CUSTOMER: "message", AGENT: "agent", EVENT: "event"}.get(origin)  # type: ignore[arg-type]
    if kind is None:
        return None
    msg_type = "event" if kind == "event" else ("text" if text else str(item.get("msgtype") or "unknown"))
    message = InboundMessage(
        platform=PLATFORM,
        bot_id=bot_id,
        msg_id=msgid,
        conversation_id=conversation_of(open_kfid, customer),
        sender_id=customer,
        text=str(event.get("event_type", "")) if kind == "event" else text,
        msg_type=msg_type,
        parts=parts if kind == "message" else (),
        received_at=number_or_zero(item.get("send_time")),
        reply_to=target_of(open_kfid, customer),
    )
    return PulledItem(kind=kind, message=message, event=event if kind == "event" else {})


def handoff_for(
    bot: object, open_kfid: object, customer: object, servicer: object = None
) -> InboundMessage:
    """An operator's handoff of one customer, as the message the worker hands over (in the customer's lane).
    ValueError says what is wrong: not a 微信客服 bot, which account is meant is not clear or not served, or the
    agent named is not a WeCom userid."""
    from bots.wecom_kf.config import USERID_PATTERN, WeComKfConfig

    if not isinstance(bot, WeComKfConfig):
        raise ValueError(f"bot {getattr(bot, 'id', '?')!r} is not a wecom-kf bot")
    if not isinstance(customer, str) or not customer:
        raise ValueError("a customer (external_userid) is needed")
    if open_kfid is not None and not isinstance(open_kfid, str):
        raise ValueError("open_kfid is a string")
    if servicer and (not isinstance(servicer, str) or not re.match(USERID_PATTERN, servicer)):
        raise ValueError("servicer is an agent's WeCom userid (letters, digits, _ - @ . ; at most 64)")
    accounts = bot.open_kfids or []
    open_kfid = open_kfid or (accounts[0] if len(accounts) == 1 else "")
    if not open_kfid:
        raise ValueError("the account (open_kfid) is needed: the bot serves more than one, or all of them")
    if bot.open_kfids is not None and open_kfid not in bot.open_kfids:
        raise ValueError(f"the bot does not serve the account {open_kfid!r} (its open_kfids: {', '.join(accounts)})")
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot.id,
        msg_id=f"handoff:{open_kfid}:{customer}:{time.time_ns()}",
        conversation_id=conversation_of(open_kfid, customer),
        sender_id=customer,
        text="",
        msg_type="handoff",
        reply_to=target_of(open_kfid, customer),
    ).model_copy(update={"family": bot.identity.family, "tenant": bot.identity.tenant})
