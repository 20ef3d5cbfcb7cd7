"""Ingest benchmark: signed, encrypted WeCom callbacks through one gateway process vs a bare FastAPI endpoint.

Measures the acknowledgement path only (verify → decrypt → parse → dedup+enqueue (one Redis script) → 200), with no
worker, against a bare FastAPI app that just reads the body and answers 200, run by uvicorn the same way.
The same gateway process is also measured with DingTalk HTTP-mode robot callbacks (signed `timestamp`/`sign`
headers, JSON body; verify → parse → dedup+enqueue → 200 "{}"), the row `gateway-dingtalk`.

Phase 1 (capacity): closed loop, `--concurrency` keep-alive connections for `--duration` seconds after a warm-up.
Phase 2 (latency): open loop at half the gateway's capacity, the same rate against both servers; latency is taken
from each request's *scheduled* send time, so that queueing in front of a busy server is not hidden (coordinated
omission).

Run: `.venv/bin/python bench/ingest.py [--duration 10 --concurrency 48 --users 1000]`.
The bare server alone: `.venv/bin/python bench/ingest.py --bare-server PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlencode

from fastapi import FastAPI, Request, Response

# `python bench/ingest.py` puts bench/, not the project, on the path; `bench.common` needs the project.
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    HttpConnection,
    StartupError,
    Stopped,
    Tally,
    connect,
    http_ok,
    interruptible,
    ms,
    percentile,
    run_in_stack,
    table,
    wait_ready,
)
from testkit.configs import botgw_config, dingtalk_robot, wecom_app
from testkit.processes import Proc, free_port
from testkit.services import gateway_args
from testkit.stacks import Stack

BOT_ID = "app"
DINGTALK_BOT_ID = "ding"
NAMESPACE = "bench"
START_TIMEOUT_S = 30.0
PHASE_GRACE_S = 30.0
MAX_ERRORS = 50
T = TypeVar("T")


# --------------------------------------------------------------------------- bare server


def bare_app() -> FastAPI:
    """The ceiling: FastAPI on the same route shape, reading the body and answering 200 with nothing else."""
    app = FastAPI(title="bare", docs_url=None, redoc_url=None)

    @app.post("/callback/{bot_id}")
    async def receive(bot_id: str, request: Request) -> Response:
        await request.body()
        return Response(content="", status_code=200, media_type="text/plain")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def serve_bare(port: int) -> int:
    """Run the bare app exactly as `botgw serve` runs the gateway (gateway/cli/processes.py `_serve`)."""
    import uvicorn

    uvicorn.run(bare_app(), host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="on")
    return 0


# --------------------------------------------------------------------------- config and pre-built callbacks


def gateway_config(redis_url: str) -> dict[str, Any]:
    """One WeCom app and one DingTalk HTTP-mode robot; limits high enough never to throttle; WARNING logs."""
    api_base = f"http://127.0.0.1:{free_port()}"  # nothing listens: no worker runs, nothing is sent
    bots = [wecom_app(BOT_ID, api_base), dingtalk_robot(DINGTALK_BOT_ID, "http", api_base)]
    return botgw_config(redis_url, NAMESPACE, bots)


class CallbackFactory:
    """Builds complete HTTP/1.1 requests (head + body), each a distinct message, so none is a dedup hit."""

    def __init__(self, bot_config: dict[str, Any], users: int) -> None:
        from bots.wecom.config import WeComAppConfig
        from simulator.wecom.signer import WeComCallbackSigner

        self._signer = WeComCallbackSigner(WeComAppConfig(**bot_config))
        self._users = users
        self._next = 0
        self._msg_base = secrets.randbelow(10**9) * 10**9

    def build(self, count: int) -> list[bytes]:
        timestamp = int(time.time())
        out: list[bytes] = []
        for i in range(self._next, self._next + count):
            user = f"bench-user-{i % self._users:06d}"
            msg_id = str(self._msg_base + i)
            callback = self._signer.text(user, f"benchmark message {i}", msg_id=msg_id, timestamp=timestamp)
            head = (
                f"POST /callback/{BOT_ID}?{urlencode(callback.params)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: text/xml\r\nContent-Length: {len(callback.body)}\r\n\r\n"
            )
            out.append(head.encode("ascii") + callback.body)
        self._next += count
        return out


class DingTalkCallbackFactory:
    """Builds complete DingTalk HTTP-mode robot callbacks (signed headers, JSON body), each with its own msgId.

    DingTalk signs each request with its own millisecond timestamp; one timestamp per batch costs the gateway the
    same (it recomputes the HMAC on every request either way), as the WeCom factory's one timestamp does.
    """

    def __init__(self, bot_config: dict[str, Any], users: int) -> None:
        from bots.dingtalk.config import DingTalkBotConfig

        self._bot = DingTalkBotConfig(**bot_config)
        self._users = users
        self._next = 0
        self._msg_base = secrets.randbelow(10**9) * 10**9

    def build(self, count: int) -> list[bytes]:
        from bots.dingtalk.crypto import sign
        from simulator.dingtalk.user import robot_payload

        # One (timestamp, sign) pair per message: botgw binds a pair to the first msgId it came with and refuses it
        # with any other (403), as a replayed signature. Milliseconds counted back from now stay in the 1 h window.
        now_ms = int(time.time() * 1000)
        secret = self._bot.app_secret.get_secret_value()
        webhook = {
            "url": f"{self._bot.oapi_base}/robot/sendBySession?session=bench",
            "expires_ms": int(time.time() * 1000) + 5_400_000,
        }
        out: list[bytes] = []
        for i in range(self._next, self._next + count):
            user = f"bench-user-{i % self._users:06d}"
            text, conversation = f"benchmark message {i}", f"cid-single-{user}"
            payload = robot_payload(self._bot, user, text, conversation=conversation, group=False, webhook=webhook)
            payload["msgId"] = f"msgbench{self._msg_base + i}"
            body = json.dumps(payload, ensure_ascii=False).encode()
            timestamp = str(now_ms - (i - self._next))
            head = (
                f"POST /callback/{self._bot.id} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"timestamp: {timestamp}\r\nsign: {sign(timestamp, secret)}\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            out.append(head.encode("ascii") + body)
        self._next += count
        return out


class Source:
    """Hands out pre-built requests: each at most once (gateway) or round robin (bare server)."""

    def __init__(self, requests: list[bytes], unique: bool) -> None:
        self._requests = requests
        self._unique = unique
        self._at = 0
        self.exhausted = False

    def take(self) -> bytes | None:
        if self._at >= len(self._requests):
            if self._unique:
                self.exhausted = True
                return None
            self._at = 0
        payload = self._requests[self._at]
        self._at += 1
        return payload


# --------------------------------------------------------------------------- phases


class TooManyErrors(ConnectionError):
    """Connections keep failing: the server is down or broken, so the phase stops instead of spinning."""


async def reconnect(port: int, tally: Tally) -> HttpConnection:
    """Count a transport error and open a fresh connection; give up after MAX_ERRORS in one run."""
    tally.errors += 1
    if tally.errors > MAX_ERRORS:
        raise TooManyErrors(f"more than {MAX_ERRORS} connection errors against port {port}")
    return await connect(port)


@dataclass
class CapacityResult:
    """Phase 1 of one server: closed-loop throughput and the CPU each process used meanwhile."""

    tally: Tally
    warmup: Tally
    elapsed_s: float
    exhausted: bool
    cpu: dict[str, float]

    @property
    def rate(self) -> float:
        """Answers per second that count as capacity: 200s only (a 4xx/5xx is work refused, not done)."""
        return self.tally.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class LatencyResult:
    """Phase 2 of one server: open-loop latencies (from scheduled send time) and the generator's own lag."""

    tally: Tally
    rate: float
    achieved: float
    latencies: list[float]
    lags: list[float]
    cpu: dict[str, float]


