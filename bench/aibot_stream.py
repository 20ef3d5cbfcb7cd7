"""WeCom AI-bot streaming benchmark: time to first visible text and refresh answer latency, with the real engine.

Why: an AI bot (智能机器人) user sees nothing until one of WeCom's refresh callbacks gets non-empty text back, and
every refresh is a synchronous callback that must be answered quickly from Redis by whichever gateway replica WeCom
picks. These two numbers are what the user feels; this measures both with everything real.

What: redis-server, the tiny ERNIE-4.5 MoE on the vLLM CPU build (streaming, `--max-tokens`, temperature 0), the
simulator, TWO gateway processes and one worker. `--questions` questions, each from a fresh user, at `--concurrency`,
are asked the way WeCom does it (`simulator.wecom.ai_user.WeComAIBotUser.ask`): the encrypted first callback, then a
refresh callback every `--interval` seconds, alternating between the two gateways, until the stream finishes.
- time to first visible text: from sending the first callback to the first answer (first callback or refresh)
  with non-empty text; the response_url is fetched from the simulator before the clock starts;
- refresh answer latency: each refresh callback's round trip (verify, decrypt, read the stream from Redis, encrypt).
vLLM's own time to first token (its /metrics) is printed next to them, to show what botgw and polling add.

Run: `.venv/bin/python bench/aibot_stream.py [--questions 20 --concurrency 4 --interval 0.2 --max-tokens 128]`
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import secrets
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

# `python bench/aibot_stream.py` puts bench/, not the project, on the path; `bench.common` needs the project.
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Broken,
    CpuMeter,
    closed_loop,
    http_ok,
    main_async,
    ms,
    percentile,
    table,
    vllm_histograms,
    wait_ready,
)
from bench.overhead import MODEL, PROMPTS, SYSTEM_PROMPT, engine_config
from bots.wecom.config import WeComAIBotConfig
from simulator.wecom.ai_user import StreamView, WeComAIBotUser
from testkit.configs import botgw_config, random_aes_key
from testkit.processes import free_port
from testkit.services import gateway_args, simulator_args, worker_args
from testkit.stacks import Stack

NAMESPACE = "aibench"
BOT_ID = "ai"
GATEWAYS = ("gateway-1", "gateway-2")
PROCESSES = ("engine", *GATEWAYS, "worker", "simulator", "redis", "bench")
ENGINE_START_S = 300.0
SERVER_START_S = 60.0
REQUEST_TIMEOUT_S = 30.0
MAX_ERRORS = 3


# --------------------------------------------------------------------------- configuration and the user


def aibot_config(redis_url: str, engine_url: str, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """One WeCom AI bot (platform wecom-ai, as in tests/conftest.py); temperature 0, limits that never bite."""
    slots = max(8, concurrency)
    bot = {"id": BOT_ID, "platform": "wecom-ai", "token": secrets.token_hex(8), "encoding_aes_key": random_aes_key()}
    return botgw_config(
        redis_url,
        NAMESPACE,
        [bot],
        engine_config(engine_url, max_tokens, slots),
        system_prompt=SYSTEM_PROMPT,
        worker={"concurrency": slots},
    )


class PreparedUser(WeComAIBotUser):
    """WeCom for one question: the response_url is fetched before the clock starts, so that `first_text_s` runs
    from the first callback. One instance per question, so its callbacks alternate gateway-1, gateway-2, ..."""

    def __init__(self, bot: WeComAIBotConfig, gateways: list[str], sim_url: str, http: httpx.AsyncClient) -> None:
        super().__init__(bot, gateways, sim_url, http)
        self._response_url = ""

    async def prepare(self) -> None:
        self._response_url = await super().new_response_url()

    async def new_response_url(self) -> str:
        return self._response_url


@dataclass
class Answer:
    """One question as its user saw it."""

    index: int
    view: StreamView
    total_s: float

    def backwards(self) -> bool:
        """Did the shown text ever stop extending what was shown before (the store must never allow it)?"""
        return any(not later.startswith(earlier) for earlier, later in itertools.pairwise(self.view.shown))


@dataclass
class Results:
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    vllm: dict[str, float] = field(default_factory=dict)


async def vllm_counters(http: httpx.AsyncClient, engine_url: str) -> dict[str, float]:
    """vLLM's own TTFT and e2e histograms' sums and counts (summed over label sets)."""
    return await vllm_histograms(http, engine_url, "time_to_first_token_seconds", "e2e_request_latency_seconds")


async def ask_all(
    args: argparse.Namespace,
    bot: WeComAIBotConfig,
    gateways: list[str],
    sim_url: str,
    http: httpx.AsyncClient,
    count: int,
    tag: str,
    results: Results,
) -> None:
    """`count` questions from fresh users, `--concurrency` at a time (closed loop)."""

    async def one(index: int) -> None:
        user = PreparedUser(bot, gateways, sim_url, http)
        try:
            await user.prepare()
            started = time.perf_counter()
            view = await user.ask(
                f"{tag}-{index}-{secrets.token_hex(3)}", PROMPTS[index % len(PROMPTS)], interval_s=args.interval
            )
        except Exception as exc:  # an error here is a result to report, not a crash of the benchmark
            results.errors.append(f"question {index}: {type(exc).__name__}: {exc}")
            if len(results.errors) > MAX_ERRORS:
                raise Broken(f"too many failed questions: {results.errors}") from exc
            return
        results.answers.append(Answer(index, view, time.perf_counter() - started))

    results.elapsed_s = await closed_loop(args.concurrency, count, one)


# --------------------------------------------------------------------------- report


def _stats_row(name: str, values: list[float]) -> list[str]:
    mean = sum(values) / len(values) if values else math.nan
    return [
        name,
        str(len(values)),
        *(ms(percentile(values, pct)) for pct in (50, 90, 99)),
        ms(max(values, default=math.nan)),
        ms(mean),
    ]


def report(args: argparse.Namespace, results: Results, wall_s: float) -> bool:
    """Print the table and the checks; returns True if something broke."""
    answers = results.answers
    # A question that failed, or never showed text, stays in the figures as an infinite latency: dropping it would
    # make them look better the more questions fail.
    failed = [math.inf] * len(results.errors)
    first = [a.view.first_text_s if a.view.first_text_s is not None else math.inf for a in answers] + failed
    refreshes = [value for a in answers for value in a.view.refresh_latencies_s]
    # Per question, callback 0 (the message) went to gateway-1, refresh k to GATEWAYS[(k + 1) % 2].
    by_gateway = {
        name: [v for a in answers for k, v in enumerate(a.view.refresh_latencies_s) if (k + 1) % 2 == slot]
        for slot, name in enumerate(GATEWAYS)
    }
    totals = [a.total_s for a in answers] + failed
    vllm = results.vllm
    ttft = vllm.get("time_to_first_token_seconds_sum", math.nan) / max(
        1.0, vllm.get("time_to_first_token_seconds_count", 0)
    )
    e2e = vllm.get("e2e_request_latency_seconds_sum", math.nan) / max(
        1.0, vllm.get("e2e_request_latency_seconds_count", 0)
    )

    print()
    print(
        f"botgw WeCom AI-bot streaming: {MODEL} on vLLM CPU, max_tokens {args.max_tokens}, temperature 0; "
        f"{args.questions} questions at concurrency {args.concurrency}, refresh every {args.interval:g} s "
        f"alternating between 2 gateways; 1 worker; {os.cpu_count()} cores shared by everything"
    )
    print()
    rows = [
        _stats_row("time to first visible text", first),
        _stats_row("refresh answer latency", refreshes),
        *(_stats_row(f"  refreshes via {name}", values) for name, values in by_gateway.items()),
        _stats_row("question to finished answer", totals),
    ]
    print(table(["measure", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms"], rows))
    print()
    per_question = len(refreshes) / max(1, len(answers))
    states = sum(len(a.view.shown) for a in answers) / max(1, len(answers))
    print(
        f"vLLM's own means over the same requests: time to first token {ms(ttft)} ms, e2e {ms(e2e)} ms "
        f"({int(vllm.get('e2e_request_latency_seconds_count', 0))} requests); a refresh waits {args.interval:g} s, "
        f"so polling alone adds up to that to the first visible text (about half on average)"
    )
    print(f"per question: {per_question:.1f} refresh callbacks, {states:.1f} distinct states shown")
    wall = results.elapsed_s
    cpu = ", ".join(f"{name} {results.cpu.get(name, math.nan) / wall * 100:.0f}%" for name in PROCESSES if wall > 0)
    print(f"CPU over the measured run ({wall:.1f} s; 100% = one core): {cpu}")
    waits = ", ".join(f"{name} {results.cpu.get(f'{name} wait', math.nan):.2f}" for name in PROCESSES)
    print(f"run-queue wait, seconds (runnable but no core free; summed over threads): {waits}")
    print("note: timings are noisy on a shared 2-core machine (the engine competes with everything else here)")

    print()
    unfinished = [a.index for a in answers if not a.view.finished]
    empty = [a.index for a in answers if not a.view.text]
    backwards = [a.index for a in answers if a.backwards()]
    ok = not results.errors and not unfinished and not empty and not backwards and len(answers) == args.questions
    print(
        f"checks: {len(answers)}/{args.questions} answered, unfinished {unfinished or 0}, empty {empty or 0}, "
        f"text went backwards {backwards or 0}, errors {len(results.errors)} -> {'OK' if ok else 'BROKEN'}"
    )
    for error in results.errors[:5]:
        print(f"  {error}")
    print(f"run time: {wall_s:.0f} s")
    return not ok


# --------------------------------------------------------------------------- main


async def benchmark(args: argparse.Namespace, stack: Stack) -> bool:
    began = time.perf_counter()
    ports = {name: free_port() for name in ("redis", "engine", "simulator", *GATEWAYS)}
    engine_url, sim_url = f"http://127.0.0.1:{ports['engine']}", f"http://127.0.0.1:{ports['simulator']}"
    gateway_urls = [f"http://127.0.0.1:{ports[name]}" for name in GATEWAYS]
    redis_url = f"redis://127.0.0.1:{ports['redis']}/0"

    stack.start_redis(ports["redis"])
    stack.start_engine(ports["engine"])
    config = aibot_config(redis_url, engine_url, args.concurrency, args.max_tokens)
    path = stack.write_config(config)
    stack.start("simulator", simulator_args(path, ports["simulator"]))
    admin_urls = []
    for name in GATEWAYS:
        serve, admin_url = gateway_args(path, ports[name])
        stack.start(name, serve)
        admin_urls.append(admin_url)
    stack.start("worker", worker_args(path, "bench-worker"))

    bot = WeComAIBotConfig(**config["bots"][0])
    redis = Redis.from_url(redis_url)
    limits = httpx.Limits(max_connections=4 * args.concurrency + 8)
    try:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as http:

            def ok(url: str) -> Awaitable[bool]:
                return http_ok(http, url)

            children = stack.procs
            await wait_ready(stack, children["redis"], lambda: redis.ping(), SERVER_START_S)
            await wait_ready(stack, children["simulator"], lambda: ok(f"{sim_url}/__sim__/healthz"), SERVER_START_S)
            for name, url in zip(GATEWAYS, gateway_urls, strict=True):
                await wait_ready(stack, children[name], lambda url=url: ok(f"{url}/healthz"), SERVER_START_S)
            print(f"servers up; waiting for the engine (logs in {stack.log_dir}) ...", flush=True)
            await wait_ready(stack, children["engine"], lambda: ok(f"{engine_url}/health"), ENGINE_START_S)
            for name, url in zip(GATEWAYS, admin_urls, strict=True):
                await wait_ready(stack, children[name], lambda url=url: ok(f"{url}/readyz"), SERVER_START_S)
            print(f"engine ready after {time.perf_counter() - began:.0f} s", flush=True)

            warm = Results()
            print(f"warm-up: {args.warmup} questions ...", flush=True)
            await ask_all(args, bot, gateway_urls, sim_url, http, args.warmup, "warm", warm)
            if warm.errors:
                raise Broken(f"warm-up failed: {warm.errors[:3]}")

            results = Results()
            print(f"measuring: {args.questions} questions at concurrency {args.concurrency} ...", flush=True)
            meter = CpuMeter(stack)
            vllm_before, cpu_before = await vllm_counters(http, engine_url), meter.sample()
            await ask_all(args, bot, gateway_urls, sim_url, http, args.questions, "q", results)
            results.cpu, vllm_after = meter.since(cpu_before), await vllm_counters(http, engine_url)
            results.vllm = {name: vllm_after.get(name, 0.0) - value for name, value in vllm_before.items()}
            stack.check_alive()
    finally:
        await redis.aclose()
    return report(args, results, time.perf_counter() - began)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--questions", type=int, default=20, help="measured questions (default 20)")
    parser.add_argument("--concurrency", type=int, default=4, help="questions in flight (default 4)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between refreshes (default 0.2)")
    parser.add_argument("--max-tokens", type=int, default=128, help="engine.max_tokens (default 128)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up questions, not counted (default 2)")
    parser.add_argument("--time-limit", type=float, default=420.0, help="stop and fail after this many seconds")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs and config")
    args = parser.parse_args(argv)
    if min(args.questions, args.concurrency, args.max_tokens, args.warmup) < 1 or args.interval <= 0:
        parser.error("--questions, --concurrency, --max-tokens, --warmup and --interval must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return main_async(parse_args(argv), "botgw-aibot-", benchmark)


if __name__ == "__main__":
    sys.exit(main())
