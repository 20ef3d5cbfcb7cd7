"""WeCom AI-bot streaming benchmark: time to first visible text and refresh answer latency, with the real engine.

Why: an AI bot (智能机器人) user sees nothing until one of WeCom's refresh callbacks gets non-empty text back, and
every refresh is a synchronous callback that must be answered quickly from Redis by whichever gateway replica WeCom
picks. These two numbers are what the user feels; this measures both with everything real.

What: redis-server, the tiny ERNIE-4.5 MoE on the vLLM CPU build (streaming, `--max-tokens`, temperature 0), the
simulator, TWO gateway processes and one worker. `--questions` questions, each from a fresh user, at `--concurrency`,
are asked the way WeCom does it (`bots.simulator.wecom_ai.WeComAIBotUser.ask`): the encrypted first callback, then a
refresh callback every `--interval` seconds, alternating between the two gateways, until the stream finishes.
- time to first visible text: from sending the first callback to the first answer (first callback or refresh)
  with non-empty text; the response_url is fetched from the simulator before the clock starts;
- refresh answer latency: each refresh callback's round trip (verify, decrypt, read the stream from Redis, encrypt).
vLLM's own time to first token (its /metrics) is printed next to them, to show what botgw and polling add.

Run: `.venv/bin/python bench/aibot_stream.py [--questions 20 --concurrency 4 --interval 0.2 --max-tokens 128]`
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/aibot_stream.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from bench.overhead import (  # noqa: E402
    BOTGW,
    MODEL,
    PROMPTS,
    SYSTEM_PROMPT,
    Broken,
    CpuMeter,
    Stack,
    _ms,
    _table,
    free_port,
    percentile,
    random_aes_key,
    wait_ready,
)
from bots.simulator.wecom_ai import StreamView, WeComAIBotUser  # noqa: E402
from bots.wecom.config import WeComAIBotConfig  # noqa: E402

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
    return {
        "redis_url": redis_url,
        "namespace": NAMESPACE,
        "system_prompt": SYSTEM_PROMPT,
        "log_level": "WARNING",
        "engine": {
            "base_url": engine_url,
            "model": MODEL,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "max_in_flight": slots,
        },
        "limits": {"per_user": "1000000/minute", "http_per_source": "1000000/second"},
        "worker": {"concurrency": slots},
        "bots": [
            {"id": BOT_ID, "platform": "wecom-ai", "token": secrets.token_hex(8), "encoding_aes_key": random_aes_key()}
        ],
    }


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
    text = (await http.get(f"{engine_url}/metrics", timeout=10)).text
    values: dict[str, float] = {}
    pattern = r"^vllm:(time_to_first_token_seconds|e2e_request_latency_seconds)_(sum|count)\{[^}]*\} (\S+)$"
    for match in re.finditer(pattern, text, re.MULTILINE):
        key = f"{match.group(1)}_{match.group(2)}"
        values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


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
    cursor = 0

    async def client() -> None:
        nonlocal cursor
        while cursor < count:
            index = cursor
            cursor += 1
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
                continue
            results.answers.append(Answer(index, view, time.perf_counter() - started))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    results.elapsed_s = time.perf_counter() - started


# --------------------------------------------------------------------------- report


def _stats_row(name: str, values: list[float]) -> list[str]:
    mean = sum(values) / len(values) if values else math.nan
    return [
        name,
        str(len(values)),
        *(_ms(percentile(values, pct)) for pct in (50, 90, 99)),
        _ms(max(values, default=math.nan)),
        _ms(mean),
    ]


def report(args: argparse.Namespace, results: Results, wall_s: float) -> bool:
    """Print the table and the checks; returns True if something broke."""
    answers = results.answers
    first = [a.view.first_text_s for a in answers if a.view.first_text_s is not None]
    refreshes = [value for a in answers for value in a.view.refresh_latencies_s]
    # Per question, callback 0 (the message) went to gateway-1, refresh k to GATEWAYS[(k + 1) % 2].
    by_gateway = {
        name: [v for a in answers for k, v in enumerate(a.view.refresh_latencies_s) if (k + 1) % 2 == slot]
        for slot, name in enumerate(GATEWAYS)
    }
    totals = [a.total_s for a in answers]
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
    print(_table(["measure", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms"], rows))
    print()
    per_question = len(refreshes) / max(1, len(answers))
    states = sum(len(a.view.shown) for a in answers) / max(1, len(answers))
    print(
        f"vLLM's own means over the same requests: time to first token {_ms(ttft)} ms, e2e {_ms(e2e)} ms "
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

    redis_binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    stack.start(
        "redis",
        [redis_binary, "--port", str(ports["redis"]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
    )
    stack.start("engine", [*BOTGW, "engine", "serve", "--profile", "tiny", "--port", str(ports["engine"])])
    config = aibot_config(redis_url, engine_url, args.concurrency, args.max_tokens)
    config_path = stack.log_dir / "botgw.yaml"
    config_path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    # BOTGW_* variables of the caller's shell would override the file; these processes must see only the file.
    clean_env = {key: value for key, value in os.environ.items() if not key.startswith("BOTGW_")}
    cfg = ["--config", str(config_path)]
    stack.start("simulator", [*BOTGW, "sim", "serve", *cfg, "--port", str(ports["simulator"])], clean_env)
    for name in GATEWAYS:
        stack.start(name, [*BOTGW, "serve", *cfg, "--port", str(ports[name])], clean_env)
    stack.start("worker", [*BOTGW, "worker", *cfg, "--name", "bench-worker"], clean_env)

    bot = WeComAIBotConfig(**config["bots"][0])
    redis = Redis.from_url(redis_url)
    limits = httpx.Limits(max_connections=4 * args.concurrency + 8)
    try:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as http:

            async def ok(url: str) -> bool:
                return (await http.get(url, timeout=2)).status_code == 200

            children = stack.children
            await wait_ready(stack, children["redis"], lambda: redis.ping(), SERVER_START_S)
            await wait_ready(stack, children["simulator"], lambda: ok(f"{sim_url}/__sim__/healthz"), SERVER_START_S)
            for name, url in zip(GATEWAYS, gateway_urls, strict=True):
                await wait_ready(stack, children[name], lambda url=url: ok(f"{url}/healthz"), SERVER_START_S)
            print(f"servers up; waiting for the engine (logs in {stack.log_dir}) ...", flush=True)
            await wait_ready(stack, children["engine"], lambda: ok(f"{engine_url}/health"), ENGINE_START_S)
            for name, url in zip(GATEWAYS, gateway_urls, strict=True):
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
            cpu_after, vllm_after = meter.sample(), await vllm_counters(http, engine_url)
            results.cpu = {name: cpu_after[name] - cpu_before[name] for name in cpu_before}
            results.vllm = {name: vllm_after.get(name, 0.0) - value for name, value in vllm_before.items()}
            stack.check_alive()
    finally:
        await redis.aclose()
    return report(args, results, time.perf_counter() - began)


async def _main_task(args: argparse.Namespace, stack: Stack) -> int:
    """The benchmark under a time limit; SIGINT/SIGTERM/SIGHUP cancel it so that the children are stopped."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    caught: list[int] = []

    def stop(sig: int) -> None:
        caught.append(sig)
        if task is not None:
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop, sig)
    try:
        async with asyncio.timeout(args.time_limit):
            return 1 if await benchmark(args, stack) else 0
    except asyncio.CancelledError:
        if not caught:
            raise
        print(f"bench: stopped by signal {caught[0]}", file=sys.stderr)
        return 128 + caught[0]
    except TimeoutError:
        print(f"bench: not finished within --time-limit {args.time_limit:.0f} s", file=sys.stderr)
        return 1
    except Broken as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1


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
    args = parse_args(argv)
    stack = Stack(Path(tempfile.mkdtemp(prefix="botgw-aibot-")))
    code = 1
    try:
        code = asyncio.run(_main_task(args, stack))
    finally:
        stack.stop()
        if code == 0 and not args.keep_logs:
            shutil.rmtree(stack.log_dir, ignore_errors=True)
        else:
            print(f"logs: {stack.log_dir}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
