"""An image in the engine request: the user turn the parts stage builds (`[{"type": "text"}, {"type": "image_url",
"image_url": {"url": "data:image/jpeg;base64,…"}}]`) checked by vLLM's own code in the engine venv, and the
pool sending such a request only to the engines that can see (stub engines, testkit/fakes/stub_engine.py).

No multimodal model small enough to build here is served by the vLLM CPU build in these tests, so vLLM's own
request schema, content-part parser and image loader stand in for a vision engine."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from PIL import Image

from engine import launcher
from engine.pool import EnginePool, NoEngineSees, carries_image
from engine.settings import EngineEndpoint, EngineSettings
from testkit.processes import Proc
from testkit.stacks import start_stub_engine, stub_requests

ENGINE_PYTHON = launcher.default_engine_python()

# In the engine venv: each request through vLLM's ChatCompletionRequest, its user parts through vLLM's own content
# part parser (renderers/chat_utils.py), and each image URL through vLLM's MediaConnector, which decodes data: URLs.
VLLM_CHECK = """
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.multimodal.media.connector import MediaConnector
from vllm.renderers.chat_utils import _parse_chat_message_content_mm_part
results = []
for body in json.load(sys.stdin):
    try:
        request = ChatCompletionRequest.model_validate(body)
        seen = []
        for message in body["messages"]:
            if not isinstance(message["content"], list):
                continue
            for part in message["content"]:
                kind, content = _parse_chat_message_content_mm_part(part)
                if kind == "image_url":
                    image = MediaConnector().fetch_image(content)
                    seen.append(["image", image.size[0], image.size[1], image.mode])
                else:
                    seen.append([kind, content])
        results.append({"ok": True, "parts": seen, "stream": request.stream})
    except Exception as exc:
        results.append({"ok": False, "error": type(exc).__name__ + ": " + str(exc).splitlines()[0][:200]})
print(json.dumps(results))
"""


def jpeg_data_url(width: int = 48, height: int = 32) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_turn(text: str, url: str) -> dict:
    """The user turn as the parts stage sends it."""
    image = {"type": "image_url", "image_url": {"url": url}}
    return {"role": "user", "content": [{"type": "text", "text": text}, image]}


def request_body(messages: list[dict]) -> dict:
    """What engine/client.py sends (streamed, usage in the last chunk)."""
    return {"model": "ernie-4.5-vl-28b-a3b", "messages": messages, "max_tokens": 64, "temperature": 0.3,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


def vllm_check(bodies: list[dict]) -> list[dict]:
    result = subprocess.run([ENGINE_PYTHON, "-c", VLLM_CHECK], input=json.dumps(bodies), capture_output=True,
                            text=True, timeout=300, cwd="/")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_image_turn_is_read_by_vllms_own_request_code() -> None:
    good = request_body([
        {"role": "system", "content": "You are the company's assistant."},
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
        image_turn("这张报销单填对了吗？", jpeg_data_url(48, 32)),
    ])  # fmt: skip
    not_an_image = request_body([image_turn("what is this", "data:image/jpeg;base64,"
                                            + base64.b64encode(b"not a jpeg").decode())])
    checked = vllm_check([good, not_an_image])
    assert checked[0] == {"ok": True, "stream": True,
                          "parts": [["text", "这张报销单填对了吗？"], ["image", 48, 32, "RGB"]]}  # fmt: skip
    assert not checked[1]["ok"], "the check must be able to fail: vLLM cannot decode these bytes as an image"
    assert carries_image(good["messages"]) and not carries_image(good["messages"][:3])


def test_endpoints_take_plain_urls_and_written_out_entries() -> None:
    settings = EngineSettings.model_validate({"vision": True, "endpoints": [
        "http://a:8000/v1", {"url": "http://b:8000/", "vision": False}, {"url": "http://c:8000"},
    ]})  # fmt: skip
    assert settings.targets() == [("http://a:8000", True), ("http://b:8000", False), ("http://c:8000", True)]
    assert settings.urls() == ["http://a:8000", "http://b:8000", "http://c:8000"]
    assert EngineSettings().targets() == [("http://127.0.0.1:8000", False)]
    assert EngineSettings(endpoints=[EngineEndpoint(url="http://d:8000", vision=True)]).targets()[0][1] is True
    with pytest.raises(ValueError):
        EngineSettings.model_validate({"endpoints": [{"url": "http://e:8000", "sees": True}]})


@pytest.fixture(scope="module")
def stub_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    log_dir = tmp_path_factory.mktemp("vision")
    started: list[tuple[Proc, str]] = [start_stub_engine(log_dir, 0.0, f"stub-vision-{i}") for i in range(2)]
    yield [url for _, url in started]
    for proc, _ in started:
        proc.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def started_pool(settings: EngineSettings, http: httpx.AsyncClient) -> EnginePool:
    pool = EnginePool(settings, http)
    await pool.start()
    assert await pool.wait_ready(20)
    return pool


async def test_an_image_goes_only_to_the_engine_that_sees(stub_engines: list[str], http) -> None:
    text_engine, vision_engine = stub_engines
    settings = EngineSettings(model="ernie-tiny", poll_interval_s=0.2, warmup=False,
                              endpoints=[text_engine, EngineEndpoint(url=vision_engine, vision=True)])  # fmt: skip
    pool = await started_pool(settings, http)
    try:
        assert pool.sees_images
        while not all(endpoint.status == "ready" for endpoint in pool.endpoints):
            await asyncio.sleep(0.05)
        url = jpeg_data_url()
        before = {engine: len(stub_requests(engine)) for engine in stub_engines}
        answers = await asyncio.gather(*(pool.chat([image_turn(f"picture {i}", url)], max_tokens=8) for i in range(6)))
        assert [a.text for a in answers] == [f"answer to: picture {i}" for i in range(6)]
        assert len(stub_requests(text_engine)) == before[text_engine]  # the text engine saw none of them
        seen = stub_requests(vision_engine)[before[vision_engine]:]
        assert len(seen) == 6 and all(record["images"] == [url] for record in seen)
        # plain text still goes to either engine, by load
        await asyncio.gather(*(pool.chat([{"role": "user", "content": f"text {i}"}], max_tokens=8) for i in range(8)))
        assert len(stub_requests(text_engine)) > before[text_engine]
    finally:
        await pool.aclose()


async def test_an_image_for_a_pool_that_cannot_see_fails_at_once(stub_engines: list[str], http) -> None:
    """The parts stage asks `sees_images` first and replies itself; a request that slips through is not queued for
    an engine that will never come (NoEngineSees is not retryable)."""
    pool = await started_pool(EngineSettings(model="ernie-tiny", warmup=False, endpoints=stub_engines[:1]), http)
    try:
        assert not pool.sees_images
        with pytest.raises(NoEngineSees) as refused:
            await asyncio.wait_for(pool.chat([image_turn("what is this", jpeg_data_url())], max_tokens=8), 5)
        assert not refused.value.retryable
    finally:
        await pool.aclose()
