"""The gateway's uvicorn server (gateway/edge/server.py): it wakes about once a second while idle, not ten times,
yet still sends a current Date header and stops at once when a signal comes."""

from __future__ import annotations

import asyncio
import email.utils
import signal
import socket
import time

import httpx
import uvicorn

from gateway.edge.server import QuietServer


async def _app(scope: dict, receive: object, send: object) -> None:  # a bare ASGI app: 200 "ok"
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


async def test_an_idle_server_wakes_once_a_second_sends_a_current_date_and_stops_at_a_signal() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    server = QuietServer(uvicorn.Config(_app, log_config=None, access_log=False, lifespan="off"))
    ticks = 0
    tick = server.on_tick

    async def counted(counter: int) -> bool:
        nonlocal ticks
        ticks += 1
        return await tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.sleep(2.5)
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
        assert response.status_code == 200
        sent_at = email.utils.parsedate_to_datetime(response.headers["date"]).timestamp()
        assert abs(sent_at - time.time()) <= 2.0, response.headers["date"]
        # uvicorn's own loop ticks every 0.1 s: 25 ticks in 2.5 s; this one once a second.
        assert 2 <= ticks <= 4, ticks

        asked = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)
        server._captured_signals.clear()  # uvicorn would raise the signal again after serving: not in pytest
        await asyncio.wait_for(asyncio.shield(serving), timeout=0.5)
        assert time.monotonic() - asked < 0.5  # woken by the signal, not by the next second
    finally:
        server.should_exit = True
        await asyncio.gather(serving, return_exceptions=True)
