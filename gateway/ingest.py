"""The fast path after an adapter accepted a callback: dedup and enqueue, in one Redis script.

The engine is never called here, and neither is anything that could wait: the platform
gets its acknowledgement in milliseconds. Dedup and enqueue are one atomic script, so a
delivery is either queued and remembered, or neither; calls from concurrent callbacks
share Redis round trips through the batcher. Per-user limits are applied by the worker,
before it calls the engine, which keeps this path to a single round trip.
"""

from __future__ import annotations

import time
from typing import Literal

from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from bots.base import InboundMessage
from gateway import metrics
from gateway.batching import RedisBatcher
from gateway.keys import Keys
from gateway.logs import request_id
from gateway.queue import WorkQueue

Outcome = Literal["accepted", "duplicate"]


class Ingest:
    """Admits a parsed message into the durable queue exactly once."""

    def __init__(self, batcher: RedisBatcher, keys: Keys, queue: WorkQueue, dedup_ttl_s: int) -> None:
        self._batcher = batcher
        self._keys = keys
        self._queue = queue
        self._dedup_ttl_s = dedup_ttl_s

    async def accept(self, message: InboundMessage) -> Outcome:
        """Queue the message unless this delivery was seen before (a platform retry)."""
        fields = {
            "msg": message.model_dump_json(),
            "kind": "chat",
            "enqueued_at": f"{time.time():.6f}",
            "rid": request_id.get(),
        }
        dedup_key = self._keys.dedup(message.dedup_key)

        def enqueue(pipe: Pipeline) -> None:
            self._queue.queue_enqueue(
                pipe, message.conversation_key, fields, dedup_key=dedup_key, dedup_ttl_s=self._dedup_ttl_s
            )

        try:
            turn = await self._batcher.submit(enqueue)
        except NoScriptError:  # Redis restarted and lost its scripts
            await self._queue.load_scripts()
            turn = await self._batcher.submit(enqueue)
        if not turn:
            metrics.DEDUP_HITS.labels(message.platform).inc()
            return "duplicate"
        return "accepted"
