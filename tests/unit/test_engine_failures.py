"""What the engine pool and client make of engines that answer badly (each a finding of a review, failing on the
code before its fix): a request every engine answers with a 500 while healthy is not a reason to empty the pool;
a 200 that is not a chat completion is an engine error; a wrong api_key is said, without the key; an engine URL
is never logged or labelled with its password; a URL without a scheme fails at start."""

from __future__ import annotations

import json
import logging
from collections import Counter

import httpx
import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from engine.client import EngineError
from engine.pool import EnginePool
from engine.settings import EngineSettings

MODEL = "m"
WARM_UP = 1  # the warm-up's max_tokens


def engine(chat: Counter[str], answer: httpx.Response, key: str | None = None) -> httpx.MockTransport:
    """Engines whose /health is fine, whose warm-up works and whose every other chat gets `answer`."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            if key and request.headers.get("authorization") != f"Bearer {key}":
                return httpx.Response(401, json={"error": "Unauthorized"})
            return httpx.Response(200, json={"data": [{"id": MODEL, "max_model_len": 4096}]})
        if path == "/v1/chat/completions":
            if json.loads(request.content).get("max_tokens") == WARM_UP:
                return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}], "usage": {}})
            chat[request.url.host] += 1
            return answer
        return httpx.Response(200, text="")

    return httpx.MockTransport(handle)


def settings(*urls: str, **more: object) -> EngineSettings:
    return EngineSettings(base_url=urls[0], endpoints=list(urls), model=MODEL, poll_interval_s=0.05, max_wait_s=30,
                          **more)  # type: ignore[arg-type]  # fmt: skip


async def test_a_request_every_engine_fails_while_healthy_is_asked_once_of_each_and_empties_nothing() -> None:
    chat: Counter[str] = Counter()
    transport = engine(chat, httpx.Response(500, text="Internal Server Error: the picture could not be read"))
    async with httpx.AsyncClient(transport=transport) as http:
        pool = EnginePool(settings("http://a:8000", "http://b:8000"), http)
        await pool.start()
        try:
            assert await pool.wait_ready(5)
            with pytest.raises(EngineError) as raised:
                await pool.chat([{"role": "user", "content": "x"}])
            assert raised.value.status == 500 and raised.value.retryable
            assert chat == {"a": 1, "b": 1}, f"asked {dict(chat)}: once of each engine"
            assert [e.status for e in pool.endpoints] == ["ready", "ready"], "engines were taken out of the pool"
        finally:
            await pool.aclose()


@pytest.mark.parametrize(
    "answer",
    [httpx.Response(200, text="<html>proxy</html>"), httpx.Response(200, json={"object": "error"})],
    ids=["not-json", "no-choices"],
)
async def test_a_200_that_is_not_a_chat_completion_is_an_engine_error(answer: httpx.Response) -> None:
    chat: Counter[str] = Counter()
    async with httpx.AsyncClient(transport=engine(chat, answer)) as http:
        pool = EnginePool(settings("http://a:8000"), http)
        await pool.start()
        try:
            assert await pool.wait_ready(5)
            with pytest.raises(EngineError):
                await pool.endpoints[0].client.chat([{"role": "user", "content": "x"}])
        finally:
            await pool.aclose()


async def test_a_wrong_api_key_is_said_once_without_the_key_and_no_url_shows_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chat: Counter[str] = Counter()
    url = "http://botgw:pa55word@a:8000/v1/"
    transport = engine(chat, httpx.Response(200, json={}), key="sk-right")
    caplog.set_level(logging.INFO, logger="engine")  # httpx's own lines are off in botgw (gateway/logs.py)
    async with httpx.AsyncClient(transport=transport) as http:
        pool = EnginePool(settings(url, api_key="sk-wrong-key"), http)
        await pool.start()
        try:
            assert not await pool.wait_ready(1)
        finally:
            await pool.aclose()
    ours = [record for record in caplog.records if record.name.startswith("engine")]
    said = [record.getMessage() for record in ours if "api_key" in record.getMessage()]
    assert len(said) == 1 and "wrong" in said[0], said
    everything = str([record.__dict__ for record in ours])
    assert "sk-wrong-key" not in everything and "pa55word" not in everything
    assert pool.endpoints[0].name == "http://***@a:8000"
    exported = [sample.labels for metric in REGISTRY.collect() for sample in metric.samples
                if metric.name.startswith("botgw_engine")]  # fmt: skip
    assert all("pa55word" not in str(labels) for labels in exported)


@pytest.mark.parametrize("url", ["localhost:8000", "http://", "ftp://h:8000"])
def test_an_engine_url_without_http_and_a_host_fails_at_start(url: str) -> None:
    with pytest.raises(ValueError, match="needs http:// or https:// and a host"):
        EngineSettings(base_url=url)


def test_an_engine_url_copied_from_a_curl_example_is_taken() -> None:
    assert EngineSettings(base_url="http://h:8000/v1/chat/completions").urls() == ["http://h:8000"]


def test_a_tool_servers_bad_url_is_refused_without_its_password() -> None:
    from tools.config import ToolServerSettings

    with pytest.raises(ValidationError) as refused:
        ToolServerSettings(url="htps://svc:S3cr3tT0ken@mcp.internal/mcp")
    said = refused.value.errors()[0]["msg"]  # what `botgw config check` prints (never the input itself)
    assert "url must be http(s)" in said and "S3cr3tT0ken" not in said, said


async def test_an_engine_failing_every_request_while_healthy_is_taken_out_after_a_few_in_a_row() -> None:
    """Its /health fine (a proxy in front of it, say) and every chat a 500: kept in, it stayed the least loaded
    and took every answer that could not fail over (a review of the first version of the rule above)."""
    from engine.pool import TAKE_OUT_AFTER_REFUSALS

    chat: Counter[str] = Counter()

    def handle(request: httpx.Request) -> httpx.Response:
        broken = request.url.host == "a"
        if request.url.path == "/v1/chat/completions" and json.loads(request.content).get("max_tokens") != WARM_UP:
            chat[request.url.host] += 1
            if broken:
                return httpx.Response(500, text="upstream error")
            return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}], "usage": {}})
        return engine(Counter(), httpx.Response(200, json={})).handler(request)  # type: ignore[attr-defined]

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        pool = EnginePool(settings("http://a:8000", "http://b:8000"), http)
        await pool.start()
        try:
            assert await pool.wait_ready(5)
            a, b = pool.endpoints
            b.load.running = 5  # a looks the least loaded: it is picked first
            outcomes = []
            for _ in range(TAKE_OUT_AFTER_REFUSALS + 2):
                try:
                    await pool.chat([{"role": "user", "content": "x"}], failover=False)
                    outcomes.append("answered")
                except EngineError:
                    outcomes.append("failed")
            assert outcomes == ["failed"] * TAKE_OUT_AFTER_REFUSALS + ["answered"] * 2, outcomes
            assert a.status == "down" and b.status == "ready"
        finally:
            await pool.aclose()


def sse(*events: str) -> httpx.Response:
    return httpx.Response(200, text="".join(f"data: {event}\n\n" for event in events),
                          headers={"content-type": "text/event-stream"})  # fmt: skip


def delta(text: str, finish: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # vLLM's answer when generation fails once the stream began: an error chunk, then [DONE], all in a 200
        (sse(delta("The answer is "), delta("partly"), json.dumps({"error": {"message": "CUDA error: out of memory",
                                                                             "type": "InternalServerError",
                                                                             "code": 500}}), "[DONE]"),
         "out of memory"),
        (sse(delta("The answer is "), delta("partly")), "ended before"),  # cut: no [DONE], no finish_reason
    ],
    ids=["error-chunk", "cut-stream"],
)
async def test_a_stream_that_fails_midway_is_an_engine_error_not_a_short_answer(answer: httpx.Response,
                                                                                said: str) -> None:
    chat: Counter[str] = Counter()
    shown: list[str] = []

    async def on_delta(text: str) -> None:
        shown.append(text)

    async with httpx.AsyncClient(transport=engine(chat, answer)) as http:
        pool = EnginePool(settings("http://a:8000"), http)
        await pool.start()
        try:
            assert await pool.wait_ready(5)
            with pytest.raises(EngineError, match=said) as raised:
                await pool.endpoints[0].client.chat([{"role": "user", "content": "x"}], on_delta=on_delta)
            assert raised.value.retryable
            assert shown == ["The answer is ", "partly"]  # what the user saw: generate resumes from it
        finally:
            await pool.aclose()


async def test_a_whole_stream_with_its_finish_reason_is_an_answer_even_without_done() -> None:
    chat: Counter[str] = Counter()
    answer = sse(delta("Hello"), delta(" there", "stop"))
    async with httpx.AsyncClient(transport=engine(chat, answer)) as http:
        pool = EnginePool(settings("http://a:8000"), http)
        await pool.start()
        try:
            assert await pool.wait_ready(5)

            async def ignore(text: str) -> None:
                return None

            completion = await pool.endpoints[0].client.chat([{"role": "user", "content": "x"}], on_delta=ignore)
            assert completion.text == "Hello there" and completion.finish_reason == "stop"
        finally:
            await pool.aclose()


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"first_token_timeout_s": 200, "request_timeout_s": 180}, "first_token_timeout_s"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"connect_timeout_s": -1}, "connect_timeout_s"),
    ],
)
def test_engine_timeouts_that_could_never_work_fail_at_start(fields: dict, said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        EngineSettings(**fields)


def test_a_request_timeout_lowered_alone_takes_the_first_token_limit_with_it() -> None:
    settings = EngineSettings(request_timeout_s=30)  # a config written before the check: still starts
    assert settings.first_token_timeout_s == 15 and settings.request_timeout_s == 30