async def _closed_loop(port: int, conns: list[HttpConnection], source: Source, seconds: float) -> tuple[Tally, float]:
    """Every connection sends its next request as soon as the previous answer arrived, until the deadline."""
    tally = Tally()
    start = time.perf_counter()
    deadline = start + seconds

    async def drive(slot: int) -> None:
        while time.perf_counter() < deadline:
            payload = source.take()
            if payload is None:
                return
            try:
                status = await conns[slot].request(payload)
            except ConnectionError:
                conns[slot] = await reconnect(port, tally)
                continue
            tally.statuses[status] += 1

    await asyncio.gather(*(drive(slot) for slot in range(len(conns))))
    return tally, time.perf_counter() - start


async def _open_loop(
    port: int, conns: list[HttpConnection], source: Source, rate: float, seconds: float
) -> tuple[Tally, list[float], list[float], float]:
    """Request i is due at start + i/rate; a connection that is free takes the next due request (wrk2-style)."""
    total = max(1, int(rate * seconds))
    interval = 1.0 / rate
    tally = Tally()
    latencies: list[float] = []
    lags: list[float] = []
    cursor = 0
    start = time.perf_counter() + 0.05
    last_done = start

    async def drive(slot: int) -> None:
        nonlocal cursor, last_done
        while cursor < total:
            index = cursor
            cursor += 1
            payload = source.take()
            if payload is None:
                return
            due = start + index * interval
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter()
            lags.append(sent - due)
            try:
                status = await conns[slot].request(payload)
            except ConnectionError:
                latencies.append(math.inf)  # a failed request stays in the figures, as the worst latency
                conns[slot] = await reconnect(port, tally)
                continue
            done = time.perf_counter()
            tally.statuses[status] += 1
            latencies.append(done - due if status == 200 else math.inf)
            last_done = max(last_done, done)

    await asyncio.gather(*(drive(slot) for slot in range(len(conns))))
    achieved = tally.ok / (last_done - start) if last_done > start else 0.0
    return tally, latencies, lags, achieved


