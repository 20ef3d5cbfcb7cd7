"""Function calling in the engine client, against a real HTTP server: the stub engine (testkit/fakes/stub_engine.py)
asks for tools the way vLLM does, whole (through the aiohttp session production uses) and streamed (httpx).
The real vLLM engine's side is tests/e2e/engine/test_tool_calling.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from engine.client import Completion, EngineClient, ToolCall
from engine.pool import EnginePool
from engine.settings import EngineSettings
from testkit.stacks import start_stub_engine, stub_requests

ROOMS_BOOK = {"type": "function", "function": {"name": "rooms__book", "description": "Book a meeting room",
              "parameters": {"type": "object", "properties": {"room": {"type": "string"}}}}}  # fmt: skip
ROOMS_LIST = {"type": "function", "function": {"name": "rooms__list", "description": "The free rooms",
              "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
TOOLS = [ROOMS_BOOK, ROOMS_LIST]


@pytest.fixture(scope="module")
def stub_engine(log_dir: Path) -> Iterator[str]:
    proc, url = start_stub_engine(log_dir, 0.0, "stub-engine-tools")
    yield url
    proc.stop()


@pytest.fixture
async def clients(stub_engine: str) -> AsyncIterator[tuple[EngineClient, EngineClient]]:
    """The same engine as production asks it for whole answers (aiohttp) and as the streamed path does (httpx)."""
    settings = EngineSettings(base_url=stub_engine, model="ernie-tiny")
    async with httpx.AsyncClient() as http, aiohttp.ClientSession() as session:
        yield EngineClient(settings, http, session=session), EngineClient(settings, http)


def last_request(engine_url: str) -> dict:
    return stub_requests(engine_url)[-1]


async def ask_both_ways(clients: tuple[EngineClient, EngineClient], messages: list[dict], tools: list[dict] | None,
                        ) -> tuple[Completion, Completion, list[str]]:
    """The whole answer, then the streamed one (and the text pieces its on_delta saw)."""
    whole_client, stream_client = clients
    whole = await whole_client.chat(messages, tools=tools)
    seen: list[str] = []

    async def on_delta(piece: str) -> None:
        seen.append(piece)

    streamed = await stream_client.chat(messages, tools=tools, on_delta=on_delta)
    return whole, streamed, seen


async def test_the_tools_a_model_asks_for_come_back_as_tool_calls_whole_and_streamed(clients, stub_engine) -> None:
    question = ('book 3B, then list\ntool:rooms__book {"room": "3B", "note": "会议"}\ntool:rooms__list\n'
                'tool:files__delete {"path": "/"}')  # files__delete is not offered: it stays text
    whole, streamed, seen = await ask_both_ways(clients, [{"role": "user", "content": question}], TOOLS)
    for completion in (whole, streamed):
        assert completion.finish_reason == "tool_calls" and completion.text == ""
        assert [(call.name, call.arguments) for call in completion.tool_calls] == [
            ("rooms__book", '{"room": "3B", "note": "会议"}'), ("rooms__list", "{}")]
        assert json.loads(completion.tool_calls[0].arguments) == {"room": "3B", "note": "会议"}
        ids = [call.id for call in completion.tool_calls]
        assert all(ids) and len(set(ids)) == 2, ids
        assert completion.prompt_tokens > 0 and completion.completion_tokens > 0
    assert whole.tool_calls[0].id != streamed.tool_calls[0].id  # each answer's own ids, as the engine gave them
    assert seen == []  # no text to show while tools are asked for
    sent = last_request(stub_engine)
    assert sent["tools"] == ["rooms__book", "rooms__list"] and sent["tool_choice"] == "auto"


async def test_malformed_arguments_reach_the_caller_as_the_engine_wrote_them(clients, stub_engine) -> None:
    question = 'tool:rooms__book {"room": "3B"'
    whole, streamed, _ = await ask_both_ways(clients, [{"role": "user", "content": question}], TOOLS)
    assert whole.tool_calls == (ToolCall(whole.tool_calls[0].id, "rooms__book", '{"room": "3B"'),)
    assert streamed.tool_calls == (ToolCall(streamed.tool_calls[0].id, "rooms__book", '{"room": "3B"'),)


async def test_tool_results_go_back_and_the_answer_is_text(clients, stub_engine) -> None:
    call = {"id": "call_7", "type": "function", "function": {"name": "rooms__book", "arguments": '{"room": "3B"}'}}
    messages = [
        {"role": "user", "content": 'tool:rooms__book {"room": "3B"}'},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "content": "booked 3B at 15:00"},
        {"role": "tool", "tool_call_id": "call_8", "content": "3A, 7B"},
    ]
    whole, streamed, seen = await ask_both_ways(clients, messages, TOOLS)
    for completion in (whole, streamed):
        assert completion.text == "tool results: booked 3B at 15:00 | 3A, 7B"
        assert completion.tool_calls == () and completion.finish_reason == "stop"
    assert "".join(seen) == streamed.text
    sent = last_request(stub_engine)
    assert sent["tool_results"] == ["booked 3B at 15:00", "3A, 7B"] and sent["tools"] == ["rooms__book", "rooms__list"]


async def test_without_tools_the_request_is_what_it_always_was(clients, stub_engine) -> None:
    """No `tools`, no `tool_choice`: a chat without tools costs the engine nothing new. An empty list counts as none
    (vLLM refuses `tools: []`). Directive lines are only text then."""
    question = 'tool:rooms__book {"room": "3B"}'
    for tools in (None, []):
        whole, streamed, _ = await ask_both_ways(clients, [{"role": "user", "content": question}], tools)
        for completion in (whole, streamed):
            assert completion.text == f"answer to: {question}" and completion.tool_calls == ()
        for sent in stub_requests(stub_engine)[-2:]:
            assert "tools" not in sent["fields"] and "tool_choice" not in sent["fields"], sent["fields"]
            assert sent["tools"] == [] and sent["tool_results"] == []


async def test_the_pool_passes_the_tools_on(stub_engine) -> None:
    settings = EngineSettings(base_url=stub_engine, model="ernie-tiny", poll_interval_s=0.2, warmup=False)
    async with httpx.AsyncClient() as http:
        pool = EnginePool(settings, http)
        await pool.start()
        try:
            assert await pool.wait_ready(20)
            completion = await pool.chat([{"role": "user", "content": "tool:rooms__list {}"}], tools=[ROOMS_LIST])
        finally:
            await pool.aclose()
    assert [(call.name, call.arguments) for call in completion.tool_calls] == [("rooms__list", "{}")]
    assert last_request(stub_engine)["tools"] == ["rooms__list"]
