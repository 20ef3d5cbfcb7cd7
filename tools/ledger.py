"""One answer's tool calls as recorded in Redis, so that a worker taking over replays them instead of repeating them.

Every step is written before the next one starts: the base messages, the engine's request for calls (a round), a
call's start (before it is made) and its result (after). A worker that takes over reads the ledger back: rounds are
not asked of the engine again, finished calls are not made again, and a call that started but has no result has an
unknown outcome (the caller decides: a read-only tool is retried, any other is not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from tools.servers import CallResult

LEDGER_TTL_S = 7 * 86400  # longer than any retry, dead letter replay or confirmation wait


@dataclass(frozen=True)
class CallSlot:
    """A call's place in the ledger: round `round`, call `index` of that round."""

    round: int
    index: int

    @property
    def field(self) -> str:
        return f"{self.round}.{self.index}"


class ToolLedger:
    """The hash at one key: `base` (the messages before the first round), `remember` (the question as memory keeps
    it), `r<n>` (round n's assistant message), `c<n>.<i>` (call started), `d<n>.<i>` (its result), `ok<n>.<i>` (the
    asker confirmed it)."""

    def __init__(self, redis: Redis, key: str, fields: dict[str, str]) -> None:
        self._redis = redis
        self.key = key
        self._fields = fields

    @classmethod
    async def open(cls, redis: Redis, key: str) -> ToolLedger:
        raw = await redis.hgetall(key)
        return cls(redis, key, {_text(name): _text(value) for name, value in raw.items()})

    @property
    def empty(self) -> bool:
        return not self._fields

    async def _set(self, values: dict[str, str]) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key, mapping=values)
            pipe.expire(self.key, LEDGER_TTL_S)
            await pipe.execute()
        self._fields.update(values)

    async def start(self, base: list[dict[str, Any]], remember: str) -> None:
        """The messages before the first round, as the first worker to start the answer wrote them."""
        await self._set_first("base", json.dumps(base, ensure_ascii=False))
        await self._set_first("remember", remember)

    def base(self) -> list[dict[str, Any]]:
        return json.loads(self._fields["base"])

    def remember(self) -> str:
        return self._fields.get("remember", "")

    def round(self, number: int) -> dict[str, Any] | None:
        recorded = self._fields.get(f"r{number}")
        return json.loads(recorded) if recorded is not None else None

    async def _set_first(self, field: str, value: str) -> bool:
        """Write `field` unless another worker (one whose lease passed on while it worked) wrote it first; the
        stored value is kept either way. True when this write was the first."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self.key, field, value)
            pipe.hget(self.key, field)
            pipe.expire(self.key, LEDGER_TTL_S)
            first, stored, _ = await pipe.execute()
        self._fields[field] = _text(stored)
        return bool(first)

    async def record_round(self, number: int, assistant: dict[str, Any]) -> dict[str, Any]:
        """Round `number` as the first worker to reach it recorded it (two never ask the engine for different ones)."""
        await self._set_first(f"r{number}", json.dumps(assistant, ensure_ascii=False))
        return json.loads(self._fields[f"r{number}"])

    def started(self, slot: CallSlot) -> bool:
        return f"c{slot.field}" in self._fields

    def result(self, slot: CallSlot) -> CallResult | None:
        recorded = self._fields.get(f"d{slot.field}")
        if recorded is None:
            return None
        data = json.loads(recorded)
        return CallResult(data["outcome"], data["text"], int(data["duration_ms"]))

    def confirmed(self, slot: CallSlot) -> bool:
        return f"ok{slot.field}" in self._fields

    async def mark_started(self, slot: CallSlot) -> bool:
        """True for the one worker that may make the call; False when it was started before (maybe done)."""
        return await self._set_first(f"c{slot.field}", "1")

    async def mark_result(self, slot: CallSlot, result: CallResult) -> CallResult:
        """The call's result, the first recorded: a worker whose lease passed on while the call ran, finding it
        started, records "outcome unknown", which must not replace the real result its successor recorded."""
        data = {"outcome": result.outcome, "text": result.text, "duration_ms": result.duration_ms}
        await self._set_first(f"d{slot.field}", json.dumps(data, ensure_ascii=False))
        recorded = self.result(slot)
        assert recorded is not None
        return recorded

    async def mark_confirmed(self, slot: CallSlot) -> None:
        await self._set({f"ok{slot.field}": "1"})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
