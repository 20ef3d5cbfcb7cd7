"""What every command module shares: usage errors, argparse types, the signal runner, and Redis for one command."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from gateway.state.redis_text import is_stream_id

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from gateway.config import Settings


class UsageError(Exception):
    """The command was called wrongly in a way argparse cannot see (exit 2, like argparse's own)."""


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse then says what was wrong and exits 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number (1 or more)")
    return value


def letter_id(text: str) -> str:
    """An argparse type: a dead letter's id as `dlq list` prints it (a Redis stream id, `1712345678901-0`)."""
    if not is_stream_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a dead-letter id (like 1712345678901-0; `botgw dlq list`)")
    return text


def until_signal(run: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run `run(stop)` until SIGINT or SIGTERM sets `stop` (then it finishes what it holds)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(stop)

    asyncio.run(main())
    return 0


@asynccontextmanager
async def redis_for(settings: Settings, wait_s: float = 0.0) -> AsyncIterator[Redis]:
    """Redis as the configuration names it, with its timeouts: one place, so that no command forgets them."""
    from gateway.state.redis_client import connected

    async with connected(settings.redis_url, wait_s, **settings.redis_options()) as redis:
        yield redis
