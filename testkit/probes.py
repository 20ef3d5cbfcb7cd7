"""Looking at running processes from a test: a recording listener, one Prometheus sample, and the replies a person
got at the simulator (simulator/replies.py's loop, for synchronous callers)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

import httpx

from simulator.replies import wait_until_quiet

T = TypeVar("T")


class Listener:
    """A plain HTTP server standing for an address inside the company's network: it records what reaches it."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"errcode": 0}')

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus exposition at `url` (/metrics): the sum over series whose labels include
    `labels` (0 when there is none)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        series, value = line.rsplit(" ", 1)
        if all(f'{key}="{wanted}"' in series for key, wanted in labels.items()):
            total += float(value)
    return total


def run_to_end(coroutine: Coroutine[object, object, T]) -> T:
    """asyncio.run, also from a thread whose loop is running (Playwright's sync API keeps one in the browser
    tests): the coroutine then runs on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def wait_replies(
    fetch: Callable[[httpx.AsyncClient], Awaitable[list[dict]]], count: int, timeout: float, settle: float, what: str
) -> list[dict]:
    """At least `count` replies, then `settle` quiet seconds to catch extras (simulator/replies.py's loop, for the
    tests' synchronous helpers); AssertionError naming `what` when fewer came within `timeout`."""

    async def wait() -> list[dict]:
        async with httpx.AsyncClient(timeout=5) as http:
            return await wait_until_quiet(lambda: fetch(http), timeout, quiet_s=settle, at_least=count)

    items = run_to_end(wait())
    if len(items) < count:
        raise AssertionError(f"{what} got {len(items)} messages, expected {count}")
    return items
