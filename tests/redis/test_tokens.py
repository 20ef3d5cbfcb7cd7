"""Platform access tokens: the shared cache in Redis with each process's copy in front (gateway/state/tokens.py)."""

from __future__ import annotations

import secrets

import pytest
from redis.asyncio import Redis

from gateway.state.keys import Keys
from gateway.state.tokens import RedisTokenStore


@pytest.fixture
async def redis(redis_url: str):  # type: ignore[no-untyped-def]
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_a_token_dropped_while_it_was_being_read_is_not_kept_in_the_process(redis: Redis) -> None:
    """A read that started before the platform called the token invalid must not bring it back afterwards: the
    process would keep sending it until another refused call."""
    keys, name = Keys("t" + secrets.token_hex(4)), "wecom:app:x"
    writer, reader = RedisTokenStore(redis, keys), RedisTokenStore(redis, keys)
    await writer.put(name, "T1", 3600)
    real_pipeline = redis.pipeline

    class DroppedMeanwhile:
        """The reader's Redis read, with another call of the same process invalidating T1 right after it."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            self._pipe = real_pipeline(*args, **kwargs)

        async def __aenter__(self):  # type: ignore[no-untyped-def]
            await self._pipe.__aenter__()
            return self

        async def __aexit__(self, *exc: object) -> None:
            await self._pipe.__aexit__(*exc)

        def __getattr__(self, attr: str):  # type: ignore[no-untyped-def]
            return getattr(self._pipe, attr)

        async def execute(self) -> list:
            result = await self._pipe.execute()
            await reader.invalidate(name, "T1")
            return result

    redis.pipeline = DroppedMeanwhile  # type: ignore[method-assign]
    try:
        assert await reader.get(name) == "T1"  # what Redis held when the read was made
    finally:
        redis.pipeline = real_pipeline  # type: ignore[method-assign]
    assert await reader.get(name) is None, "the stale token came back into the process after it was dropped"
    await writer.put(name, "T2", 3600)
    assert await reader.get(name) == "T2" and await reader.get(name) == "T2"
