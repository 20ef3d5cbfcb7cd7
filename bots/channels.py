"""What the gateway needs of a platform adapter, typed: one Protocol per capability.

Every adapter is a `Channel`. What else it must offer follows from its `reply_style` (the worker picks the
delivery by it, gateway/delivery/): `pieces` needs `PiecesChannel`, `stream` needs `StreamChannel`, `card`
needs `CardChannel`, `page` nothing more. A platform with human agents offers `HumanSessions` as
`adapter.sessions`; a pulled channel (微信客服) offers `PulledChannel`. `check_channel` says at start, in
one line, when an adapter lacks what its style needs, instead of an AttributeError mid-answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from bots.base import (
    InboundMessage,
    Pacing,
    PulledPage,
    ReplyQuota,
    ReplyStyle,
    ReplyTarget,
    Sessions,
)
from bots.buttons import ButtonTap, Question
from bots.parts import Downloaded, Media

HumanSessions = Sessions  # who holds a conversation, handoff to a human (bots.base.Sessions)


# -- callbacks: what a platform POSTs to /callback/{bot} ---------------------------------------------------------


@dataclass(frozen=True)
class CallbackRequest:
    """What an adapter gets of the HTTP request: the platforms sign different parts of it."""

    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    now: float


@dataclass(frozen=True)
class Queued:
    """A verified callback's work for the queue."""

    message: InboundMessage
    pull: bool = False  # the callback only says "there is something new": the worker pulls the channel's log
    signature: str = ""  # a signature that covers less than the body: bound to the first message it came with


@dataclass(frozen=True)
class StreamPoll:
    """A polled-stream platform asks for the current state of one answer's stream."""

    stream_id: str


@dataclass(frozen=True)
class WelcomeEvent:
    """The person opened the chat: answer with the welcome text."""


@dataclass(frozen=True)
class UnsupportedMessage:
    """A message the bot cannot read (an image, a file): answered at once with a short notice."""

    msg_type: str


PolledEvent = InboundMessage | StreamPoll | WelcomeEvent | UnsupportedMessage | None
CallbackStyle = Literal["queue", "polled-stream"]


@runtime_checkable
class PulledThroughApp(Protocol):
    """A pulled channel whose callbacks arrive at another bot's URL (微信客服 on a WeCom self-built app)."""

    @property
    def app_id(self) -> str | None:
        """The bot whose callback URL receives this one's callbacks (None: its own URL)."""
        ...

    def pull_for(self, plaintext: str, now: float) -> InboundMessage | None: ...


@runtime_checkable
class HostsPulled(Protocol):
    """A bot whose callback URL also receives a pulled channel's callbacks (the WeCom app)."""

    def attach_pulled(self, channel: PulledThroughApp) -> None: ...


@runtime_checkable
class JoinsBots(Protocol):
    """A bot that needs the other bots' settings once all are built (the page's company logins)."""

    def join_bots(self, bots: Mapping[str, Any]) -> None: ...


@runtime_checkable
class QueueingCallbacks(Protocol):
    """Callbacks acknowledged at once with a fixed body; the answer goes out later by the platform's send API
    (WeCom app, 微信客服, DingTalk robot in HTTP mode)."""

    platform: str
    callback_style: CallbackStyle
    ack: tuple[str, str]  # the acknowledgement's body and media type

    def handshake(self, query: Mapping[str, str], now: float) -> str:
        """The URL check when the callback URL is saved: what to answer, bare (CallbackRejected if refused)."""
        ...

    def receive(self, request: CallbackRequest) -> Queued | None:
        """Verify and read a callback: the work to queue, or None (an event that needs nothing)."""
        ...


@runtime_checkable
class PolledStreamCallbacks(Protocol):
    """Callbacks answered with the answer's stream, which the platform polls (WeCom AI bot): the gateway opens
    the stream on a message and answers each refresh with what the worker has written so far."""

    platform: str
    bot_id: str
    callback_style: CallbackStyle
    welcome_text: str
    stream_limit_s: float  # the platform stops polling after this long: the stream is closed with an apology

    def handshake(self, query: Mapping[str, str], now: float) -> str: ...

    def parse(self, query: Mapping[str, str], body: bytes, now: float) -> PolledEvent:
        """Verify and read a callback. A message names its stream in `reply_to.stream_id`; one that names none
        (a button tap) is queued without a stream, the callback answered with an empty body."""
        ...

    def stream_payload(self, stream_id: str, content: str, finish: bool) -> dict: ...

    def text_payload(self, text: str) -> dict: ...

    def envelope(self, payload: dict, nonce: str, timestamp: int) -> str:
        """The reply body: the payload as the platform wants it (encrypted and signed)."""
        ...


# -- connections: platforms that push into a connection botgw holds open ------------------------------------------

MessageSink = Callable[[InboundMessage], Awaitable[None]]


class HeldConnection(Protocol):
    """One bot's connection to its platform (DingTalk Stream mode), handing what arrives to a sink."""

    bot_id: str
    connected: bool  # a socket is open and answers its pings

    async def run(self, stop: asyncio.Event) -> None: ...


class Buttons(Protocol):
    """Questions asked with buttons (a DingTalk interactive card, a WeCom template card): a tap comes back as an
    InboundMessage with `tap` (bots.buttons), in the conversation the question was asked in."""

    async def ask(self, target: ReplyTarget, question: Question) -> None:
        """Show `question` with its buttons to `target` (SendError when it could not)."""
        ...

    async def answered(self, target: ReplyTarget, tap: ButtonTap, label: str) -> None:
        """The tapped card says `label` (已确认 …) and takes no more taps, where the platform lets botgw update it
        after the tap was settled (SendError when it could not; nothing where it cannot)."""
        ...


