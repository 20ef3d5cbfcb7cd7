"""Tool calls waiting for the asker's 确认 or 取消, one per conversation, settled once.

The waiting call is a Redis hash: `pending` (what will be done, as JSON) and, once someone answers, `taken`
("<message>|<verdict>", set with HSETNX: the first answer wins; the same message tried again by a worker that took
over finds its own mark and carries on). It outlives its confirm_ttl_s by a day, so that a late answer is told that
it expired instead of being taken for a new question.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis

from tools.config import CANCEL_WORDS, CONFIRM_WORDS

KEPT_AFTER_EXPIRY_S = 86400
Verdict = Literal["confirmed", "cancelled", "expired"]


def reply_verdict(text: str) -> Literal["confirmed", "cancelled"] | None:
    """确认/取消 (and a few common forms) as written alone, give or take punctuation; anything else is a message."""
    word = text.strip().strip("。.!！ ").lower()
    if word in CONFIRM_WORDS:
        return "confirmed"
    if word in CANCEL_WORDS:
        return "cancelled"
    return None


@dataclass(frozen=True)
class PendingCall:
    """A confirm tool's call the model asked for, waiting for its asker."""

    id: str
    asker: str  # qualified identity: only they may answer
    bot: str
    tool: str  # server.tool
    arguments: dict[str, Any]
    call_set: str  # the ledger it belongs to
    round: int
    index: int
    expires_at: float
    asked_at: float = 0.0  # an answer written before this is not to this question (a replayed old 确认)
    asked_by: str = ""  # the asking message's dedup key: its own retry moves nothing on
    shown_at: float = 0.0  # when the question was asked: what the asker wrote before could not answer it

    def expired(self, now: float | None = None) -> bool:
        return (now or time.time()) >= self.expires_at


@dataclass(frozen=True)
class Settled:
    """How a waiting call was answered: by which message, with what; `first` when this answer settled it."""

    by: str
    verdict: Verdict
    first: bool
    at: float = 0.0  # when it was settled


class Confirmations:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def ask(self, key: str, pending: PendingCall, ttl_s: float) -> None:
        """Wait for `pending` here, replacing whatever waited before (a newer question is the one to confirm)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, "pending", json.dumps(dataclasses.asdict(pending), ensure_ascii=False))
            pipe.expire(key, int(ttl_s) + KEPT_AFTER_EXPIRY_S)
            await pipe.execute()

    async def get(self, key: str) -> PendingCall | None:
        raw = await self._redis.hget(key, "pending")
        return PendingCall(**json.loads(raw)) if raw else None

    async def waiting(self, key: str) -> tuple[PendingCall | None, Settled | None]:
        """The call waiting here and how it was settled, if it was (one read: asked every message of a bot with
        tools)."""
        raw, taken = await self._redis.hmget(key, ["pending", "taken"])
        pending = PendingCall(**json.loads(raw)) if raw else None
        return pending, _settled(taken, first=False) if taken else None

    async def settle(self, key: str, by: str, verdict: Verdict) -> Settled:
        """The first answer wins; any later one learns how it was settled (and by whom)."""
        first = bool(await self._redis.hsetnx(key, "taken", f"{by}|{verdict}|{time.time():.3f}"))
        taken = await self._redis.hget(key, "taken")
        return _settled(taken or f"{by}|{verdict}|0", first)


def _settled(taken: bytes | str, first: bool) -> Settled:
    text = taken.decode() if isinstance(taken, bytes) else taken
    rest, _, at = text.rpartition("|")
    owner, _, verdict = rest.rpartition("|")
    return Settled(owner, verdict, first, float(at))  # type: ignore[arg-type]  # written here only
