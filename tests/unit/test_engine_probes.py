"""The engine pool's probes: a ready engine that answers chats gets no light /health probe besides (each probe costs
CPU here and in vLLM) but still its full check, and the light probe again as soon as the chats stop; readiness read
over real HTTP through the client production uses, and refused with a reason for what is not an engine of ours."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from engine import pool as pool_module
from engine.client import EngineClient
from engine.pool import EnginePool
from engine.settings import EngineSettings
from testkit.stacks import start_stub_engine

MODEL = "ernie-tiny"


def engine_app(seen: Counter[str], alive: dict[str, bool]) -> httpx.MockTransport:
    """An OpenAI-compatible engine in-process: /health, /v1/models, /metrics and whole chat answers."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen[request.url.path] += 1
        if not alive["up"]:
            return httpx.Response(503)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL, "max_model_len": 4096}]})
        if request.url.path == "/v1/chat/completions":
            answer = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": {}}
            return httpx.Response(200, json=answer)
        return httpx.Response(200, text="")

    return httpx.MockTransport(handle)


@pytest.fixture
def fast_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "READY_CHECK_S", 0.5)
    monkeypatch.setattr(pool_module, "FULL_CHECK_S", 1.0)


async def until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_ready_engine_answering_chats_gets_no_liveness_probe_and_does_when_they_stop(fast_probes: None) -> None:
    seen: Counter[str] = Counter()
    alive = {"up": True}
    settings = EngineSettings(base_url="http://engine.test", model=MODEL, poll_interval_s=0.05, warmup=False)
    async with httpx.AsyncClient(transport=engine_app(seen, alive)) as http:
        pool = EnginePool(settings, http)
        await pool.start()
        try:
            assert await pool.wait_ready(5)
            seen.clear()
            chatting_until = time.monotonic() + 2.5
            while time.monotonic() < chatting_until:  # a chat every 0.02 s, well within READY_CHECK_S of the next
                await pool.chat([{"role": "user", "content": "hello"}])
                await asyncio.sleep(0.02)
            while_chatting = Counter(seen)
            seen.clear()
            # no chats: the light /health comes back between the full checks (/health + /v1/models)
            probed_alone = await until(lambda: seen["/health"] >= seen["/v1/models"] + 2, 10)
            alive["up"] = False  # and still finds an engine that went away without a chat noticing
            went_down = await until(lambda: pool.endpoints[0].status == "down", 10)
        finally:
            await pool.aclose()
    assert while_chatting["/health"] == while_chatting["/v1/models"] >= 1  # the full checks alone
    assert probed_alone
    assert went_down


@pytest.fixture(scope="module")
def stub_engine(log_dir: Path) -> Iterator[str]:
    proc, url = start_stub_engine(log_dir, 0.0, "stub-engine-probes")
    yield url
    proc.stop()


@pytest.fixture(params=["aiohttp", "httpx"])
async def http_clients(request: pytest.FixtureRequest) -> AsyncIterator[tuple[httpx.AsyncClient, object]]:
    """The probes as production sends them (the aiohttp session) and as the model tests do (httpx alone); after
    the test, the aiohttp session must have carried the probes, and httpx none of them."""
    through: Counter[str] = Counter()

    async def on_aiohttp(session: object, context: object, params: aiohttp.TraceRequestStartParams) -> None:
        through["aiohttp"] += 1

    async def on_httpx(request: httpx.Request) -> None:
        through["httpx"] += 1

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_aiohttp)
    async with httpx.AsyncClient(event_hooks={"request": [on_httpx]}) as http, \
            aiohttp.ClientSession(trace_configs=[trace]) as session:  # fmt: skip
        yield http, (session if request.param == "aiohttp" else None)
    assert through[request.param] >= 1
    assert through["httpx" if request.param == "aiohttp" else "aiohttp"] == 0


async def test_readiness_over_real_http_reads_the_model_and_its_length(stub_engine: str, http_clients) -> None:
    http, session = http_clients
    client = EngineClient(EngineSettings(base_url=stub_engine, model=MODEL), http, session=session)  # type: ignore[arg-type]
    assert await client.is_alive() and await client.is_ready()
    assert client.max_model_len and client.max_model_len > 0


async def test_readiness_says_why_an_engine_that_answers_is_not_ready(
    stub_engine: str, http_clients, caplog: pytest.LogCaptureFixture
) -> None:
    http, session = http_clients
    other = EngineClient(EngineSettings(base_url=stub_engine, model="another-model"), http, session=session)  # type: ignore[arg-type]
    wrong_root = EngineClient(EngineSettings(base_url=f"{stub_engine}/nothing", model=MODEL), http, session=session)  # type: ignore[arg-type]
    gone = EngineClient(EngineSettings(base_url="http://127.0.0.1:9", model=MODEL), http, session=session)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="engine.client"):
        assert not await other.is_ready()
        assert not await wrong_root.is_ready()
        assert not await gone.is_ready() and not await gone.is_alive()
    said = [record.getMessage() for record in caplog.records]
    assert "the engine does not serve the configured model" in said
    assert any("engine answered 404" in line for line in said)


@pytest.mark.parametrize("listing", [b"null", b'{"data": null}', b'{"data": "x"}', b'{"data": [1]}', b"<html>"])
async def test_a_model_list_that_is_not_one_is_not_ready_and_raises_nothing(listing: bytes) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=listing if request.url.path == "/v1/models" else b"")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        client = EngineClient(EngineSettings(base_url="http://engine.test", model=MODEL), http)
        assert not await client.is_ready()
