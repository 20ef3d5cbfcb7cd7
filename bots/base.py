"""Normalized types shared by every platform adapter.

Adapters turn a platform's callback into one `InboundMessage` and send replies back;
they know nothing of Redis, the queue or the engine (see DESIGN.md). What they need
from outside (a token cache) comes in through the small protocols defined here.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from bots.buttons import ButtonTap
from bots.parts import DEFAULT_MAX_MEDIA_BYTES, Downloaded, Media, MediaError, Part
from tools.config import BotTools

if TYPE_CHECKING:
    from bots.channels import Buttons


class ReplyTarget(BaseModel):
    """Where an answer goes: enough for the adapter's `send` without the original callback."""

    model_config = ConfigDict(frozen=True)

    user_id: str = ""
    chat_id: str = ""
    webhook_url: str = ""
    webhook_expires_at: float = 0.0
    stream_id: str = ""
    conversation_id: str = ""  # the platform's id of the conversation, where a later reply must name it


class InboundMessage(BaseModel):
    """One message from a person, whatever platform it came from."""

    model_config = ConfigDict(frozen=True)

    platform: str
    bot_id: str
    msg_id: str
    conversation_id: str
    sender_id: str
    text: str
    msg_type: str = "text"
    parts: tuple[Part, ...] = Field(
        default=(), description="what it holds besides its text (images, voice, files, quotes), in order"
    )
    mentioned_bot: bool = False
    group_id: str = Field(default="", description="the group conversation it was written in; '' one-to-one")
    received_at: float = Field(default_factory=time.time)
    reply_to: ReplyTarget = Field(default_factory=ReplyTarget)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description="the user's preset, if any")
    family: str = Field(default="", description="whose users these are: wecom, dingtalk, wecom-kf, web ('' = platform)")
    tenant: str = Field(default="", description="the organisation the sender belongs to (a corp id); '' = the bot")
    tap: ButtonTap | None = Field(
        default=None, description="a button of botgw's question tapped (bots.buttons); text is then the choice's word"
    )
    memory_by_person: bool = Field(
        default=False,
        description="one-to-one: the memory is the person's, shared by every bot of their family (app, AI bot, page)",
    )

    @property
    def person(self) -> str:
        """Who sent it, qualified so that no two platforms' or organisations' users can collide:
        `<family>:<tenant>:<user>` (wecom:<corp_id>:<userid>, web:<bot>:<name>). Limits and budgets count it."""
        return qualified(self.family or self.platform, self.tenant or self.bot_id, self.sender_id)

    @property
    def group(self) -> str:
        """The group conversation it was written in, qualified like `person`; '' one-to-one."""
        if not self.group_id:
            return ""
        return qualified(self.family or self.platform, self.tenant or self.bot_id, self.group_id)

    @property
    def session_key(self) -> str:
        """Whose memory this message belongs to: the person's own (`dm:<person>`) for a one-to-one message of a
        family that shares it, else platform, bot, conversation and user."""
        if self.memory_by_person and not self.group_id:
            return f"dm:{self.person}"
        return self.bot_session_key

    @property
    def bot_session_key(self) -> str:
        """The memory's name per bot and conversation (every session's name before memory followed the person:
        a one-to-one memory of that time is adopted under `session_key` when first read)."""
        return f"{self.platform}:{self.bot_id}:{self.conversation_id}:{self.sender_id}"

    @property
    def conversation_key(self) -> str:
        """Which conversation must be answered in order, one message at a time."""
        return f"{self.platform}:{self.bot_id}:{self.conversation_id}"

    @property
    def dedup_key(self) -> str:
        """Which delivery this is: the same for every retry of one platform message."""
        digest = hashlib.sha1(self.msg_id.encode()).hexdigest()[:20]
        return f"{self.platform}:{self.bot_id}:{digest}"


@dataclass(frozen=True)
class Identity:
    """How a bot's senders are named: their family (whose users: wecom, dingtalk, wecom-kf, web), their
    organisation, and whether a one-to-one conversation's memory is the person's across the family's bots."""

    family: str
    tenant: str
    memory_by_person: bool = False

    def stamp(self, message: InboundMessage) -> InboundMessage:
        update = {"family": self.family, "tenant": self.tenant, "memory_by_person": self.memory_by_person}
        return message.model_copy(update=update)


def qualified(family: str, tenant: str, user: str) -> str:
    """`<family>:<tenant>:<user>`: an identity that names its platform family and organisation."""
    return f"{family}:{tenant}:{user}"


