"""Platform access tokens cached in Redis and refreshed by one process at a time, with each process's copy in
front: a send asks Redis only when this process holds no token (or the platform called it invalid)."""

from __future__ import annotations

import asyncio
import secrets
import time
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
    """The `TokenStore` that adapters use: one token per app for all replicas, kept in this process too until
    its Redis entry would expire (the platform's token-invalid error drops it: bots/http.py invalidates)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._invalidate = redis.register_script(_INVALIDATE)
        self._local: dict[str, tuple[str, float]] = {}  # name -> (token, monotonic time its Redis entry expires)
        self._changes: dict[str, int] = {}  # name -> how often this process put or dropped it (see `get`)

    async def get(self, name: str) -> str | None:
        local = self._local.get(name)
        if local is not None and time.monotonic() < local[1]:
            return local[0]
        changes = self._changes.get(name, 0)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._keys.token(name))
            pipe.pttl(self._keys.token(name))
            value, ttl_ms = await pipe.execute()
        if value is None:
            self._local.pop(name, None)
            return None
        token = as_text(value)
        # Kept only if nothing was put or dropped meanwhile: a read that started before an invalidation must not
        # bring the stale token back into this process after it (it would cost one more refused call).
        if int(ttl_ms) > 0 and self._changes.get(name, 0) == changes:
            self._local[name] = (token, time.monotonic() + int(ttl_ms) / 1000)
        return token

    async def put(self, name: str, token: str, ttl_s: float) -> None:
        self._changes[name] = self._changes.get(name, 0) + 1
        await self._redis.set(self._keys.token(name), token, px=int(ttl_s * 1000))
        self._local[name] = (token, time.monotonic() + ttl_s)

    async def invalidate(self, name: str, token: str) -> None:
        """Drop the cached token only if it is still the stale one (another process may have refreshed)."""
        self._changes[name] = self._changes.get(name, 0) + 1
        if self._local.get(name, ("",))[0] == token:
            del self._local[name]
        await self._invalidate(keys=[self._keys.token(name)], args=[token])

    def refresh_lock(self, name: str) -> RedisRefreshLock:
        return RedisRefreshLock(self._redis, self._keys.token_lock(name))
