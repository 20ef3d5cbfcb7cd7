"""Function calling on the real vLLM CPU engine: the ERNIE-4.5 text profiles serve with vLLM's auto tool choice and
its ernie45 tool-call parser (checked by vLLM's own argument checks), and the session's engine, the tiny ERNIE-4.5
MoE on the tiny profile, takes chat requests with `tools` and hands back the calls the model writes, whole and
streamed, as engine.client's ToolCall."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest

from engine.client import EngineClient, ToolCall
from engine.settings import EngineSettings
from testkit.processes import Proc, wait_http
from tests.e2e.engine.test_engine_profiles import all_profile_commands, run_in_engine_venv

ERNIE_TEXT_PROFILES = ("tiny", "ernie-0.3b-cpu", "ernie-0.3b-gpu", "ernie-21b-a3b", "ernie-21b-a3b-multinode",
                       "ernie-21b-a3b tp2 dp4", "multinode 3x4")  # fmt: skip
ROOMS_BOOK = {"type": "function", "function": {"name": "rooms__book", "description": "Book a meeting room",
              "parameters": {"type": "object", "properties": {"room": {"type": "string"}}, "required": ["room"]}}}
# ERNIE-4.5's tool-call format, as vLLM's ernie45 parser reads it.
ERNIE_CALL = '<tool_call>\n{"name": "rooms__book", "arguments": {"room": "3B"}}\n</tool_call>'


def tool_flags(argv: list[str]) -> tuple[bool, str]:
    """Whether the model may choose tools, and the parser that reads its calls."""
    return "--enable-auto-tool-choice" in argv, argv[argv.index("--tool-call-parser") + 1]


class Pieces(list[str]):
    """The text pieces a streamed answer showed (an on_delta)."""

    async def __call__(self, piece: str) -> None:
        self.append(piece)


def test_ernie_text_profiles_serve_with_tool_calling_and_vllm_checks_the_parser() -> None:
    commands = all_profile_commands()
    for name in ERNIE_TEXT_PROFILES:
        assert tool_flags(commands[name]) == (True, "ernie45"), name
    for name in ("embed-bge-m3", "rerank-bge-v2-m3", "asr-whisper-cpu"):  # no chat, no tools
        assert "--tool-call-parser" not in commands[name], name
    tiny = commands["tiny"]
    wrong_parser = [*tiny[: tiny.index("--tool-call-parser") + 1], "ernie46"]
    no_parser = tiny[: tiny.index("--tool-call-parser")]
    checked = [commands[name] for name in ERNIE_TEXT_PROFILES]
    errors = run_in_engine_venv("engine.argcheck", [*checked, wrong_parser, no_parser])
    assert errors[: len(checked)] == [""] * len(checked)
    assert "invalid tool call parser: ernie46" in errors[-2], "an unknown parser must fail the check, not the start"
    assert "requires --tool-call-parser" in errors[-1]


@pytest.fixture(scope="module")
def engine_url(engine_proc: tuple[Proc, int]) -> str:
    """The session's engine (the tiny profile, so with the tool-calling flags), once it answers."""
    proc, port = engine_proc
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 600, proc)
    return url


@pytest.fixture
async def clients(engine_url: str) -> AsyncIterator[tuple[EngineClient, EngineClient]]:
    """Whole answers through aiohttp (as production asks them), streamed ones through httpx."""
    settings = EngineSettings(base_url=engine_url, model="ernie-tiny", max_tokens=16)
    async with httpx.AsyncClient(timeout=120) as http, aiohttp.ClientSession() as session:
        yield EngineClient(settings, http, session=session), EngineClient(settings, http)


async def test_the_engine_accepts_a_chat_with_tools(engine_url: str, clients) -> None:
    """The tiny model's weights are random: whether it writes text or a call is chance, so the answer's shape is
    checked, not its content."""
    body = {"model": "ernie-tiny", "messages": [{"role": "user", "content": "book room 3B for 3pm"}],
            "max_tokens": 16, "tools": [ROOMS_BOOK], "tool_choice": "auto"}  # fmt: skip
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(f"{engine_url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text[:500]
    data = response.json()
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("length", "stop", "tool_calls")
    assert isinstance(choice["message"]["content"], str | None)
    assert isinstance(choice["message"].get("tool_calls") or [], list)
    assert data["usage"]["prompt_tokens"] > 0 and data["usage"]["completion_tokens"] > 0
    whole_client, stream_client = clients
    whole = await whole_client.chat(body["messages"], tools=[ROOMS_BOOK])
    streamed = await stream_client.chat(body["messages"], tools=[ROOMS_BOOK], on_delta=Pieces())
    for completion in (whole, streamed):
        assert completion.finish_reason in ("length", "stop", "tool_calls") and completion.completion_tokens > 0
        assert all(isinstance(call, ToolCall) for call in completion.tool_calls)


async def test_the_second_round_with_the_tools_result_is_accepted_and_the_tools_reach_the_prompt(
    engine_url: str,
) -> None:
    """The worker's second round carries the assistant's call and a `tool` message: the chat template
    (engine/templates/ernie45.jinja) renders both, and the offered tools, instead of refusing the role."""
    messages = [
        {"role": "system", "content": "You book rooms."},
        {"role": "user", "content": "book room 3B"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "rooms__book", "arguments": '{"room": "3B"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "booked: B-17"},
    ]
    body = {"model": "ernie-tiny", "messages": messages, "max_tokens": 8, "tools": [ROOMS_BOOK]}
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(f"{engine_url}/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text[:500]
        with_tools = await http.post(f"{engine_url}/tokenize", json={"model": "ernie-tiny", "messages": messages,
                                                                       "tools": [ROOMS_BOOK]})
        without = await http.post(f"{engine_url}/tokenize", json={"model": "ernie-tiny", "messages": messages[:2]})
    assert with_tools.status_code == 200 and without.status_code == 200, with_tools.text[:300]
    assert with_tools.json()["count"] > without.json()["count"] + 20, "the tools and the round are in the prompt"


PARSE_CALL = """
import json, sys
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.ernie45_tool_parser import Ernie45ToolParser
model_dir, text, tool = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
parser = Ernie45ToolParser(AutoTokenizer.from_pretrained(model_dir))
request = ChatCompletionRequest(model="x", messages=[{"role": "user", "content": "hi"}], tools=[tool])
found = parser.extract_tool_calls(text, request)
print(json.dumps([[call.function.name, call.function.arguments] for call in found.tool_calls]))
"""


def test_vllms_ernie45_parser_reads_a_call_in_ernies_format_with_the_tiny_tokenizer(engine_url: str) -> None:
    """What a trained ERNIE writes (and the chat template writes back for the next round) is what the engine's
    parser turns into an OpenAI tool call: run offline in the engine's venv, since the tiny model's random weights
    write such a call only by chance (forcing one with a grammar crashed vLLM's CPU engine core)."""
    import json
    import subprocess

    from engine.launcher import default_tiny_model_dir
    from tests.e2e.engine.test_engine_profiles import ENGINE_PYTHON

    args = [ENGINE_PYTHON, "-c", PARSE_CALL, default_tiny_model_dir(), ERNIE_CALL, json.dumps(ROOMS_BOOK)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [["rooms__book", '{"room": "3B"}']]
