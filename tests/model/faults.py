"""A seeded fault plan and the wrappers that apply it at every side-effect boundary of one worker.

Every Redis command and script, every platform HTTP call and every engine request of a worker passes one
`FaultContext`. While the plan is armed, each call may fail before its effect, fail after it (the caller
sees an error although it happened), kill the worker right there, or (engine streams) be cut mid-stream.
A decision depends only on the seed, the boundary's name and how often that boundary was crossed before,
so that a replay of the same moves meets the same faults as far as the calls come in the same order.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.queue import scheduler
from gateway.state import conversations, limits, reply_record, streams

Fault = Literal["before", "after", "kill", "midstream"]
# Redis commands that are not side effects worth a fault of their own (connection set-up, script loading).
QUIET = {"SCRIPT", "CLIENT", "HELLO", "SELECT", "PING", "INFO"}


class Killed(BaseException):
    """The worker died at this call: nothing after it happens (a BaseException, so no `except Exception` of the
    product can treat a death as a failure to recover from)."""


def script_names() -> dict[str, str]:
    """The SHA1 of every Lua script of the product, by module and name, so a fault report says which one."""
    names = {}
    for module in (scheduler, reply_record, conversations, limits, streams):
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str) and "redis.call" in value:
                names[hashlib.sha1(value.encode()).hexdigest()] = f"{module.__name__.split('.')[-1]}.{name}"
    return names


SCRIPTS = script_names()


@dataclass
class FaultPlan:
    """Which call fails how: `rate` is the chance of a fault at any call while armed."""

    seed: int
    rate: float = 0.04
    armed: bool = False
    crossed: Counter[str] = field(default_factory=Counter)
    injected: list[tuple[str, Fault]] = field(default_factory=list)

    def decide(self, boundary: str, kinds: tuple[Fault, ...]) -> Fault | None:
        self.crossed[boundary] += 1
        if not self.armed:
            return None
        digest = hashlib.sha256(f"{self.seed}|{boundary}|{self.crossed[boundary]}".encode()).digest()
        if int.from_bytes(digest[:4], "big") / 2**32 >= self.rate:
            return None
        fault = kinds[digest[4] % len(kinds)]
        self.injected.append((boundary, fault))
        return fault


@dataclass
class FaultContext:
    """One worker's view of the plan: once it is killed, every further call of it dies too."""

    plan: FaultPlan
    name: str
    dead: bool = False

    def check(self) -> None:
        if self.dead:
            raise Killed(self.name)

    def decide(self, boundary: str, kinds: tuple[Fault, ...] = ("before", "after", "kill")) -> Fault | None:
        self.check()
        fault = self.plan.decide(boundary, kinds)
        if fault == "kill":
            self.dead = True
            raise Killed(f"{self.name} at {boundary}")
        return fault


def redis_boundary(args: tuple[Any, ...]) -> str:
    command = str(args[0]).upper()
    if command in ("EVALSHA", "EVAL") and len(args) > 1:
        return "redis:" + SCRIPTS.get(str(args[1]), f"script-{str(args[1])[:8]}")
    return f"redis:{command}"


class FaultyPipeline(Pipeline):
    """A pipeline whose execution is one boundary (its commands run together or not at all)."""

    faults: FaultContext

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        names = ",".join(sorted({str(command[0][0]) for command in self.command_stack}))
        fault = self.faults.decide(f"redis:pipeline[{names}]")
        if fault == "before":
            await self.reset()
            raise RedisConnectionError("fault: before the pipeline")
        result = await super().execute(raise_on_error)
        self.faults.check()
        if fault == "after":
            raise RedisTimeoutError("fault: after the pipeline")
        return result


class FaultyRedis(Redis):
    """The product's Redis client, every command and script call passing the worker's fault context."""

    faults: FaultContext

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() in QUIET:
            self.faults.check()
            return await super().execute_command(*args, **options)
        fault = self.faults.decide(redis_boundary(args))
        if fault == "before":
            raise RedisConnectionError("fault: before the command")
        result = await super().execute_command(*args, **options)
        self.faults.check()
        if fault == "after":
            raise RedisTimeoutError("fault: after the command")
        return result

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = FaultyPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.faults = self.faults
        return pipe


def faulty_redis(url: str, faults: FaultContext) -> FaultyRedis:
    client = FaultyRedis.from_url(url, socket_timeout=5.0)
    client.faults = faults
    return client


class FaultyTransport(httpx.AsyncBaseTransport):
    """Platform calls over real HTTP to the simulator, each one a boundary named by its path."""

    def __init__(self, faults: FaultContext, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.faults = faults
        self.inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fault = self.faults.decide(f"http:{request.method} {request.url.path}")
        if fault == "before":
            raise httpx.ConnectError("fault: before the call", request=request)
        response = await self.inner.handle_async_request(request)
        await response.aread()
        self.faults.check()
        if fault == "after":
            raise httpx.ReadTimeout("fault: after the call", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CutStream(httpx.AsyncByteStream):
    """An SSE body that breaks after its first events, as a dying engine's does."""

    def __init__(self, body: bytes, keep_events: int) -> None:
        self.events = body.split(b"\n\n")
        self.keep = keep_events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self.events[: self.keep]:
            yield event + b"\n\n"
        raise httpx.RemoteProtocolError("fault: the engine died mid-stream")


class EngineTransport(httpx.AsyncBaseTransport):
    """The stub engine (testkit/fakes/stub_engine.py) in process; a chat request may fail before it is sent or be cut
    after a few streamed chunks. Health and model polls are not faulted (the pool's own failover is not the
    answer path)."""

    def __init__(self, faults: FaultContext, app: Any) -> None:
        self.faults = faults
        self.inner = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/chat/completions"):
            self.faults.check()
            return await self.inner.handle_async_request(request)
        warmup = json.loads(request.content or b"{}").get("max_tokens") == 1
        fault = None if warmup else self.faults.decide("engine:chat", ("before", "midstream", "kill"))
        if fault == "before":
            raise httpx.ConnectError("fault: engine unreachable", request=request)
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        self.faults.check()
        if fault != "midstream" or b"data:" not in body:
            return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)
        return httpx.Response(response.status_code, headers=response.headers, stream=_CutStream(body, 2),
                              request=request)  # fmt: skip


class FaultyWindows:
    """The `limits` library keeps a connection of its own (send pacing): its calls are boundaries too."""

    def __init__(self, inner: limits.MovingWindowLimiter, faults: FaultContext, name: str) -> None:
        self.inner = inner
        self.faults = faults
        self.name = name

    async def hit(self, key: str, windows: list[Any]) -> limits.LimitDecision:
        fault = self.faults.decide(f"limits:{self.name}.hit")
        if fault == "before":
            raise RedisConnectionError("fault: before the window hit")
        decision = await self.inner.hit(key, windows)
        self.faults.check()
        if fault == "after":
            raise RedisTimeoutError("fault: after the window hit")
        return decision

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
