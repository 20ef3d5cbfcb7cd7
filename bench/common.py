"""What every benchmark in bench/ needs beside testkit's stack: readiness, CPU meters, a lean HTTP client, run control,

One copy, so that a fix to how a benchmark starts, measures or stops its processes reaches all of them.
Only the standard library is imported at module level: `bench/ingest.py --bare-server` imports this module in the
bare server it measures, which should carry nothing it does not need.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from testkit.processes import CLK_TCK, Broken, Proc, stat_fields

if TYPE_CHECKING:
    import httpx

    from testkit.stacks import Stack

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
READY_POLL_S = 0.1
T = TypeVar("T")


class StartupError(Broken):
    """A server did not come up; the message carries the tail of its log."""


# --------------------------------------------------------------------------- processes
# The processes themselves are testkit's: `Stack` (testkit/stacks.py) starts, pins, stops and checks them, `Proc`
# (testkit/processes.py) is one of them.


async def wait_ready(stack: Stack, child: Proc, probe: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Poll `probe` until it answers True; raise StartupError after `timeout` or as soon as any child has died.

    Any exception from the probe means "not up yet" (connection refused, a half-started server).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stack.check_alive()
        except Broken as exc:
            raise StartupError(str(exc)) from None
        with contextlib.suppress(Exception):
            if await probe():
                return
        await asyncio.sleep(READY_POLL_S)
    raise StartupError(f"{child.name} not ready after {timeout:.0f} s:\n{child.tail()}")


async def http_ok(http: httpx.AsyncClient, url: str) -> bool:
    """Readiness probe: does `url` answer 200?"""
    return (await http.get(url, timeout=2)).status_code == 200


# --------------------------------------------------------------------------- CPU


def usage_by_session() -> dict[int, tuple[float, float]]:
    """(CPU seconds, run-queue wait seconds) of every live process, summed by session (vLLM's children count).

    The wait (schedstat: runnable but no core free) is what a process loses on a saturated 2-core machine; every
    sequential hop between processes pays it.
    """
    totals: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(Path(entry.path, "stat").read_text())
            total = totals[int(fields[3])]
            total[0] += (int(fields[11]) + int(fields[12])) / CLK_TCK
            for task in os.scandir(Path(entry.path, "task")):
                total[1] += int(Path(task.path, "schedstat").read_text().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return {session: (cpu, wait) for session, (cpu, wait) in totals.items()}


class CpuMeter:
    """CPU and run-queue wait seconds each process (tree) of a stack, and this one, used between two samples."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack

    def sample(self) -> dict[str, float]:
        """`name` -> CPU seconds, `name wait` -> run-queue wait seconds, so far."""
        sessions = usage_by_session()
        used: dict[str, float] = {}
        for name, proc in self._stack.procs.items():
            used[name], used[f"{name} wait"] = sessions.get(proc.pid, (math.nan, math.nan))
        # This process's session also holds the shell that started it, so count this process alone.
        used["bench"] = time.process_time()
        used["bench wait"] = math.nan
        with contextlib.suppress(OSError, ValueError, IndexError):
            tasks = os.scandir("/proc/self/task")
            used["bench wait"] = sum(int(Path(t.path, "schedstat").read_text().split()[1]) for t in tasks) / 1e9
        return used

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """What each process used since `before` (an earlier `sample()`)."""
        after = self.sample()
        return {name: after[name] - value for name, value in before.items()}


# --------------------------------------------------------------------------- Redis round trips

TRIPS_HOOK = Path(__file__).resolve().parent / "trips_hook"  # its sitecustomize.py counts a child's round trips


class RoundTrips:
    """Redis round trips of botgw processes between two samples, counted in the processes themselves by
    bench/trips_hook/sitecustomize.py (redis-py's asyncio sends), which answers on a Unix socket per process.

    `env(name, root)` is the environment of a child to count; `commands` also names the commands sent (some CPU);
    `parts` also times the parts of an answer (the hook's PARTS) in the process's event-loop thread."""

    def __init__(self, directory: Path, commands: bool = False, parts: bool = False) -> None:
        self._directory = directory
        self._commands = commands
        self._parts = parts
        self.names: list[str] = []

    def env(self, name: str, root: Path) -> dict[str, str]:
        """For the child `name` running botgw from `root`: the hook first on its path, then the tree."""
        self.names.append(name)
        env = {"PYTHONPATH": f"{TRIPS_HOOK}{os.pathsep}{root}", "BENCH_TRIPS_SOCKET": str(self._socket(name))}
        if self._parts:
            env["BENCH_PARTS"] = "1"
        return {**env, "BENCH_TRIPS_COMMANDS": "1"} if self._commands else env

    def _socket(self, name: str) -> Path:
        return self._directory / f"trips-{name}.sock"

    async def sample(self) -> dict[str, dict[str, Any]]:
        """`name` -> {"sends": round trips so far, "commands": {command: sends}}; absent if it does not answer."""
        counts: dict[str, dict[str, Any]] = {}
        for name in self.names:
            with contextlib.suppress(OSError, ValueError):
                reader, writer = await asyncio.open_unix_connection(str(self._socket(name)))
                counts[name] = json.loads(await reader.read())
                writer.close()
        return counts

    async def since(self, before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Round trips (and commands) of each process since `before`; a process missing in either sample is left out.
        With `parts`: "parts" {label: (CPU seconds, calls)} and "loop_s" (the event loop thread's CPU seconds)."""
        after = await self.sample()
        used = {}
        for name, then in before.items():
            if name in after:
                now = after[name]
                commands = Counter(now["commands"])
                commands.subtract(then["commands"])
                used[name] = {"sends": now["sends"] - then["sends"], "commands": +commands}
                if "parts" in now:
                    earlier = then.get("parts", {})
                    used[name]["parts"] = {
                        label: (seconds - earlier.get(label, (0.0, 0))[0], calls - earlier.get(label, (0.0, 0))[1])
                        for label, (seconds, calls) in now["parts"].items()
                    }
                    used[name]["loop_s"] = now["loop_s"] - then.get("loop_s", 0.0)
        return used


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
    """A fresh lean connection to 127.0.0.1:`port`."""
    _, protocol = await asyncio.get_running_loop().create_connection(HttpConnection, "127.0.0.1", port)
    return protocol


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


async def closed_loop(concurrency: int, total: int, one: Callable[[int], Awaitable[None]]) -> float:
    """`concurrency` clients, each starting the next of `total` items as soon as its last is done; wall seconds."""
    cursor = 0

    async def client() -> None:
        nonlocal cursor
        while cursor < total:
            index = cursor
            cursor += 1
            await one(index)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - start


async def vllm_histograms(http: httpx.AsyncClient, engine_url: str, *names: str) -> dict[str, float]:
    """`<name>_sum` and `<name>_count` of vLLM's own histograms (its /metrics), summed over label sets.

    vLLM's view of the same requests splits a request's time into inside and outside vLLM. Absent series are absent.
    """
    text = (await http.get(f"{engine_url}/metrics", timeout=10)).text
    values: dict[str, float] = {}
    pattern = rf"^vllm:({'|'.join(map(re.escape, names))})_(sum|count)\{{[^}}]*\}} (\S+)$"
    for match in re.finditer(pattern, text, re.MULTILINE):
        key = f"{match.group(1)}_{match.group(2)}"
        values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


# --------------------------------------------------------------------------- report


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (nan if empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))]


def ms(value: float, digits: int = 1) -> str:
    """Seconds as milliseconds for a table cell; n/a for nan (nothing measured)."""
    return "n/a" if math.isnan(value) else f"{value * 1000:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, every column right-aligned, for a terminal or a log."""
    widths = [max(len(row[col]) for row in [header, *rows]) for col in range(len(header))]
    lines = [" | ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    return "\n".join([lines[0], "-+-".join("-" * width for width in widths), *lines[1:]])


# --------------------------------------------------------------------------- run control


class Stopped(Exception):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) ended the run; `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


async def interruptible(coro: Awaitable[T], limit_s: float) -> T:
    """Await `coro` under a time limit (TimeoutError); SIGINT/SIGTERM/SIGHUP cancel it and raise Stopped.

    The handlers run in the event loop: a plain Python signal handler would raise inside whatever protocol callback
    is running, where the loop reports and swallows it, and the run would go on. Cancelling, rather than dying,
    lets the caller stop the children. Ignored signals (nohup) stay ignored; the previous handlers come back.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    caught: list[int] = []
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}

    def stop(sig: int) -> None:
        caught.append(sig)
        if task is not None:
            task.cancel()

    for sig in saved:
        loop.add_signal_handler(sig, stop, sig)
    try:
        async with asyncio.timeout(limit_s):
            return await coro
    except asyncio.CancelledError:
        if not caught:
            raise
        raise Stopped(caught[0]) from None
    finally:
        for sig, handler in saved.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


async def run_benchmark(
    benchmark: Awaitable[bool], time_limit: float, failures: tuple[type[Exception], ...] = ()
) -> int:
    """The exit code of `benchmark` (it returns True if something broke) under `--time-limit` and stop signals.

    A stop signal gives 128 + its number; a Broken, the time limit or one of `failures` (printed with its repr)
    gives 1, each with one line on stderr.
    """
    try:
        return 1 if await interruptible(benchmark, time_limit) else 0
    except Stopped as exc:
        print(f"bench: stopped by signal {exc.signum}", file=sys.stderr)
        return 128 + exc.signum
    except TimeoutError:
        print(f"bench: not finished within --time-limit {time_limit:.0f} s", file=sys.stderr)
        return 1
    except Broken as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except failures as exc:
        print(f"bench: {exc!r}", file=sys.stderr)
        return 1


def run_in_stack(
    prefix: str,
    keep_logs: bool,
    run: Callable[[Stack], int],
    log_dir: str | None = None,
    root: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """`run(stack)` with a fresh stack whose processes are stopped however it ends; logs are removed only on success,
    and never from a `log_dir` the caller named (the tests', which are read after the run). The stack runs botgw
    from the tree at `root` (default this one), with `env` added to its children's environment.

    A failed run keeps its logs and config (their directory is printed), which is where its reason is.
    """
    from testkit.processes import ROOT
    from testkit.stacks import Stack  # not at module level: the bare server of bench/ingest.py imports this module

    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    path = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=prefix))
    stack = Stack(log_dir=path, root=root or ROOT, env=dict(env or {}))
    code = 1
    try:
        code = run(stack)
    finally:
        stack.stop()
        if code == 0 and not keep_logs and not log_dir:
            shutil.rmtree(stack.log_dir, ignore_errors=True)
        else:
            print(f"logs: {stack.log_dir}", file=sys.stderr)
    return code


def main_async(
    args: argparse.Namespace,
    prefix: str,
    benchmark: Callable[[argparse.Namespace, Stack], Coroutine[Any, Any, bool]],
    failures: tuple[type[Exception], ...] = (),
    root: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """`main` of a benchmark with an async `benchmark(args, stack)` and the options --time-limit and --keep-logs;
    `root` and `env` as for `run_in_stack`."""

    def run(stack: Stack) -> int:
        return asyncio.run(run_benchmark(benchmark(args, stack), args.time_limit, failures))

    return run_in_stack(prefix, args.keep_logs, run, getattr(args, "log_dir", None), root, env)
