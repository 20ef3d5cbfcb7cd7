"""The flood guard: requests per source address (`limits.http_per_source`), counted before any route runs.

Why not slowapi's middleware, used before: it applies its default limits only to a request whose route it finds in
`app.routes`, and FastAPI nests included routers, so it found none and limited nothing (seen in a profile for
issue 22; no test covered it). This is the same guard on the `limits` library slowapi is built on: one fixed-window
hit per request and window (slowapi's default strategy), keyed by the TCP peer as slowapi's get_remote_address was,
in `limits.http_storage` (this process's memory by default). A full window answers 429 with Retry-After, and the
request goes no further.
"""

from __future__ import annotations

import json
import math
import time

from limits import parse_many
from limits.aio.strategies import FixedWindowRateLimiter
from limits.storage import storage_from_string
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.state.redis_client import limits_storage


class FloodGuard:
    """ASGI middleware: HTTP requests over `spec` (e.g. "2000/second") from one address are answered 429."""

    def __init__(self, app: ASGIApp, spec: str, storage_url: str, key_prefix: str) -> None:
        self.app = app
        self._windows = parse_many(spec)
        uri, options = limits_storage(storage_url)
        self._limiter = FixedWindowRateLimiter(storage_from_string(uri, key_prefix=key_prefix, **options))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        source = scope["client"][0] if scope.get("client") else "unknown"
        for window in self._windows:
            if not await self._limiter.hit(window, source):
                await self._refuse(send, window, source)
                return
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send, window: object, source: str) -> None:
        stats = await self._limiter.get_window_stats(window, source)  # type: ignore[arg-type]
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        body = json.dumps({"error": f"rate limit exceeded: {window} from one address"}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(retry_after).encode()),
        ]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})
