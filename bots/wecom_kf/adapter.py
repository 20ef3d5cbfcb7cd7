"""微信客服 adapter: the callback that says "pull", the pulled log, replies within the 5-message rule,
and the session (who holds the customer: the bot, a human, nobody) as the worker needs it.

The callback is verified like an app's (same crypto, corp id as the receiver id) and answered at once;
the pull itself is queued work (gateway/pull.py), as is every message it finds.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Mapping

import httpx

from bots.base import (
    ChannelDefaults,
    CursorRefused,
    EventEffect,
    InboundMessage,
    Owner,
    Pacing,
    PermanentSendError,
    PulledPage,
    ReplyQuota,
    ReplyStyle,
    ReplyTarget,
    SendError,
    TokenStore,
)
from bots.channels import CallbackRequest, Queued
from bots.parts import Downloaded, Media
from bots.wecom.adapter import verified_echo, verified_plaintext
from bots.wecom_kf.client import KfApiClient
from bots.wecom_kf.config import WeComKfConfig
from bots.wecom_kf.crypto import kf_crypto
from bots.wecom_kf.exceptions import refused_as_repeat
from bots.wecom_kf.models import PLATFORM, number_or_zero, parse_item, parse_pull_callback

log = logging.getLogger(__name__)
TEXT_MAX_BYTES = 2048  # the app text cap, which the bots people use split at (the Kefu cap is UNCONFIRMED)
NOT_ON_DUTY = 95014  # trans to 3: the servicer is not 正在接待 or not activated (wecom-kf.md, service_state/trans)
QUOTA = ReplyQuota(limit=5, window_s=48 * 3600, reserve=1)
STATE_NEW, STATE_BOT, STATE_POOL, STATE_HUMAN, STATE_ENDED = 0, 1, 2, 3, 4
_OWNERS: dict[int, Owner] = {STATE_NEW: "free", STATE_BOT: "bot", STATE_POOL: "human", STATE_HUMAN: "human",
                             STATE_ENDED: "free"}  # fmt: skip
# session_status_change: 1 an agent took it from the pool, 2 transferred, 3 ended, 4 an ended one taken up again
_CHANGES: dict[int, Owner] = {1: "human", 2: "human", 3: "free", 4: "human"}
_NOT_WORDS = re.compile(r"[\s\W_]+")


# msg_send_fail's fail_type (wecom-kf.md §2 events): 4 the session is older than 48 h, 5 closed, 6 over the message
# limit, 10 the customer refused. Whether the platform counted the failed message against the 5 is UNCONFIRMED:
# the harsher reading, that it did, gives no slot back; "over the limit" means it counted more than we did, so
# the allowance is taken as used up. An operator should see every kind but the customer's own refusal.
_OVER_LIMIT = "6"
_CUSTOMER_REFUSED = "10"


def send_failure(event: dict) -> EventEffect:
    """What a msg_send_fail means: which message, why, and what it does to the allowance."""
    fail_type = str(event.get("fail_type", ""))
    return EventEffect(
        label=f"msg_send_fail:{fail_type}",
        failed_msgid=str(event.get("fail_msgid", "")),
        fail_type=fail_type,
        quota_refund=-QUOTA.limit if fail_type == _OVER_LIMIT else 0,
        dead_letter=fail_type != _CUSTOMER_REFUSED,
    )


def msgid_for(key: str) -> str:
    """A msgid WeCom accepts (≤ 32 bytes of [0-9a-zA-Z_-]), the same for every attempt at one piece."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class KfSessions:
    """Who holds a customer's session, and the moves the bot makes: take it, hand it to a human, notices."""

    def __init__(self, config: WeComKfConfig, api: KfApiClient) -> None:
        self._config = config
        self._api = api
        self._keywords = {_NOT_WORDS.sub("", word) for word in config.handoff.keywords if word.strip()}

    def wants_human(self, text: str) -> bool:
        """The message is a handoff keyword, alone or nearly ("转人工！", "我要人工客服"), not a sentence that
        merely contains one ("人工智能是什么")."""
        words = _NOT_WORDS.sub("", text)
        return any(words == keyword or (words.endswith(keyword) and len(words) <= len(keyword) + 2)
                   for keyword in self._keywords)  # fmt: skip

    async def is_open(self, target: ReplyTarget) -> bool:
        return await self._api.has_session(target.chat_id, target.user_id)

    async def owner(self, target: ReplyTarget) -> Owner:
        state, _ = await self._api.service_state(target.chat_id, target.user_id)
        return _OWNERS.get(state, "human")  # an unknown state: stay quiet rather than talk over someone

    async def take(self, target: ReplyTarget) -> None:
        await self._api.trans(target.chat_id, target.user_id, STATE_BOT)

    async def hand_off(self, target: ReplyTarget, servicer: str | None) -> str:
        """Move the customer to a named agent, else the queue; returns the msg_code for the notice ('' none).

        A named agent who is not on duty (95014) is no reason to keep the customer with the bot: the queue
        takes them. A move refused (whatever its code) while a human already holds the session (the state changed
        under us) is a handoff already made: nothing to notify."""
        servicer = servicer or self._config.handoff.servicer
        try:
            if servicer:
                try:
                    return await self._api.trans(target.chat_id, target.user_id, STATE_HUMAN, servicer)
                except PermanentSendError as exc:
                    if exc.code != NOT_ON_DUTY:
                        raise
                    log.warning("the handoff's servicer is not on duty; handing to the queue",
                                extra={"code": exc.code})  # fmt: skip
            return await self._api.trans(target.chat_id, target.user_id, STATE_POOL)
        except PermanentSendError as exc:
            if await self._with_a_human(target):
                log.info("the handoff's move was refused, and the session is already with a human: no move needed",
                         extra={"code": exc.code})  # fmt: skip
                return ""
            raise

    async def _with_a_human(self, target: ReplyTarget) -> bool:
        """Whether a human holds the session now (False when that cannot be asked either). Any refusal of a move is
        asked about: the documents give no code for "the state changed under us" (95016 was the simulator's own
        choice, found by a review)."""
        try:
            return await self.owner(target) == "human"
        except SendError:
            return False

    async def send_notice(
        self, target: ReplyTarget, code: str, text: str, notice_key: str, *, resend: bool = False
    ) -> None:
        try:
            await self._api.send_on_event(code, text, msgid_for(notice_key))
        except PermanentSendError as exc:
            if not (resend and refused_as_repeat(exc)):
                raise
            log.warning("a resent notice was refused; taken as delivered by the earlier attempt (UNCONFIRMED)",
                        extra={"code": exc.code})  # fmt: skip

    def handoff_text(self) -> str:
        return self._config.handoff.notice_text

    def on_event(self, event: dict, target: ReplyTarget) -> EventEffect:
        kind = str(event.get("event_type", ""))
        if kind == "enter_session":
            account = self._config.accounts.get(target.chat_id)
            text = (account.welcome_text if account and account.welcome_text else None) or self._config.welcome_text
            return EventEffect(welcome_code=str(event.get("welcome_code", "")), welcome_text=text or "", label=kind)
        if kind == "msg_send_fail":
            return send_failure(event)
        if kind == "session_status_change":
            change = int(number_or_zero(event.get("change_type")))
            return EventEffect(owner=_CHANGES.get(change), label=f"{kind}:{change}")
        return EventEffect(label=kind or "unknown")


