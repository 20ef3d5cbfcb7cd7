"""The web chat page's adapter: the page (Chainlit) posts a signed-in user's message to the gateway,
which streams the answer back from the same stream store the WeCom AI bot uses.

The page says how the person signed in (`login`): through WeCom or DingTalk they are that platform's member
(the same identity, memory and limits as in the bot whose login the page uses); with a password or the
proxy's header they are the page's own user, `web:<bot>:<name>`.

A tap on one of the buttons the page shows under a question (a tool call's 确认/取消) comes as the same post with
`button` (the button's key, bots.buttons) instead of text: a message with `tap` whose text is the choice's word,
from the same signed-in person in the same conversation as their messages. Its msg_id is made of the person and
the button (`tap:<person>:<choice>:<question>`), never taken from the post: the same tap posted again is the same
delivery (queued once; its answer read again), and no tap can pass for another person's message.

Attached files come as refs the gateway handed out for the page's uploads (bots/web/uploads.py): each becomes an
image or file part whose media is the ref bound to its owner, and `download` reads it from the upload store.
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
    qualified,
)
from bots.buttons import CHOICE_WORDS, ButtonTap, read_button_key
from bots.parts import Downloaded, Media, MediaError, Part
from bots.web.config import WebBotConfig
from bots.web.uploads import MAX_ATTACHMENTS, REF, UploadStore, kind_of, media_ref, split_media_ref
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
        self.uploads: UploadStore | None = None

    def attach_uploads(self, store: UploadStore) -> None:
        """Where the page's uploads are kept (the gateway's and the worker's runtime give it; none: no files)."""
        self.uploads = store

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

    def owner_of(self, user: str, login: str) -> str:
        """Who a page user is, as `InboundMessage.person` names them (`web:<bot>:<name>`, `wecom:<corp>:<userid>`):
        the name their uploads are kept under. CallbackRejected: a name no user could have, a login not offered."""
        if not USER_ID.fullmatch(user):
            raise CallbackRejected("malformed_fields", 400, "user must be 1-128 of A-Z a-z 0-9 _ . @ -")
        identity = self.identity_of(login or "password")
        return qualified(identity.family or PLATFORM, identity.tenant or self.bot_id, user)

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
        tap = tapped(payload)
        text = CHOICE_WORDS[tap.choice] if tap else str(payload.get("text", ""))
        if len(text) > MAX_TEXT_CHARS:
            raise CallbackRejected("text_too_long", 413, f"text over {MAX_TEXT_CHARS} characters")
        temperature = payload.get("temperature")
        user = str(payload["user"])
        login = str(payload.get("login") or "password")
        person = self.owner_of(user, login)  # a name no user could have, a login not offered: refused here
        identity = self.identity_of(login)
        # A company member's conversation on the page is named apart from a page user's of the same name: the
        # per-bot memory name (`bot_session_key`) of a page user must never be adopted as the member's memory.
        conversation = user if login in PAGE_LOGINS else f"{login}:{user}"
        tap_id = f"tap:{person}:{tap.choice}:{tap.question_id}" if tap else ""
        given = str(payload.get("msg_id") or "")
        if not tap_id and given.startswith("tap:"):  # a typed message cannot pre-empt a tap's delivery
            raise CallbackRejected("bad_msg_id", 400, "msg_id: 'tap:' names a button's delivery")
        # A client's own msg_id (its retry is one delivery) is the sender's: two users sending one msg_id were one
        # delivery, and the second was shown the first one's answer (found by a review).
        msg_id = tap_id or (f"{person}:{given}" if given else secrets.token_hex(12))
        message = InboundMessage(
            platform=PLATFORM,
            bot_id=self.bot_id,
            msg_id=msg_id,
            conversation_id=conversation,
            sender_id=user,
            text=text,
            received_at=now,
            reply_to=ReplyTarget(user_id=user),
            temperature=float(temperature) if temperature is not None else None,
            family=identity.family,
            tenant=identity.tenant,
            memory_by_person=identity.memory_by_person,
            tap=tap,
        )
        stream_id = stream_id_for(message.dedup_key)
        parts = attached_parts(payload.get("attachments"), message.person)  # the uploads are the sender's own
        return message.model_copy(update={
            "reply_to": message.reply_to.model_copy(update={"stream_id": stream_id}),
            # a tap is a text message (the choice's word) to the stages: ReadParts answers any other type
            # without media as one it cannot read
            "parts": parts, "msg_type": "attachments" if parts else "text",
        })

    async def check_uploads(self, message: InboundMessage) -> None:
        """Every attachment is an upload of the sender's that is still kept, as the page described it: otherwise
        a 400 before anything is queued (a ref never handed out, expired, or another user's)."""
        for part in message.parts:
            found = split_media_ref(part.media.ref) if part.media else None
            if found is None or self.uploads is None:
                raise CallbackRejected("unknown_upload", 400, "this page takes no attachments")
            ref, owner = found
            info = await self.uploads.info(self.bot_id, owner, ref)
            if info is None:
                raise CallbackRejected("unknown_upload", 400, "no such upload: it expired or is not yours")
            if (info.mime, info.size, info.name) != (part.media.mime, part.media.size, part.media.name):
                raise CallbackRejected("unknown_upload", 400, "the attachment is not the upload its ref names")

    async def download(self, media: Media) -> Downloaded:
        """The upload from the store, as its owner kept it (nothing is fetched from anywhere else)."""
        found = split_media_ref(media.ref)
        if found is None:
            raise MediaError("refused", "not a page upload's ref")
        if self.uploads is None:
            raise MediaError("unavailable", "this process has no upload store")
        ref, owner = found
        kept = await self.uploads.get(self.bot_id, owner, ref)
        if kept is None:
            raise MediaError("expired", "the upload is no longer kept")
        if len(kept.data) > self.max_media_bytes:
            raise MediaError("too_large", f"over {self.max_media_bytes} bytes")
        return kept