@runtime_checkable
class Channel(Protocol):
    """Every adapter: who it is, how it shows answers, and what shapes its answer path."""

    platform: str
    bot_id: str
    reply_style: ReplyStyle
    max_answer_bytes: int | None  # the most of one answer the platform can show (None: sent in pieces)
    merge_window_s: float  # a person's messages this close together are answered together (0: never)
    reply_quota: ReplyQuota | None  # at most so many messages to a person per window (微信客服)
    sessions: HumanSessions | None  # human agents can hold a conversation
    buttons: Buttons | None  # questions shown with buttons (None: as text, answered by a reply)

    def system_prompt_for(self, message: InboundMessage) -> str | None: ...

    def knowledge_for(self, message: InboundMessage) -> Any: ...  # knowledge.config's KnowledgeUse, or None

    callback_style: CallbackStyle | None  # how /callback/{bot} is answered (None: it receives no callbacks)

    def connection(self, sink: MessageSink) -> HeldConnection | None:
        """The connection this bot holds open to its platform (None: messages come by callback)."""
        ...

    reply_format: Literal["markdown", "text"]  # answers as Markdown the platform renders, or as plain text
    max_media_bytes: int  # the largest attachment downloaded

    async def download(self, media: Media) -> Downloaded:
        """An attachment of a message this bot received, at most `max_media_bytes` of it (MediaError: why not).
        Only the platform's own hosts are asked (bots.parts)."""
        ...


@runtime_checkable
class PiecesChannel(Channel, Protocol):
    """Answers sent as messages, piece by piece, within the platform's allowances."""

    duplicate_check_window_s: float

    def pacing(self, target: ReplyTarget) -> Pacing: ...

    def max_bytes_for(self, target: ReplyTarget) -> int: ...

    async def send_piece(
        self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = ""
    ) -> None: ...

    def platform_message_id(self, piece_key: str) -> str: ...


@runtime_checkable
class StreamChannel(Channel, Protocol):
    """A stream the platform reads from botgw (WeCom AI bot), and one post for what does not fit it."""

    max_stream_bytes: int
    max_overflow_bytes: int

    def overflow_allowed(self, target: ReplyTarget) -> bool: ...

    async def send_overflow(self, target: ReplyTarget, text: str) -> None: ...


class Cards(Protocol):
    """A card shown in the conversation and updated in place (DingTalk AI card)."""

    updates_per_second: float

    def new_track_id(self, *parts: str) -> str: ...

    async def create(self, track_id: str, *, group_id: str) -> None: ...

    async def deliver(self, track_id: str, *, group_id: str, user_id: str) -> None: ...

    async def writing(self, track_id: str) -> None:
        """The card shows that an answer is being written."""
        ...

    async def show(self, track_id: str, text: str, *, final: bool = False) -> None:
        """The card shows the full text so far (`final`: the last update)."""
        ...

    async def finished(self, track_id: str, text: str) -> None: ...

    async def failed(self, track_id: str, text: str) -> None: ...


@runtime_checkable
class CardChannel(Channel, Protocol):
    cards: Cards


@runtime_checkable
class PageChannel(Channel, Protocol):
    """The web page's bot: the page posts to /web/{bot} with the bot's key and reads the answer back."""

    answer_timeout_s: float

    def authorize(self, headers: Mapping[str, str]) -> None:
        """CallbackRejected (401) unless the request carries the bot's key."""
        ...

    def parse(self, headers: Mapping[str, str], body: bytes, now: float) -> InboundMessage: ...


@runtime_checkable
class PulledChannel(Channel, Protocol):
    """A channel whose callback only says "pull" (微信客服): the worker pulls its log."""

    skip_history: bool  # on the first pull, what was written before the bot was configured is not answered

    async def pull_page(self, channel: str, cursor: str, hint: str) -> PulledPage: ...


NEEDS: dict[str, type] = {"pieces": PiecesChannel, "stream": StreamChannel, "card": CardChannel, "page": PageChannel}
CALLBACKS: dict[str, type] = {"queue": QueueingCallbacks, "polled-stream": PolledStreamCallbacks}


def check_channel(adapter: object) -> None:
    """Raise TypeError naming what the adapter lacks for its reply style (at start, not mid-answer)."""
    style = getattr(adapter, "reply_style", None)
    needed = NEEDS.get(str(style))
    if needed is None:
        raise TypeError(f"{type(adapter).__name__}: unknown reply_style {style!r} (one of {', '.join(NEEDS)})")
    _require(adapter, needed, f"reply_style {style!r}")
    callbacks = getattr(adapter, "callback_style", None)
    if callbacks is not None:
        if callbacks not in CALLBACKS:
            known = ", ".join(CALLBACKS)
            raise TypeError(f"{type(adapter).__name__}: unknown callback_style {callbacks!r} (one of {known})")
        _require(adapter, CALLBACKS[callbacks], f"callback_style {callbacks!r}")


def _require(adapter: object, protocol: type, why: str) -> None:
    if not isinstance(adapter, protocol):
        missing = [name for name in _members(protocol) if not hasattr(adapter, name)]
        raise TypeError(f"{type(adapter).__name__} has {why} but lacks {', '.join(missing)}")


def _members(protocol: type) -> list[str]:
    names: list[str] = []
    for klass in protocol.__mro__:
        if klass in (Protocol, object) or not getattr(klass, "_is_protocol", False):
            continue
        names += [n for n in (*getattr(klass, "__annotations__", {}), *vars(klass)) if not n.startswith("_")]
    return sorted(set(names))
