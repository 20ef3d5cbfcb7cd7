"""The Stream connection's connections/open: an answer that is not the endpoint and ticket (a proxy's login page
answering 200, a JSON list) is a failed open, retried later; it never ends the Stream process, which would lose
every robot message DingTalk pushes meanwhile (DingTalk does not resend them)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from dingtalk_stream.frames import AckMessage

from bots.dingtalk import stream
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.stream import DingTalkStreamConnection, StreamOpenError
from simulator.dingtalk import messages
from simulator.dingtalk.user import robot_payload

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


async def test_a_robot_message_that_cannot_be_queued_in_its_ack_window_is_kept_trying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis away longer than the ack window (an AOF load): the message was logged and lost, as DingTalk never
    pushes it again (found by a review). Now it is acked and kept trying in the background until the sink takes it."""
    monkeypatch.setattr(stream, "QUEUE_RETRY_DELAYS_S", (0.01,))
    monkeypatch.setattr(stream, "LATE_FIRST_DELAY_S", 0.01)
    monkeypatch.setattr(stream, "MAX_BACKOFF_S", 0.05)
    queued: list[object] = []
    refusals = 8  # the ack window's two tries, then six late ones

    async def sink(message: object) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise ConnectionError("Redis is loading")
        queued.append(message)

    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    conn = DingTalkStreamConnection(CONFIG, http, sink)  # type: ignore[arg-type]
    webhook = {"url": "https://oapi.dingtalk.com/robot/sendBySession?session=s", "expires_ms": 0}
    payload = robot_payload(CONFIG, "u1", "", conversation="cid", group=False, webhook=webhook,
                            message=messages.text_message("还在吗"))  # fmt: skip
    ack = json.loads(await conn._robot_message("m-1", payload))
    assert ack["code"] == AckMessage.STATUS_SYSTEM_EXCEPTION and not queued
    for _ in range(300):
        if queued:
            break
        await asyncio.sleep(0.01)
    assert len(queued) == 1 and getattr(queued[0], "text", "") == "还在吗"
    await conn._end_late()

