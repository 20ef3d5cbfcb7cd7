"""Overhead benchmark: one tiny vLLM engine asked directly vs through botgw (WeCom callback → delivered reply).

What does botgw cost in front of vLLM? Both paths use the same engine, the same prompts, the same max_tokens and
temperature 0, at the same closed-loop concurrency (1, 8, 32), run alternately (direct, then botgw, per round) so
that drift and other load on the machine hit both:

(a) direct: exactly the request the worker sends (system prompt + user text, streamed with usage), timed from the
    request's start to the last byte of the stream;
(b) botgw: a signed, encrypted WeCom callback POSTed to the gateway, timed from the POST's start to the moment the
    simulated WeCom recorded the delivered reply (its `at`; the simulator and this process share the clock).

Every botgw message comes from a fresh user, so there is no history and the prompt equals (a)'s. Completion of (b)
is learnt from Redis keyspace notifications on the message's reply record (pushed, so the closed loop does not wait
on a poll interval), with a slow poll of the simulator as a fallback; latencies and the one-reply-per-message check
come from the simulator's own records.

CPU per answered message: user+sys seconds of the botgw processes (gateway + worker), each with its children
(psutil if installed, else /proc/<pid>/stat, utime+stime of live descendants and cutime+cstime of reaped ones),
sampled around each botgw run and divided by the messages answered; the simulator's is printed separately.

`--pin on` runs the engine pinned to core 0 (`taskset -c 0`) and everything else (gateway, worker, simulator,
redis, and this load generator via os.sched_setaffinity) on core 1; `--pin both` runs the whole benchmark twice,
unpinned then pinned (a fresh stack each, so vLLM sizes its threads for the cores it is given), and prints the two
side by side.

Run: `.venv/bin/python bench/overhead.py [--requests 100 --rounds 2 --max-tokens 32 --levels 1,8,32 --pin off]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

# `python bench/overhead.py` puts bench/, not the project, on the path; `bench.common` needs the project.
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Broken,
    CpuMeter,
    RoundTrips,
    closed_loop,
    http_ok,
    main_async,
    ms,
    percentile,
    table,
    vllm_histograms,
    wait_ready,
)
from bots.base import InboundMessage
from bots.markdown import to_text
from bots.wecom.config import WeComAppConfig
from engine.client import sse_chunks
from gateway import texts
from gateway.state.keys import Keys
from simulator.replies import wecom_messages
from simulator.wecom.signer import WeComCallbackSigner
from testkit.configs import botgw_config, wecom_app
from testkit.processes import CLK_TCK, ROOT, free_port
from testkit.services import gateway_args, simulator_args, worker_args
from testkit.stacks import Stack

try:
    import psutil
except ImportError:  # not a dependency of botgw: /proc serves as well on Linux
    psutil = None

BOT_ID = "app"
NAMESPACE = "overhead"
MODEL = "ernie-tiny"
SYSTEM_PROMPT = "You are the company's helpful assistant. Answer briefly and politely."
PROMPTS = (
    "你好，请介绍一下你自己",
    "How do I reset my VPN password?",
    "明天下午三点的会议室还有空吗？",
    "Summarise the travel reimbursement policy in two sentences.",
    "请帮我写一封请假邮件，周五休息一天",
    "What is the difference between a process and a thread?",
    "报销发票抬头应该怎么写？",
    "Give me three ideas for the team offsite.",
    "打印机卡纸了怎么办",
    "Translate 'quarterly business review' into Chinese.",
    "新员工入职需要准备哪些材料？",
    "Explain what a Redis Stream consumer group is.",
    "公司年假怎么计算？",
    "Write a haiku about Monday mornings.",
    "怎么申请一台新的笔记本电脑？",
    "List the steps to book a meeting room in WeCom.",
)
ENGINE_START_S = 300.0
SERVER_START_S = 60.0
REQUEST_TIMEOUT_S = 120.0
FALLBACK_POLL_S = 0.5
SETTLE_S = 1.5
IDLE_S = 10.0  # the idle window in which the background's CPU is measured
MAX_ERRORS = 20
SAME_WORK_TOKEN_GAP = 0.02  # completion tokens per request may differ this much between the modes
SAME_WORK_REPLIES = 0.9  # at least this share of botgw replies must equal the direct reply to the same prompt
PROCESSES = ("engine", "gateway", "worker", "simulator", "redis", "bench")
BOTGW_SIDE = ("gateway", "worker", "simulator", "redis")
BOTGW_PROCS = ("gateway", "worker")  # botgw's own processes, for CPU per answered message
TRIPS_GOAL = 5  # Redis round trips per answered message (issue #22)
LATENCY_GOAL_S = 0.003  # added median latency at concurrency 1 (issue #22)
CPU_GOAL_MS = 3.0  # botgw CPU per answered message (issue #22)
ENGINE_CORE, OTHERS_CORE = 0, 1  # --pin: the engine alone on core 0, everything else on core 1


# --------------------------------------------------------------------------- configuration


def stack_config(redis_url: str, engine_url: str, sim_url: str, max_tokens: int, concurrency: int) -> dict[str, Any]:
    """As in production except: temperature 0, limits that never bite, enough worker and engine slots."""
    return botgw_config(
        redis_url,
        NAMESPACE,
        [wecom_app(BOT_ID, sim_url)],
        engine_config(engine_url, max_tokens, concurrency),
        system_prompt=SYSTEM_PROMPT,
        worker={"concurrency": concurrency},
    )


def engine_config(engine_url: str, max_tokens: int, slots: int) -> dict[str, Any]:
    """The tiny model at temperature 0 (replies comparable across modes and runs), `slots` requests in flight."""
    return {
        "base_url": engine_url,
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "max_in_flight": slots,
    }


def as_sent(reply: str) -> str:
    """A direct reply as the bench's WeCom app bot delivers it: the app answers in text (its adapter's default
    reply_format), so the model's Markdown is made readable (bots/markdown.py) before it is sent; comparing raw
    Markdown would count that as other work; an empty completion is answered with botgw's own text."""
    return to_text(reply) if reply.strip() else texts.EMPTY_ANSWER_TEXT


# --------------------------------------------------------------------------- the two clients