class BotSettings(BaseModel):
    """What every platform's bot configuration is: a pydantic model that may check itself against the others."""

    model_config = ConfigDict(extra="forbid")

    id: str
    platform: str  # a Literal in each platform's model: the key of its row in bots/registry.py
    reply_format: Literal["markdown", "text"] | None = Field(
        default=None,
        description="answers as Markdown the platform renders, or as plain text (Markdown turned into readable "
        "text); null: the platform's default (its adapter's `default_reply_format`)",
    )
    allow_users: list[str] = Field(default_factory=list, description="only these senders are answered (empty: all)")
    deny_users: list[str] = Field(default_factory=list, description="these senders are never answered")
    allow_groups: list[str] = Field(default_factory=list, description="only in these groups (empty: every group)")
    deny_groups: list[str] = Field(default_factory=list, description="never in these groups")
    group_prefix: str = Field(default="", description="a group message is answered only when it starts with this")
    max_media_bytes: int = Field(
        default=DEFAULT_MAX_MEDIA_BYTES, ge=1024, description="the largest image, voice or file downloaded"
    )
    tools: BotTools | None = Field(default=None, description="MCP tools the answers may call (tools.servers)")

    def check_peers(self, bots: Sequence[BotSettings]) -> None:
        """Check (and complete) this bot's settings against the other configured bots: a name that must resolve,
        a secret that must match. ValueError says what is wrong, as `bots.<id>.<key>: …`."""

    def handoff_request(self, account: object, person: object, servicer: object = None) -> InboundMessage:
        """An operator's handoff of `person` (in `account`, where the bot serves several) to a human (`servicer`,
        else the queue), as the message a worker carries out; ValueError says what is wrong with the request.
        Only a platform with human agents has handoffs."""
        raise ValueError(f"bot {self.id!r} is a {self.platform} bot: it has no human agents to hand over to")


