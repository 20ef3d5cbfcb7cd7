"""The decrypted WeCom app message (inner XML) → InboundMessage.

The app's message types are those of WeCom doc 96467 消息格式 (developer.work.weixin.qq.com/document/path/96467,
"消息类型支持：文本、图片、语音、视频、位置以及链接信息"): text (Content), image (PicUrl, MediaId), voice (MediaId,
Format, and Recognition when 语音识别 is on), video (MediaId, ThumbMediaId), location (Location_X, Location_Y,
Scale, Label) and link (Title, Description, Url, PicUrl). There is no file type, so none is read here. Media is
named by its MediaId (valid three days, "仅三天内有效"), downloaded later through media/get
(bots/wecom/client.py), never on the callback's fast path; PicUrl is not used (media/get, on the bot's API host,
serves the same picture).

Events need no answer, except a tap on a button of botgw's card (doc 90240 模板卡片事件推送: `Event`
template_card_event with `EventKey`, the button's key, `TaskId`, `CardType`, `ResponseCode`): it becomes a
message in the tapper's one-to-one conversation, as if they had typed the button's word (bots/wecom/cards.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from bots.base import CallbackRejected, InboundMessage, ReplyTarget
from bots.buttons import CHOICE_WORDS, ButtonTap
from bots.parts import Media, Part
from bots.wecom.cards import CARD_EVENT, read_card_tap
from bots.xml import parse_flat_xml

PLATFORM = "wecom"

MAX_RESPONSE_CODE_CHARS = 512  # a ResponseCode is an opaque token; anything longer is not one


def app_parts(msg_type: str, fields: Mapping[str, str]) -> tuple[str, tuple[Part, ...]]:
    """(what the sender typed, the other parts) of one app message. A type the engine cannot read (video,
    location, link, anything new) has neither: its msg_type says what it was, and the worker says what it can
    read. A picture or recording without its MediaId cannot be fetched either."""
    media_id = fields.get("MediaId", "")
    if msg_type == "text":
        return fields.get("Content", ""), ()
    if msg_type == "image" and media_id:
        return "", (Part(kind="image", media=Media(ref=media_id)),)
    if msg_type == "voice" and (media_id or fields.get("Recognition")):
        media = Media(ref=media_id, format=fields.get("Format", "").lower()) if media_id else None
        return "", (Part(kind="audio", text=fields.get("Recognition", ""), media=media),)
    return "", ()


def parse_app_message(
    bot_id: str, plaintext: str, received_at: float, agent_id: int | None = None
) -> InboundMessage | None:
    """Build the normalized message, or None for events (enter_agent, subscribe, …), which need no answer.

    WeCom's rule for dedup: MsgId where there is one, FromUserName + CreateTime for events. A message or event
    that names another app (AgentID, doc 90239) is refused: every app of a corporation decrypts with its corp id,
    so two apps given one token and key would take each other's callbacks, and both answer (found by a review).
    """
    fields = parse_flat_xml(plaintext.encode("utf-8"))
    named = fields.get("AgentID", "")
    if agent_id is not None and named and named.strip() != str(agent_id):
        raise CallbackRejected("wrong_agent", 403, "the callback names another app (AgentID)")
    msg_type = fields.get("MsgType", "")
    sender = fields.get("FromUserName", "")
    if msg_type == "event":  # before the sender check: a 微信客服 kf_msg_or_event at an app's URL names none
        return card_tap(bot_id, fields, received_at) if fields.get("Event") == CARD_EVENT else None
    if not msg_type or not sender:
        raise CallbackRejected("missing_fields", 400, "MsgType or FromUserName missing")
    msg_id = fields.get("MsgId") or f"{sender}:{fields.get('CreateTime', '')}"
    text, parts = app_parts(msg_type, fields)
    return one_to_one(bot_id, sender, msg_id, text, msg_type, parts, received_at)


def card_tap(bot_id: str, fields: Mapping[str, str], received_at: float) -> InboundMessage | None:
    """A tap on a button of botgw's card, as the tapper's message (None: another card's event). Its id follows
    WeCom's rule for events (FromUserName + CreateTime) with the card and the button, so that a retry of one tap
    is one delivery and two taps are two."""
    tap = read_card_tap(fields.get("EventKey", ""), fields.get("TaskId", ""))
    if tap is None:
        return None
    sender, created = fields.get("FromUserName", ""), fields.get("CreateTime", "")
    if not sender or not created:
        raise CallbackRejected("missing_fields", 400, "a card event without FromUserName or CreateTime")
    msg_id = f"{sender}:{created}:{fields.get('TaskId', '')}:{fields.get('EventKey', '')}"
    code = fields.get("ResponseCode", "")  # lets the app update this card once (doc 94888)
    if isinstance(code, str) and 0 < len(code) <= MAX_RESPONSE_CODE_CHARS:
        tap = tap.model_copy(update={"card_ref": code})
    return one_to_one(bot_id, sender, msg_id, CHOICE_WORDS[tap.choice], "text", (), received_at, tap)


def one_to_one(
    bot_id: str,
    sender: str,
    msg_id: str,
    text: str,
    msg_type: str,
    parts: tuple[Part, ...],
    received_at: float,
    tap: ButtonTap | None = None,
) -> InboundMessage:
    """A message in the sender's one-to-one conversation with the app (the only kind an app has), answered to
    them: what a typed message and a tap share, so that a tap lands in the lane its question waits in."""
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot_id,
        msg_id=msg_id,
        conversation_id=sender,
        sender_id=sender,
        text=text,
        msg_type=msg_type,
        parts=parts,
        received_at=received_at,
        reply_to=ReplyTarget(user_id=sender),
        tap=tap,
    )
