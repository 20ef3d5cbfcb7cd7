"""Readiness with warm-up, waiting for an engine that is not up yet, and routing across two real engines."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway import commands
from tests.conftest import Stack
from tests.holding_proxy import HoldingProxy
from tests.procs import (
    BOTGW,
    Proc,
    engine_requests_finished,
    free_port,
    start_gateway,
    start_worker,
    wait_http,
    write_config,
)


class Isolated:
    """A gateway and workers of their own (own namespace, own engine settings) next to the session stack."""

    def __init__(self, stack: Stack, engine: dict) -> None:
        self.namespace = "e" + secrets.token_hex(4)
        config = {**stack.config, "namespace": self.namespace, "engine": {**stack.config["engine"], **engine}}
        self.path = write_config(stack.log_dir / f"{self.namespace}.yaml", config)
        self.port = free_port()
        url = f"http://127.0.0.1:{self.port}"
        self.stack = Stack(config, self.path, url, stack.sim_url, stack.redis, self.namespace, stack.log_dir)

    def start_gateway(self) -> None:
        self.stack.procs["gateway"] = start_gateway(self.path, self.port, self.stack.log_dir, f"gw-{self.namespace}")

    def start_worker(self, name: str = "w") -> Proc:
        proc = start_worker(self.path, self.stack.log_dir, f"{self.namespace}-{name}")
        self.stack.procs[name] = proc
        return proc

    def stop(self) -> None:
        for proc in self.stack.procs.values():
            proc.stop()


@pytest.fixture
def isolated_factory(stack: Stack) -> Iterator[object]:
    made: list[Isolated] = []

    def make(**engine: object) -> Isolated:
        made.append(Isolated(stack, engine))
        return made[-1]

    yield make
    for item in made:
        item.stop()


def start_engine(port: int, log_dir: Path, name: str) -> Proc:
    return Proc([*BOTGW, "engine", "serve", "--profile", "tiny", "--port", str(port)], log_dir / f"{name}.log")


def test_readyz_waits_for_the_warm_up_answer(stack: Stack, live_engine: str, isolated_factory) -> None:
    with HoldingProxy(live_engine) as proxy:
        iso = isolated_factory(base_url=proxy.url, poll_interval_s=0.2)
        iso.start_gateway()
        deadline = time.monotonic() + 20
        while proxy.held == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.held >= 1, "the gateway should have sent its warm-up request"
        held = httpx.get(f"{iso.stack.admin_url}/readyz", timeout=5)
        assert held.status_code == 503
        assert held.json()["engines"] == {proxy.url: "warming"}
        assert httpx.get(f"{proxy.url}/health", timeout=5).status_code == 200  # the engine itself is up
        proxy.release.set()
        wait_http(f"{iso.stack.admin_url}/readyz", 20)
        assert httpx.get(f"{iso.stack.admin_url}/readyz", timeout=5).json()["engines"] == {proxy.url: "ready"}


def test_engine_down_at_start_message_waits_notice_once_then_answer(
    stack: Stack, live_engine: str, isolated_factory, user: str
) -> None:
    port = free_port()
    iso = isolated_factory(base_url=f"http://127.0.0.1:{port}", poll_interval_s=0.3, wait_notice_after_s=1.5)
    iso.start_gateway()
    iso.start_worker()
    assert iso.stack.post_callback(iso.stack.signer().text(user, "Are you there?")).status_code == 200
    notice = iso.stack.wait_delivered(user, 1, timeout=30, settle=3.0)
    assert [item["content"] for item in notice] == [commands.ENGINE_STARTING_TEXT]
    engine = start_engine(port, stack.log_dir, "engine-late")
    iso.stack.procs["engine-late"] = engine
    wait_http(f"http://127.0.0.1:{port}/health", 600, engine)
    delivered = iso.stack.wait_delivered(user, 2, timeout=120, settle=2.0)
    assert len(delivered) == 2
    assert delivered[1]["content"] and delivered[1]["content"] != commands.ENGINE_STARTING_TEXT


def test_two_engines_share_the_load_and_survive_one_dying(
    stack: Stack, live_engine: str, isolated_factory
) -> None:
    port = free_port()
    second = f"http://127.0.0.1:{port}"
    iso = isolated_factory(endpoints=[live_engine, second], poll_interval_s=0.3, max_tokens=160)
    engine = start_engine(port, stack.log_dir, "engine-second")
    iso.stack.procs["engine-second"] = engine
    wait_http(f"{second}/health", 600, engine)
    iso.start_gateway()
    worker = iso.start_worker()
    deadline = time.monotonic() + 60
    while worker.tail(50).count('"engine ready"') < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker.tail(50).count('"engine ready"') == 2, "the worker should see both engines ready"
    signer = iso.stack.signer()

    before = {url: engine_requests_finished(url) for url in (live_engine, second)}
    users = [f"s{secrets.token_hex(4)}" for _ in range(12)]
    for user in users:
        assert iso.stack.post_callback(signer.text(user, f"question from {user}")).status_code == 200
    for user in users:
        iso.stack.wait_delivered(user, 1, timeout=120, settle=0)
    served = {url: engine_requests_finished(url) - before[url] for url in before}
    assert all(count >= 2 for count in served.values()), f"load was not spread: {served}"

    users = [f"k{secrets.token_hex(4)}" for _ in range(12)]
    for user in users:
        assert iso.stack.post_callback(signer.text(user, f"question from {user}")).status_code == 200
    time.sleep(0.3)
    engine.kill()  # SIGKILL the second engine while answers are being generated
    for user in users:
        iso.stack.wait_delivered(user, 1, timeout=180, settle=0)
    time.sleep(2.0)
    assert all(len(iso.stack.delivered(user)) == 1 for user in users)
    assert "engine taken out" in iso.stack.procs["w"].tail(400)
