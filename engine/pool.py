"""Several vLLM engines as one: readiness with warm-up, load-aware routing, failover, backpressure.

Each endpoint is watched by its own loop: /health and /v1/models say whether it is up,
a one-token warm-up request must come back before it counts as ready, and its
/metrics (vllm:num_requests_running + vllm:num_requests_waiting) say how loaded it is.
A request goes to the ready engine with the least load; an engine that fails is taken
out and probed again with backoff, and the request is retried on another one. A request that
carries an image goes only to the engines that can see (`engine.vision`, or per endpoint).

/metrics is read every poll only where it steers requests (several engines, in a process that
sends chats): vLLM's exposition is ~57 KB and each read cost vLLM ~12 ms and each botgw process
~1 ms per answer. Elsewhere a ready engine is checked through the light /health every
READY_CHECK_S (a failed request takes it out at once anyway) and its load read every SLOW_LOAD_S,
for the gauges, the KV-pressure warning and the web page's "busy".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import httpx

from bots.urls import redact_url
from engine.client import Completion, DeltaCallback, EngineClient, EngineError
from engine.observability import KV_PRESSURE_WARNINGS
from engine.settings import EngineSettings

log = logging.getLogger(__name__)

Status = Literal["down", "warming", "ready"]
StateListener = Callable[["Endpoint"], None]
Message = dict[str, Any]  # an OpenAI chat message: content is a string or a list of parts (text, image_url);
# an assistant message may carry `tool_calls` (content None), answered by {"role": "tool", "tool_call_id", "content"}
WARMUP_MESSAGES = [{"role": "user", "content": "ping"}]
MAX_PROBE_BACKOFF_S = 5.0  # an engine that is still loading is probed often: it may be up any second
# A request failed with a server error while /health is fine is the request's failure, unless the engine fails
# this many requests in a row so: then it is the engine's, and it is taken out like one that does not answer.
TAKE_OUT_AFTER_REFUSALS = 3
HEALTH_FAILURES_TO_TAKE_OUT = 2
FULL_CHECK_S = 10.0  # /health + /v1/models (is our model still the one served?) at most this often when ready
READY_CHECK_S = 5.0  # a ready engine whose load steers nothing: /health this often
SLOW_LOAD_S = 15.0  # ... and /metrics this often


class EngineUnavailable(EngineError):
    """No engine became ready in time; the message stays queued and is tried again later."""


class NoEngineSees(EngineError):
    """An image request, and no engine in the pool can see images: asking again will not help."""

    def __init__(self) -> None:
        super().__init__("no engine can see images", retryable=False)


def carries_image(messages: list[Message]) -> bool:
    """Whether a user message holds an image part (OpenAI's `{"type": "image_url", ...}` in a content list)."""
    return any(
        message.get("role") == "user"
        and isinstance(message.get("content"), list)
        and any(isinstance(part, dict) and part.get("type") == "image_url" for part in message["content"])
        for message in messages
    )


@dataclass
class EngineLoad:
    """What an engine's /metrics said at the last scrape."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0


_WANTED = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
}


def parse_vllm_metrics(text: str) -> EngineLoad:
    """Sum vLLM's gauges over its engines (labels `engine`, `model_name`); the KV cache is the fullest one's.

    Only the three gauges' sample lines are read: vLLM's exposition is mostly histograms, and running the
    full Prometheus parser over it every poll cost each botgw process milliseconds per second.
    """
    values: dict[str, list[float]] = {name: [] for name in _WANTED.values()}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        attribute = _WANTED.get(line.split("{", 1)[0].split(" ", 1)[0])
        if attribute is None:
            continue
        try:
            values[attribute].append(float(line.rsplit(" ", 1)[1]))
        except (IndexError, ValueError):
            continue
    return EngineLoad(
        running=sum(values["running"]),
        waiting=sum(values["waiting"]),
        kv_cache_usage=max(values["kv_cache_usage"], default=0.0),
    )


@dataclass
class Endpoint:
    """One engine as this process sees it."""

    url: str
    client: EngineClient
    slots: asyncio.Semaphore
    vision: bool = False  # its model can see images
    status: Status = "down"
    load: EngineLoad = field(default_factory=EngineLoad)
    in_flight: int = 0
    sent_since_scrape: int = 0
    failures: int = 0
    health_failures: int = 0
    refusals: int = 0  # server errors in a row while /health was fine (engine/pool.py EnginePool._run)
    full_check_at: float = 0.0  # monotonic time of the last /health + /v1/models
    answered_at: float = 0.0  # ... and of the last chat it answered (it is up)
    scraped_at: float = 0.0  # ... and of the last /metrics
    next_probe_at: float = 0.0
    kv_high_since: float = 0.0

    @property
    def name(self) -> str:
        """The engine in logs, metric labels and the pulse: its URL without a user name or password in it."""
        return redact_url(self.url)

    def score(self) -> float:
        """Lower is better: what vLLM reported plus what we sent since (the scrape lags)."""
        return self.load.running + self.load.waiting + self.sent_since_scrape


class EnginePool:
    """The engines one process uses; start() begins watching them."""

    def __init__(
        self, settings: EngineSettings, http: httpx.AsyncClient, session: aiohttp.ClientSession | None = None
    ) -> None:
        """`session`: where whole answers are asked when given (engine/client.py: EngineClient._post)."""
        self._settings = settings
        self._http = http
        self.endpoints = [
            Endpoint(url, EngineClient(settings, http, url, session), asyncio.Semaphore(settings.max_in_flight), sees)
            for url, sees in settings.targets()
        ]
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[StateListener] = []
        self._routes = False  # set by the first chat(): this process sends requests, so load may steer them

    @property
    def model(self) -> str:
        return self._settings.model

    def on_change(self, listener: StateListener) -> None:
        """Call `listener(endpoint)` after every probe (metrics export uses this)."""
        self._listeners.append(listener)

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(endpoint)) for endpoint in self.endpoints]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def max_model_len(self) -> int | None:
        """The smallest context window of the ready engines (a request must fit whichever one it goes to)."""
        lengths = [e.client.max_model_len for e in self.endpoints if e.status == "ready" and e.client.max_model_len]
        return min(lengths) if lengths else None

    @property
    def ready(self) -> bool:
        return any(endpoint.status == "ready" for endpoint in self.endpoints)

    @property
    def sees_images(self) -> bool:
        """Some engine of the pool can see images (ready or not): an image is worth sending to the engine."""
        return any(endpoint.vision for endpoint in self.endpoints)

    def _ready_for(self, vision: bool) -> bool:
        return any(e.status == "ready" and (e.vision or not vision) for e in self.endpoints)

    async def wait_ready(self, timeout_s: float, *, vision: bool = False) -> bool:
        """True as soon as one engine is ready (one that sees, with `vision`); False if none is within timeout_s."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self._ready_for(vision)), timeout_s)
            except TimeoutError:
                return False
        return True

    def _pick(self, avoid: set[str], vision: bool = False) -> Endpoint | None:
        ready = [e for e in self.endpoints if e.status == "ready" and (e.vision or not vision)]
        preferred = [e for e in ready if e.url not in avoid] or ready
        return min(preferred, key=Endpoint.score, default=None)

    async def _run(
        self,
        call: Callable[[Endpoint], Awaitable[Completion | int]],
        limited: bool,
        failover: bool = True,
        vision: bool = False,
    ) -> Completion | int:
        """Run `call` on the best ready engine (one that sees, with `vision`); on a retryable failure take it out
        and try another. An engine that answers a server error while its /health is fine failed this request, not
        itself (a picture or a tool call vLLM chokes on): it stays in the pool for everyone else, and the request
        is asked of each engine once, then its error is raised. Taking engines out for such a request emptied the
        pool again and again until max_wait_s (found by a review)."""
        if vision and not self.sees_images:
            raise NoEngineSees()
        deadline = time.monotonic() + self._settings.max_wait_s
        failed: set[str] = set()  # taken out while this request ran: tried again once they are back
        refused: set[str] = set()  # failed this request while healthy: not asked again
        refused_error: EngineError | None = None
        while True:
            endpoint = self._pick(failed | refused, vision)
            if endpoint is not None and endpoint.url in refused and refused_error is not None:
                raise refused_error  # every ready engine failed this request while healthy
            if endpoint is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not await self.wait_ready(remaining, vision=vision):
                    raise EngineUnavailable(f"no engine{' that can see images' if vision else ''} is ready")
                continue
            try:
                if not limited:
                    result = await call(endpoint)
                else:
                    async with endpoint.slots:
                        endpoint.in_flight += 1
                        endpoint.sent_since_scrape += 1
                        try:
                            result = await call(endpoint)
                        finally:
                            endpoint.in_flight -= 1
                endpoint.refusals = 0
                return result
            except EngineError as exc:
                if not exc.retryable or exc.timed_out:
                    raise  # the request's own failure: a slow engine under load is not taken out of the pool
                if exc.status >= 500 and await endpoint.client.is_alive():
                    endpoint.refusals += 1
                    if endpoint.refusals < TAKE_OUT_AFTER_REFUSALS:
                        log.warning("an engine failed a request while healthy; it stays in",
                                    extra={"endpoint": endpoint.name, "error": str(exc)[:200]})  # fmt: skip
                        refused.add(endpoint.url)
                        refused_error = exc
                        if not failover:
                            raise
                        continue
                    # failing everything it is asked while its /health says fine (a proxy in front of it, say)
                    endpoint.refusals = 0
                failed.add(endpoint.url)
                await self._take_out(endpoint, str(exc))
                if not failover or time.monotonic() > deadline:
                    raise

    async def chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        on_delta: DeltaCallback | None = None,
        extra: dict | None = None,
        failover: bool = True,
        tools: list[dict] | None = None,
    ) -> Completion:
        """A chat completion from the least-loaded ready engine (of those that see, when a message carries an image:
        NoEngineSees when none can). `tools`: OpenAI function definitions offered to the model (EngineClient.chat).

        With failover (the default) a retryable failure is retried on another engine; a caller
        that has already shown streamed text (failover=False) gets the error and decides.
        """

        self._routes = True

        async def ask(endpoint: Endpoint) -> Completion:
            completion = await endpoint.client.chat(
                messages, max_tokens=max_tokens, temperature=temperature, on_delta=on_delta, extra=extra, tools=tools
            )
            endpoint.answered_at = time.monotonic()
            return completion

        result = await self._run(ask, limited=True, failover=failover, vision=carries_image(messages))
        assert isinstance(result, Completion)
        return result

    async def count_tokens(self, text: str) -> int:
        result = await self._run(lambda endpoint: endpoint.client.count_tokens(text), limited=False)
        assert isinstance(result, int)
        return result

    # -- watching ----------------------------------------------------------------------------

    async def _take_out(self, endpoint: Endpoint, reason: str) -> None:
        if endpoint.status != "down":
            log.warning("engine taken out", extra={"endpoint": endpoint.name, "reason": reason})
        endpoint.status = "down"
        endpoint.failures += 1
        backoff = min(MAX_PROBE_BACKOFF_S, self._settings.poll_interval_s * 2 ** min(endpoint.failures, 6))
        endpoint.next_probe_at = time.monotonic() + backoff
        await self._notify(endpoint)

    async def _notify(self, endpoint: Endpoint) -> None:
        for listener in self._listeners:
            listener(endpoint)
        async with self._changed:
            self._changed.notify_all()

    def _load_steers(self) -> bool:
        """Whether load is worth reading every poll: only where it chooses between engines for our requests."""
        return self._routes and len(self.endpoints) > 1

    def _next_probe_in(self, endpoint: Endpoint) -> float:
        interval = self._settings.poll_interval_s
        if endpoint.status == "down":
            return max(interval, endpoint.next_probe_at - time.monotonic())
        return interval if self._load_steers() else max(interval, READY_CHECK_S)

    async def _watch(self, endpoint: Endpoint) -> None:
        while True:
            try:
                await self._probe(endpoint)
            except Exception:  # a watcher must never die
                log.exception("engine probe failed", extra={"endpoint": endpoint.name})
            await asyncio.sleep(self._next_probe_in(endpoint))

    async def _check(self, endpoint: Endpoint, now: float) -> bool:
        """Is a ready engine still up? By the cheapest read that also keeps its load as fresh as it is needed. The
        light /health is left out while the engine answers chats (a probe costs CPU here and in vLLM, issue 22): a
        chat answered within READY_CHECK_S says it is up, and a failed one takes it out at once. /v1/models still
        comes every FULL_CHECK_S (a new engine behind the same address may serve another model or length)."""
        if now - endpoint.full_check_at >= FULL_CHECK_S:
            return await self._full_check(endpoint, now)
        if self._load_steers():
            return await self._scrape(endpoint, now)  # read for the load anyway: it doubles as the liveness check
        if now - endpoint.answered_at < READY_CHECK_S:
            return True
        return await endpoint.client.is_alive()

    async def _full_check(self, endpoint: Endpoint, now: float) -> bool:
        endpoint.full_check_at = now
        return await endpoint.client.is_ready()

    async def _probe(self, endpoint: Endpoint) -> None:
        now = time.monotonic()
        if endpoint.status == "down" and now < endpoint.next_probe_at:
            return
        ok = await (self._check(endpoint, now) if endpoint.status == "ready" else self._full_check(endpoint, now))
        if not ok:
            endpoint.health_failures += 1
            if endpoint.status == "down":
                await self._take_out(endpoint, "still down")
            elif endpoint.health_failures >= HEALTH_FAILURES_TO_TAKE_OUT:
                # one slow answer from a busy engine is not death; two in a row is taken seriously
                await self._take_out(endpoint, "health check failed")
            return
        endpoint.health_failures = 0
        if endpoint.status == "down":
            if self._settings.warmup:
                endpoint.status = "warming"
                await self._notify(endpoint)
                try:
                    await endpoint.client.chat(WARMUP_MESSAGES, max_tokens=1, temperature=0.0)
                except EngineError as exc:
                    await self._take_out(endpoint, f"warm-up failed: {exc}")
                    return
            endpoint.status = "ready"
            endpoint.failures = 0
            log.info("engine ready", extra={"endpoint": endpoint.name, "warmed_up": self._settings.warmup})
        load_every = self._settings.poll_interval_s if self._load_steers() else SLOW_LOAD_S
        if now - endpoint.scraped_at >= load_every:
            await self._scrape(endpoint, now)
        await self._notify(endpoint)

    async def _scrape(self, endpoint: Endpoint, now: float) -> bool:
        """Read the engine's load from /metrics; False when it did not answer."""
        try:
            text = await endpoint.client.metrics_text()
        except EngineError:
            return False
        endpoint.scraped_at = now
        endpoint.load = parse_vllm_metrics(text)
        endpoint.sent_since_scrape = 0
        self._watch_kv_pressure(endpoint)
        return True

    def _watch_kv_pressure(self, endpoint: Endpoint) -> None:
        """Warn once the KV cache has stayed above the threshold for kv_warn_after_s."""
        now = time.monotonic()
        if endpoint.load.kv_cache_usage < self._settings.kv_warn_threshold:
            endpoint.kv_high_since = 0.0
            return
        if not endpoint.kv_high_since:
            endpoint.kv_high_since = now
        elif now - endpoint.kv_high_since >= self._settings.kv_warn_after_s:
            log.warning(
                "engine KV cache under sustained pressure; add engines or lower max_in_flight",
                extra={"endpoint": endpoint.name, "kv_cache_usage": endpoint.load.kv_cache_usage},
            )
            endpoint.kv_high_since = now  # warn again after another period, not every poll
            KV_PRESSURE_WARNINGS.labels(endpoint.name).inc()
