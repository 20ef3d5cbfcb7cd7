"""An HTTP proxy in front of a real engine that can hold chat completions: lets a test observe
the gateway while an engine is up but its warm-up answer has not come back yet."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response

from tests.procs import free_port


class HoldingProxy:
    """Forwards everything to `target`; /v1/chat/completions waits until `release` is set."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.release = threading.Event()
        self.held = 0
        self.port = free_port()
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def forward(path: str, request: Request) -> Response:
            if path.endswith("chat/completions"):
                self.held += 1
                while not self.release.is_set():
                    await asyncio.sleep(0.05)
            async with httpx.AsyncClient(timeout=60) as client:
                upstream = await client.request(
                    request.method,
                    f"{self.target}/{path}",
                    content=await request.body(),
                    headers={"content-type": request.headers.get("content-type", "application/json")},
                )
            return Response(upstream.content, upstream.status_code, media_type=upstream.headers.get("content-type"))

        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HoldingProxy:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.should_exit = True
        self._thread.join(10)
