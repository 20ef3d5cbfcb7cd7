"""Operating the gateway: what the public port shows, and a SIGTERM that loses no callback in flight."""

from __future__ import annotations

import secrets
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import httpx
import pytest

from testkit.configs import write_config
from testkit.processes import BOTGW, Proc, free_port, wait_for
from testkit.services import start_gateway
from testkit.stacks import Stack

ADMIN_TOKEN = "adm-" + secrets.token_hex(12)


@pytest.fixture
def own_gateway(stack: Stack) -> Iterator[Stack]:
    """A gateway of its own (namespace, admin token), no worker: entries stay where they were queued."""
    namespace = "o" + secrets.token_hex(4)
    config = {**stack.config, "namespace": namespace, "admin": {"token": ADMIN_TOKEN}}
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    port = free_port()
    own = Stack(config, path, f"http://127.0.0.1:{port}", stack.sim_url, stack.redis, namespace, stack.log_dir)
    own.procs["gateway"] = start_gateway(path, port, stack.log_dir, name=f"gw-{namespace}")
    yield own
    for proc in own.procs.values():
        proc.stop()


def test_operator_routes_live_on_the_admin_listener_only(own_gateway: Stack) -> None:
    public, admin = own_gateway.gateway_url, own_gateway.admin_url
    for path in ("/metrics", "/readyz"):
        assert httpx.get(f"{public}{path}", timeout=5).status_code == 404, path
    assert httpx.get(f"{public}/admin/limits/{secrets.token_hex(3)}", timeout=5).status_code == 401
    assert httpx.get(f"{public}/healthz", timeout=5).status_code == 200

    metrics = httpx.get(f"{admin}/metrics", timeout=5)
    assert metrics.status_code == 200 and "botgw_callbacks_total" in metrics.text
    readyz = httpx.get(f"{admin}/readyz", timeout=10)
    assert readyz.status_code in (200, 503) and "engines" in readyz.json()
    # The admin listener serves operators' routes only: no callbacks, no web API.
    assert httpx.post(f"{admin}/callback/{own_gateway.bot.id}", content=b"x", timeout=5).status_code == 404

    # A Prometheus that can reach only the public port scrapes with the admin token; a wrong one is refused.
    bearer = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.get(f"{public}/metrics", headers=bearer, timeout=5).status_code == 200
    wrong = {"authorization": f"Bearer {ADMIN_TOKEN}x"}
    assert httpx.get(f"{public}/metrics", headers=wrong, timeout=5).status_code == 404


def test_sigterm_finishes_the_callback_in_flight_then_stops_accepting(own_gateway: Stack, user: str) -> None:
    stack = own_gateway
    callback = stack.signer().text(user, "sent while the gateway stops")
    port = int(stack.gateway_url.rsplit(":", 1)[1])
    before = stack.entries_added()

    # Half a request on the wire, then SIGTERM: uvicorn must finish it, not cut it.
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST /callback/{stack.bot.id}?{urlencode(callback.params)} HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: text/xml\r\nContent-Length: {len(callback.body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    conn.sendall(head + callback.body[:20])
    time.sleep(0.3)
    gateway = stack.procs["gateway"]
    gateway.kill(signal.SIGTERM)
    time.sleep(0.5)
    conn.sendall(callback.body[20:])
    response = b""
    while chunk := conn.recv(65536):
        response += chunk
    conn.close()

    assert response.startswith(b"HTTP/1.1 200"), response[:200]
    assert stack.entries_added() == before + 1
    gateway.popen.wait(15)
    # uvicorn re-raises the SIGTERM once it has shut down cleanly, so the exit status is -15, not a crash.
    assert gateway.popen.returncode in (0, -signal.SIGTERM), gateway.tail()
    assert "Application shutdown complete" in gateway.tail()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{stack.gateway_url}/healthz", timeout=2)


def test_stream_process_sigterm_queues_every_message_it_acknowledged(stack: Stack) -> None:
    """DingTalk never resends a Stream push, so on SIGTERM the process must queue (and then ack) the frames
    in hand before it closes: every frame DingTalk saw acknowledged is in the queue, and it exits cleanly."""
    from tests.e2e.dingtalk.test_dingtalk import send, stream_stats

    proc = Proc([*BOTGW, "dingtalk-stream", "--config", str(stack.config_path)], stack.log_dir / "dts-term.log")
    try:
        wait_for(lambda: "dingtalk stream connected" in proc.tail(20), 30, "the Stream connection")
        entries_before, acked_before = stack.entries_added(), stream_stats(stack)["acked"]
        users = [f"term{secrets.token_hex(3)}" for _ in range(12)]
        with ThreadPoolExecutor(max_workers=12) as pool:
            sent = [pool.submit(send, stack, "ding-stream", user, "/help") for user in users]
            wait_for(lambda: stream_stats(stack)["acked"] > acked_before, 10, "the first push to be acknowledged")
            proc.kill(signal.SIGTERM)  # while the rest are arriving
            for future in sent:
                future.result()
        proc.popen.wait(15)
        assert proc.popen.returncode == 0, proc.tail()
        acked = stream_stats(stack)["acked"] - acked_before
        assert acked >= 1
        assert stack.entries_added() - entries_before == acked, "a frame was acknowledged but not queued"
    finally:
        proc.stop()
