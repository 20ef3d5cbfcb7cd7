"""Fairness benchmark: do light users wait longer while a heavy user floods the queue?

Why: the scheduler keeps one lane per conversation and serves ready lanes round-robin across users, and a user's
engine requests are capped (`limits.max_concurrent_per_user`, default 1), so 30 queued messages of one user should
take one worker slot at a time and never hold back the others. This measures it end to end.

What: redis-server, a stub engine (testkit/fakes/stub_engine.py: every chat answer after a fixed `--delay`, so the
times are the scheduler's, not generation's), the simulator (WeCom API), one gateway and two workers (default
concurrency 8 each); one WeCom app bot; `limits.per_user` 1000/minute. Per round, with fresh user ids each time:

  baseline: 5 light users send one message each (at once);
  flood:    a heavy user sends 30 messages in a row; 0.3 s after its first, 5 light users send one each.

A light user's latency runs from the moment its callback is POSTed to the simulator's record (`at`) of the answer
delivered to it (this process and the simulator share the clock). The heavy user's time runs from its first POST to
its 30th answer; its answers must arrive once each and in the order sent. `--rounds` rounds, pooled.

Run: `.venv/bin/python bench/fairness.py [--delay 1.0 --rounds 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

# `python bench/fairness.py` puts bench/, not the project, on the path; `bench.common` needs the project.
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Broken,
    http_ok,
    main_async,
    ms,
    percentile,
    table,
    wait_ready,
)
from bots.wecom.config import WeComAppConfig
from gateway.state.keys import Keys
from simulator.replies import wecom_messages
from simulator.wecom.signer import SignedCallback, WeComCallbackSigner
from testkit.configs import botgw_config, wecom_app
from testkit.processes import free_port
from testkit.services import gateway_args, simulator_args, worker_args
from testkit.stacks import Stack

BOT_ID = "app"
NAMESPACE = "fairness"
MODEL = "ernie-tiny"
SYSTEM_PROMPT = "You are the company's helpful assistant. Answer briefly and politely."
WORKERS = 2
LIGHT_USERS = 5
HEAVY_MESSAGES = 30
HEAD_START_S = 0.3  # the light users send this long after the heavy user's first message
WARMUP_USERS = 4
GOAL_RATIO = 1.2
SERVER_START_S = 60.0
POLL_S = 0.05
SETTLE_S = 1.0  # a quiet time after the last answer, so that a late duplicate would be seen
IDLE_TIMEOUT_S = 30.0
ANSWER_GRACE_S = 30.0  # on top of the engine time a phase needs at the least


# --------------------------------------------------------------------------- configuration


def fairness_config(redis_url: str, engine_url: str, sim_url: str) -> dict[str, Any]:
    """One WeCom app on the simulator, the stub engine, per-user limit 1000/minute, worker defaults."""
    engine = {"base_url": engine_url, "model": MODEL, "max_tokens": 24, "temperature": 0.0}
    config = botgw_config(redis_url, NAMESPACE, [wecom_app(BOT_ID, sim_url)], engine, system_prompt=SYSTEM_PROMPT)
    config["limits"]["per_user"] = "1000/minute"
    return config


# --------------------------------------------------------------------------- one phase


@dataclass
class Phase:
    """One phase of one round: what was sent when, and the answers the simulator recorded."""

    name: str
    number: int
    light: list[str]
    heavy: str | None = None
    texts: dict[str, list[str]] = field(default_factory=dict)  # user -> texts in the order sent
    sent_at: dict[str, list[float]] = field(default_factory=dict)  # user -> wall time of each POST
    answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # user -> deliveries, by `at`

    def light_latencies(self) -> list[float]:
        return [self.answers[user][0]["at"] - self.sent_at[user][0] for user in self.light if self.answers.get(user)]

    def heavy_time(self) -> float:
        """First POST of the heavy user -> its last answer."""
        if not self.heavy or not self.answers.get(self.heavy):
            return math.nan
        return max(item["at"] for item in self.answers[self.heavy]) - self.sent_at[self.heavy][0]

    def heavy_in_order(self) -> bool:
        """Every heavy message answered exactly once, the answers delivered in the order sent."""
        if not self.heavy:
            return True
        texts = self.texts[self.heavy]
        got = [item["content"] for item in self.answers.get(self.heavy, [])]
        return len(got) == len(texts) and all(text in answer for text, answer in zip(texts, got, strict=True))


class Client:
    """Sends signed WeCom callbacks to the gateway and reads what the simulator delivered."""

    def __init__(self, http: httpx.AsyncClient, gateway_url: str, sim_url: str, bot: dict[str, Any]) -> None:
        self._http = http
        self._callback_url = f"{gateway_url}/callback/{BOT_ID}"
        self._sim_url = sim_url
        self._signer = WeComCallbackSigner(WeComAppConfig(**bot))

    def sign(self, user: str, text: str) -> SignedCallback:
        return self._signer.text(user, text)

    async def post(self, phase: Phase, user: str, text: str, callback: SignedCallback) -> None:
        """POST one callback (built beforehand); its send time is taken just before the request."""
        phase.texts.setdefault(user, []).append(text)
        phase.sent_at.setdefault(user, []).append(time.time())
        response = await self._http.post(self._callback_url, params=callback.params, content=callback.body)
        if response.status_code != 200:
            raise Broken(f"gateway answered HTTP {response.status_code} for {user}: {response.text[:200]}")

    async def delivered(self, since: float) -> list[dict[str, Any]]:
        return await wecom_messages(self._http, self._sim_url, since=since)

    async def collect(self, phase: Phase, since: float, expected: dict[str, int], timeout: float) -> None:
        """Poll the simulator until every user has its expected number of answers (Broken after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for item in await self.delivered(since):
                if item["touser"] in expected:
                    by_user[item["touser"]].append(item)
            if all(len(by_user[user]) >= count for user, count in expected.items()):
                break
            if time.monotonic() > deadline:
                missing = {user: f"{len(by_user[user])}/{count}" for user, count in expected.items()}
                raise Broken(f"{phase.name} round {phase.number}: answers missing after {timeout:.0f} s: {missing}")
            await asyncio.sleep(POLL_S)
        phase.answers = {user: sorted(items, key=lambda item: item["at"]) for user, items in by_user.items()}


async def wait_idle(redis: Redis, stack: Stack) -> None:
    """Until every entry ever enqueued has been handled (the scheduler's counters), so phases do not overlap."""
    key = Keys(NAMESPACE).scheduler_stats
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        enqueued, handled = (int(value or 0) for value in await redis.hmget(key, "enqueued", "handled"))
        if enqueued == handled:
            return
        if time.monotonic() > deadline:
            raise Broken(f"queue not empty after {IDLE_TIMEOUT_S:.0f} s: enqueued {enqueued}, handled {handled}")
        stack.check_alive()
        await asyncio.sleep(POLL_S)


async def baseline(client: Client, number: int, delay: float) -> Phase:
    """Light users alone, each one message, all at once."""
    phase = Phase("baseline", number, [f"light-r{number}-base-{i}" for i in range(LIGHT_USERS)])
    texts = {user: f"{user}: where is the printer?" for user in phase.light}
    callbacks = {user: client.sign(user, text) for user, text in texts.items()}
    since = time.time() - 0.5
    await asyncio.gather(*(client.post(phase, user, texts[user], callbacks[user]) for user in phase.light))
    await client.collect(phase, since, dict.fromkeys(phase.light, 1), delay + ANSWER_GRACE_S)
    return phase


async def flood(client: Client, number: int, delay: float) -> Phase:
    """The heavy user's 30 messages in a row; the light users' one each, HEAD_START_S after its first."""
    light = [f"light-r{number}-flood-{i}" for i in range(LIGHT_USERS)]
    phase = Phase("flood", number, light, heavy=f"heavy-r{number}")
    heavy = phase.heavy or ""
    heavy_texts = [f"{heavy} message {i:02d}: how do I book a room?" for i in range(HEAVY_MESSAGES)]
    heavy_callbacks = [client.sign(heavy, text) for text in heavy_texts]
    light_texts = {user: f"{user}: where is the printer?" for user in light}
    light_callbacks = {user: client.sign(user, text) for user, text in light_texts.items()}
    since = time.time() - 0.5

    async def heavy_sends() -> None:
        for text, callback in zip(heavy_texts, heavy_callbacks, strict=True):
            await client.post(phase, heavy, text, callback)

    started = time.perf_counter()
    sending = asyncio.create_task(heavy_sends())
    try:
        await asyncio.sleep(max(0.0, started + HEAD_START_S - time.perf_counter()))
        await asyncio.gather(*(client.post(phase, user, light_texts[user], light_callbacks[user]) for user in light))
        await sending
    finally:
        if not sending.done():
            sending.cancel()
    expected = {**dict.fromkeys(light, 1), heavy: HEAVY_MESSAGES}
    await client.collect(phase, since, expected, HEAVY_MESSAGES * delay * 2 + ANSWER_GRACE_S)
    return phase


# --------------------------------------------------------------------------- report


def report(
    args: argparse.Namespace, phases: list[Phase], counts: Counter[str], engine_requests: int, sent: int, wall: float
) -> bool:
    """Print the table, the goal and the checks; returns True if something broke (not for a missed goal)."""
    base = [value for phase in phases if phase.name == "baseline" for value in phase.light_latencies()]
    loaded = [value for phase in phases if phase.name == "flood" for value in phase.light_latencies()]
    print()
    print(
        f"botgw fairness: 1 gateway, {WORKERS} workers (default concurrency), stub engine answering after "
        f"{args.delay:g} s; {os.cpu_count()} cores shared by everything; {args.rounds} round(s)"
    )
    print(
        f"baseline: {LIGHT_USERS} light users send one message each; flood: a heavy user sends {HEAVY_MESSAGES} in a "
        f"row, {HEAD_START_S:g} s later {LIGHT_USERS} fresh light users send one each"
    )
    print("light latency: callback POST -> answer recorded by the simulated WeCom")
    print()
    rows = [
        [
            name,
            str(len(values)),
            *(ms(percentile(values, pct), 0) for pct in (50, 95)),
            ms(max(values, default=math.nan), 0),
        ]
        for name, values in (("baseline", base), ("with flood", loaded))
    ]
    print(table(["light users", "samples", "p50 ms", "p95 ms", "max ms"], rows))
    print()
    p95_base, p95_flood = percentile(base, 95), percentile(loaded, 95)
    ratio = p95_flood / p95_base if p95_base > 0 else math.nan
    verdict = "PASS" if ratio <= GOAL_RATIO else "FAIL"
    print(f"goal p95(flood) / p95(baseline) <= {GOAL_RATIO:g}: {ratio:.2f} -> {verdict}")

    broken = False
    serial = HEAVY_MESSAGES * args.delay
    for phase in phases:
        if phase.heavy is None:
            continue
        in_order = phase.heavy_in_order()
        broken |= not in_order
        print(
            f"heavy user, round {phase.number}: {HEAVY_MESSAGES} answers in {phase.heavy_time():.2f} s "
            f"({HEAVY_MESSAGES} x {args.delay:g} s = {serial:.1f} s of engine time, one at a time); answered once "
            f"each, in order -> {'OK' if in_order else 'MISMATCH'}"
        )
    expected = Counter({user: len(texts) for phase in phases for user, texts in phase.texts.items()})
    wrong = {user: f"{counts.get(user, 0)}/{count}" for user, count in expected.items() if counts.get(user, 0) != count}
    strangers = sorted(set(counts) - set(expected) - {f"warmup-{i}" for i in range(WARMUP_USERS)})
    ok = not wrong and not strangers
    print(
        f"reply count check: {sum(expected.values())} measured messages from {len(expected)} users, "
        f"{len(wrong)} users with a wrong number of replies, {len(strangers)} unknown recipients -> "
        f"{'OK' if ok else 'MISMATCH'}"
    )
    if wrong:
        print(f"  e.g. {dict(list(wrong.items())[:5])}")
    broken |= not ok
    engine_ok = engine_requests == sent
    print(
        f"engine check: {engine_requests} chat requests reached the engine for {sent} messages (warm-up included) "
        f"-> {'OK' if engine_ok else 'MISMATCH'}"
    )
    broken |= not engine_ok
    print("note: timings are noisy on a shared 2-core machine; with few samples p95 is close to the maximum")
    print(f"run time: {wall:.0f} s")
    return broken


# --------------------------------------------------------------------------- main


async def benchmark(args: argparse.Namespace, stack: Stack) -> bool:
    began = time.perf_counter()
    ports = {name: free_port() for name in ("redis", "engine", "simulator", "gateway")}
    engine_url, sim_url = f"http://127.0.0.1:{ports['engine']}", f"http://127.0.0.1:{ports['simulator']}"
    gateway_url, redis_url = f"http://127.0.0.1:{ports['gateway']}", f"redis://127.0.0.1:{ports['redis']}/0"

    stack.start_redis(ports["redis"])
    stub = [sys.executable, "-m", "testkit.fakes.stub_engine", "--port", str(ports["engine"])]
    stack.start("engine", [*stub, "--delay", str(args.delay), "--model", MODEL])
    config = fairness_config(redis_url, engine_url, sim_url)
    path = stack.write_config(config)
    stack.start("simulator", simulator_args(path, ports["simulator"]))
    serve, admin_url = gateway_args(path, ports["gateway"])
    stack.start("gateway", serve)
    worker_env = {"BOTGW_LOG_LEVEL": "INFO"}  # for "worker started" in its log; one line per message
    workers = [f"worker-{number}" for number in range(1, WORKERS + 1)]
    for name in workers:
        stack.start(name, worker_args(path, f"bench-{name}"), worker_env)

    redis = Redis.from_url(redis_url)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0)) as http:
            children = stack.procs
            await wait_ready(stack, children["redis"], lambda: redis.ping(), SERVER_START_S)
            await wait_ready(stack, children["engine"], lambda: http_ok(http, f"{engine_url}/health"), SERVER_START_S)
            await wait_ready(
                stack, children["simulator"], lambda: http_ok(http, f"{sim_url}/__sim__/healthz"), SERVER_START_S
            )
            await wait_ready(stack, children["gateway"], lambda: http_ok(http, f"{admin_url}/readyz"), SERVER_START_S)
            for name in workers:
                child = children[name]

                async def started(child: Any = child) -> bool:
                    return b"worker started" in child.log_path.read_bytes()

                await wait_ready(stack, child, started, SERVER_START_S)
            print(f"servers up after {time.perf_counter() - began:.1f} s (logs in {stack.log_dir})", flush=True)

            client = Client(http, gateway_url, sim_url, config["bots"][0])
            warm = Phase("warm-up", 0, [f"warmup-{i}" for i in range(WARMUP_USERS)])
            since = time.time() - 0.5
            for user in warm.light:
                await client.post(warm, user, f"{user}: hello", client.sign(user, f"{user}: hello"))
            await client.collect(warm, since, dict.fromkeys(warm.light, 1), args.delay + ANSWER_GRACE_S)
            await wait_idle(redis, stack)
            print(f"warm-up: {WARMUP_USERS} messages answered", flush=True)

            phases: list[Phase] = []
            for number in range(1, args.rounds + 1):
                # The order alternates (odd rounds baseline first, even rounds flood first), so that a drift of
                # the machine over the run weighs on both phases alike.
                for run in (baseline, flood) if number % 2 else (flood, baseline):
                    phase = await run(client, number, args.delay)
                    phases.append(phase)
                    await wait_idle(redis, stack)
                    stack.check_alive()
                    latencies = phase.light_latencies()
                    heavy = f", heavy user's {HEAVY_MESSAGES} in {phase.heavy_time():.2f} s" if phase.heavy else ""
                    print(
                        f"  round {number}, {phase.name:8}: light p50 {ms(percentile(latencies, 50), 0)} ms, "
                        f"max {ms(max(latencies, default=math.nan), 0)} ms{heavy}",
                        flush=True,
                    )
            await asyncio.sleep(SETTLE_S)  # a late duplicate would show up in the count check
            counts = Counter(item["touser"] for item in await client.delivered(0.0))
            recorded = (await http.get(f"{engine_url}/__stub__/requests")).json()
            engine_requests = sum(1 for record in recorded if not record.get("warmup"))
    finally:
        await redis.aclose()
    sent = WARMUP_USERS + sum(len(texts) for phase in phases for texts in phase.texts.values())
    return report(args, phases, counts, engine_requests, sent, time.perf_counter() - began)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--delay", type=float, default=1.0, help="the stub engine's answer time, s (default 1.0)")
    parser.add_argument("--rounds", type=int, default=3, help="baseline+flood rounds, fresh users each (default 3)")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop and fail after this many seconds (default: from the others)",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs and config")
    args = parser.parse_args(argv)
    if args.rounds < 1 or not 0 < args.delay <= 30:
        parser.error("--rounds must be positive and --delay in (0, 30]")
    if args.time_limit is None:
        # Start-up, then per round: baseline (one answer time) and flood (the heavy user's answers one at a time).
        args.time_limit = 90 + args.rounds * ((HEAVY_MESSAGES + 1) * args.delay * 2 + 30)
    return args


def main(argv: list[str] | None = None) -> int:
    return main_async(parse_args(argv), "botgw-fairness-", benchmark, failures=(httpx.HTTPError, OSError))


if __name__ == "__main__":
    sys.exit(main())
