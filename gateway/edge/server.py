"""uvicorn's server without its ten-a-second tick.

`uvicorn.Server.main_loop` wakes every 0.1 s to see whether a signal asked it to stop and, every tenth time, to
refresh the `Date` header. Measured on an idle gateway (bench/overhead.py's idle line): those wakeups were most of
its 3 ms of CPU a second, which an answer at concurrency 1 (a few a second) pays a share of. `QuietServer` wakes
once a second for the `Date` header (HTTP dates have a one-second resolution), and at once when a signal comes.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import FrameType

import uvicorn

DATE_EVERY_S = 1.0


class QuietServer(uvicorn.Server):
    """uvicorn.Server whose main loop sleeps until a signal or the next second, instead of polling."""

    _stop_asked: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop, self._stop_asked = asyncio.get_running_loop(), asyncio.Event()
        if self.should_exit:  # a signal before the loop existed
            return
        # uvicorn's on_tick refreshes the Date header when its counter is a multiple of 10, and says whether to stop.
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_asked.wait(), DATE_EVERY_S)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._stop_asked is not None:
            # A signal handler runs between two bytecodes of the loop's thread: hand the wakeup to the loop.
            self._loop.call_soon_threadsafe(self._stop_asked.set)
