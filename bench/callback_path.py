"""The gateway's callback path in process: CPU per signed WeCom callback, and per part, without a server or a network.

Why: bench/overhead.py measures botgw's CPU per answer end to end, but on this 2-core machine it moves by 15-25% from
run to run, so a change of a few percent cannot be seen there (issue 22). This runs the same code in one process
against a real redis-server, in rounds, and prints the lowest and the median CPU per call of each round, which move
by a few percent only:
- `app`: the whole gateway ASGI app (`gateway.edge.app.create_app`: its middleware, route, verify, decrypt, parse,
  dedup and enqueue through the batcher into Redis, the 200), `--concurrency` callbacks at a time; what uvicorn adds
  (HTTP parsing, the socket) is not in it: bench/ingest.py measures the gateway with it;
- `adapter`: the WeCom app adapter alone (signature, timestamp, AES, both XML parses, the message model);
- `redis script`: one EVALSHA round trip through redis-py as botgw opens it (`open_redis`: hiredis packing, the
  socket timeout every botgw client has), and the same with redis-py's connections on Python 3.11's own
  `asyncio.wait_for` (gateway/state/redis_wire.py says why botgw replaces it).

Run: `.venv/bin/python bench/callback_path.py [--callbacks 2000 --rounds 8 --concurrency 8]` (under a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop
from redis.asyncio import connection as redis_connection

from bench.common import table
from gateway.config import load_settings
from gateway.edge.app import create_app
from gateway.state.redis_client import open_redis
from simulator.wecom.signer import SignedCallback, WeComCallbackSigner
from testkit.configs import botgw_config, wecom_app, write_config
from testkit.redis_servers import start_redis

BOT_ID = "app"
USERS = 50


def asgi_scope(callback: SignedCallback, query: bytes) -> dict[str, Any]:
    """The scope uvicorn would give the app for this callback's POST (`query`: its parameters, encoded)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": f"/callback/{BOT_ID}",
        "raw_path": f"/callback/{BOT_ID}".encode(),
        "query_string": query,
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"text/xml"),
            (b"content-length", str(len(callback.body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }


async def post(app: Any, callback: SignedCallback, query: bytes) -> None:
    """One callback through the ASGI app; anything but a 200 stops the benchmark."""
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:  # the body was read: a second receive waits for a disconnect that does not come
            await asyncio.Event().wait()
        delivered = True
        return {"type": "http.request", "body": callback.body, "more_body": False}

    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(asgi_scope(callback, query), receive, send)
    if statuses != [200]:
        raise SystemExit(f"the gateway answered {statuses} to a valid callback")


async def rounds(
    name: str, calls: int, rounds_n: int, run_round: Callable[[int, int], Awaitable[None]]
) -> list[str]:
    """CPU per call of each round (process time: this process alone, Redis apart): the lowest and the median."""
    per_call = []
    for number in range(rounds_n):
        started = time.process_time()
        await run_round(number, calls)
        per_call.append((time.process_time() - started) / calls * 1e6)
    return [name, str(calls), f"{min(per_call):.0f}", f"{statistics.median(per_call):.0f}"]


async def measure(args: argparse.Namespace, redis_url: str, workdir: Path) -> list[list[str]]:
    config = botgw_config(redis_url, "cbpath", [wecom_app(BOT_ID, "http://127.0.0.1:9")])
    settings = load_settings(write_config(workdir / "botgw.yaml", config))
    signer = WeComCallbackSigner(settings.bot(BOT_ID))
    total = args.callbacks * (args.rounds + 1)
    callbacks = [signer.text(f"user{i % USERS}", f"question {i}") for i in range(total)]  # each a new MsgId
    queries = [urlencode(callback.params).encode() for callback in callbacks]  # uvicorn's work, not the app's
    app = create_app(settings)
    rows = []
    async with app.router.lifespan_context(app):
        adapter = app.state.runtime.adapters[BOT_ID]
        for callback, query in zip(callbacks[: args.callbacks], queries, strict=False):  # warm-up: caches, Redis
            await post(app, callback, query)

        async def app_round(number: int, calls: int) -> None:
            batch = list(zip(callbacks, queries, strict=True))[(number + 1) * calls : (number + 2) * calls]
            for start in range(0, calls, args.concurrency):
                await asyncio.gather(*(post(app, c, q) for c, q in batch[start : start + args.concurrency]))

        rows.append(await rounds(f"app, {args.concurrency} at a time", args.callbacks, args.rounds, app_round))

        async def adapter_round(number: int, calls: int) -> None:
            now = time.time()
            for callback in callbacks[:calls]:
                adapter.parse(callback.params, callback.body, now)

        rows.append(await rounds("adapter (verify, decrypt, parse)", args.callbacks, args.rounds, adapter_round))

    redis = open_redis(redis_url, **settings.redis_options())
    script = redis.register_script("return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])")
    try:

        async def script_round(number: int, calls: int) -> None:
            for i in range(calls):
                await script(keys=["cbpath:bench"], args=["field", f"value {i}"])

        await script_round(0, 100)
        rows.append(await rounds("redis script (one EVALSHA)", args.callbacks, args.rounds, script_round))
        if redis_connection.asyncio is not asyncio:  # Python 3.11, the shim installed: once more without it
            shim, redis_connection.asyncio = redis_connection.asyncio, asyncio  # type: ignore[attr-defined]
            try:
                rows.append(
                    await rounds("redis script, 3.11's wait_for", args.callbacks, args.rounds, script_round)
                )
            finally:
                redis_connection.asyncio = shim  # type: ignore[attr-defined]
    finally:
        await redis.aclose()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callbacks", type=int, default=2000, help="calls per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each measurement (default 8)")
    parser.add_argument("--concurrency", type=int, default=8, help="callbacks at a time through the app (default 8)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="botgw-cbpath-") as folder:
        workdir = Path(folder)
        proc, redis_url = start_redis(workdir, "redis")
        try:
            rows = uvloop.run(measure(args, redis_url, workdir))
        finally:
            proc.stop()
    print(table(["what", "calls per round", "min µs CPU per call", "median µs CPU per call"], rows))
    print(f"{args.rounds} rounds each; process time of this process alone (redis-server's own CPU is not in it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
