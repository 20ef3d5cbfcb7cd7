"""Readiness with warm-up (the real engine behind a holding proxy), and, with stub engines
(testkit/fakes/stub_engine.py) whose load and answers the test controls: waiting for an engine that is not up
yet, least-loaded routing, failover when an engine is killed mid-request, and an answer that continues when its
engine is killed mid-stream."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from bots.wecom.config import WeComAIBotConfig
from gateway import texts
from simulator.wecom.ai_user import WeComAIBotUser
from testkit.configs import write_config
from testkit.fakes.holding_proxy import HoldingProxy
from testkit.fakes.stub_engine import answer_for
from testkit.probes import metric
from testkit.processes import Proc, free_port, wait_for, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import Cluster, Stack


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
    stack: Stack, isolated_factory, user: str
) -> None:
    port = free_port()  # nothing listens here yet: the engine is "down"
    iso = isolated_factory(base_url=f"http://127.0.0.1:{port}", poll_interval_s=0.3, wait_notice_after_s=1.5)
    iso.start_gateway()
    iso.start_worker()
    assert iso.stack.post_callback(iso.stack.signer().text(user, "Are you there?")).status_code == 200
    notice = iso.stack.wait_delivered(user, 1, timeout=30, settle=3.0)
    assert [item["content"] for item in notice] == [texts.ENGINE_STARTING_TEXT]
    engine = Proc(
        [sys.executable, "-m", "testkit.fakes.stub_engine", "--port", str(port), "--delay", "0.2"],
        stack.log_dir / f"stub-late-{iso.namespace}.log",
    )
    iso.stack.procs["engine-late"] = engine
    wait_http(f"http://127.0.0.1:{port}/health", 30, engine)
    iso.stack.wait_delivered(user, 2, timeout=60, settle=2.0)
    assert iso.stack.texts(user) == [texts.ENGINE_STARTING_TEXT, answer_for("Are you there?")], "notified once"


def send_all(c: Cluster, texts: dict[str, str]) -> None:
    """One WeCom callback per user, over one keep-alive connection (a burst)."""
    signer = c.stack.signer()
    with httpx.Client(timeout=10) as http:
        for user, text in texts.items():
            body = signer.text(user, text)
            assert http.post(f"{c.gateways[0]}/callback/app", params=body.params, content=body.body).status_code == 200


def routed(c: Cluster, texts: dict[str, str]) -> list[int]:
    """How many of `texts` each engine was asked."""
    wanted = set(texts.values())
    return [sum(1 for r in c.engine_requests(i) if r["user"] in wanted) for i in range(len(c.engine_urls))]


def test_least_loaded_routing_and_failover_when_an_engine_is_killed(cluster) -> None:
    metrics_port = free_port()
    c = cluster(1.0, engines=2, engine={"poll_interval_s": 2.0}, worker={"metrics_port": metrics_port})
    c.add_gateway()
    c.add_worker("w")
    worker_metrics = f"http://127.0.0.1:{metrics_port}"

    # Two idle engines of the same speed, 8 requests at once (the worker's 8 slots): each goes to the engine with
    # fewer requests in flight, so they split evenly (one may go astray when a scrape lands between a send and its
    # arrival at the engine, which undercounts it: /metrics is read every 2 s here, so that few scrapes do).
    burst = {f"even{i}{secrets.token_hex(3)}": f"even question {i}" for i in range(8)}
    send_all(c, burst)
    for user, text in burst.items():
        c.stack.wait_delivered(user, 1, timeout=30, settle=0)
        assert c.stack.texts(user) == [answer_for(text)]
    split = routed(c, burst)
    assert sum(split) == 8 and min(split) >= 3, f"8 requests over two idle engines went {split}"

    # Engine 1 reports 50 requests running (another gateway's, say): while engine 0 has fewer, it gets them all.
    httpx.post(f"{c.engine_urls[1]}/__stub__/load", json={"running": 50}, timeout=5).raise_for_status()
    busy = c.engine_urls[1]
    wait_for(lambda: metric(worker_metrics, "botgw_engine_requests_running", endpoint=busy) == 50, 10,
             "the worker to read engine 1's load")
    loaded = {f"load{i}{secrets.token_hex(3)}": f"loaded question {i}" for i in range(6)}
    send_all(c, loaded)
    for user, text in loaded.items():
        c.stack.wait_delivered(user, 1, timeout=30, settle=0)
        assert c.stack.texts(user) == [answer_for(text)]
    assert routed(c, loaded) == [6, 0], "a request went to the busier engine"

    # Engine 0 is killed while it holds requests (it has become slow): they are retried on engine 1, answered once.
    httpx.post(f"{c.engine_urls[0]}/__stub__/load", json={"delay_s": 60}, timeout=5).raise_for_status()
    doomed = {f"kill{i}{secrets.token_hex(3)}": f"doomed question {i}" for i in range(4)}
    send_all(c, doomed)
    wait_for(lambda: routed(c, doomed)[0] == 4, 10, "engine 0 to hold the four requests")
    c.engines[0].kill()
    for user in doomed:
        c.stack.wait_delivered(user, 1, timeout=60, settle=0)
    time.sleep(1.0)  # room for a double answer to show
    for user, text in doomed.items():
        assert c.stack.texts(user) == [answer_for(text)]
    retried = [r["user"] for r in c.engine_requests(1) if r["user"] in doomed.values()]
    assert sorted(retried) == sorted(doomed.values()), "each killed request was retried on the other engine, once"
    assert "engine taken out" in c.procs["w"].tail(400)
    assert c.stack.queue_depth() == 0


def test_engine_killed_mid_stream_the_answer_continues(cluster, user: str) -> None:
    """An AI-bot answer is being streamed when its engine is SIGKILLed: what the user sees is continued on the
    other engine (continue_final_message), never replaced nor shown going backwards."""
    c = cluster(0.1, engines=2, chunk_delay_s=0.8, engine={"poll_interval_s": 0.2})
    gateway = c.add_gateway()
    c.add_worker("w")
    bot = WeComAIBotConfig(**next(b for b in c.config["bots"] if b["id"] == "ai"))
    text = "Tell me a long story about the sea"
    killed: list[int] = []

    async def on_update(shown: str) -> None:
        if shown and not killed:  # the first chunk is on screen: kill the engine that is writing it
            index = next(i for i in range(2) if any(r["user"] == text for r in c.engine_requests(i)))
            c.engines[index].kill()
            killed.append(index)

    async def ask():  # type: ignore[no-untyped-def]
        async with httpx.AsyncClient(timeout=30) as http:
            return await WeComAIBotUser(bot, [gateway], c.stack.sim_url, http).ask(
                user, text, interval_s=0.1, on_update=on_update
            )

    view = asyncio.run(ask())
    assert killed, "the answer was never seen growing"
    assert view.finished and view.text == answer_for(text)
    for before, after in itertools.pairwise(view.shown):
        assert after.startswith(before), f"text went backwards: {before!r} -> {after!r}"
    (survivor,) = {0, 1} - set(killed)
    continued = [r for r in c.engine_requests(survivor) if r["user"] == text]
    assert len(continued) == 1 and continued[0]["continued"], "the other engine was asked to continue the text"
    assert answer_for(text).startswith(continued[0]["continued"])
