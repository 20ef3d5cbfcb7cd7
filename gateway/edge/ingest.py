"""The fast path after an adapter accepted a callback: dedup and enqueue, in one Redis script.

The engine is never called here, and neither is anything that could wait: the platform
gets its acknowledgement in milliseconds. Dedup and enqueue are one atomic script, so a
delivery is either queued and remembered, or neither; calls from concurrent callbacks
share Redis round trips through the batcher. Limits are applied by the worker, before it
calls the engine, which keeps this path to a single round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from bots.audience import Audiences
from bots.base import InboundMessage
from gateway import metrics
from gateway.config import Settings
from gateway.edge.batching import RedisBatcher
from gateway.logs import request_id
from gateway.queue.entry import EntryKind, QueueEntry
from gateway.queue.scheduler import Binding, Scheduler
from gateway.state.keys import Keys
from gateway.state.memory import Scope

Outcome = Literal["accepted", "duplicate", "replayed", "ignored"]


class Ingest:
    """Admits a parsed message into its conversation's lane exactly once."""

    def __init__(self, batcher: RedisBatcher, keys: Keys, scheduler: Scheduler, settings: Settings) -> None:
        self._batcher = batcher
        self._keys = keys
        self._scheduler = scheduler
        self._settings = settings
        self._dedup_ttl_s = settings.effective_dedup_ttl_s()
        self._audiences = Audiences(settings.bots, metrics.count_ignored)

    def admit(self, message: InboundMessage) -> InboundMessage | None:
        """The message as its bot answers it (a group prefix taken off), or None: the bot does not answer this
        sender or group (bots.audience), counted and dropped."""
        return self._audiences.admit(message)

    async def accept(self, message: InboundMessage, signature: str = "", kind: EntryKind = EntryKind.CHAT) -> Outcome:
        """Queue the message unless this delivery was seen before (a platform retry). `kind` says what the
        worker does with it: answer it ("chat"), or pull a channel's log ("pull", the message names it).

        `signature` names a signature that covers less than the body (DingTalk HTTP signs only a timestamp):
        it is bound to the messages it came with when first seen (gateway/queue/scheduler.py: DingTalk pushes in the
        same millisecond share a pair), and a later reuse with another message is "replayed".
        A message its bot does not answer (bots.audience) is "ignored": nothing is queued, but its signature is
        bound all the same (else a pair captured from a message the bot ignores would carry any other).
        """
        binding = None
        if signature:
            key = self._keys.signature_binding(message.bot_id, signature)
            binding = Binding(key, message.msg_id, self._dedup_ttl_s)
        if kind is EntryKind.CHAT:
            admitted = self.admit(message)
            if admitted is None:
                return "replayed" if binding and await self._bind(binding) < 0 else "ignored"
            message = admitted
        scope = Scope.of(message, self._settings.memory.group)
        entry = QueueEntry(owner=scope.owner, kind=kind, message=message, request_id=request_id.get() or None)
        dedup_key = self._keys.dedup(message.dedup_key)
        weight = self._settings.worker.weight(message.bot_id)

        def enqueue(pipe: Pipeline) -> None:
            self._scheduler.queue_enqueue(pipe, scope.lane, entry, dedup_key, self._dedup_ttl_s, weight, binding)

        queued = await self._submit(enqueue)
        if queued == -1:
            return "replayed"
        if not queued:
            metrics.DEDUP_HITS.labels(message.platform).inc()
            return "duplicate"
        return "accepted"

    async def _bind(self, binding: Binding) -> int:
        """Bind a signature whose message is not queued: -1 when it came with another message first."""
        return int(await self._submit(lambda pipe: self._scheduler.queue_bind(pipe, binding)))

    async def _submit(self, call: Callable[[Pipeline], None]) -> Any:
        """`call`'s script in the next batch; loaded again if Redis restarted and lost its scripts."""
        try:
            return await self._batcher.submit(call)
        except NoScriptError:
            await self._scheduler.load_scripts()
            return await self._batcher.submit(call)
