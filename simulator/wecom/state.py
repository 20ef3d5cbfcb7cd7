"""What the simulated WeCom app API remembers: apps, tokens, deliveries, pending faults (simulator/wecom/api.py
plays the API over it, simulator/wecom/control.py drives it)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from simulator.faults import FaultQueue


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
    media: dict[str, StoredMedia] = field(default_factory=dict)  # media_id -> the file
    faults: FaultQueue = field(default_factory=FaultQueue)  # endpoints: send, gettoken, getuserinfo
    gettoken_calls: int = 0
    send_calls: int = 0
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

    def reset(self) -> None:
        self.tokens.clear()
        self.delivered.clear()
        self.media.clear()
        self.faults.clear()
        self.gettoken_calls = self.send_calls = self.duplicates_dropped = self.held = self.dropped_over_rate = 0
        self.release.set()
        self.release = asyncio.Event()

