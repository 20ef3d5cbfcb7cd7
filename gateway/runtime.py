"""The per-process resources that the gateway and the workers share the shape of.

One Redis client, one httpx.AsyncClient, one engine client, and one adapter per bot,
opened together and closed together. Whole engine answers go through an aiohttp session (engine/client.py says
why); `use_uvloop` is for the process's entry point, before its event loop exists.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import httpx
from redis.asyncio import Redis

from bots.channels import Channel
from bots.http import PlatformClient
from bots.registry import build_adapters
from engine.observability import export_endpoint
from engine.pool import EnginePool
from gateway.config import Settings
from gateway.queue.scheduler import Scheduler
from gateway.state.key_migration import old_keys_present
from gateway.state.keys import Keys
from gateway.state.redis_client import RedisConfigError, check_redis, is_cluster_url, open_redis
from gateway.state.tokens import RedisTokenStore
from gateway.state.uploads import RedisUploadStore

HTTP_TIMEOUT = httpx.Timeout(15.0, connect=5.0)


@dataclass
class Runtime:
    """What a process needs to take a message from callback to reply."""

    settings: Settings
    redis: Redis
    http: httpx.AsyncClient
    keys: Keys
    scheduler: Scheduler
    engine: EnginePool
    adapters: dict[str, Channel]


def use_uvloop() -> bool:
    """Have the next asyncio.run use uvloop (installed with uvicorn[standard]; uvicorn picks it by itself): its
    loop costs a worker about a quarter of plain asyncio's per message. False when it is not installed."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


@asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[Runtime]:
    redis = open_redis(settings.redis_url, health_check_interval=30, **settings.redis_options())
    try:
        await check_redis(redis, settings.redis_url)
        if not is_cluster_url(settings.redis_url) and await old_keys_present(redis, Keys(settings.namespace)):
            raise RedisConfigError(
                f"Redis holds namespace {settings.namespace!r} under the names of a release before hash tags: "
                "stop every botgw process and run `botgw migrate-keys --config FILE` once, or the queue and "
                "the conversations would be forgotten"
            )
    except BaseException:  # a refusal, Redis down, or an interrupt: nothing is left open
        await redis.aclose()
        raise
    async with contextlib.AsyncExitStack() as opened:  # whatever fails below, what was opened is closed
        opened.push_async_callback(redis.aclose)
        json_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=200),
            timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT.read, sock_connect=HTTP_TIMEOUT.connect),
            # The proxy environment is read by PlatformClient, once per host (trust_env reads it on every call).
        )
        opened.push_async_callback(json_session.close)
        http = PlatformClient(json_session=json_session, timeout=HTTP_TIMEOUT,
                              limits=httpx.Limits(max_connections=200))
        opened.push_async_callback(http.aclose)
        engine_connections = (settings.engine.max_in_flight + 8) * len(settings.engine.urls())
        engine_http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.engine.request_timeout_s, connect=settings.engine.connect_timeout_s),
            limits=httpx.Limits(max_connections=engine_connections),
        )
        opened.push_async_callback(engine_http.aclose)
        engine_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=engine_connections),
            timeout=aiohttp.ClientTimeout(total=None, connect=settings.engine.connect_timeout_s),
        )
        opened.push_async_callback(engine_session.close)
        keys = Keys(settings.namespace)
        engine = EnginePool(settings.engine, engine_http, engine_session)
        engine.on_change(export_endpoint)
        runtime = Runtime(
            settings=settings,
            redis=redis,
            http=http,
            keys=keys,
            scheduler=Scheduler(redis, keys),
            engine=engine,
            adapters=build_adapters(settings.bots, http, RedisTokenStore(redis, keys)),
        )
        for adapter in runtime.adapters.values():  # the page's adapter reads its uploads (bots/web/uploads.py)
            if attach := getattr(adapter, "attach_uploads", None):
                attach(RedisUploadStore(redis, keys))
        opened.push_async_callback(engine.aclose)
        await engine.start()
        yield runtime
