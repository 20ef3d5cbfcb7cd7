"""The fast path after an adapter accepted a callback: dedup → per-user limit → enqueue.

Everything here is a few Redis round trips; the engine is never called on this path,
so the platform gets its acknowledgement in milliseconds.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from redis.asyncio import Redis

from bots.base import InboundMessage
from gateway import metrics
from gateway.keys import Keys
from gateway.limits import UserLimiter, over_limit_notice
from gateway.logs import request_id
from gateway.queue import WorkQueue

log = logging.getLogger(__name__)

Outcome = Literal["accepted", "duplicate", "limited", "limited_silent"]


class Ingest:
    """Admits a parsed message into the durable queue exactly once."""

    def __init__(self, redis: Redis, keys: Keys, queue: WorkQueue, limiter: UserLimiter, dedup_ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self._queue = queue
        self._limiter = limiter
        self._dedup_ttl_s = dedup_ttl_s

    async def accept(self, message: InboundMessage) -> Outcome:
        """Queue the message (or an over-limit notice); a platform retry of it is dropped."""
        dedup_key = self._keys.dedup(message.dedup_key)
        if not await self._redis.set(dedup_key, "1", nx=True, ex=self._dedup_ttl_s):
            metrics.DEDUP_HITS.labels(message.platform).inc()
            return "duplicate"
        try:
            return await self._admit(message)
        except Exception:
            # Not queued: forget the delivery so that the platform's retry is processed.
            await self._redis.delete(dedup_key)
            raise

    async def _admit(self, message: InboundMessage) -> Outcome:
        user = f"{message.platform}:{message.bot_id}:{message.sender_id}"
        decision = await self._limiter.hit(user)
        fields = {
            "msg": message.model_dump_json(),
            "kind": "chat",
            "enqueued_at": f"{time.time():.6f}",
            "rid": request_id.get(),
        }
        outcome: Outcome = "accepted"
        if not decision.allowed:
            metrics.LIMIT_HITS.labels(message.platform).inc()
            # One notice per window, so that a flooding user does not make us flood the platform.
            notice_key = self._keys.limit_notice(user)
            if not await self._redis.set(notice_key, "1", nx=True, ex=decision.retry_after_s):
                return "limited_silent"
            fields["kind"] = "notice"
            fields["notice"] = over_limit_notice(decision.retry_after_s)
            outcome = "limited"
        await self._queue.enqueue(message.conversation_key, fields)
        return outcome
