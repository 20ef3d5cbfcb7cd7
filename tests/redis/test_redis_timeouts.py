"""redis-py's commands under Python 3.12's wait_for (gateway/state/redis_wire.py): none runs in a Task of its own,
and a Redis that stops reading and answering still fails a call after the socket timeout, with redis-py's errors."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.state.redis_client import open_redis
from testkit.redis_servers import start_redis


async def test_a_command_runs_in_the_callers_task(redis_url: str) -> None:
    client = open_redis(redis_url, socket_timeout=5.0, socket_connect_timeout=2.0)
    try:
        await client.ping()  # connected: what follows are sends and reads only
        loop = asyncio.get_running_loop()
        made: list[object] = []
        before = loop.get_task_factory()

        def counted(loop: asyncio.AbstractEventLoop, coro: object, **kwargs: object) -> asyncio.Task:
            made.append(coro)
            return asyncio.Task(coro, loop=loop, **kwargs)  # type: ignore[arg-type]

        loop.set_task_factory(counted)  # type: ignore[arg-type]
        try:
            for number in range(20):
                await client.set(f"wait-for-{number}", "v", ex=60)
        finally:
            loop.set_task_factory(before)
        assert made == [], "Python 3.11's wait_for runs each send in a Task of its own"
    finally:
        await client.aclose()


def test_a_redis_that_stops_still_fails_a_call_after_the_socket_timeout(log_dir: Path) -> None:
    proc, url = start_redis(log_dir, "stopped-redis")

    async def run() -> None:
        client = open_redis(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        await client.ping()
        os.kill(proc.pid, signal.SIGSTOP)  # nothing read, nothing answered: a blackholed server
        try:
            started = time.monotonic()
            # A value larger than the loopback socket's buffers: the send itself waits, and times out.
            with pytest.raises(RedisTimeoutError, match="writing"):  # the send's timeout, not a read's
                await client.set("big", b"x" * (64 << 20))
            took_send = time.monotonic() - started
            started = time.monotonic()
            with pytest.raises(RedisTimeoutError):  # a small command is sent, and its answer never comes
                await client.get("small")
            took_read = time.monotonic() - started
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            await client.aclose()
        assert 0.9 < took_send < 10 and 0.9 < took_read < 10, (took_send, took_read)

    try:
        asyncio.run(run())
    finally:
        proc.stop()
