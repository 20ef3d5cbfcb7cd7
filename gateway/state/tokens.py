"""Platform access tokens cached in Redis and refreshed by one process at a time."""

from __future__ import annotations

import asyncio
import secrets
from types import TracebackType

from redis.asyncio import Redis

from gateway.state.keys import Keys
from gateway.state.redis_text import as_text

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_INVALIDATE = _RELEASE


class RedisRefreshLock:
    """A short Redis lock (SET NX PX) so that only one process calls gettoken at a time."""

    def __init__(self, redis: Redis, key: str, ttl_ms: int = 10_000, wait_s: float = 15.0) -> None:
        self._redis = redis
        self._key = key
        self._ttl_ms = ttl_ms
        self._wait_s = wait_s
        self._owner = secrets.token_hex(8)
        self._release = redis.register_script(_RELEASE)

    async def __aenter__(self) -> RedisRefreshLock:
        delay = 0.02
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        while not await self._redis.set(self._key, self._owner, nx=True, px=self._ttl_ms):
            if loop.time() > deadline:
                break  # the holder died or hangs: go ahead rather than block a reply forever
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._release(keys=[self._key], args=[self._owner])


class RedisTokenStore:
    """The `TokenStore` that adapters use: one token per app for all replicas."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._invalidate = redis.register_script(_INVALIDATE)

    async def get(self, name: str) -> str | None:
        value = await self._redis.get(self._keys.token(name))
        return None if value is None else as_text(value)

    async def put(self, name: str, token: str, ttl_s: float) -> None:
        await self._redis.set(self._keys.token(name), token, px=int(ttl_s * 1000))

    async def invalidate(self, name: str, token: str) -> None:
        """Drop the cached token only if it is still the stale one (another process may have refreshed)."""
        await self._invalidate(keys=[self._keys.token(name)], args=[token])

    def refresh_lock(self, name: str) -> RedisRefreshLock:
        return RedisRefreshLock(self._redis, self._keys.token_lock(name))