class Meter:
    """CPU seconds used by the servers and by this load generator over one timed window."""

    def __init__(self, children: dict[str, Proc]) -> None:
        self._children = children
        self._start: dict[str, float] = {}
        self._wall = 0.0

    def _sample(self) -> dict[str, float]:
        sample = {name: child.cpu_seconds() for name, child in self._children.items()}
        sample["load generator"] = time.process_time()
        return sample

    def begin(self) -> None:
        self._start, self._wall = self._sample(), time.perf_counter()

    def end(self) -> dict[str, float]:
        """Share of one core each process used since `begin` (1.0 = one full core)."""
        wall = time.perf_counter() - self._wall
        return {name: (used - self._start[name]) / wall for name, used in self._sample().items()}


def run_loop(coro: Coroutine[Any, Any, T], fast: bool) -> T:
    """uvloop where throughput matters; the stdlib loop for timed sends (its timers never fire early).

    uvloop's timers have 1 ms granularity and may fire up to ~1 ms early, which would make open-loop
    latencies look better than they are.
    """
    factory = None
    if fast:
        with contextlib.suppress(ImportError):
            import uvloop

            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


async def _capacity(
    port: int, source: Source, concurrency: int, warmup: float, seconds: float, meter: Meter
) -> CapacityResult:
    conns = [await connect(port) for _ in range(concurrency)]
    try:
        warm, _ = await _closed_loop(port, conns, source, warmup)
        meter.begin()
        tally, elapsed = await _closed_loop(port, conns, source, seconds)
        cpu = meter.end()
    finally:
        for conn in conns:
            conn.close()
    return CapacityResult(tally, warm, elapsed, source.exhausted, cpu)


async def _latency(
    port: int, source: Source, concurrency: int, rate: float, seconds: float, meter: Meter
) -> LatencyResult:
    conns = [await connect(port) for _ in range(concurrency)]
    try:
        meter.begin()
        tally, latencies, lags, achieved = await _open_loop(port, conns, source, rate, seconds)
        cpu = meter.end()
    finally:
        for conn in conns:
            conn.close()
    latencies.sort()
    lags.sort()
    return LatencyResult(tally, rate, achieved, latencies, lags, cpu)


def timed_phase(coro: Coroutine[Any, Any, T], limit_s: float, fast: bool) -> T:
    """Run one phase with a hard time limit, GC paused so that collections of the request pool do not stall sends."""

    gc.disable()
    try:
        return run_loop(interruptible(coro, limit_s), fast)
    except Stopped as exc:  # Ctrl-C reads as an interruption; SIGTERM/SIGHUP end the run with 128 + the signal
        if exc.signum == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(128 + exc.signum) from None
    finally:
        gc.enable()


# --------------------------------------------------------------------------- report