@dataclass
class Run:
    """One closed-loop run of one mode at one concurrency."""

    mode: str
    concurrency: int
    sent: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    acks: list[float] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # botgw: seconds per stage
    errors: list[str] = field(default_factory=list)
    replies: dict[int, str] = field(default_factory=dict)  # request index -> reply text
    tokens: int = 0
    engine_tokens: float = 0.0  # completion tokens vLLM generated during the run (its own counter), either mode
    engine_requests: float = 0.0  # requests vLLM finished during the run
    cpu: dict[str, float] = field(default_factory=dict)
    tree_cpu: dict[str, float] = field(default_factory=dict)  # user+sys of each process and its children
    trips: dict[str, int] = field(default_factory=dict)  # Redis round trips of each botgw process
    commands: Counter[str] = field(default_factory=Counter)  # what they sent (--trips-commands)
    parts: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)  # process -> part -> (s, calls)
    loop_s: dict[str, float] = field(default_factory=dict)  # process -> CPU of its event loop's thread (--parts)
    vllm_e2e: tuple[float, float] = (0.0, 0.0)  # sum of seconds, count

    def error(self, text: str) -> None:
        self.errors.append(text)
        if len(self.errors) > MAX_ERRORS:
            raise Broken(f"{self.mode} at concurrency {self.concurrency}: too many errors: {self.errors[:3]}")

    def failed(self, text: str) -> None:
        """A request that got no (single, 200) answer: an error, and an infinite latency in the figures (a failure
        is never dropped from them: it would make the percentiles look better the more requests fail)."""
        self.latencies.append(math.inf)
        self.error(text)

    @property
    def answered(self) -> int:
        """Requests answered (200, one reply): only these count as capacity."""
        return sum(1 for value in self.latencies if math.isfinite(value))


class Direct:
    """(a): the worker's request (engine/client.py `_stream`), sent straight to vLLM."""

    def __init__(self, http: httpx.AsyncClient, engine_url: str, max_tokens: int) -> None:
        self._http = http
        self._url = f"{engine_url}/v1/chat/completions"
        self._max_tokens = max_tokens

    def body(self, text: str) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}],
            "max_tokens": self._max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def run(self, run: Run, total: int) -> None:
        async def one(index: int) -> None:
            body = self.body(PROMPTS[index % len(PROMPTS)])
            parts: list[str] = []
            started = time.perf_counter()
            try:
                async with self._http.stream("POST", self._url, json=body) as response:
                    if response.status_code != 200:
                        run.failed(f"engine answered HTTP {response.status_code}")
                        return
                    async for chunk in sse_chunks(response):
                        if chunk.get("usage"):
                            run.tokens += int(chunk["usage"].get("completion_tokens", 0))
                        for choice in chunk.get("choices", []):
                            parts.append((choice.get("delta") or {}).get("content") or "")
            except httpx.HTTPError as exc:
                run.failed(f"engine request failed: {exc!r}")
                return
            run.latencies.append(time.perf_counter() - started)
            run.replies[index] = "".join(parts)

        run.sent = total
        run.elapsed = await closed_loop(run.concurrency, total, one)


@dataclass(frozen=True)
class Prepared:
    """A callback built before the clock starts: WeCom signs and encrypts on its own machines."""

    user: str
    params: dict[str, str]
    body: bytes
    reply_key: str


class Botgw:
    """(b): WeCom callbacks into the gateway; a reply counts when the simulated WeCom has recorded it."""

    def __init__(self, http: httpx.AsyncClient, redis: Redis, gateway_url: str, sim_url: str, bot: dict) -> None:
        self._http = http
        self._redis = redis
        self._callback_url = f"{gateway_url}/callback/{BOT_ID}"
        self._sim_url = sim_url
        self._signer = WeComCallbackSigner(WeComAppConfig(**bot))
        self._keys = Keys(NAMESPACE)
        self._pending: dict[str, asyncio.Future[None]] = {}  # reply key -> resolved when delivered
        self._pending_users: dict[str, str] = {}  # user -> reply key
        self._tasks: set[asyncio.Task[None]] = set()
        self._serial = 0
        self._pubsub: Any = None
        self._poll_since = 0.0
        self._detected: dict[str, float] = {}  # reply key -> when this process learnt of the delivery
        self.users: set[str] = set()
        self.seen_via: Counter[str] = Counter()

    async def start(self) -> None:
        """Listen for the reply records' changes (Redis runs with notify-keyspace-events Kh) and poll slowly."""
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.psubscribe(f"__keyspace@0__:{self._keys.reply('*')}")
        self._spawn(self._listen(self._pubsub))
        self._spawn(self._poll())

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _resolve(self, key: str, via: str) -> None:
        future = self._pending.get(key)
        if future is not None and not future.done():
            future.set_result(None)
            self.seen_via[via] += 1
            self._detected[key] = time.time()

    async def _listen(self, pubsub: Any) -> None:
        prefix = len("__keyspace@0__:")
        async for message in pubsub.listen():
            if message.get("type") != "pmessage":
                continue
            channel = message["channel"]
            key = (channel.decode() if isinstance(channel, bytes) else channel)[prefix:]
            if key in self._pending:
                self._spawn(self._check_sent(key))

    async def _check_sent(self, key: str) -> None:
        """Delivered once the worker has counted a piece as sent (one round trip earlier than `done`)."""
        with contextlib.suppress(Exception):
            if await self._redis.hget(key, "sent"):
                self._resolve(key, "redis notification")

    async def _poll(self) -> None:
        """Fallback should the reply record change name: whatever the simulator has delivered is done."""
        while True:
            await asyncio.sleep(FALLBACK_POLL_S)
            if not self._pending_users:
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError):
                for item in await self.delivered(self._poll_since):
                    key = self._pending_users.get(item["touser"])
                    if key:
                        self._resolve(key, "simulator poll")

    async def delivered(self, since: float) -> list[dict[str, Any]]:
        return await wecom_messages(self._http, self._sim_url, since=since)

    def prepare(self, total: int) -> list[Prepared]:
        prepared = []
        for index in range(total):
            self._serial += 1
            user = f"bench{self._serial:06d}"
            msg_id = str(secrets.randbits(63))
            callback = self._signer.text(user, PROMPTS[index % len(PROMPTS)], msg_id=msg_id)
            message = InboundMessage(
                platform="wecom", bot_id=BOT_ID, msg_id=msg_id, conversation_id=user, sender_id=user, text=""
            )
            prepared.append(Prepared(user, callback.params, callback.body, self._keys.reply(message.dedup_key)))
        return prepared

    async def run(self, run: Run, total: int) -> None:
        prepared = self.prepare(total)
        sent_at: dict[int, float] = {}
        acked_at: dict[int, float] = {}
        self._poll_since = time.time() - 1
        loop = asyncio.get_running_loop()

        async def one(index: int) -> None:
            item = prepared[index]
            done: asyncio.Future[None] = loop.create_future()
            self._pending[item.reply_key] = done
            self._pending_users[item.user] = item.reply_key
            self.users.add(item.user)
            try:
                sent_at[index] = time.time()
                started = time.perf_counter()
                try:
                    ack = await self._http.post(self._callback_url, params=item.params, content=item.body)
                except httpx.HTTPError as exc:
                    run.error(f"callback failed: {exc!r}")
                    return
                run.acks.append(time.perf_counter() - started)
                acked_at[index] = time.time()
                if ack.status_code != 200:
                    run.error(f"gateway answered HTTP {ack.status_code}: {ack.text[:200]}")
                    return
                try:
                    await asyncio.wait_for(done, REQUEST_TIMEOUT_S)
                except TimeoutError:
                    run.error(f"no reply to {item.user} within {REQUEST_TIMEOUT_S:.0f} s")
            finally:
                self._pending.pop(item.reply_key, None)
                self._pending_users.pop(item.user, None)

        run.sent = total
        run.elapsed = await closed_loop(run.concurrency, total, one)
        by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for delivered in await self.delivered(min(sent_at.values(), default=time.time()) - 1):
            by_user[delivered["touser"]].append(delivered)
        # When the worker stored the answer (right after the engine finished): splits the time in two.
        async with self._redis.pipeline(transaction=False) as pipe:
            for item in prepared:
                pipe.hget(item.reply_key, "created")
            created = [float(value) if value else math.nan for value in await pipe.execute()]
        for index, started_at in sent_at.items():
            item = prepared[index]
            replies = by_user.get(item.user, [])
            if len(replies) != 1:  # no reply (its callback failed, or it timed out), or a doubled one
                run.failed(f"{item.user} got {len(replies)} replies")
                continue
            delivered_at = replies[0]["at"]
            run.latencies.append(delivered_at - started_at)
            run.replies[index] = replies[0]["content"]
            if index in acked_at and not math.isnan(created[index]):
                run.stages["ack to answer stored"].append(created[index] - acked_at[index])
                run.stages["answer stored to delivered"].append(delivered_at - created[index])
            if item.reply_key in self._detected:
                run.stages["detection lag"].append(self._detected.pop(item.reply_key) - delivered_at)


