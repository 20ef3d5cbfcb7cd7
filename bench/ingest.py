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
import base64
import contextlib
import ctypes
import gc
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast
from urllib.parse import urlencode

from fastapi import FastAPI, Request, Response

ROOT = Path(__file__).resolve().parent.parent
BOT_ID = "app"
DINGTALK_BOT_ID = "ding"
NAMESPACE = "bench"
START_TIMEOUT_S = 30.0
PHASE_GRACE_S = 30.0
PR_SET_PDEATHSIG = 1
MAX_ERRORS = 50
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
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
    """Run the bare app exactly as `botgw serve` runs the gateway (gateway/cli.py `_serve`)."""
    import uvicorn

    uvicorn.run(bare_app(), host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="on")
    return 0


# --------------------------------------------------------------------------- child processes


def _die_with_parent() -> None:
    """Children get SIGKILL if the benchmark itself is killed hard, so nothing is left listening."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Child:
    """A server process in its own session, output to a log file; stopped (group-wide) by `stop`."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")  # closed in stop()
        self.popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            if not self.alive():
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(wait)
        self._log.close()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """utime + stime of the process so far, from /proc (Linux)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return math.nan
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StartupError(RuntimeError):
    """A server did not come up; the message carries the tail of its log."""


def wait_until(child: Child, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not child.alive():
            raise StartupError(f"{child.name} exited with {child.popen.returncode}:\n{child.tail()}")
        with contextlib.suppress(Exception):
            if ready():
                return
        time.sleep(0.1)
    raise StartupError(f"{child.name} not ready after {START_TIMEOUT_S:.0f} s:\n{child.tail()}")


def http_ok(port: int, path: str = "/healthz") -> Callable[[], bool]:
    import httpx

    return lambda: httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2.0).status_code == 200


# --------------------------------------------------------------------------- config and pre-built callbacks


def random_aes_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def gateway_config(redis_url: str) -> dict[str, Any]:
    """One WeCom app and one DingTalk HTTP-mode robot; limits high enough never to throttle; WARNING logs."""
    api_base = f"http://127.0.0.1:{free_port()}"  # nothing listens: no worker runs, nothing is sent
    return {
        "redis_url": redis_url,
        "namespace": NAMESPACE,
        "log_level": "WARNING",
        "engine": {"base_url": f"http://127.0.0.1:{free_port()}", "model": "unused"},
        "limits": {"per_user": "1000000/minute", "http_per_source": "1000000/second"},
        "bots": [
            {
                "id": BOT_ID,
                "platform": "wecom",
                "corp_id": "wwbench" + secrets.token_hex(5),
                "agent_id": 1000002,
                "secret": secrets.token_urlsafe(24),
                "token": secrets.token_hex(8),
                "encoding_aes_key": random_aes_key(),
                "api_base": api_base,
            },
            {
                "id": DINGTALK_BOT_ID,
                "platform": "dingtalk",
                "mode": "http",
                "app_key": "dingbench" + secrets.token_hex(5),
                "app_secret": secrets.token_urlsafe(24),
                "api_base": api_base,
                "oapi_base": api_base,
            },
        ],
    }


class CallbackFactory:
    """Builds complete HTTP/1.1 requests (head + body), each a distinct message, so none is a dedup hit."""

    def __init__(self, bot_config: dict[str, Any], users: int) -> None:
        from bots.simulator.wecom_callback import WeComCallbackSigner
        from bots.wecom.config import WeComAppConfig

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
        from bots.simulator.dingtalk_user import robot_payload

        timestamp = str(int(time.time() * 1000))
        signature = sign(timestamp, self._bot.app_secret.get_secret_value())
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
            head = (
                f"POST /callback/{self._bot.id} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"timestamp: {timestamp}\r\nsign: {signature}\r\nContent-Length: {len(body)}\r\n\r\n"
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


# --------------------------------------------------------------------------- lean HTTP/1.1 client


class HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time; reads status and Content-Length only.

    httpx costs far more CPU per request than the bare server does, and on 2 cores that would measure the client.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            self._fail(ConnectionError("response without Content-Length"))
            return
        line_end = head.find(b"\r\n", at + 2)
        total = end + 4 + int(head[at + 17 : line_end if line_end >= 0 else len(head)])
        if len(self._buffer) < total:
            return
        del self._buffer[:total]
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(int(head[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(ConnectionError(f"connection closed: {exc}"))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def request(self, payload: bytes) -> asyncio.Future[int]:
        """Send one request; the future resolves to the response status."""
        if self.transport is None:
            raise ConnectionError("not connected")
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.transport.write(payload)
        return waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(port: int) -> HttpConnection:
    _, protocol = await asyncio.get_running_loop().create_connection(HttpConnection, "127.0.0.1", port)
    return protocol


# --------------------------------------------------------------------------- phases


@dataclass
class Tally:
    """Responses by status and transport errors of one run."""

    statuses: Counter[int] = field(default_factory=Counter)
    errors: int = 0

    @property
    def responses(self) -> int:
        return sum(self.statuses.values())

    @property
    def ok(self) -> int:
        return self.statuses[200]

    @property
    def non_200(self) -> int:
        return self.responses - self.ok


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
        return self.tally.responses / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class LatencyResult:
    """Phase 2 of one server: open-loop latencies (from scheduled send time) and the generator's own lag."""

    tally: Tally
    rate: float
    achieved: float
    latencies: list[float]
    lags: list[float]
    cpu: dict[str, float]


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (nan if empty)."""
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(pct / 100 * len(values)) - 1))]


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
            try:
                status = await conns[slot].request(payload)
            except ConnectionError:
                conns[slot] = await reconnect(port, tally)
                continue
            done = time.perf_counter()
            tally.statuses[status] += 1
            latencies.append(done - due)
            lags.append(sent - due)
            last_done = max(last_done, done)

    await asyncio.gather(*(drive(slot) for slot in range(len(conns))))
    achieved = tally.responses / (last_done - start) if last_done > start else 0.0
    return tally, latencies, lags, achieved


class Meter:
    """CPU seconds used by the servers and by this load generator over one timed window."""

    def __init__(self, children: dict[str, Child]) -> None:
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


async def _interruptible(coro: Coroutine[Any, Any, T], limit_s: float) -> T:
    """Ctrl-C / SIGTERM / SIGHUP cancel the phase from the loop, then end the run (children are stopped by main).

    A plain Python signal handler would raise inside whatever protocol callback is running, where the event
    loop reports and swallows it, and the run would go on.
    """
    loop = asyncio.get_running_loop()
    task = cast(asyncio.Task[T], asyncio.current_task())
    caught: list[int] = []
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}

    def stop(sig: int) -> None:
        caught.append(sig)
        task.cancel()

    for sig in saved:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await asyncio.wait_for(coro, limit_s)
    except asyncio.CancelledError:
        if not caught:
            raise
        if caught[0] == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(128 + caught[0]) from None
    finally:
        for sig, handler in saved.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


def timed_phase(coro: Coroutine[Any, Any, T], limit_s: float, fast: bool) -> T:
    """Run one phase with a hard time limit, GC paused so that collections of the request pool do not stall sends."""

    gc.disable()
    try:
        return run_loop(_interruptible(coro, limit_s), fast)
    finally:
        gc.enable()


# --------------------------------------------------------------------------- report


def gateway_outcomes(port: int) -> dict[str, dict[str, float]]:
    """botgw_callbacks_total by platform, then outcome, from the gateway's /metrics."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    outcomes: dict[str, dict[str, float]] = {}
    for match in re.finditer(r"^botgw_callbacks_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        outcome = re.search(r'outcome="([^"]*)"', match.group(1))
        platform = re.search(r'platform="([^"]*)"', match.group(1))
        if outcome:
            counts = outcomes.setdefault(platform.group(1) if platform else "", {})
            counts[outcome.group(1)] = counts.get(outcome.group(1), 0.0) + float(match.group(2))
    return outcomes


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 1000:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[col])) for row in [header, *rows]) for col in range(len(header))]
    line = "-+-".join("-" * width for width in widths)
    render = [" | ".join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    head = " | ".join(cell.rjust(width) for cell, width in zip(header, widths, strict=True))
    return "\n".join([head, line, *render])


def _cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {share * 100:.0f}%" for name, share in cpu.items() if not math.isnan(share))


# --------------------------------------------------------------------------- main


@dataclass
class Stack:
    """The processes of one run."""

    log_dir: Path
    children: dict[str, Child] = field(default_factory=dict)

    def start(self, name: str, args: list[str]) -> Child:
        child = Child(name, args, self.log_dir)
        self.children[name] = child
        return child

    def stop(self) -> None:
        for child in reversed(list(self.children.values())):
            child.stop()


def _raise_exit(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def start_servers(stack: Stack) -> tuple[int, int, dict[str, Any], Any]:
    """redis-server (no persistence), the gateway (no worker) and the bare app; returns ports, config, redis."""
    import redis
    import yaml

    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    redis_port, gateway_port, bare_port = free_port(), free_port(), free_port()
    redis_child = stack.start(
        "redis",
        [binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
    )
    client = redis.Redis(port=redis_port)
    wait_until(redis_child, lambda: bool(client.ping()))
    config = gateway_config(f"redis://127.0.0.1:{redis_port}/0")
    config_path = stack.log_dir / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    serve = ["serve", "--config", str(config_path), "--port", str(gateway_port)]
    gateway = stack.start("gateway", [sys.executable, "-m", "gateway.cli", *serve])
    bare = stack.start("bare", [sys.executable, str(Path(__file__).resolve()), "--bare-server", str(bare_port)])
    wait_until(gateway, http_ok(gateway_port))
    wait_until(bare, http_ok(bare_port))
    return gateway_port, bare_port, config, client


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
    gateway_port, bare_port, config, redis_client = start_servers(stack)
    ports = {"bare": bare_port, "gateway": gateway_port}
    meters = {
        name: Meter({"server": stack.children[server], "redis": stack.children["redis"]})
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
    for name, (server, kind) in TARGETS.items():
        source = Source(latency_pools[kind], unique=server == "gateway")
        rate = rates[kind]
        print(f"phase 2 latency: {name} at {rate:.0f} req/s ({args.latency_duration:g} s)...", flush=True)
        latency[name] = timed_phase(
            _latency(ports[server], source, args.concurrency, rate, args.latency_duration, meters[name]),
            args.latency_duration + PHASE_GRACE_S,
            fast=False,
        )

    xlen = int(redis_client.xlen(f"{NAMESPACE}:inbound"))
    outcomes = gateway_outcomes(gateway_port)
    return report(args, capacity, latency, xlen, outcomes, time.perf_counter() - began)


def report(
    args: argparse.Namespace,
    capacity: dict[str, CapacityResult],
    latency: dict[str, LatencyResult],
    xlen: int,
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
                *(_ms(percentile(lat.latencies, pct)) for pct in (50, 90, 99)),
                _ms(lat.latencies[-1] if lat.latencies else math.nan),
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
    print(_table(header, rows))
    print()
    for name in capacity:
        cap, lat = capacity[name], latency[name]
        print(f"CPU, capacity phase, {name:{width}}: {_cpu(cap.cpu)}  (100% = one core)")
        print(f"CPU, latency phase,  {name:{width}}: {_cpu(lat.cpu)}")
        print(
            f"generator send lag, {name:{width}}: p50 {_ms(percentile(lat.lags, 50))} ms, "
            f"p99 {_ms(percentile(lat.lags, 99))} ms (included in the latencies above)"
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
    xlen_ok = True
    for name, platform in PLATFORM_OF.items():
        cap, lat = capacity[name], latency[name]
        answered[name] = cap.warmup.ok + cap.tally.ok + lat.tally.ok
        counts = outcomes.get(platform, {})
        accepted = int(counts.get("accepted", 0))
        others = {outcome: int(count) for outcome, count in counts.items() if outcome != "accepted" and count}
        platform_ok = accepted == answered[name] and not others
        xlen_ok &= platform_ok
        print(
            f"outcome check, {platform:8}: gateway answered {answered[name]} x 200, outcomes accepted={accepted} "
            f"other={others or 0} -> {'OK' if platform_ok else 'MISMATCH'}"
        )
    total_ok = sum(answered.values())
    xlen_ok &= xlen == total_ok
    print(
        f"XLEN check: {NAMESPACE}:inbound has {xlen} entries, gateway answered {total_ok} x 200 "
        f"({' + '.join(str(count) for count in answered.values())}) -> {'OK' if xlen_ok else 'MISMATCH'}"
    )
    bare_cap = capacity["bare"]
    for name, platform in PLATFORM_OF.items():
        ratio = capacity[name].rate / bare_cap.rate if bare_cap.rate else 0.0
        p99 = percentile(latency[name].latencies, 99)
        label = "" if name == "gateway" else f" ({platform}, same goals)"
        print(f"goal capacity{label}: {name}/bare = {ratio:.2f} (>= 0.50) -> {'PASS' if ratio >= 0.5 else 'FAIL'}")
        print(
            f"goal latency{label}:  {name} p99 at half load = {_ms(p99)} ms (< 20 ms) -> "
            f"{'PASS' if p99 < 0.020 else 'FAIL'}"
        )
    print(f"run time: {wall_s:.1f} s")

    broken = (
        not xlen_ok
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bare_server:
        return serve_bare(args.bare_server)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    stack = Stack(Path(tempfile.mkdtemp(prefix="botgw-bench-")))
    code = 1
    try:
        code = benchmark(args, stack)
    except StartupError as exc:
        print(f"bench: a server failed to start: {exc}", file=sys.stderr)
    except TimeoutError:
        print("bench: a phase did not finish in time (server stalled?)", file=sys.stderr)
    except (ConnectionError, OSError) as exc:
        print(f"bench: connection failure: {exc!r}", file=sys.stderr)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        code = 130
    except SystemExit as exc:
        print(f"bench: stopped by a signal (exit {exc.code})", file=sys.stderr)
        raise
    finally:
        stack.stop()
        if code == 0 and not args.keep_logs:
            shutil.rmtree(stack.log_dir, ignore_errors=True)
        else:
            print(f"logs: {stack.log_dir}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
