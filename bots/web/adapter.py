"""The web chat page's adapter: the page (Chainlit) posts a signed-in user's message to the gateway,
which streams the answer back from the same stream store the WeCom AI bot uses.

The page says how the person signed in (`login`): through WeCom or DingTalk they are that platform's member
(the same identity, memory and limits as in the bot whose login the page uses); with a password or the
proxy's header they are the page's own user, `web:<bot>:<name>`.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

from bots.base import (
    CallbackRejected,
    ChannelDefaults,
    Identity,
    InboundMessage,
    ReplyStyle,
    ReplyTarget,
)
from bots.web.config import WebBotConfig
from bots.wecom.aibot import stream_id_for

PLATFORM = "web"
MAX_TEXT_CHARS = 8000
PAGE_LOGINS = ("password", "header")  # the page's own users
USER_ID = re.compile(r"[A-Za-z0-9_.@-]{1,128}")  # a page name, a WeCom userid, a DingTalk staffId: never a ':'


class WebAdapter(ChannelDefaults):
    platform = PLATFORM
    reply_style: ReplyStyle = "page"

    def __init__(self, config: WebBotConfig) -> None:
        self.config = config
        self.bot_id = config.id
        self.answer_timeout_s = float(config.answer_timeout_s)
        self._own = Identity(PLATFORM, config.id)
        self._logins: dict[str, Identity] = {}

    def join_bots(self, bots: Mapping[str, Any]) -> None:
        """The identities of the bots whose company logins the page offers (`web_login`)."""
        for via in ("wecom", "dingtalk"):
            login = getattr(self.config.web_login, via)
            if login is not None and login.bot in bots:
                self._logins[via] = bots[login.bot].identity

    def identity_of(self, login: str) -> Identity:
        if login in PAGE_LOGINS:
            return self._own
        if login in self._logins:
            return self._logins[login]
        raise CallbackRejected("unknown_login", 400, f"this page offers no {login!r} sign-in")

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
        if not USER_ID.fullmatch(user):
            raise CallbackRejected("malformed_fields", 400, "user must be 1-128 of A-Z a-z 0-9 _ . @ -")
        login = str(payload.get("login") or "password")
        identity = self.identity_of(login)
        # A company member's conversation on the page is named apart from a page user's of the same name: the
        # per-bot memory name (`bot_session_key`) of a page user must never be adopted as the member's memory.
        conversation = user if login in PAGE_LOGINS else f"{login}:{user}"
        message = InboundMessage(
            platform=PLATFORM,
            bot_id=self.bot_id,
            msg_id=str(payload.get("msg_id") or secrets.token_hex(12)),
            conversation_id=conversation,
            sender_id=user,
            text=text,
            received_at=now,
            reply_to=ReplyTarget(user_id=user),
            temperature=float(temperature) if temperature is not None else None,
            family=identity.family,
            tenant=identity.tenant,
            memory_by_person=identity.memory_by_person,
        )
        stream_id = stream_id_for(message.dedup_key)
        return message.model_copy(update={"reply_to": message.reply_to.model_copy(update={"stream_id": stream_id})})
