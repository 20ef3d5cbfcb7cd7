"""An HTTP proxy in front of a real engine that can hold chat completions (to observe the gateway while
an engine is up but its warm-up answer has not come back) or slow a streamed answer down (to kill a
worker in the middle of one: the tiny engine alone answers too fast for that)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from engine.client import sse_lines
from testkit.processes import free_port


class HoldingProxy:
    """Forwards everything to `target`; /v1/chat/completions waits until `release` is set."""

    def __init__(self, target: str, chunk_delay_s: float = 0.0) -> None:
        self.target = target.rstrip("/")
        self.chunk_delay_s = chunk_delay_s
        self.release = threading.Event()
        self.held = 0
        self.chat_bodies: list[dict] = []
        self.port = free_port()
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def forward(path: str, request: Request) -> Response:
            if path.endswith("chat/completions"):
                self.held += 1
                self.chat_bodies.append(json.loads(await request.body()))
                while not self.release.is_set():
                    await asyncio.sleep(0.05)
                if self.chunk_delay_s:
                    return await self._slow_stream(path, await request.body())
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

    async def _slow_stream(self, path: str, body: bytes) -> Response:
        """Forward a streamed completion line by line, each line delayed."""
        client = httpx.AsyncClient(timeout=120)
        upstream = await client.send(
            client.build_request(
                "POST", f"{self.target}/{path}", content=body, headers={"content-type": "application/json"}
            ),
            stream=True,
        )

        async def lines() -> AsyncIterator[bytes]:
            try:
                async for line in sse_lines(upstream):
                    if line:
                        await asyncio.sleep(self.chunk_delay_s)
                    yield (line + "\n").encode()
            finally:
                await upstream.aclose()
                await client.aclose()

        media_type = upstream.headers.get("content-type", "text/event-stream")
        return StreamingResponse(lines(), status_code=upstream.status_code, media_type=media_type)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HoldingProxy:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the holding proxy on port {self.port} did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.should_exit = True
        self._thread.join(10)
