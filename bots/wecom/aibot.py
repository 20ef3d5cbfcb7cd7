"""WeCom AI bot (智能机器人) adapter: JSON callbacks in, encrypted stream replies out.

WeCom drives the stream by polling: the first callback of a message is answered with a
stream id, then WeCom sends "refresh" callbacks for that id, each answered with the full
text so far, until one says finish. The adapter only translates; where the text so far
lives (Redis, so that any replica can answer any refresh) is the gateway's business.
The crypto is the app callbacks' with an empty receiver id; wechatpy only builds XML
envelopes, so the JSON envelope is built here.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

import httpx

from bots.base import (
    CallbackRejected,
    ChannelDefaults,
    Identity,
    InboundMessage,
    PermanentSendError,
    ReplyStyle,
    ReplyTarget,
)
from bots.buttons import CHOICE_WORDS, ButtonTap, Question
from bots.channels import PolledEvent, StreamPoll, UnsupportedMessage, WelcomeEvent
from bots.http import download_bounded, request_json
from bots.parts import Downloaded, Media, MediaError, Part
from bots.safe_json import object_field, parse_json_object
from bots.text import utf8_prefix
from bots.urls import trusted
from bots.wecom.adapter import check_timestamp, required_params
from bots.wecom.aibot_parts import READABLE, aibot_content
from bots.wecom.cards import AIBOT_CARD, CARD_EVENT, button_card, read_card_tap
from bots.wecom.config import WeComAIBotConfig
from bots.wecom.crypto import WeComCrypto, decode_aes_key, sign
from bots.wecom.media import decrypt_aibot_media, filename_from, sniffed_name

PLATFORM = "wecom-ai"
STREAM_MAX_BYTES = 20480
RESPONSE_URL_MAX_BYTES = 20480
RESPONSE_URL_TTL_S = 3600  # a response_url works for an hour after the message
RESPONSE_URL_MARGIN_S = 60  # not used in its last minute: a post that arrives late is refused


AIBotEvent = PolledEvent  # a refresh (StreamPoll), enter_chat (WelcomeEvent), a message or a tap, or one it cannot read


def stream_id_for(message_dedup_key: str) -> str:
    """The same stream id for every retry of one message, so a retried first callback joins its stream."""
    return hashlib.sha256(message_dedup_key.encode()).hexdigest()[:32]


class WeComAIBotAdapter(ChannelDefaults):
    """One AI bot: verifies its JSON callbacks, classifies them, and builds its encrypted replies."""

    platform = PLATFORM
    max_stream_bytes = STREAM_MAX_BYTES
    max_overflow_bytes = RESPONSE_URL_MAX_BYTES
    max_answer_bytes = STREAM_MAX_BYTES + RESPONSE_URL_MAX_BYTES
    reply_style: ReplyStyle = "stream"
    callback_style = "polled-stream"  # WeCom polls the answer's stream with refresh callbacks
    default_reply_format = "markdown"  # stream content is rendered as Markdown (doc 101031 流式消息回复)

    def __init__(self, config: WeComAIBotConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.bot_id = config.id
        self._token = config.token.get_secret_value()
        self.crypto = WeComCrypto(self._token, config.encoding_aes_key.get_secret_value(), "")
        self._media_key = decode_aes_key(config.encoding_aes_key.get_secret_value())
        self._http = http
        self.buttons = ResponseUrlButtons(self)

    @property
    def welcome_text(self) -> str:
        return self.config.welcome_text

    @property
    def stream_limit_s(self) -> float:
        return float(self.config.stream_limit_s)

    def handshake(self, query: Mapping[str, str], now: float) -> str:
        """GET URL verification, as for apps (receiver id empty)."""
        signature, timestamp, nonce, echostr = required_params(query, "msg_signature", "timestamp", "nonce", "echostr")
        check_timestamp(timestamp, now, self.config.replay_window_s)
        return self.crypto.verify_and_decrypt(signature, timestamp, nonce, echostr)

    def parse(self, query: Mapping[str, str], body: bytes, now: float) -> AIBotEvent:
        signature, timestamp, nonce = required_params(query, "msg_signature", "timestamp", "nonce")
        check_timestamp(timestamp, now, self.config.replay_window_s)
        encrypted = parse_json_object(body, "body").get("encrypt")
        if not isinstance(encrypted, str) or not encrypted:
            raise CallbackRejected("missing_encrypt", 400, "body has no encrypt field")
        payload = parse_json_object(self.crypto.verify_and_decrypt(signature, timestamp, nonce, encrypted), "plaintext")
        return self._classify(payload, now)

    def _classify(self, payload: dict[str, Any], now: float) -> AIBotEvent:
        named = str(payload.get("aibotid", ""))
        if self.config.aibot_id and named and named != self.config.aibot_id:
            # Every AI bot decrypts with an empty receiver id: two bots given one token and key would take each
            # other's callbacks, and both answer (found by a review).
            raise CallbackRejected("wrong_bot", 403, "the callback names another AI bot")
        msg_type = str(payload.get("msgtype", ""))
        if msg_type == "stream":
            stream_id = str(object_field(payload, "stream").get("id", ""))
            if not stream_id:
                raise CallbackRejected("missing_fields", 400, "stream refresh without stream.id")
            return StreamPoll(stream_id)
        if msg_type == "event":
            event = object_field(payload, "event")
            event_type = str(event.get("eventtype", ""))
            if event_type == CARD_EVENT:
                return self._card_tap(payload, object_field(event, CARD_EVENT), now)
            return WelcomeEvent() if event_type == "enter_chat" else None
        sender = str(object_field(payload, "from").get("userid", ""))
        msg_id = str(payload.get("msgid", ""))
        if not sender or not msg_id:
            raise CallbackRejected("missing_fields", 400, "from.userid or msgid missing")
        if msg_type not in READABLE:
            return UnsupportedMessage(msg_type or "unknown")
        text, parts = aibot_content(payload, msg_type)
        message = self._message(payload, sender, msg_id, text, msg_type, parts, now)
        stream_id = stream_id_for(message.dedup_key)
        return message.model_copy(update={"reply_to": message.reply_to.model_copy(update={"stream_id": stream_id})})

    def _card_tap(self, payload: dict[str, Any], event: dict[str, Any], now: float) -> InboundMessage | None:
        """A tap on a button of botgw's card (doc 100719 模板卡片事件: event.template_card_event.event_key and
        task_id), as the tapper's message in the conversation the card was shown in; None for another card's.
        It opens no stream: the passive reply to a card event can only update the card (doc 101031
        回复消息更新模板卡片; an empty reply is allowed), so the answer goes through the event's own
        response_url. Its id is the event's msgid ("开发者需据此进行事件排重"), else the tapper, time, card
        and button."""
        tap = read_card_tap(event.get("event_key", ""), event.get("task_id", ""))
        if tap is None:
            return None
        sender = str(object_field(payload, "from").get("userid", ""))
        if not sender:
            raise CallbackRejected("missing_fields", 400, "a card event without from.userid")
        msg_id = str(payload.get("msgid", "")) or (
            f"{sender}:{payload.get('create_time', '')}:{event.get('task_id', '')}:{event.get('event_key', '')}")
        return self._message(payload, sender, msg_id, CHOICE_WORDS[tap.choice], "text", (), now, tap)

    def _message(
        self,
        payload: dict[str, Any],
        sender: str,
        msg_id: str,
        text: str,
        msg_type: str,
        parts: tuple[Part, ...],
        now: float,
        tap: ButtonTap | None = None,
    ) -> InboundMessage:
        """A message in its conversation (the group's when chattype is group, else the sender's one-to-one),
        answered through the callback's response_url where the stream cannot carry it: what a message and a tap
        share, so that a tap lands in the lane its question waits in."""
        group = str(payload.get("chatid", "")) if payload.get("chattype") == "group" else ""
        identity = self._identity(payload)
        # An outsider is named with their corporation wherever a user is a key (memory, lanes, stream limits,
        # allow/deny lists): their "alice" named plainly shared the member alice's per-bot memory (a review).
        who = sender if identity.tenant == self.config.identity.tenant else f"{identity.tenant}/{sender}"
        message = InboundMessage(
            platform=PLATFORM,
            bot_id=self.bot_id,
            msg_id=msg_id,
            conversation_id=group or who,
            sender_id=who,
            text=text,
            msg_type=msg_type,
            parts=parts,
            mentioned_bot=bool(group),
            group_id=group,
            received_at=now,
            reply_to=ReplyTarget(
                user_id=sender,
                chat_id=group,
                webhook_url=str(payload.get("response_url", "")),
                webhook_expires_at=now + RESPONSE_URL_TTL_S - RESPONSE_URL_MARGIN_S,
            ),
            tap=tap,
        )
        return identity.stamp(message)

    def _identity(self, payload: dict[str, Any]) -> Identity:
        """Who the sender is: a member of the bot's corporation, or of the one `from.corpid` names. WeCom sends
        corpid only for a bot that is not the corporation's own (doc 100719, From 结构体: 若为企业内部智能机器人
        不返回): an outsider's "alice" is not the member alice, nor given her memory, limits or tool rights
        (found by a review)."""
        own = self.config.identity
        corp = str(object_field(payload, "from").get("corpid", ""))
        if not corp or corp == own.tenant:
            return own
        return Identity(own.family, corp, memory_by_person=False)

    async def download(self, media: Media) -> Downloaded:
        """A picture or file of a message: its URL (from inside the encrypted callback) fetched, then decrypted
        with the bot's key. Only from WeCom's media host (`media_hosts`) or its API origin as configured (the
        simulator's); no redirects. Any https host was fetched before (found by a review): a leaked key would have
        let a forged callback make the worker GET internal addresses."""
        url = media.ref
        if not trusted(url, self.config.api_base, PLATFORM, "media", self.config.media_hosts):
            raise MediaError("refused", "the AI bot's media URL is neither WeCom's media host nor its API origin")
        try:
            data, headers = await download_bounded(self._http, url, "AI bot media", self.max_media_bytes + 32)
        except MediaError as exc:
            if exc.reason == "refused":  # the URL works five minutes (doc 100719): a refusal after that is expiry
                raise MediaError("expired", str(exc)) from exc
            raise
        plain = decrypt_aibot_media(self._media_key, data)
        if len(plain) > self.max_media_bytes:
            raise MediaError("too_large", f"AI bot media: over {self.max_media_bytes} bytes")
        return Downloaded(plain, "", filename_from(headers) or sniffed_name(plain))

    # -- replies ---------------------------------------------------------------------------

    def envelope(self, payload: dict[str, Any], nonce: str, timestamp: int) -> str:
        """The encrypted JSON reply: {encrypt, msgsignature, timestamp, nonce}."""
        encrypted = self.crypto.encrypt(json.dumps(payload, ensure_ascii=False))
        signature = sign(self._token, str(timestamp), nonce, encrypted)
        return json.dumps({"encrypt": encrypted, "msgsignature": signature, "timestamp": timestamp, "nonce": nonce})

    @staticmethod
    def stream_payload(stream_id: str, content: str, finish: bool) -> dict[str, Any]:
        """A stream reply carrying the full text so far, cut to WeCom's 20480 bytes."""
        return {
            "msgtype": "stream",
            "stream": {"id": stream_id, "finish": finish, "content": utf8_prefix(content, STREAM_MAX_BYTES)},
        }

    @staticmethod
    def text_payload(text: str) -> dict[str, Any]:
        return {"msgtype": "text", "text": {"content": text}}

    def overflow_allowed(self, target: ReplyTarget) -> bool:
        """The message's response_url may be used: it points at WeCom's API origin (it came in the body), and its
        hour is not over."""
        url = target.webhook_url
        if not url or (target.webhook_expires_at and time.time() >= target.webhook_expires_at):
            return False
        return trusted(url, self.config.api_base, self.platform, "response_url")

    async def send_overflow(self, target: ReplyTarget, text: str) -> None:
        """POST the part of an answer that did not fit the stream (or the whole answer to a tap, which has no
        stream) to the message's response_url (usable once)."""
        content = utf8_prefix(text, RESPONSE_URL_MAX_BYTES)
        await self.post_response(target, {"msgtype": "markdown", "markdown": {"content": content}})

    async def post_response(self, target: ReplyTarget, body: dict[str, Any]) -> None:
        """POST one message to the target's response_url (doc 101138 主动回复消息: once, within the hour)."""
        if not self.overflow_allowed(target):
            raise PermanentSendError("message has no response_url of WeCom's", code="no_response_url")
        data = await request_json(self._http, "POST", target.webhook_url, "response_url", json=body)
        if int(data.get("errcode", 0)) != 0:
            raise PermanentSendError(f"response_url refused the message: {data.get('errmsg', '')}")


class ResponseUrlButtons:
    """A question's buttons as a template card posted to the message's response_url, which takes one "当且仅当
    回调的会话类型为单聊的时候" (doc 101138): in a group nothing is shown, and the question's text (reply 确认 or
    取消) is the way to answer. The tap comes back as a template_card_event callback (WeComAIBotAdapter.parse)."""

    def __init__(self, adapter: WeComAIBotAdapter) -> None:
        self._adapter = adapter

    async def ask(self, target: ReplyTarget, question: Question) -> None:
        if target.chat_id:  # not marked shown: the question's text is the way to answer
            raise PermanentSendError("a template card goes through response_url only in a single chat")
        card = button_card(question, AIBOT_CARD)
        await self._adapter.post_response(target, {"msgtype": "template_card", "template_card": card})

    async def answered(self, target: ReplyTarget, tap: ButtonTap, label: str) -> None:
        """Not updated: the AI bot's card can be updated only in the reply to the tap's own callback (doc 101031),
        which is answered empty at once, before the tap is settled. A second tap is answered with nothing."""


def new_nonce() -> str:
    return str(secrets.randbelow(10**10))