def tapped(payload: dict[str, Any]) -> ButtonTap | None:
    """The tap a post names with `button` (None: a message). CallbackRejected for a key that is not one of
    botgw's buttons, or a tap that also carries text or files: nothing is queued."""
    if "button" not in payload:
        return None
    tap = read_button_key(payload["button"]) if isinstance(payload["button"], str) else None
    if tap is None:
        raise CallbackRejected("unknown_button", 400, "button must be the key of one of the page's buttons")
    if payload.get("text") or payload.get("attachments"):
        raise CallbackRejected("malformed_fields", 400, "a button's tap carries no text and no attachments")
    return tap


def attached_parts(attachments: object, owner: str) -> tuple[Part, ...]:
    """The parts a message's `attachments` (`[{ref, name, mime, size}]`, as the upload route answered) become,
    in order; CallbackRejected for anything else (checked against the store by `check_uploads`)."""
    if attachments is None:
        return ()
    if not isinstance(attachments, list) or len(attachments) > MAX_ATTACHMENTS:
        raise CallbackRejected("malformed_fields", 400, f"attachments: a list of at most {MAX_ATTACHMENTS}")
    parts = []
    for item in attachments:
        if not isinstance(item, dict):
            raise CallbackRejected("malformed_fields", 400, "an attachment is {ref, name, mime, size}")
        ref, mime, size = str(item.get("ref", "")), str(item.get("mime", "")), item.get("size")
        kind = kind_of(mime)
        if not REF.fullmatch(ref) or kind is None or not isinstance(size, int) or isinstance(size, bool):
            raise CallbackRejected("malformed_fields", 400, "an attachment is {ref, name, mime, size}")
        media = Media(ref=media_ref(ref, owner), name=str(item.get("name", ""))[:200], mime=mime, size=size)
        parts.append(Part(kind=kind, media=media))
    return tuple(parts)
