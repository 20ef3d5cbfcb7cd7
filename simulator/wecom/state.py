"""What the simulated WeCom app API remembers: apps, tokens, deliveries, pending faults (simulator/wecom/api.py
plays the API over it, simulator/wecom/control.py drives it)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from simulator.faults import FaultQueue
from simulator.wecom.cards import ShownCard


@dataclass
class Delivered:
    """A message WeCom would have shown to the user."""

    msgid: str
    agentid: int
    touser: str
    content: str
    at: float
    truncated: bool
    duplicate_check: bool = False  # the send asked for enable_duplicate_check
    msgtype: str = "text"  # text or markdown


@dataclass
class StoredMedia:
    """A file as media/get serves it: uploaded by a simulated member's client (a picture, a recording)."""

    data: bytes
    mime: str
    name: str
    expires_at: float


@dataclass
class WeComApiState:
    """Everything the simulated WeCom remembers: apps, tokens, deliveries, pending faults."""

    apps: set[tuple[str, str]] = field(default_factory=set)  # (corpid, secret)
    tokens: dict[str, float] = field(default_factory=dict)  # token -> expires_at
    token_apps: dict[str, tuple[str, str]] = field(default_factory=dict)  # token -> the (corpid, secret) it is for
    agents: dict[int, tuple[str, str]] = field(default_factory=dict)  # agentid -> its app's (corpid, secret)
    unknown_users: set[str] = field(default_factory=set)  # userids that are not (or no longer) members
    delivered: list[Delivered] = field(default_factory=list)
    cards: list[ShownCard] = field(default_factory=list)  # template cards shown (simulator/wecom/cards.py)
    task_ids: set[tuple[int, str]] = field(default_factory=set)  # (agentid, task_id) of every card taken
    cards_dropped: int = 0  # cards answered ok and never shown (a reused task_id)
    # response_code -> (the card it updates, when issued): one per card sent and per tap event (doc 94888)
    response_codes: dict[str, tuple[ShownCard | None, float]] = field(default_factory=dict)
    media: dict[str, StoredMedia] = field(default_factory=dict)  # media_id -> the file
    faults: FaultQueue = field(default_factory=FaultQueue)  # endpoints: send, gettoken, getuserinfo
    gettoken_calls: int = 0
    send_calls: int = 0
    send_calls_to: Counter[str] = field(default_factory=Counter)  # per touser: a test counts only its own
    duplicates_dropped: int = 0
    dropped_over_rate: int = 0  # sends past a member's allowance: answered ok, never shown
    held: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def token_refusal(self, token: str) -> tuple[int, str] | None:
        """(errcode, errmsg) for an access_token WeCom would refuse (unknown: 40014, past its time: 42001)."""
        expires_at = self.tokens.get(token)
        if expires_at is None:
            return 40014, "invalid access_token"
        if expires_at < time.time():
            return 42001, "access_token expired"
        return None

    def sent_at(self, agentid: int, member: str) -> list[float]:
        """When the app sent `member` each message and card it showed (their per-member allowance counts both)."""
        return [d.at for d in self.delivered if d.touser == member and d.agentid == agentid] + [
            c.at for c in self.cards if c.touser == member and c.owner == str(agentid)]

    def reset(self) -> None:
        self.tokens.clear()
        self.delivered.clear()
        self.cards.clear()
        self.task_ids.clear()
        self.response_codes.clear()
        self.cards_dropped = 0
        self.media.clear()
        self.faults.clear()
        self.send_calls_to.clear()
        self.gettoken_calls = self.send_calls = self.duplicates_dropped = self.held = self.dropped_over_rate = 0
        self.release.set()
        self.release = asyncio.Event()

