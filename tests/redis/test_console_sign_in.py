"""The console's sign-in limit takes a right token's count back only while its window lives (a review found a DECR
after the minute made a counter with no expiry, and every later sign-in from that address refused for good)."""

from __future__ import annotations

import secrets

from redis.asyncio import Redis

from gateway.console.routes import _TAKE_BACK


async def test_taking_a_count_back_never_makes_a_counter_without_expiry(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    key = "console-sign-in-" + secrets.token_hex(4)
    assert await redis.eval(_TAKE_BACK, 1, key) == 0
    assert not await redis.exists(key), "a counter with no expiry was made"
    await redis.set(key, 2, ex=60)
    assert await redis.eval(_TAKE_BACK, 1, key) == 1 and 0 < await redis.ttl(key) <= 60
    await redis.set(key, 0, ex=60)
    assert await redis.eval(_TAKE_BACK, 1, key) == 0 and int(await redis.get(key)) == 0
    await redis.aclose()
