"""What the gateway needs of a platform adapter, typed: one Protocol per capability.

Every adapter is a `Channel`. What else it must offer follows from its `reply_style` (the worker picks the
delivery by it, gateway/delivery/): `pieces` needs `PiecesChannel`, `stream` needs `StreamChannel`, `card`
needs `CardChannel`, `page` nothing more. A platform with human agents offers `HumanSessions` as
`adapter.sessions`; a pulled channel (微信客服) offers `PulledChannel`. `check_channel` says at start, in
one line, when an adapter lacks what its style needs, instead of an AttributeError mid-answer.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from bots.base import (
    InboundMessage,
    Pacing,
    PulledPage,
    ReplyQuota,
    ReplyStyle,
    ReplyTarget,
    Sessions,
)

HumanSessions = Sessions  # who holds a conversation, handoff to a human (bots.base.Sessions)


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

    def system_prompt_for(self, message: InboundMessage) -> str | None: ...

    def knowledge_for(self, message: InboundMessage) -> Any: ...  # knowledge.config's KnowledgeUse, or None


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
class PulledChannel(Channel, Protocol):
    """A channel whose callback only says "pull" (微信客服): the worker pulls its log."""

    async def pull_page(self, channel: str, cursor: str, hint: str) -> PulledPage: ...


NEEDS: dict[str, type] = {"pieces": PiecesChannel, "stream": StreamChannel, "card": CardChannel, "page": Channel}


def check_channel(adapter: object) -> None:
    """Raise TypeError naming what the adapter lacks for its reply style (at start, not mid-answer)."""
    style = getattr(adapter, "reply_style", None)
    needed = NEEDS.get(str(style))
    if needed is None:
        raise TypeError(f"{type(adapter).__name__}: unknown reply_style {style!r} (one of {', '.join(NEEDS)})")
    if not isinstance(adapter, needed):
        missing = [name for name in _members(needed) if not hasattr(adapter, name)]
        raise TypeError(f"{type(adapter).__name__} has reply_style {style!r} but lacks {', '.join(missing)}")


def _members(protocol: type) -> list[str]:
    names: list[str] = []
    for klass in protocol.__mro__:
        if klass in (Protocol, object) or not getattr(klass, "_is_protocol", False):
            continue
        names += [n for n in (*getattr(klass, "__annotations__", {}), *vars(klass)) if not n.startswith("_")]
    return sorted(set(names))
