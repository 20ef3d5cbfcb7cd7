"""The Stream connection's connections/open: an answer that is not the endpoint and ticket (a proxy's login page
answering 200, a JSON list) is a failed open, retried later; it never ends the Stream process, which would lose
every robot message DingTalk pushes meanwhile (DingTalk does not resend them)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.stream import DingTalkStreamConnection, StreamOpenError

CONFIG = DingTalkBotConfig(id="ding", mode="stream", app_key="dingkey", app_secret="ding-secret-for-tests")


def connection(answer: httpx.Response) -> tuple[DingTalkStreamConnection, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer

    async def sink(message: object) -> None:
        raise AssertionError("nothing is queued")

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return DingTalkStreamConnection(CONFIG, http, sink), seen  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="<html>please sign in to the proxy</html>"),
        httpx.Response(200, json=["endpoint", "ticket"]),
        httpx.Response(200, json={"endpoint": "wss://x"}),
    ],
    ids=["html", "json-list", "no-ticket"],
)
def test_an_open_without_endpoint_and_ticket_is_a_failed_open(answer: httpx.Response) -> None:
    stream, _ = connection(answer)
    with pytest.raises(StreamOpenError):
        asyncio.run(stream._open())


def test_the_connection_keeps_trying_after_a_page_that_is_not_json(caplog: pytest.LogCaptureFixture) -> None:
    stream, seen = connection(httpx.Response(200, text="<html>login</html>"))

    async def run_for_a_while() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(stream.run(stop))
        await asyncio.sleep(1.6)  # the first retry comes within 0.5-1 s
        assert not running.done(), "the connection ended instead of trying again"
        stop.set()
        await asyncio.wait_for(running, timeout=5)

    asyncio.run(run_for_a_while())
    assert len(seen) >= 2
    assert CONFIG.app_secret.get_secret_value() not in caplog.text
