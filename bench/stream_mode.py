"""Stream-mode intake benchmark: DingTalk robot messages per second through ONE `botgw dingtalk-stream` process.

Why: in Stream mode DingTalk pushes every robot message down one WebSocket that botgw holds, and botgw acks a frame
only once the message is deduplicated and queued in Redis. How many messages a second one such process takes in
bounds a Stream-mode deployment the way `bench/ingest.py` bounds an HTTP one.

What: redis-server, the simulator (`botgw sim serve`, whose Stream gateway delivers the frames) and one
`botgw dingtalk-stream`; no worker, no engine. After a warm-up, `--messages` robot messages, each with its own msgId,
are POSTed to the simulator's push endpoint as fast as `--concurrency` keep-alive connections allow. The clock runs
from the first push until the simulator counts every frame acked and the work queue counts every message enqueued
(the scheduler's `enqueued` counter in `{<namespace>}:sched:stats`). Per message, push answered -> enqueued (the
queue entry's `t`, enqueue time in ms on the same clock) is reported too; with no worker running, every entry stays
in its lane (`{<namespace>}:sched:lane:*`), where the duplicate check reads them.

Caveat: the simulator is one Python process doing the push endpoint, the frame delivery loop (a 50 ms tick over
every pending frame), the WebSocket server and a TCP relay in front of it; it may well be the bottleneck, so the CPU
of every process is printed next to the rate.

Run: `.venv/bin/python bench/stream_mode.py [--messages 2000 --concurrency 16 --warmup 100]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

# `python bench/stream_mode.py` puts bench/, not the project, on the path; `bench.common` needs the project.
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Broken,
    CpuMeter,
    HttpConnection,
    Tally,
    connect,
    http_ok,
    main_async,
    percentile,
    table,
    wait_ready,
)
from bots.dingtalk.config import DingTalkBotConfig
from gateway.state.keys import Keys
from simulator.dingtalk.user import robot_payload
from testkit.configs import botgw_config, dingtalk_robot
from testkit.processes import BOTGW, free_port
from testkit.services import simulator_args
from testkit.stacks import Stack

NAMESPACE = "streambench"
BOT_ID = "ding-stream"
SERVER_START_S = 60.0
CONNECT_S = 30.0
POLL_S = 0.05
MAX_ERRORS = 50
SCAN_COUNT = 1000
KEYS = Keys(NAMESPACE)
PROCESSES = ("simulator", "dingtalk-stream", "redis", "bench")


# --------------------------------------------------------------------------- configuration and pushes


def stream_config(redis_url: str, sim_url: str) -> dict[str, Any]:
    """One Stream-mode DingTalk robot pointed at the simulator; WARNING logs, as in production; no engine needed."""
    return botgw_config(redis_url, NAMESPACE, [dingtalk_robot(BOT_ID, "stream", sim_url)])


def build_pushes(
    bot: DingTalkBotConfig, sim_url: str, count: int, users: int, tag: str
) -> tuple[list[bytes], list[str]]:
    """Complete HTTP/1.1 POSTs to the push endpoint (built before the clock starts) and their msgIds."""
    expires_ms = int(time.time() * 1000) + 5_400_000
    webhook = {"url": f"{sim_url}/robot/sendBySession?session=bench", "expires_ms": expires_ms}
    requests: list[bytes] = []
    msg_ids: list[str] = []
    for i in range(count):
        user = f"bench-user-{i % users:05d}"
        text, conversation = f"{tag} message {i}", f"cid-single-{user}"
        payload = robot_payload(bot, user, text, conversation=conversation, group=False, webhook=webhook)
        payload["msgId"] = f"msg{tag}{secrets.token_hex(6)}{i:06d}"
        body = json.dumps({"client_id": bot.app_key, "payload": payload}, ensure_ascii=False).encode()
        head = (
            "POST /__sim__/dingtalk/stream/push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        requests.append(head.encode("ascii") + body)
        msg_ids.append(payload["msgId"])
    return requests, msg_ids


# --------------------------------------------------------------------------- one batch


@dataclass
class Batch:
    """One batch of pushes: when each was answered, and when the simulator and Redis had all of them."""

    count: int
    tally: Tally = field(default_factory=Tally)
    pushed_at: dict[str, float] = field(default_factory=dict)  # msgId -> wall time the push was answered
    push_s: float = math.nan  # first push sent -> last push answered
    acked_s: float = math.nan  # first push sent -> simulator counts all acked
    done_s: float = math.nan  # first push sent -> acked and all in Redis
    max_unacked: int = 0  # frames pushed (once: DingTalk does not resend robot messages) and not yet acked
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.count / self.done_s if self.done_s > 0 else math.nan


async def push_all(port: int, requests: list[bytes], msg_ids: list[str], concurrency: int, batch: Batch) -> None:
    """Closed loop: each connection sends the next push as soon as its previous one was answered."""
    conns: list[HttpConnection] = [await connect(port) for _ in range(concurrency)]
    cursor = 0

    async def drive(slot: int) -> None:
        nonlocal cursor
        while cursor < len(requests):
            index = cursor
            cursor += 1
            try:
                status = await conns[slot].request(requests[index])
            except ConnectionError as exc:
                batch.tally.errors += 1
                if batch.tally.errors > MAX_ERRORS:
                    raise Broken(f"more than {MAX_ERRORS} connection errors pushing to the simulator") from exc
                conns[slot] = await connect(port)
                continue
            batch.tally.statuses[status] += 1
            batch.pushed_at[msg_ids[index]] = time.time()

    try:
        await asyncio.gather(*(drive(slot) for slot in range(len(conns))))
    finally:
        for conn in conns:
            conn.close()


async def run_batch(
    args: argparse.Namespace,
    stack: Stack,
    sim_port: int,
    http: httpx.AsyncClient,
    redis: Redis,
    requests: list[bytes],
    msg_ids: list[str],
) -> Batch:
    """Push one batch and wait until the simulator counts it acked and Redis holds it (bounded by --batch-timeout)."""
    stats_url = f"http://127.0.0.1:{sim_port}/__sim__/dingtalk/stream/stats"
    acked_before = int((await http.get(stats_url)).json()["acked"])
    enqueued_before = await enqueued_count(redis)
    batch = Batch(len(requests))
    meter = CpuMeter(stack)
    cpu_before = meter.sample()
    start = time.perf_counter()
    pushing = asyncio.create_task(push_all(sim_port, requests, msg_ids, args.concurrency, batch))
    deadline = start + args.batch_timeout
    try:
        while True:
            if pushing.done() and math.isnan(batch.push_s):
                pushing.result()  # re-raise a failure
                batch.push_s = time.perf_counter() - start
            stats = (await http.get(stats_url)).json()
            enqueued = await enqueued_count(redis) - enqueued_before
            now = time.perf_counter() - start
            batch.max_unacked = max(batch.max_unacked, int(stats["unacked"]))
            if int(stats["acked"]) - acked_before >= batch.count and math.isnan(batch.acked_s):
                batch.acked_s = now
            if not math.isnan(batch.acked_s) and enqueued >= batch.count and not math.isnan(batch.push_s):
                batch.done_s = now
                break
            if time.perf_counter() > deadline:
                raise Broken(
                    f"batch of {batch.count} not through after {args.batch_timeout:.0f} s: pushed "
                    f"{batch.tally.responses}, acked {int(stats['acked']) - acked_before}, in Redis {enqueued}, "
                    f"stats {stats}"
                )
            stack.check_alive()
            await asyncio.sleep(POLL_S)
    finally:
        if not pushing.done():
            pushing.cancel()
    batch.cpu = meter.since(cpu_before)
    return batch


async def enqueued_count(redis: Redis) -> int:
    """Entries ever enqueued in the work queue (the scheduler's `enqueued` counter)."""
    return int(await redis.hget(KEYS.scheduler_stats, "enqueued") or 0)


async def queued_messages(redis: Redis) -> dict[str, list[float]]:
    """msgId -> enqueue time (s) of every entry in the lanes (a msgId queued twice would be a duplicate).

    No worker runs, so every entry ever enqueued is still in its lane.
    """
    found: dict[str, list[float]] = {}
    async for key in redis.scan_iter(match=KEYS.lane("*"), count=SCAN_COUNT):
        for raw in await redis.lrange(key, 0, -1):
            entry = json.loads(raw)
            found.setdefault(str(entry["msg"]["msg_id"]), []).append(float(entry["t"]) / 1000)
    return found


# --------------------------------------------------------------------------- report


def report(
    args: argparse.Namespace,
    warmup: Batch,
    batches: list[Batch],
    queued: dict[str, list[float]],
    counted: int,
    wall_s: float,
) -> bool:
    """Print the table and the checks (warm-up included); returns True if something broke."""
    print()
    print(
        f"botgw DingTalk Stream-mode intake: one `botgw dingtalk-stream` process, one connection; {os.cpu_count()} "
        f"cores shared by simulator, botgw, redis and this client; {args.messages} messages per round, pushed by "
        f"{args.concurrency} connections"
    )
    print("msgs/s = messages / (first push -> simulator counts all acked and Redis holds all)")
    print()
    rows = []
    latencies_all: list[float] = []
    intake: dict[int, float] = {}  # botgw's own pace: entries per second between the first and last enqueue time
    for number, batch in enumerate(batches, 1):
        # a message never queued stays in the figures as the worst latency, never dropped from them
        latencies = sorted(
            queued[msg_id][0] - pushed if msg_id in queued else math.inf for msg_id, pushed in batch.pushed_at.items()
        )
        latencies_all += latencies
        wall = batch.done_s
        enqueued = [queued[msg_id][0] for msg_id in batch.pushed_at if msg_id in queued]
        span = max(enqueued) - min(enqueued) if len(enqueued) > 1 else math.nan
        intake[number] = (len(enqueued) - 1) / span if span > 0 else math.nan
        rows.append(
            [
                str(number),
                str(batch.count),
                f"{batch.push_s:.2f}",
                f"{batch.count / batch.push_s:.0f}",
                f"{batch.acked_s:.2f}",
                f"{batch.done_s:.2f}",
                f"{batch.rate:.0f}",
                f"{intake[number]:.0f}",
                *(f"{percentile(latencies, pct) * 1000:.0f}" for pct in (50, 99)),
                *(f"{batch.cpu.get(name, math.nan) / wall * 100:.0f}%" for name in PROCESSES),
            ]
        )
    header = ["round", "msgs", "push s", "push/s", "acked s", "in Redis s", "msgs/s", "queued/s", "push->queued p50 ms"]
    header += ["p99 ms", *(f"CPU {name}" for name in PROCESSES)]
    print(table(header, rows))
    print("(queued/s: botgw's pace, first to last enqueue time of the round. CPU: share of one core over the round,")
    print(" 100% = one core. push->queued: push answered by the simulator -> the entry's enqueue time; includes the")
    print(" simulator's 50 ms delivery tick and waiting in botgw's socket buffer)")

    print()
    broken = False
    everything = [warmup, *batches]
    statuses = sum((batch.tally.statuses for batch in everything), Counter[int]())
    errors = sum(batch.tally.errors for batch in everything)
    pushed = {msg_id for batch in everything for msg_id in batch.pushed_at}
    expected = args.warmup + args.messages * args.rounds
    twice = {msg_id: len(times) for msg_id, times in queued.items() if len(times) > 1}
    strangers = set(queued) - pushed
    entries = sum(len(times) for times in queued.values())
    ok = entries == expected == counted and len(pushed) == expected and not twice and not strangers and not errors
    ok &= set(statuses) <= {200}
    print(
        f"duplicate check: the lanes {KEYS.lane('*')} hold {entries} entries ({counted} counted enqueued) for "
        f"{expected} pushed messages (warm-up "
        f"{args.warmup} included), {len(twice)} msgIds queued twice, {len(strangers)} unknown; push statuses "
        f"{dict(statuses)}, connection errors {errors} -> {'OK' if ok else 'MISMATCH'}"
    )
    broken |= not ok
    unacked = max(batch.max_unacked for batch in batches)
    print(f"most frames pushed and not yet acked at one poll (DingTalk never resends them): {unacked}")
    sim_share = sum(batch.cpu.get("simulator", 0.0) for batch in batches) / sum(b.done_s for b in batches)
    bot_share = sum(batch.cpu.get("dingtalk-stream", 0.0) for batch in batches) / sum(b.done_s for b in batches)
    gated = sum(batch.push_s for batch in batches) / sum(batch.done_s for batch in batches)
    print(
        f"note: the simulator used {sim_share * 100:.0f}% of a core, botgw {bot_share * 100:.0f}%; the pushes alone "
        f"took {gated * 100:.0f}% of the measured time. Frames cannot reach botgw faster than the simulator takes "
        "the pushes and delivers them, so msgs/s is a lower bound for botgw; queued/s is closer to botgw's own pace"
    )
    p50, p99 = (percentile(latencies_all, pct) * 1000 for pct in (50, 99))
    print(f"push->queued over all rounds: p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    print("note: timings are noisy on a shared 2-core machine; compare rounds before trusting small differences")
    print(f"run time: {wall_s:.0f} s")
    return broken


# --------------------------------------------------------------------------- main


async def benchmark(args: argparse.Namespace, stack: Stack) -> bool:
    began = time.perf_counter()
    redis_port, sim_port = free_port(), free_port()
    redis_url, sim_url = f"redis://127.0.0.1:{redis_port}/0", f"http://127.0.0.1:{sim_port}"
    stack.start_redis(redis_port)
    config = stream_config(redis_url, sim_url)
    path = stack.write_config(config)
    stack.start("simulator", simulator_args(path, sim_port))
    bot = DingTalkBotConfig(**config["bots"][0])
    redis = Redis.from_url(redis_url)
    try:
        async with httpx.AsyncClient(timeout=10) as http:

            def ok(url: str) -> Awaitable[bool]:
                return http_ok(http, url)

            async def connected() -> bool:
                stats = (await http.get(f"{sim_url}/__sim__/dingtalk/stream/stats", timeout=2)).json()
                return int(stats["live"].get(bot.app_key, 0)) >= 1

            children = stack.procs
            await wait_ready(stack, children["redis"], lambda: redis.ping(), SERVER_START_S)
            await wait_ready(stack, children["simulator"], lambda: ok(f"{sim_url}/__sim__/healthz"), SERVER_START_S)
            stack.start("dingtalk-stream", [*BOTGW, "dingtalk-stream", "--config", str(path)])
            await wait_ready(stack, children["dingtalk-stream"], connected, CONNECT_S)
            print(f"stream connected after {time.perf_counter() - began:.1f} s (logs in {stack.log_dir})", flush=True)

            tags = ["warm", *(f"r{number}" for number in range(1, args.rounds + 1))]
            counts = [args.warmup, *([args.messages] * args.rounds)]
            prepared = [
                build_pushes(bot, sim_url, count, args.users, tag) for tag, count in zip(tags, counts, strict=True)
            ]
            print(f"pre-built {sum(counts)} pushes", flush=True)
            batches: list[Batch] = []
            warmup = Batch(0)
            for tag, (requests, msg_ids) in zip(tags, prepared, strict=True):
                batch = await run_batch(args, stack, sim_port, http, redis, requests, msg_ids)
                print(
                    f"  {tag}: {batch.count} messages through in {batch.done_s:.2f} s = {batch.rate:.0f} msgs/s "
                    f"(pushes answered after {batch.push_s:.2f} s)",
                    flush=True,
                )
                if tag == "warm":
                    warmup = batch
                else:
                    batches.append(batch)
                await asyncio.sleep(args.pause)
            stack.check_alive()
            queued = await queued_messages(redis)
            counted = await enqueued_count(redis)
    finally:
        await redis.aclose()
    return report(args, warmup, batches, queued, counted, time.perf_counter() - began)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=2000, help="messages per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds (default 2)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up messages, not counted (default 100)")
    parser.add_argument("--concurrency", type=int, default=16, help="push connections (default 16)")
    parser.add_argument("--users", type=int, default=1000, help="distinct DingTalk users (default 1000)")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between rounds (default 1)")
    parser.add_argument("--batch-timeout", type=float, default=60.0, help="fail a round not through after this")
    parser.add_argument("--time-limit", type=float, default=240.0, help="stop and fail after this many seconds")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs and config")
    args = parser.parse_args(argv)
    if min(args.messages, args.rounds, args.concurrency, args.users) < 1 or args.warmup < 1:
        parser.error("--messages, --rounds, --warmup, --concurrency and --users must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return main_async(parse_args(argv), "botgw-stream-", benchmark, failures=(httpx.HTTPError, OSError))


if __name__ == "__main__":
    sys.exit(main())