class WeComKfAdapter(ChannelDefaults):
    """One 微信客服 secret and its accounts (all, or `open_kfids`)."""

    platform = PLATFORM
    reply_style: ReplyStyle = "pieces"
    callback_style = "queue"
    ack = ("", "text/plain")
    reply_quota = QUOTA
    default_reply_format = "text"  # WeChat shows a customer plain text: Markdown arrives as raw ** and #

    def __init__(self, config: WeComKfConfig, http: httpx.AsyncClient, tokens: TokenStore) -> None:
        self.config = config
        self.bot_id = config.id
        self.crypto = kf_crypto(config)
        self.api = KfApiClient(config, http, tokens)  # type: ignore[arg-type]
        self.sessions = KfSessions(config, self.api)
        self.merge_window_s = config.merge_window_s
        self.skip_history = config.skip_history

    def handshake(self, query: Mapping[str, str], now: float) -> str:
        return verified_echo(self.crypto, query, now, self.config.replay_window_s)

    def parse(self, query: Mapping[str, str], body: bytes, now: float) -> InboundMessage | None:
        """The callback → a pull request for its account (None: another event, or an account not served)."""
        plaintext = verified_plaintext(self.crypto, query, body, now, self.config.replay_window_s)
        return self.pull_for(plaintext, now)

    def receive(self, request: CallbackRequest) -> Queued | None:
        """The callback only says "pull"; the pull is queued (once per callback Token), never done here."""
        pull = self.parse(request.query, request.body, request.now)
        return None if pull is None else Queued(pull, pull=True)

    @property
    def app_id(self) -> str | None:
        """The `wecom` bot whose callback URL receives this bot's callbacks (one self-built app for both)."""
        return self.config.app

    def pull_for(self, plaintext: str, now: float) -> InboundMessage | None:
        """A verified, decrypted callback → a pull request for a served account, or None (another event)."""
        pull = parse_pull_callback(self.bot_id, plaintext, now)
        served = self.config.open_kfids
        return None if pull is None or (served is not None and pull.conversation_id not in served) else pull

    def max_bytes_for(self, target: ReplyTarget) -> int:
        return TEXT_MAX_BYTES  # send_piece sends text whatever the format: a Kefu customer sees no Markdown

    async def download(self, media: Media) -> Downloaded:
        """A customer's image, voice (AMR) or file, from media/get on the bot's own API base."""
        return await self.api.download_media(media.ref, self.max_media_bytes)

    def pacing(self, target: ReplyTarget) -> Pacing:
        return []  # the 5-message rule is the reply quota, kept by the worker

    def system_prompt_for(self, message: InboundMessage) -> str | None:
        account = self.config.accounts.get(message.reply_to.chat_id)
        return account.system_prompt if account else None

    def knowledge_for(self, message: InboundMessage):  # type: ignore[no-untyped-def]
        """An account's own knowledge bases, else the bot's."""
        account = self.config.accounts.get(message.reply_to.chat_id)
        return account.knowledge if account and account.knowledge else self.config.knowledge

    async def send_piece(
        self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = ""
    ) -> None:
        """send_msg with a msgid derived from the piece, so a retried send is refused, not doubled."""
        try:
            msgid = msgid_for(piece_key or secrets.token_hex(16))
            await self.api.send_text(target.chat_id, target.user_id, text, msgid)
        except PermanentSendError as exc:
            # A resend (an earlier attempt's outcome is unknown) with the same msgid that is refused is most likely
            # the repeat refused: the documents give no code for that, so any refusal that means nothing else is
            # taken as "delivered before" (UNCONFIRMED), and the answer's other pieces still go out.
            if not (duplicate_check and refused_as_repeat(exc)):
                raise
            log.warning("a resent piece was refused; taken as delivered by the earlier attempt (UNCONFIRMED)",
                        extra={"code": exc.code})  # fmt: skip

    def platform_message_id(self, piece_key: str) -> str:
        """send_msg's msgid of a piece: msg_send_fail names it as `fail_msgid`."""
        return msgid_for(piece_key)

    async def _answers_without_cursor(self, channel: str, hint: str) -> bool:
        """Whether sync_msg answers the account's pull when it names no cursor (the page itself is not used)."""
        try:
            await self.api.sync_msg(channel, "", hint)
        except SendError:
            return False
        return True

    async def pull_page(self, channel: str, cursor: str, hint: str) -> PulledPage:
        """One sync_msg page of account `channel`, from `cursor`, with the callback's token `hint`."""
        try:
            data = await self.api.sync_msg(channel, cursor, hint)
        except PermanentSendError as exc:
            # The documents give no code for a cursor the platform no longer knows (keyed on 40058, botgw relied on
            # the simulator's own choice, found by a review): the same pull without the cursor tells. Answered, it is
            # the cursor that was refused; refused too, it is something else (the token, the IP), raised as it is.
            if cursor and await self._answers_without_cursor(channel, hint):
                try:  # once more with it: a one-off refusal is no reason to drop a cursor (what is past it is lost)
                    data = await self.api.sync_msg(channel, cursor, hint)
                except PermanentSendError:
                    raise CursorRefused(f"the saved cursor was refused ({exc.code})", code=exc.code) from exc
            else:
                raise
        raw_items = [raw for raw in data.get("msg_list") or [] if isinstance(raw, dict)]
        identity = self.config.identity
        items = [
            parsed.model_copy(update={"message": identity.stamp(parsed.message)})
            for raw in raw_items
            if (parsed := parse_item(self.bot_id, raw)) is not None
        ]
        cursor = str(data.get("next_cursor", ""))
        return PulledPage(items=items, next_cursor=cursor, has_more=bool(data.get("has_more")))