# --------------------------------------------------------------------------- measuring


async def vllm_e2e(http: httpx.AsyncClient, engine_url: str) -> tuple[float, float]:
    """vLLM's own e2e request latency (sum, count), to split a request's time into inside and outside vLLM."""
    values = await vllm_histograms(http, engine_url, "e2e_request_latency_seconds")
    return values.get("e2e_request_latency_seconds_sum", 0.0), values.get("e2e_request_latency_seconds_count", 0.0)


def _proc_tree_cpu(roots: dict[str, int]) -> dict[str, float]:
    """/proc: name -> utime+stime+cutime+cstime summed over the root process and its live descendants, and
    name:sys -> the kernel's part of it (stime+cstime).

    cutime/cstime hold the CPU of children that have exited and been waited for, so nothing is counted twice.
    """
    own: dict[int, tuple[float, float]] = {}
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks = [int(value) for value in fields[11:15]]  # utime stime cutime cstime
            own[int(entry.name)] = (sum(ticks) / CLK_TCK, (ticks[1] + ticks[3]) / CLK_TCK)
            children[int(fields[1])].append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    used: dict[str, float] = {}
    for name, root in roots.items():
        if root not in own:
            used[name] = used[f"{name}:sys"] = math.nan
            continue
        total, kernel, todo, seen = 0.0, 0.0, [root], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            both, in_kernel = own.get(pid, (0.0, 0.0))
            total, kernel = total + both, kernel + in_kernel
            todo.extend(children.get(pid, ()))
        used[name], used[f"{name}:sys"] = total, kernel
    return used


