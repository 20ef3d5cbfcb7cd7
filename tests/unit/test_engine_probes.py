"""The engine pool's probes: a ready engine that answers chats is not probed besides (each probe costs CPU here and
in vLLM), and is probed again as soon as the chats stop."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterator
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
    monkeypatch.setattr(pool_module, "READY_CHECK_S", 0.2)
    monkeypatch.setattr(pool_module, "FULL_CHECK_S", 0.4)


async def test_a_ready_engine_answering_chats_is_not_probed_and_is_when_they_stop(fast_probes: None) -> None:
    seen: Counter[str] = Counter()
    alive = {"up": True}
    settings = EngineSettings(base_url="http://engine.test", model=MODEL, poll_interval_s=0.05, warmup=False)
    async with httpx.AsyncClient(transport=engine_app(seen, alive)) as http:
        pool = EnginePool(settings, http)
        await pool.start()
        try:
            assert await pool.wait_ready(5)
            await asyncio.sleep(0.1)
            seen.clear()
            for _ in range(30):  # 1.5 s of chats, 0.05 s apart: every probe falls within READY_CHECK_S of one
                await pool.chat([{"role": "user", "content": "hello"}])
                await asyncio.sleep(0.05)
            while_chatting = seen["/health"] + seen["/v1/models"]
            seen.clear()
            await asyncio.sleep(1.0)  # no chats: the probes come back
            idle = seen["/health"]
            alive["up"] = False  # and still find an engine that went away without a chat noticing
            await asyncio.sleep(0.6)
            status = pool.endpoints[0].status
        finally:
            await pool.aclose()
    assert while_chatting == 0
    assert idle >= 3
    assert status == "down"


@pytest.fixture(scope="module")
def stub_engine(log_dir: Path) -> Iterator[str]:
    proc, url = start_stub_engine(log_dir, 0.0, "stub-engine-probes")
    yield url
    proc.stop()


@pytest.fixture(params=["aiohttp", "httpx"])
async def http_clients(request: pytest.FixtureRequest) -> AsyncIterator[tuple[httpx.AsyncClient, object]]:
    """The probes as production sends them (the aiohttp session) and as the model tests do (httpx alone)."""
    async with httpx.AsyncClient() as http, aiohttp.ClientSession() as session:
        yield http, (session if request.param == "aiohttp" else None)


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