def gateway_outcomes(admin_url: str) -> dict[str, dict[str, float]]:
    """botgw_callbacks_total by platform, then outcome, from the gateway's /metrics (its admin listener)."""
    import httpx

    text = httpx.get(f"{admin_url}/metrics", timeout=5).text
    outcomes: dict[str, dict[str, float]] = {}
    for match in re.finditer(r"^botgw_callbacks_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        outcome = re.search(r'outcome="([^"]*)"', match.group(1))
        platform = re.search(r'platform="([^"]*)"', match.group(1))
        if outcome:
            counts = outcomes.setdefault(platform.group(1) if platform else "", {})
            counts[outcome.group(1)] = counts.get(outcome.group(1), 0.0) + float(match.group(2))
    return outcomes


def stats_key() -> str:
    """The scheduler's counters (`enqueued`, `handled`); imported here, not at module level (the bare server)."""
    from gateway.state.keys import Keys

    return Keys(NAMESPACE).scheduler_stats


def queue_enqueued(redis_client: Any) -> int:
    """Entries ever enqueued in the work queue: the scheduler's `enqueued` counter (no worker runs, none handled)."""
    return int(redis_client.hget(stats_key(), "enqueued") or 0)


def _cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {share * 100:.0f}%" for name, share in cpu.items() if not math.isnan(share))


# --------------------------------------------------------------------------- main


def _raise_exit(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


async def start_servers(stack: Stack) -> tuple[int, str, int, dict[str, Any], Any]:
    """redis-server (no persistence), the gateway (no worker) and the bare app; returns ports, config, redis."""
    import httpx
    import redis

    redis_port, gateway_port, bare_port = free_port(), free_port(), free_port()
    redis_child = stack.start_redis(redis_port)
    client = redis.Redis(port=redis_port)

    async def redis_up() -> bool:
        return bool(client.ping())

    await wait_ready(stack, redis_child, redis_up, START_TIMEOUT_S)
    config = gateway_config(f"redis://127.0.0.1:{redis_port}/0")
    config_path = stack.write_config(config, "gateway.yaml")
    serve, admin_url = gateway_args(config_path, gateway_port)
    gateway = stack.start("gateway", serve)
    bare = stack.start("bare", [sys.executable, str(Path(__file__).resolve()), "--bare-server", str(bare_port)])
    async with httpx.AsyncClient() as http:
        for child, port in ((gateway, gateway_port), (bare, bare_port)):
            url = f"http://127.0.0.1:{port}/healthz"
            await wait_ready(stack, child, lambda url=url: http_ok(http, url), START_TIMEOUT_S)
    return gateway_port, admin_url, bare_port, config, client


# Rows of the table: name -> (server process, callback kind). The gateway rows share one process, one at a time.
TARGETS: dict[str, tuple[str, str]] = {
    "bare": ("bare", "wecom"),
    "gateway": ("gateway", "wecom"),
    "gateway-dingtalk": ("gateway", "dingtalk"),
}
PLATFORM_OF = {"gateway": "wecom", "gateway-dingtalk": "dingtalk"}


def benchmark(args: argparse.Namespace, stack: Stack) -> int:
    """Both phases against every target, then the table; returns the exit code."""
    began = time.perf_counter()
    gateway_port, admin_url, bare_port, config, redis_client = asyncio.run(start_servers(stack))
    ports = {"bare": bare_port, "gateway": gateway_port}
    meters = {
        name: Meter({"server": stack.procs[server], "redis": stack.procs["redis"]})
        for name, (server, _) in TARGETS.items()
    }
    factories: dict[str, CallbackFactory | DingTalkCallbackFactory] = {
        "wecom": CallbackFactory(config["bots"][0], args.users),
        "dingtalk": DingTalkCallbackFactory(config["bots"][1], args.users),
    }

    pool_size = math.ceil((args.warmup + args.duration) * args.max_rate)
    t0 = time.perf_counter()
    pools = {kind: factory.build(pool_size) for kind, factory in factories.items()}
    gc.collect()
    gc.freeze()
    print(
        f"pre-built {pool_size} signed+encrypted WeCom callbacks and {pool_size} signed DingTalk callbacks in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    limit = args.warmup + args.duration + PHASE_GRACE_S
    capacity: dict[str, CapacityResult] = {}
    for name, (server, kind) in TARGETS.items():
        source = Source(pools[kind], unique=server == "gateway")
        print(f"phase 1 capacity: {name} ({args.concurrency} connections, {args.duration:g} s)...", flush=True)
        capacity[name] = timed_phase(
            _capacity(ports[server], source, args.concurrency, args.warmup, args.duration, meters[name]),
            limit,
            fast=True,
        )
    del pools
    gc.unfreeze()
    gc.collect()

    # Half of each kind's gateway capacity; the bare endpoint gets the WeCom rate, as before.
    rates = {
        kind: args.rate or max(1.0, round(capacity["gateway" if kind == "wecom" else "gateway-dingtalk"].rate / 2))
        for kind in factories
    }
    latency_pools = {
        kind: factory.build(math.ceil(rates[kind] * args.latency_duration) + 16) for kind, factory in factories.items()
    }
    gc.collect()
    gc.freeze()
    latency: dict[str, LatencyResult] = {}
    # The other order than phase 1's: what the machine does over time weighs on every server alike.
    for name, (server, kind) in reversed(TARGETS.items()):
        source = Source(latency_pools[kind], unique=server == "gateway")
        rate = rates[kind]
        print(f"phase 2 latency: {name} at {rate:.0f} req/s ({args.latency_duration:g} s)...", flush=True)
        latency[name] = timed_phase(
            _latency(ports[server], source, args.concurrency, rate, args.latency_duration, meters[name]),
            args.latency_duration + PHASE_GRACE_S,
            fast=False,
        )

    enqueued = queue_enqueued(redis_client)
    outcomes = gateway_outcomes(admin_url)
    return report(args, capacity, latency, enqueued, outcomes, time.perf_counter() - began)


def report(
    args: argparse.Namespace,
    capacity: dict[str, CapacityResult],
    latency: dict[str, LatencyResult],
    enqueued: int,
    outcomes: dict[str, dict[str, float]],
    wall_s: float,
) -> int:
    """Print the table and the checks; non-zero only if something broke (not for a missed goal)."""
    header = ["server", "capacity req/s", "non-200", "errors", "latency-test rate", "achieved", "p50 ms", "p90 ms"]
    header += ["p99 ms", "max ms"]
    rows: list[list[str]] = []
    for name in capacity:
        cap, lat = capacity[name], latency[name]
        non_200 = cap.warmup.non_200 + cap.tally.non_200 + lat.tally.non_200
        errors = cap.warmup.errors + cap.tally.errors + lat.tally.errors
        rows.append(
            [
                name,
                f"{cap.rate:.0f}",
                str(non_200),
                str(errors),
                f"{lat.rate:.0f}/s",
                f"{lat.achieved:.0f}/s",
                *(ms(percentile(lat.latencies, pct), 2) for pct in (50, 90, 99)),
                ms(lat.latencies[-1] if lat.latencies else math.nan, 2),
            ]
        )
    width = max(len(name) for name in capacity)
    print()
    print(f"botgw ingest benchmark ({os.cpu_count()} cores; generator, servers and redis share them)")
    print(
        f"closed loop: {args.concurrency} connections, {args.warmup:g} s warm-up + {args.duration:g} s; "
        f"open loop: {args.latency_duration:g} s at half the gateway's capacity for that platform; "
        f"{args.users} users"
    )
    print("bare and gateway: WeCom app callbacks (signed, AES-encrypted XML); gateway-dingtalk: DingTalk HTTP-mode")
    print("robot callbacks (signed headers, JSON) into the same gateway process; one row after the other")
    print()
    print(table(header, rows))
    print()
    for name in capacity:
        cap, lat = capacity[name], latency[name]
        print(f"CPU, capacity phase, {name:{width}}: {_cpu(cap.cpu)}  (100% = one core)")
        print(f"CPU, latency phase,  {name:{width}}: {_cpu(lat.cpu)}")
        print(
            f"generator send lag, {name:{width}}: p50 {ms(percentile(lat.lags, 50), 2)} ms, "
            f"p99 {ms(percentile(lat.lags, 99), 2)} ms (included in the latencies above)"
        )
    statuses = {name: dict(capacity[name].tally.statuses + latency[name].tally.statuses) for name in capacity}
    print(f"statuses (timed runs): {statuses}")
    exhausted = [name for name, cap in capacity.items() if cap.exhausted]
    if exhausted:
        print(f"note: the pre-built pool ran out for {exhausted}; raise --max-rate (rate is over the time run)")
    print(
        "note: the load generator is one Python process on the same 2 cores; the bare endpoint's rate is the "
        "ceiling of this setup, not of the gateway's hardware"
    )

    print()
    answered: dict[str, int] = {}
    queue_ok = True
    for name, platform in PLATFORM_OF.items():
        cap, lat = capacity[name], latency[name]
        answered[name] = cap.warmup.ok + cap.tally.ok + lat.tally.ok
        counts = outcomes.get(platform, {})
        accepted = int(counts.get("accepted", 0))
        others = {outcome: int(count) for outcome, count in counts.items() if outcome != "accepted" and count}
        platform_ok = accepted == answered[name] and not others
        queue_ok &= platform_ok
        print(
            f"outcome check, {platform:8}: gateway answered {answered[name]} x 200, outcomes accepted={accepted} "
            f"other={others or 0} -> {'OK' if platform_ok else 'MISMATCH'}"
        )
    total_ok = sum(answered.values())
    queue_ok &= enqueued == total_ok
    print(
        f"queue check: {stats_key()} counts {enqueued} enqueued, gateway answered {total_ok} x 200 "
        f"({' + '.join(str(count) for count in answered.values())}) -> {'OK' if queue_ok else 'MISMATCH'}"
    )
    bare_cap = capacity["bare"]
    for name, platform in PLATFORM_OF.items():
        ratio = capacity[name].rate / bare_cap.rate if bare_cap.rate else 0.0
        p99 = percentile(latency[name].latencies, 99)
        label = "" if name == "gateway" else f" ({platform}, same goals)"
        print(f"goal capacity{label}: {name}/bare = {ratio:.2f} (>= 0.50) -> {'PASS' if ratio >= 0.5 else 'FAIL'}")
        print(
            f"goal latency{label}:  {name} p99 at half load = {ms(p99, 2)} ms (< 20 ms) -> "
            f"{'PASS' if p99 < 0.020 else 'FAIL'}"
        )
    print(f"run time: {wall_s:.1f} s")

    broken = (
        not queue_ok
        or any(tally.errors or tally.non_200 for cap in capacity.values() for tally in (cap.warmup, cap.tally))
        or any(lat.tally.errors or lat.tally.non_200 for lat in latency.values())
    )
    if broken:
        print("RESULT: errors during the run (see above)", file=sys.stderr)
        return 1
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each capacity run (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds before each capacity run")
    parser.add_argument("--latency-duration", type=float, default=None, help="seconds of each latency run")
    parser.add_argument("--concurrency", type=int, default=48, help="keep-alive connections (default 48)")
    parser.add_argument("--users", type=int, default=1000, help="distinct WeCom user ids (default 1000)")
    parser.add_argument("--rate", type=float, default=None, help="latency-test rate (default: half gateway capacity)")
    parser.add_argument(
        "--max-rate", type=float, default=5000.0, help="the unique-callback pool is sized for this gateway rate"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs and config")
    parser.add_argument("--bare-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.latency_duration is None:
        args.latency_duration = args.duration
    if min(args.duration, args.latency_duration) <= 0 or args.warmup < 0 or args.concurrency < 1 or args.users < 1:
        parser.error("durations, --concurrency and --users must be positive")
    return args


def run(args: argparse.Namespace, stack: Stack) -> int:
    """The benchmark, its failures turned into one line on stderr and the exit code."""
    try:
        return benchmark(args, stack)
    except StartupError as exc:
        print(f"bench: a server failed to start: {exc}", file=sys.stderr)
    except TimeoutError:
        print("bench: a phase did not finish in time (server stalled?)", file=sys.stderr)
    except (ConnectionError, OSError) as exc:
        print(f"bench: connection failure: {exc!r}", file=sys.stderr)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        print(f"bench: stopped by a signal (exit {exc.code})", file=sys.stderr)
        raise
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bare_server:
        return serve_bare(args.bare_server)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    return run_in_stack("botgw-bench-", args.keep_logs, lambda stack: run(args, stack))


if __name__ == "__main__":
    sys.exit(main())