def _psutil_tree_cpu(roots: dict[str, int]) -> dict[str, float]:
    """psutil: the same sum (user+system, and children_user+children_system of the reaped) as `_proc_tree_cpu`."""
    used: dict[str, float] = {}
    for name, root in roots.items():
        try:
            process = psutil.Process(root)
            total = kernel = 0.0
            for member in [process, *process.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = member.cpu_times()
                    total += times.user + times.system + times.children_user + times.children_system
                    kernel += times.system + times.children_system
            used[name], used[f"{name}:sys"] = total, kernel
        except psutil.NoSuchProcess:
            used[name] = used[f"{name}:sys"] = math.nan
    return used


class TreeCpuMeter:
    """user+sys CPU seconds of each child of a stack with all its descendants, between two samples."""

    source = "psutil" if psutil is not None else "/proc/<pid>/stat"

    def __init__(self, stack: Stack) -> None:
        self._stack = stack

    def sample(self) -> dict[str, float]:
        roots = {name: proc.pid for name, proc in self._stack.procs.items()}
        return _psutil_tree_cpu(roots) if psutil is not None else _proc_tree_cpu(roots)

    def since(self, before: dict[str, float]) -> dict[str, float]:
        after = self.sample()
        return {name: after.get(name, math.nan) - value for name, value in before.items()}


async def idle_background(meter: CpuMeter) -> dict[str, float]:
    """What each botgw process spends per second with nothing asked of it (lease renewals, sweeps, engine probes,
    the pulse): at concurrency 1 an answer takes a few hundred ms, so this background is charged to few answers."""
    before = meter.sample()
    await asyncio.sleep(IDLE_S)
    used = meter.since(before)
    rates = {name: used[name] / IDLE_S * 1000 for name in ("gateway", "worker", "simulator")}
    print("idle background, CPU ms per second: " + ", ".join(f"{n} {v:.2f}" for n, v in rates.items()), flush=True)
    return rates


def _profile_window(stack: Stack, sent: int) -> bool:
    """With BENCH_PROFILE and BENCH_PROFILE_WINDOW=1, open (SIGUSR1) or close (SIGUSR2) the gateway's and the
    worker's profile around a timed run (bench/trips_hook/sitecustomize.py), so start-up and warm-up stay out."""
    if not (os.environ.get("BENCH_PROFILE") and os.environ.get("BENCH_PROFILE_WINDOW") == "1"):
        return False
    for name in ("gateway", "worker"):
        if name in stack.procs:
            os.kill(stack.procs[name].pid, sent)
    return True


async def measured(
    run: Run,
    body: Awaitable[None],
    meter: CpuMeter,
    stack: Stack,
    http: httpx.AsyncClient,
    engine_url: str,
    trips: RoundTrips | None = None,
) -> Run:
    """Run one closed loop with CPU, Redis round trips and vLLM's e2e counters sampled around it."""
    tree = TreeCpuMeter(stack)
    e2e_before = await vllm_e2e(http, engine_url)
    tokens_before = await vllm_histograms(http, engine_url, "request_generation_tokens")
    trips_before = await trips.sample() if trips else {}
    cpu_before = meter.sample()
    tree_before = tree.sample()
    profiled = _profile_window(stack, signal.SIGUSR1)
    await body
    if profiled:
        _profile_window(stack, signal.SIGUSR2)
    run.tree_cpu = tree.since(tree_before)
    run.cpu = meter.since(cpu_before)
    if trips:
        for name, used in (await trips.since(trips_before)).items():
            run.trips[name] = used["sends"]
            run.commands.update(used["commands"])
            if "parts" in used:
                run.parts[name], run.loop_s[name] = used["parts"], used["loop_s"]
    e2e_after = await vllm_e2e(http, engine_url)
    tokens_after = await vllm_histograms(http, engine_url, "request_generation_tokens")
    run.vllm_e2e = (e2e_after[0] - e2e_before[0], e2e_after[1] - e2e_before[1])
    run.engine_tokens = tokens_after.get("request_generation_tokens_sum", 0.0) - tokens_before.get(
        "request_generation_tokens_sum", 0.0
    )
    run.engine_requests = tokens_after.get("request_generation_tokens_count", 0.0) - tokens_before.get(
        "request_generation_tokens_count", 0.0
    )
    stack.check_alive()
    return run


@dataclass
class Totals:
    """All rounds of one mode at one concurrency, pooled."""

    runs: list[Run]

    @property
    def completed(self) -> int:
        return sum(run.answered for run in self.runs)

    @property
    def rate(self) -> float:
        elapsed = sum(run.elapsed for run in self.runs)
        return self.completed / elapsed if elapsed > 0 else math.nan

    @property
    def latencies(self) -> list[float]:
        return [value for run in self.runs for value in run.latencies]

    @property
    def mean(self) -> float:
        values = self.latencies
        return sum(values) / len(values) if values else math.nan

    @property
    def vllm_mean(self) -> float:
        total, count = (sum(run.vllm_e2e[i] for run in self.runs) for i in (0, 1))
        return total / count if count else math.nan

    def stage(self, name: str) -> list[float]:
        if name == "ack":
            return [value for run in self.runs for value in run.acks]
        return [value for run in self.runs for value in run.stages.get(name, [])]

    def cpu(self, name: str) -> float:
        return sum(run.cpu.get(name, math.nan) for run in self.runs)

    def tree_cpu(self, name: str) -> float:
        return sum(run.tree_cpu.get(name, math.nan) for run in self.runs)

    def trips_per_answer(self, *names: str) -> float:
        """Redis round trips of the named processes per answered message (nan if not counted)."""
        sends = sum(run.trips.get(name, math.nan) for run in self.runs for name in names)
        return sends / self.completed if self.completed else math.nan

    def commands(self) -> Counter[str]:
        return sum((run.commands for run in self.runs), Counter())

    def ms_per_answer(self, *names: str) -> float:
        """CPU milliseconds of the named processes (with their children) per answered message."""
        return sum(self.tree_cpu(name) for name in names) / self.completed * 1000 if self.completed else math.nan


# --------------------------------------------------------------------------- report


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _ratio(modes: dict[str, Totals]) -> float:
    direct = modes["direct"].rate
    return modes["botgw"].rate / direct if direct > 0 else math.nan


def report(
    args: argparse.Namespace,
    results: dict[int, dict[str, Totals]],
    botgw: Botgw,
    check: dict[str, Any],
    wall: float,
    pinned: bool = False,
) -> bool:
    """Print the tables, the goals and the checks; returns True if something broke."""
    print()
    print(
        f"botgw overhead: {MODEL} on vLLM CPU, {os.cpu_count()} cores shared by everything; max_tokens "
        f"{args.max_tokens}, temperature 0; closed loop, {args.rounds} round(s) per level of max({args.requests}, "
        "4 x concurrency) requests per mode, direct then botgw"
    )
    print(f"placement: {placement(pinned)}")
    print()
    rows = []
    for level, modes in results.items():
        direct, via = modes["direct"], modes["botgw"]
        rows.append(
            [
                str(level),
                f"{direct.completed}/{via.completed}",
                f"{direct.rate:.2f}",
                f"{via.rate:.2f}",
                f"{_ratio(modes):.3f}",
                f"{ms(percentile(direct.latencies, 50))}/{ms(percentile(direct.latencies, 99))}",
                f"{ms(percentile(via.latencies, 50))}/{ms(percentile(via.latencies, 99))}",
                ms(percentile(via.latencies, 50) - percentile(direct.latencies, 50)),
            ]
        )
    header = ["concurrency", "done d/b", "direct req/s", "botgw req/s", "throughput ratio"]
    header += ["direct p50/p99 ms", "botgw p50/p99 ms", "added p50 ms"]
    print(table(header, rows))

    print()
    print("where the time goes (means, ms):")
    print("  direct, botgw: end to end; in vLLM: vLLM's own e2e request latency (engine core, its /metrics)")
    print("  ack: callback POST round trip; ack->stored: queue, worker, /tokenize, engine, until the answer is stored")
    print("  stored->sent: reply record, token, message/send; added = (botgw - its vLLM) - (direct - its vLLM)")
    print("  detect lag p50: delivery -> this client knowing (it holds back the closed loop's next request)")
    rows = []
    for level, modes in results.items():
        direct, via = modes["direct"], modes["botgw"]
        added = (via.mean - via.vllm_mean) - (direct.mean - direct.vllm_mean)
        rows.append(
            [
                str(level),
                ms(direct.mean),
                ms(direct.vllm_mean),
                ms(via.mean),
                ms(_mean(via.stage("ack")), 2),
                ms(_mean(via.stage("ack to answer stored"))),
                ms(_mean(via.stage("answer stored to delivered")), 2),
                ms(via.vllm_mean),
                ms(added),
                ms(percentile(via.stage("detection lag"), 50), 2),
            ]
        )
    header = ["concurrency", "direct", "in vLLM", "botgw", "ack", "ack->stored", "stored->sent", "in vLLM"]
    header += ["added outside vLLM", "detect lag p50"]
    print(table(header, rows))

    print()
    captions = (
        ("CPU seconds", ""),
        ("run-queue wait seconds (runnable, no core free; summed over threads, not all on a request's path)", " wait"),
    )
    for what, suffix in captions:
        print(f"{what} per process during the timed runs; ms/req = per request or message")
        rows = []
        for level, modes in results.items():
            for mode, totals in modes.items():
                wall_s = sum(run.elapsed for run in totals.runs)
                done = max(1, totals.completed)
                side = sum(totals.cpu(name + suffix) for name in BOTGW_SIDE)
                rows.append(
                    [
                        str(level),
                        mode,
                        f"{wall_s:.1f}",
                        *(f"{totals.cpu(name + suffix):.2f}" for name in PROCESSES),
                        f"{totals.cpu('engine' + suffix) / done * 1000:.0f}",
                        f"{side / done * 1000:.1f}" if mode == "botgw" else "-",
                        f"{side / wall_s * 100:.0f}%" if mode == "botgw" else "-",
                    ]
                )
        header = ["concurrency", "mode", "wall s", *PROCESSES, "engine ms/req", "botgw procs ms/msg", "per wall s"]
        print(table(header, rows))
        print()
    print(
        "CPU per answered message (botgw mode; user+sys of each process with its children, from "
        f"{TreeCpuMeter.source}): botgw = gateway + worker; the simulator (WeCom's side) is not botgw, shown apart"
    )
    rows = []
    for level, modes in results.items():
        via = modes["botgw"]
        rows.append(
            [
                str(level),
                str(via.completed),
                *(f"{via.ms_per_answer(name):.2f}" for name in BOTGW_PROCS),
                f"{via.ms_per_answer(*BOTGW_PROCS):.2f}",
                f"{via.ms_per_answer('simulator'):.2f}",
            ]
        )
    header = ["concurrency", "answered", *(f"{name} ms/answer" for name in BOTGW_PROCS), "botgw ms/answer"]
    header += ["simulator ms/answer"]
    print(table(header, rows))
    for level, modes in results.items():
        kernel = modes["botgw"].ms_per_answer(*(f"{name}:sys" for name in BOTGW_PROCS))
        print(f"of which in the kernel (sys: sockets, loopback, epoll) at concurrency {level}: {kernel:.2f} ms")
    for level, modes in results.items():
        cpu = modes["botgw"].ms_per_answer(*BOTGW_PROCS)
        verdict = "PASS" if cpu <= CPU_GOAL_MS else "FAIL"
        print(f"goal botgw CPU per answer <= {CPU_GOAL_MS:g} ms at concurrency {level}: {cpu:.2f} ms -> {verdict}")
    print()
    print(
        "note: on 2 cores the gateway, worker, simulator and redis (and this client) take CPU from vLLM (its API "
        "server, engine core and worker processes, counted together as 'engine'), and every sequential hop between "
        "processes waits for a free core (run-queue wait); direct has one hop per request, botgw more than a dozen. "
        "Other jobs on the machine disturb both modes: compare rounds and runs before trusting small differences."
    )

    print()
    broken = False
    ratio_levels = [level for level in (8, 32) if level in results]
    for level in ratio_levels:
        ratio = _ratio(results[level])
        verdict = "PASS" if ratio >= 0.97 else "FAIL"
        print(f"goal throughput ratio >= 0.97 at concurrency {level}: {ratio:.3f} -> {verdict}")
    for level, modes in results.items():
        added = percentile(modes["botgw"].latencies, 50) - percentile(modes["direct"].latencies, 50)
        verdict = "PASS" if added < LATENCY_GOAL_S else "FAIL"
        print(f"goal added median latency < {LATENCY_GOAL_S * 1000:g} ms at concurrency {level}: {ms(added)} ms"
              f" -> {verdict}")
    print("(for reference: LiteLLM documents 3.25 ms of added latency for itself, Bifrost 0.44 ms)")
    print_trips(args, results)
    print_parts(results)

    print()
    errors = [
        (level, mode, run.errors)
        for level, modes in results.items()
        for mode, totals in modes.items()
        for run in totals.runs
        if run.errors
    ]
    for level, mode, run_errors in errors:
        print(f"errors, {mode} at concurrency {level}: {len(run_errors)}, e.g. {run_errors[0]}")
    broken |= bool(errors)
    counted = check["counts"]
    exact = sum(1 for user in botgw.users if counted.get(user, 0) == 1)
    wrong = {user: counted.get(user, 0) for user in botgw.users if counted.get(user, 0) != 1}
    strangers = sorted(set(counted) - botgw.users)
    ok = not wrong and not strangers
    print(
        f"reply count check: {len(botgw.users)} botgw messages (warm-up included), {exact} with exactly one reply, "
        f"{len(wrong)} without, {len(strangers)} unknown recipients -> {'OK' if ok else 'MISMATCH'}"
    )
    if wrong:
        print(f"  e.g. {dict(list(wrong.items())[:5])}")
    broken |= not ok
    same = total = 0
    generated = {"direct": [0.0, 0.0], "botgw": [0.0, 0.0]}  # vLLM's completion tokens and requests, per mode
    for modes in results.values():
        for direct_run, via_run in zip(modes["direct"].runs, modes["botgw"].runs, strict=True):
            for mode, run in (("direct", direct_run), ("botgw", via_run)):
                generated[mode][0] += run.engine_tokens
                generated[mode][1] += run.engine_requests
            for index, text in via_run.replies.items():
                if index in direct_run.replies:
                    total += 1
                    same += text == as_sent(direct_run.replies[index])
    per_request = {mode: tokens / count if count else math.nan for mode, (tokens, count) in generated.items()}
    token_gap = abs(per_request["botgw"] / per_request["direct"] - 1) if per_request["direct"] else math.nan
    same_share = same / total if total else math.nan
    same_ok = token_gap <= SAME_WORK_TOKEN_GAP and same_share >= SAME_WORK_REPLIES
    print(
        f"same work: vLLM generated {per_request['direct']:.1f} completion tokens per direct request and "
        f"{per_request['botgw']:.1f} per botgw request (max_tokens {args.max_tokens}; gap {token_gap:.1%}, "
        f"allowed {SAME_WORK_TOKEN_GAP:.0%}); {same} of {total} botgw replies equal the direct reply to the same "
        f"prompt ({same_share:.0%}, at least {SAME_WORK_REPLIES:.0%} wanted: temperature 0, batching on CPU can "
        f"change a few) -> {'OK' if same_ok else 'MISMATCH: the two modes did not do the same work'}"
    )
    broken |= not same_ok
    print(f"botgw completion learnt via: {dict(botgw.seen_via)}")
    print(f"run time: {wall:.0f} s")
    return broken


def print_trips(args: argparse.Namespace, results: dict[int, dict[str, Totals]]) -> None:
    """Redis round trips per answered message, per botgw process and in all (the goal: at most TRIPS_GOAL)."""
    if not args.trips:
        return
    print()
    print(
        "Redis round trips per answered message (botgw mode; counted in the processes: one per request written, a "
        "pipeline or MULTI/EXEC one; background work such as leases and heartbeats included)"
    )
    rows = []
    for level, modes in results.items():
        via = modes["botgw"]
        counts = [via.trips_per_answer(name) for name in BOTGW_PROCS]
        rows.append([str(level), str(via.completed), *(f"{value:.2f}" for value in counts), f"{sum(counts):.2f}"])
    header = ["concurrency", "answered", *(f"{name} trips/answer" for name in BOTGW_PROCS), "botgw trips/answer"]
    print(table(header, rows))
    for level, modes in results.items():
        total = modes["botgw"].trips_per_answer(*BOTGW_PROCS)
        verdict = "PASS" if total <= TRIPS_GOAL else "FAIL"
        print(f"goal Redis round trips per answer <= {TRIPS_GOAL} at concurrency {level}: {total:.2f} -> {verdict}")
    if args.trips_commands:
        commands = sum((modes["botgw"].commands() for modes in results.values()), Counter())
        answered = sum(modes["botgw"].completed for modes in results.values())
        print(f"commands sent most (gateway + worker, all levels), per answered message of {answered}:")
        for name, count in commands.most_common(args.trips_commands):
            print(f"  {count / max(1, answered):7.2f}  {name}")


# (process, label, parent label or "" for the process's whole loop): the hook's PARTS, as nested in the code
PART_ROWS = [
    ("gateway", "callback", ""),
    ("gateway", "enqueue", "callback"),
    ("worker", "answer", ""),
    ("worker", "record + memory load", "answer"),
    ("worker", "engine call", "answer"),
    ("worker", "piece begin mark", "answer"),
    ("worker", "platform API calls", "answer"),
    ("worker", "release", "answer"),
]


def print_parts(results: dict[int, dict[str, Totals]]) -> None:
    """--parts: where the CPU of an answer goes at concurrency 1 (bench/trips_hook/sitecustomize.py's PARTS)."""
    if 1 not in results or not any(run.parts for run in results[1]["botgw"].runs):
        return
    runs = [run for run in results[1]["botgw"].runs if run.parts]
    answered = sum(run.answered for run in runs)

    def per_answer(process: str, label: str) -> tuple[float, float]:
        seconds = sum(run.parts.get(process, {}).get(label, (0.0, 0))[0] for run in runs)
        calls = sum(run.parts.get(process, {}).get(label, (0.0, 0))[1] for run in runs)
        return seconds * 1000 / max(1, answered), calls / max(1, answered)

    print()
    print(
        "CPU per answer by part at concurrency 1 (--parts): ms of each process's event-loop thread while the part ran, "
        "its waits included (at concurrency 1 only the background runs meanwhile); 'rest' is the parent's CPU outside "
        "the parts named under it"
    )
    rows = []
    for process in BOTGW_PROCS:
        whole = sum(run.loop_s.get(process, 0.0) for run in runs) * 1000 / max(1, answered)
        named = {label: per_answer(process, label) for proc, label, _ in PART_ROWS if proc == process}
        rows.append([process, "whole event-loop thread", f"{whole:.3f}", ""])
        for proc, label, parent in PART_ROWS:
            if proc != process:
                continue
            indent = "  " if parent else ""
            rows.append([process, f"{indent}{label}", f"{named[label][0]:.3f}", f"{named[label][1]:.2f}"])
        for parent in {parent for proc, _, parent in PART_ROWS if proc == process} - {""}:
            inner = sum(named[label][0] for proc, label, up in PART_ROWS if proc == process and up == parent)
            rows.append([process, f"  rest of {parent}", f"{named[parent][0] - inner:.3f}", ""])
        top = sum(named[label][0] for proc, label, up in PART_ROWS if proc == process and not up)
        rows.append([process, "outside the parts (HTTP server or take; background)", f"{whole - top:.3f}", ""])
    print(table(["process", "part", "ms/answer", "calls/answer"], rows))


def affinities(stack: Stack) -> str:
    """The cores each child (its session's processes, e.g. vLLM's engine core) and this process may run on."""
    sessions: dict[int, set[int]] = defaultdict(set)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(entry.path, "stat").read_text()
            session = int(stat[stat.rindex(")") + 2 :].split()[3])
            sessions[session] |= os.sched_getaffinity(int(entry.name))
    parts = [f"{name} {sorted(sessions.get(proc.pid, set()))}" for name, proc in stack.procs.items()]
    return ", ".join([*parts, f"bench {sorted(os.sched_getaffinity(0))}"])


def compare(outcomes: dict[bool, dict[int, dict[str, Totals]]]) -> None:
    """`--pin both`: the unpinned and the pinned run side by side (unpinned / pinned in each cell)."""
    off, on = outcomes[False], outcomes[True]

    def pair(values: tuple[float, float], digits: int) -> str:
        return " / ".join("n/a" if math.isnan(value) else f"{value:.{digits}f}" for value in values)

    rows = []
    for level in off:
        if level not in on:
            continue
        runs = (off[level], on[level])
        added = tuple(
            (percentile(modes["botgw"].latencies, 50) - percentile(modes["direct"].latencies, 50)) * 1000
            for modes in runs
        )
        rows.append(
            [
                str(level),
                pair(tuple(modes["direct"].rate for modes in runs), 2),
                pair(tuple(modes["botgw"].rate for modes in runs), 2),
                pair(tuple(_ratio(modes) for modes in runs), 3),
                pair(added, 1),
                pair(tuple(modes["botgw"].ms_per_answer(*BOTGW_PROCS) for modes in runs), 2),
                pair(tuple(modes["botgw"].ms_per_answer("simulator") for modes in runs), 2),
            ]
        )
    print()
    print(
        f"unpinned vs pinned (engine on core {ENGINE_CORE}, everything else on core {OTHERS_CORE}): unpinned / pinned"
    )
    header = ["concurrency", "direct req/s", "botgw req/s", "throughput ratio", "added p50 ms"]
    header += ["botgw CPU ms/answer", "simulator CPU ms/answer"]
    print(table(header, rows))


# --------------------------------------------------------------------------- main


def placement(pinned: bool) -> str:
    if pinned:
        return (
            f"pinned: the engine on core {ENGINE_CORE} (taskset -c {ENGINE_CORE}); gateway, worker, simulator, redis "
            f"and this client on core {OTHERS_CORE}"
        )
    return "unpinned: every process may run on any core"


def set_affinity(cores: set[int]) -> None:
    """Every thread of this process on `cores`; children started afterwards inherit it."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), cores)


async def benchmark(
    args: argparse.Namespace,
    stack: Stack,
    pinned: bool = False,
    outcomes: dict[bool, dict[int, dict[str, Totals]]] | None = None,
) -> bool:
    """One whole run on a fresh stack; with `pinned`, this process and what it starts on core 1, the engine on 0."""
    cores = os.sched_getaffinity(0)
    if pinned:
        set_affinity({OTHERS_CORE})
    try:
        return await _benchmark(args, stack, pinned, outcomes if outcomes is not None else {})
    finally:
        if pinned:
            set_affinity(cores)


async def _benchmark(
    args: argparse.Namespace, stack: Stack, pinned: bool, outcomes: dict[bool, dict[int, dict[str, Totals]]]
) -> bool:
    began = time.perf_counter()
    levels: list[int] = args.levels
    slots = max(32, *levels)
    ports = {name: free_port() for name in ("redis", "engine", "simulator", "gateway")}
    engine_url, sim_url = f"http://127.0.0.1:{ports['engine']}", f"http://127.0.0.1:{ports['simulator']}"
    gateway_url, redis_url = f"http://127.0.0.1:{ports['gateway']}", f"redis://127.0.0.1:{ports['redis']}/0"

    stack.start_redis(ports["redis"], "--notify-keyspace-events", "Kh")
    # The others inherit core 1 from this process.
    stack.start_engine(ports["engine"], cores=str(ENGINE_CORE) if pinned else "", vllm_args=tuple(args.engine_arg))
    config = stack_config(redis_url, engine_url, sim_url, args.max_tokens, slots)
    path = stack.write_config(config)
    tree = {"PYTHONPATH": str(stack.root)}  # botgw from the stack's tree (another revision's, with --compare)
    stack.start("simulator", simulator_args(path, ports["simulator"]), tree)
    serve, admin_url = gateway_args(path, ports["gateway"])
    round_trips = RoundTrips(stack.log_dir, commands=args.trips_commands > 0, parts=args.parts)
    for name, command in (("gateway", serve), ("worker", worker_args(path, "bench-worker"))):
        stack.start(name, command, round_trips.env(name, stack.root) if args.trips else tree)

    # Idle connections are dropped before uvicorn's 5 s keep-alive timeout closes them under us (a ReadError).
    limits = httpx.Limits(max_connections=slots + 8, max_keepalive_connections=slots + 8, keepalive_expiry=2.0)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    redis = Redis.from_url(redis_url)
    async with (
        httpx.AsyncClient(timeout=timeout, limits=limits) as engine_http,
        httpx.AsyncClient(timeout=timeout, limits=limits) as botgw_http,
    ):

        def ok(url: str) -> Awaitable[bool]:
            return http_ok(botgw_http, url)

        children = stack.procs
        await wait_ready(stack, children["simulator"], lambda: ok(f"{sim_url}/__sim__/healthz"), SERVER_START_S)
        await wait_ready(stack, children["gateway"], lambda: ok(f"{gateway_url}/healthz"), SERVER_START_S)
        print(f"servers up; waiting for the engine (logs in {stack.log_dir}) ...", flush=True)
        await wait_ready(stack, children["engine"], lambda: ok(f"{engine_url}/health"), ENGINE_START_S)
        await wait_ready(stack, children["gateway"], lambda: ok(f"{admin_url}/readyz"), SERVER_START_S)
        print(f"engine ready after {time.perf_counter() - began:.0f} s", flush=True)
        if pinned:
            print(f"affinity: {affinities(stack)}", flush=True)

        direct = Direct(engine_http, engine_url, args.max_tokens)
        botgw = Botgw(botgw_http, redis, gateway_url, sim_url, config["bots"][0])
        await botgw.start()
        meter = CpuMeter(stack)
        trips = round_trips if args.trips else None
        try:
            warm = max(levels)
            print(f"warm-up: {args.warmup} requests per mode at concurrency {warm} ...", flush=True)
            for client in (direct, botgw):
                run = Run("warm-up", warm)
                await client.run(run, args.warmup)
                if run.errors:
                    raise Broken(f"warm-up failed: {run.errors[:3]}")

            await idle_background(meter)
            results: dict[int, dict[str, Totals]] = {}
            for level in levels:
                total = max(args.requests, 4 * level)
                results[level] = {"direct": Totals([]), "botgw": Totals([])}
                for round_no in range(1, args.rounds + 1):
                    # The order alternates: whatever the machine does over time (a cache warming, a thermal
                    # drift) weighs on both modes alike.
                    order = [("direct", direct), ("botgw", botgw)]
                    for mode, client in order if round_no % 2 else order[::-1]:
                        run = Run(mode, level)
                        await measured(run, client.run(run, total), meter, stack, engine_http, engine_url, trips)
                        results[level][mode].runs.append(run)
                        print(
                            f"  concurrency {level:>2}, round {round_no}, {mode:6}: {run.answered}/{total} in "
                            f"{run.elapsed:.1f} s = {run.answered / run.elapsed:.2f} req/s, "
                            f"p50 {ms(percentile(run.latencies, 50))} ms",
                            flush=True,
                        )
            await asyncio.sleep(SETTLE_S)  # a late duplicate would show up in the count check
            counts = Counter(item["touser"] for item in await botgw.delivered(0.0))
        finally:
            await botgw.aclose()
            await redis.aclose()
    outcomes[pinned] = results
    return report(args, results, botgw, {"counts": counts}, time.perf_counter() - began, pinned)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--levels", default="1,8,32", help="concurrency levels, comma-separated (default 1,8,32)")
    parser.add_argument("--requests", type=int, default=100, help="requests per run: max(this, 4 x concurrency)")
    parser.add_argument("--rounds", type=int, default=2, help="direct+botgw rounds per level (default 2)")
    parser.add_argument("--max-tokens", type=int, default=32, help="engine.max_tokens, also for direct (default 32)")
    parser.add_argument("--warmup", type=int, default=32, help="warm-up requests per mode (default 32)")
    parser.add_argument("--time-limit", type=float, default=360.0, help="stop and fail after this many seconds")
    parser.add_argument("--engine-arg", action="append", default=[], help="extra vLLM flag (repeatable)")
    parser.add_argument(
        "--pin",
        choices=("off", "on", "both"),
        default="off",
        help=f"on: the engine on core {ENGINE_CORE}, everything else on core {OTHERS_CORE}; both: a run of each",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs and config")
    parser.add_argument(
        "--no-trips",
        dest="trips",
        action="store_false",
        help="do not count Redis round trips in the gateway and the worker (bench/trips_hook/sitecustomize.py)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="also time the parts of an answer in the gateway and the worker, printed for concurrency 1 (with trips)",
    )
    parser.add_argument(
        "--trips-commands", type=int, default=0, metavar="N", help="also print the N commands sent most (some CPU)"
    )
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="run the benchmark against botgw at git revision REV (exported to a temporary directory), then against "
        "this tree, and print the two side by side",
    )
    args = parser.parse_args(argv)
    if args.compare and args.pin == "both":
        parser.error("--compare runs one placement: --pin off or on")
    if args.pin != "off":
        if not shutil.which("taskset"):
            parser.error("--pin needs taskset (util-linux)")
        if not {ENGINE_CORE, OTHERS_CORE} <= os.sched_getaffinity(0):
            parser.error(
                f"--pin needs cores {ENGINE_CORE} and {OTHERS_CORE}; "
                f"this process may use {sorted(os.sched_getaffinity(0))}"
            )
    try:
        args.levels = [int(level) for level in args.levels.split(",") if level.strip()]
    except ValueError:
        parser.error("--levels takes integers, e.g. 1,8,32")
    if not args.levels or min(args.levels) < 1 or min(args.requests, args.rounds, args.max_tokens, args.warmup) < 1:
        parser.error("levels, --requests, --rounds, --max-tokens and --warmup must be positive")
    return args


def run_once(
    args: argparse.Namespace, pinned: bool, outcomes: dict[bool, dict[int, dict[str, Totals]]], root: Path | None = None
) -> int:
    """One whole run on a fresh stack (botgw's processes from the tree at `root`, default this one)."""

    def run(args: argparse.Namespace, stack: Stack) -> Coroutine[Any, Any, bool]:
        return benchmark(args, stack, pinned, outcomes)

    return main_async(args, "botgw-overhead-", run, root=root)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare:
        return compare_revisions(args)
    placements = {"off": [False], "on": [True], "both": [False, True]}[args.pin]
    outcomes: dict[bool, dict[int, dict[str, Totals]]] = {}
    code = 0
    for pinned in placements:
        if len(placements) > 1:
            print(f"=== {placement(pinned)} ===", flush=True)
        result = run_once(args, pinned, outcomes)
        code = max(code, result)
        if result >= 128:  # stopped by a signal: no second run
            return result
    if len(outcomes) == 2:
        compare(outcomes)
    return code


# --------------------------------------------------------------------------- --compare REV


def export_tree(rev: str, into: Path) -> str:
    """botgw as committed at `rev`, extracted into `into` (`git archive`); the revision's short hash."""
    git = ["git", "-C", str(ROOT)]
    parsed = subprocess.run([*git, "rev-parse", "--short", f"{rev}^{{commit}}"], capture_output=True, text=True)
    if parsed.returncode:
        raise SystemExit(f"bench: --compare {rev}: {parsed.stderr.strip()}")
    sha = parsed.stdout.strip()
    archive = subprocess.run([*git, "archive", "--format=tar", sha], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return sha


def compare_revisions(args: argparse.Namespace) -> int:
    """`--compare REV`: the same benchmark against botgw at REV, then against this tree; both side by side.

    REV's gateway, worker and simulator run from its exported tree (`python -m gateway.cli` there, the same venv);
    the engine, Redis and this client are this tree's for both runs."""
    pinned = args.pin == "on"
    runs: dict[str, dict[int, dict[str, Totals]]] = {}
    code = 0
    with tempfile.TemporaryDirectory(prefix="botgw-rev-") as tmp:
        tree = Path(tmp)
        sha = export_tree(args.compare, tree)
        for label, root in ((f"{args.compare} ({sha})", tree), ("working tree", ROOT)):
            print(f"=== botgw at {label}: {root} ===", flush=True)
            outcomes: dict[bool, dict[int, dict[str, Totals]]] = {}
            result = run_once(args, pinned, outcomes, root)
            code = max(code, result)
            if result >= 128:
                return result
            if pinned in outcomes:
                runs[label] = outcomes[pinned]
    if len(runs) == 2:
        print_comparison(runs)
    return code


def print_comparison(runs: dict[str, dict[int, dict[str, Totals]]]) -> None:
    """Before and after, per concurrency level: botgw's CPU and round trips per answer, added p50, throughput."""
    (before_label, before), (after_label, after) = runs.items()

    def cell(value: float, digits: int) -> str:
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"

    metrics: list[tuple[str, int, Any]] = [
        ("gateway CPU ms/answer", 2, lambda m: m["botgw"].ms_per_answer("gateway")),
        ("worker CPU ms/answer", 2, lambda m: m["botgw"].ms_per_answer("worker")),
        ("botgw CPU ms/answer", 2, lambda m: m["botgw"].ms_per_answer(*BOTGW_PROCS)),
        ("gateway Redis trips/answer", 2, lambda m: m["botgw"].trips_per_answer("gateway")),
        ("worker Redis trips/answer", 2, lambda m: m["botgw"].trips_per_answer("worker")),
        ("botgw Redis trips/answer", 2, lambda m: m["botgw"].trips_per_answer(*BOTGW_PROCS)),
        (
            "added p50 ms",
            1,
            lambda m: (percentile(m["botgw"].latencies, 50) - percentile(m["direct"].latencies, 50)) * 1000,
        ),
        ("throughput ratio", 3, _ratio),
    ]
    rows = []
    for level in before:
        if level not in after:
            continue
        for name, digits, metric in metrics:
            old, new = metric(before[level]), metric(after[level])
            change = "n/a" if math.isnan(old) or math.isnan(new) or old == 0 else f"{(new / old - 1) * 100:+.0f}%"
            rows.append([str(level), name, cell(old, digits), cell(new, digits), change])
    print()
    print(f"before: botgw at {before_label}; after: botgw in the {after_label} (the same engine, client and settings)")
    print(table(["concurrency", "per answered message", "before", "after", "change"], rows))
    print()
    for label, results in ((before_label, before), (after_label, after)):
        parts = [f"added p50 at concurrency 1: {cell(added_p50(results[1]), 1)} ms"] if 1 in results else []
        parts += [f"throughput ratio at {level}: {_ratio(results[level]):.3f}" for level in (8, 32) if level in results]
        print(f"{label}: " + "; ".join(parts))


def added_p50(modes: dict[str, Totals]) -> float:
    """Added median latency (ms): botgw's p50 less direct's."""
    return (percentile(modes["botgw"].latencies, 50) - percentile(modes["direct"].latencies, 50)) * 1000


if __name__ == "__main__":
    sys.exit(main())
