"""The durable work queue: a Redis Stream with one consumer group, plus per-conversation turns.

At-least-once: an entry stays pending until a worker acknowledges it; entries of a
worker that died are claimed by another after `claim_idle_ms` (XAUTOCLAIM). Each entry
carries its conversation's turn number, given atomically at enqueue time, so that
workers answer one conversation's messages in order, one at a time, while different
conversations run in parallel.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from gateway.keys import Keys

# KEYS: stream, conversation seq, conversation done, dedup key (may be unused)
# ARGV: conversation ttl, conversation key, dedup ttl (0 = no dedup), field, value, ...
# Returns 0 for a duplicate delivery, else the conversation turn number of the new entry.
_ENQUEUE = """
if ARGV[3] ~= '0' and not redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[3]) then return 0 end
local seq = redis.call('INCR', KEYS[2])
if seq == 1 then redis.call('DEL', KEYS[3]) end
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[1])
local args = {'XADD', KEYS[1], '*', 'seq', tostring(seq), 'conv', ARGV[2]}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
redis.call(unpack(args))
return seq
"""

_FINISH_TURN = """
local done = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > done then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
return 1
"""


@dataclass(frozen=True)
class Entry:
    """One queued item as a worker sees it."""

    entry_id: str
    conversation_key: str
    seq: int
    fields: dict[str, str]
    deliveries: int = 1


def _decode(raw: dict[bytes | str, bytes | str]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


def _entry(entry_id: bytes | str, raw: dict) -> Entry:
    fields = _decode(raw)
    return Entry(
        entry_id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
        conversation_key=fields.pop("conv", ""),
        seq=int(fields.pop("seq", "0")),
        fields=fields,
    )


class WorkQueue:
    """Enqueue on the gateway side; read, claim, order and acknowledge on the worker side."""

    def __init__(self, redis: Redis, keys: Keys, conversation_ttl_s: int = 7 * 86400) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl = conversation_ttl_s
        self._enqueue = redis.register_script(_ENQUEUE)
        self._finish = redis.register_script(_FINISH_TURN)

    async def ensure_group(self) -> None:
        """Create the stream and the consumer group once; harmless when they exist."""
        try:
            await self._redis.xgroup_create(self._keys.inbound_stream, self._keys.worker_group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def load_scripts(self) -> None:
        """Load the enqueue script into Redis, so that pipelines can call it by its SHA."""
        await self._redis.script_load(_ENQUEUE)

    def _enqueue_args(
        self, conversation_key: str, fields: dict[str, str], dedup_key: str, dedup_ttl_s: int
    ) -> tuple[list[str], list[str | int]]:
        argv: list[str | int] = [self._ttl, conversation_key, dedup_ttl_s if dedup_key else 0]
        for name, value in fields.items():
            argv += [name, value]
        keys = [
            self._keys.inbound_stream,
            self._keys.conversation_seq(conversation_key),
            self._keys.conversation_done(conversation_key),
            dedup_key or self._keys.inbound_stream,
        ]
        return keys, argv

    def queue_enqueue(
        self,
        pipe: Pipeline,
        conversation_key: str,
        fields: dict[str, str],
        dedup_key: str = "",
        dedup_ttl_s: int = 0,
    ) -> None:
        """Add the enqueue script to `pipe`: dedup (SET NX) and append with the next turn number, atomically.

        The pipeline's result is 0 for a duplicate delivery, else the entry's turn number. The script
        must have been loaded (load_scripts); a NoScriptError after a Redis restart means: load, retry.
        """
        keys, argv = self._enqueue_args(conversation_key, fields, dedup_key, dedup_ttl_s)
        pipe.evalsha(self._enqueue.sha, len(keys), *keys, *argv)

    async def enqueue(self, conversation_key: str, fields: dict[str, str]) -> int:
        """Append an entry with the conversation's next turn number (no dedup); returns the turn."""
        keys, argv = self._enqueue_args(conversation_key, fields, "", 0)
        return int(await self._enqueue(keys=keys, args=argv))

    async def read(self, consumer: str, count: int, block_ms: int) -> list[Entry]:
        """New entries for this consumer (blocking up to block_ms)."""
        reply = await self._redis.xreadgroup(
            self._keys.worker_group, consumer, {self._keys.inbound_stream: ">"}, count=count, block=block_ms
        )
        return [_entry(entry_id, raw) for _, items in reply or [] for entry_id, raw in items if raw]

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int = 16) -> list[Entry]:
        """Take over entries another consumer has held longer than min_idle_ms (it probably died)."""
        result = await self._redis.xautoclaim(
            self._keys.inbound_stream, self._keys.worker_group, consumer, min_idle_ms, "0-0", count=count
        )
        claimed = result[1]
        entries = [_entry(entry_id, raw) for entry_id, raw in claimed if raw]
        deleted = [entry_id for entry_id, raw in claimed if not raw]
        if deleted:
            await self._redis.xack(self._keys.inbound_stream, self._keys.worker_group, *deleted)
        return [Entry(e.entry_id, e.conversation_key, e.seq, e.fields, deliveries=2) for e in entries]

    async def touch(self, consumer: str, entry_ids: list[str]) -> None:
        """Reset the idle time of entries still being worked on, so nobody claims them meanwhile."""
        if entry_ids:
            await self._redis.xclaim(
                self._keys.inbound_stream, self._keys.worker_group, consumer, 0, entry_ids, justid=True
            )

    async def ack(self, entry_id: str) -> None:
        """Done with an entry: acknowledge and drop it, so the stream does not grow."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(self._keys.inbound_stream, self._keys.worker_group, entry_id)
            pipe.xdel(self._keys.inbound_stream, entry_id)
            await pipe.execute()

    async def wait_turn(self, conversation_key: str, seq: int, max_wait_s: float, poll_s: float = 0.05) -> bool:
        """Wait until every earlier message of the conversation is handled; False if it took too long."""
        key = self._keys.conversation_done(conversation_key)
        deadline = time.monotonic() + max_wait_s
        delay = poll_s
        while True:
            done = int(await self._redis.get(key) or 0)
            if done >= seq - 1:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    async def finish_turn(self, conversation_key: str, seq: int) -> None:
        """Let the conversation's next message go."""
        await self._finish(keys=[self._keys.conversation_done(conversation_key)], args=[seq, self._ttl])

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        """Keep an entry that could not be answered, with why, for an operator to inspect."""
        await self._redis.xadd(
            self._keys.dead_letters,
            {**entry.fields, "conv": entry.conversation_key, "reason": reason[:500]},
            maxlen=10_000,
            approximate=True,
        )

    async def stats(self) -> tuple[int, float]:
        """(entries waiting or in progress, age in seconds of the oldest one)."""
        stream = self._keys.inbound_stream
        length = await self._redis.xlen(stream)
        if not length:
            return 0, 0.0
        first = await self._redis.xrange(stream, count=1)
        if not first:
            return length, 0.0
        entry_id = first[0][0]
        millis = int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])
        return length, max(0.0, time.time() - millis / 1000)