class CallbackRejected(Exception):
    """A callback that must not be processed: bad signature, replay, malformed body.

    `status` is the HTTP status to answer; `reason` is a short, secret-free label used
    in logs and metrics.
    """

    def __init__(self, reason: str, status: int = 400, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.status = status
        self.detail = detail or reason


class SendError(Exception):
    """A reply could not be delivered. `retryable` says whether trying again can help; `token_refresh`, that the
    platform refused the access token itself (bots/http.py `cached_token`), not the call that needed it."""

    retryable: bool = True
    token_refresh: bool = False

    def __init__(self, message: str, *, code: int | str = "", retry_after: float = 0.0, not_sent: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
        # The platform certainly did not act on the request (a rate limit refused it): a retry is not a resend.
        # Anything else (a timeout, a 5xx, a busy errcode) may have been delivered all the same.
        self.not_sent = not_sent


class RetryableSendError(SendError):
    """Throttled or a transient server failure: retry after `retry_after` seconds or a backoff."""

    retryable = True


class PermanentSendError(SendError):
    """Configuration or request error (bad secret, IP not trusted): retrying cannot help."""

    retryable = False


@dataclass(frozen=True)
class ErrorHint:
    """What the console says of an error code a platform explains better than its own message (both languages);
    `said_prefix` is what the adapter's error text puts before the platform's words, and the hint replaces it."""

    name: str
    zh: str
    en: str
    said_prefix: str = ""


class Throttled(RetryableSendError):
    """The platform refuses sends to this conversation for a while (DingTalk's 130101 lasts 10 minutes): the
    message is handed back for `retry_after` seconds instead of retried in place, and no failure is counted,
    so a long throttle delays the answer instead of dead-lettering it."""


class CursorRefused(PermanentSendError):
    """A pulled channel's platform refused the saved cursor: it will refuse it for ever (drop it, start again)."""


class ConversationTaken(PermanentSendError):
    """The platform will not let the bot speak here: a human agent owns the conversation (微信客服 95018) or
    its reply allowance is used up. The answer is withheld, not failed: no retry, no dead letter.
    `by_human`: the platform said a human holds it (the worker then asks who, and remembers)."""

    def __init__(self, message: str, *, code: int | str = "", by_human: bool = False) -> None:
        super().__init__(message, code=code)
        self.by_human = by_human


@dataclass(frozen=True)
class ReplyQuota:
    """At most `limit` messages to a person within `window_s` of their last message, renewed each time they
    write (微信客服: 5 in 48 h); `reserve` of them are kept for a handoff notice."""

    limit: int
    window_s: int
    reserve: int = 1


Owner = Literal["bot", "human", "free"]
"""Who holds a conversation on a platform with human agents: the bot, a human (or the queue for one), nobody."""


class PulledItem(BaseModel):
    """One item of a pulled channel's log: a person's message, a human agent's message, or a platform event."""

    kind: Literal["message", "agent", "event"]
    message: InboundMessage
    event: dict = Field(default_factory=dict)


class PulledPage(BaseModel):
    """One page of a pull: its items, where the next pull starts, and whether more is waiting now."""

    items: list[PulledItem]
    next_cursor: str
    has_more: bool


class Sessions(Protocol):
    """What a platform with human agents (微信客服) lets the worker ask and do about a conversation."""

    def wants_human(self, text: str) -> bool:
        """The person asks for a human (a handoff keyword)."""
        ...

    async def is_open(self, target: ReplyTarget) -> bool:
        """Whether the person has a conversation a handoff can move (asked of the platform; raises SendError
        when the platform refuses to say or does not answer)."""
        ...

    async def owner(self, target: ReplyTarget) -> Owner:
        """Who holds the conversation now, asked of the platform."""
        ...

    async def take(self, target: ReplyTarget) -> None:
        """Make the bot the conversation's holder (before its first answer)."""
        ...

    async def hand_off(self, target: ReplyTarget, servicer: str | None) -> str:
        """Give the conversation to a human (a named agent, else the queue); returns the notice code."""
        ...

    async def send_notice(
        self, target: ReplyTarget, code: str, text: str, notice_key: str, *, resend: bool = False
    ) -> None:
        """Send a notice bound to an event code (a welcome, the handoff notice), once per `notice_key`;
        `resend`: an earlier attempt's outcome is unknown (a refusal of the repeat may mean it was delivered)."""
        ...

    def handoff_text(self) -> str:
        """What the person is told when they are handed to a human."""
        ...

    def on_event(self, event: dict, target: ReplyTarget) -> EventEffect:
        """What a platform event means for the conversation."""
        ...


@dataclass(frozen=True)
class EventEffect:
    """What an event changes: the new holder, a welcome to send with its code, a label to count it by."""

    owner: Owner | None = None
    welcome_code: str = ""
    welcome_text: str = ""
    label: str = ""
    failed_msgid: str = ""  # a message the platform accepted and then could not deliver (微信客服 msg_send_fail)
    fail_type: str = ""
    quota_refund: int = 0  # reply-quota slots the platform did not count after all (negative: counted more)
    dead_letter: bool = False  # the failure is one an operator should see (`botgw dlq list`)


class TokenStore(Protocol):
    """Shared cache for platform access tokens, refreshed by one process at a time."""

    async def get(self, name: str) -> str | None: ...

    async def put(self, name: str, token: str, ttl_s: float) -> None: ...

    async def invalidate(self, name: str, token: str) -> None: ...

    def refresh_lock(self, name: str) -> RefreshLock: ...


class RefreshLock(Protocol):
    """An async context manager held while one process fetches a new token."""

    async def __aenter__(self) -> object: ...

    async def __aexit__(self, *exc: object) -> None: ...


ReplyStyle = Literal["pieces", "stream", "card", "page"]
"""How a platform shows an answer: messages sent piece by piece (WeCom app, group robot, DingTalk text),
a stream the platform polls (WeCom AI bot), a card updated in place (DingTalk AI card), or a page that
reads it from the gateway (web). The worker picks how to deliver by this, never by adapter class."""


Pacing = list[tuple[str, str]]
"""Send allowances a reply must fit, shared by every worker: (key, window such as "30/61 seconds")."""

PACING_MARGIN_S = 1
"""Windows are a second longer than the platform's: a send counts when it leaves and the platform counts it when
it arrives, so with the exact window the 31st could arrive within the 1st's minute and be dropped (seen)."""


def per_window(count: int, seconds: int) -> str:
    """The allowance `count` per `seconds`, with the margin, as the limits library writes it."""
    return f"{count}/{seconds + PACING_MARGIN_S} seconds"


class ChannelDefaults:
    """What a platform without the feature declares, so that an adapter names only what it has."""

    duplicate_check_window_s: float = 0.0
    max_answer_bytes: int | None = None
    merge_window_s: float = 0.0  # a person's messages within this many seconds are answered together
    reply_quota: ReplyQuota | None = None
    sessions: Sessions | None = None  # human agents can own a conversation
    buttons: Buttons | None = None  # questions asked with buttons (None: as text, answered by a reply)
    callback_style: str | None = None  # how /callback/{bot} is answered (bots.channels; None: no callbacks)

    default_reply_format: Literal["markdown", "text"] = "text"  # what the platform shows when the bot does not say

    @property
    def reply_format(self) -> Literal["markdown", "text"]:
        """The bot's `reply_format`, else the platform's default."""
        chosen = getattr(getattr(self, "config", None), "reply_format", None)
        return chosen or self.default_reply_format

    @property
    def max_media_bytes(self) -> int:
        return int(getattr(getattr(self, "config", None), "max_media_bytes", DEFAULT_MAX_MEDIA_BYTES))

    async def download(self, media: Media) -> Downloaded:
        """A platform whose messages carry no attachments has none to download."""
        raise MediaError("unsupported", "this platform's messages carry no attachments")

    def connection(self, sink: Callable[[InboundMessage], Awaitable[None]]) -> object | None:
        """The connection this bot holds open to its platform (bots.channels.HeldConnection); None: none."""
        return None

    def system_prompt_for(self, message: InboundMessage) -> str | None:
        """A system prompt of this bot's own for the message (None: the configured default)."""
        return None

    def knowledge_for(self, message: InboundMessage):  # type: ignore[no-untyped-def]
        """The knowledge bases the message is answered from (the bot's `knowledge:`), or None."""
        return getattr(getattr(self, "config", None), "knowledge", None)

    def platform_message_id(self, piece_key: str) -> str:
        """The id the platform will know a sent piece by, where it reports later that an accepted message was
        not delivered ('' where it never does)."""
        return ""
