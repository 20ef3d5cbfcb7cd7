"""Group commit for the ack path: Redis calls made in the same event-loop moment share one pipeline.

Under load, dozens of callbacks are admitted per loop iteration; sending their scripts in
one round trip divides redis-py's per-command cost among them, while a lone callback
still goes out at once (one loop tick later). Results are handed back one per caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

QueueCall = Callable[[Pipeline], None]


class RedisBatcher:
    """Runs submitted calls in non-transactional pipelines, one batch at a time, in submission order."""

    def __init__(self, redis: Redis, max_batch: int = 512) -> None:
        self._redis = redis
        self._max_batch = max_batch
        self._pending: list[tuple[QueueCall, asyncio.Future[Any]]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for _, future in self._pending:
            if not future.done():
                future.set_exception(RuntimeError("gateway shutting down"))

    async def submit(self, call: QueueCall) -> Any:
        """Queue `call(pipe)` for the next batch and wait for its own result (or exception)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((call, future))
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(0)  # let the callbacks already running in this tick join the batch
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
            if self._pending:
                self._wakeup.set()
            await self._flush(batch)

    async def _flush(self, batch: list[tuple[QueueCall, asyncio.Future[Any]]]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for call, _ in batch:
                    call(pipe)
                results = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
