"""The web chat page's adapter: the page (Chainlit) posts a signed-in user's message to the gateway,
which streams the answer back from the same stream store the WeCom AI bot uses."""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Mapping

from bots.base import CallbackKind, CallbackRejected, ChannelDefaults, InboundMessage, ReplyStyle, ReplyTarget
from bots.web.config import WebBotConfig
from bots.wecom.aibot import stream_id_for

PLATFORM = "web"
MAX_TEXT_CHARS = 8000


class WebAdapter(ChannelDefaults):
    platform = PLATFORM
    reply_style: ReplyStyle = "page"
    callback_kind: CallbackKind | None = None  # the page posts to /web/{bot}/chat, not /callback

    def __init__(self, config: WebBotConfig) -> None:
        self.config = config
        self.bot_id = config.id

    def authorize(self, headers: Mapping[str, str]) -> None:
        expected = f"Bearer {self.config.api_key.get_secret_value()}"
        if not hmac.compare_digest(headers.get("authorization", "").encode(), expected.encode()):
            raise CallbackRejected("bad_api_key", 401, "missing or wrong API key")

    def parse(self, headers: Mapping[str, str], body: bytes, now: float) -> InboundMessage:
        self.authorize(headers)
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CallbackRejected("malformed_json", 400, "body is not valid JSON") from exc
        if not isinstance(payload, dict) or not str(payload.get("user", "")).strip():
            raise CallbackRejected("missing_fields", 400, "user and text are required")
        text = str(payload.get("text", ""))
        if len(text) > MAX_TEXT_CHARS:
            raise CallbackRejected("text_too_long", 413, f"text over {MAX_TEXT_CHARS} characters")
        temperature = payload.get("temperature")
        user = str(payload["user"])
        message = InboundMessage(
            platform=PLATFORM,
            bot_id=self.bot_id,
            msg_id=str(payload.get("msg_id") or secrets.token_hex(12)),
            conversation_id=user,
            sender_id=user,
            text=text,
            received_at=now,
            reply_to=ReplyTarget(user_id=user),
            temperature=float(temperature) if temperature is not None else None,
        )
        stream_id = stream_id_for(message.dedup_key)
        return message.model_copy(update={"reply_to": message.reply_to.model_copy(update={"stream_id": stream_id})})
