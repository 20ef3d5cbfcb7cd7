"""bots/http.py `PlatformClient`: the platforms' small JSON calls through aiohttp, with httpx's manners (no
redirect followed, a failure typed as retryable or not), against a real local HTTP server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bots.base import PermanentSendError, RetryableSendError
from bots.http import PlatformClient, request_json

seen: list[tuple[str, str, dict]] = []


async def _send(request: web.Request) -> web.Response:
    body = json.loads(await request.read()) if request.can_read_body else {}
    seen.append((request.method, request.query_string, body))
    return web.json_response({"errcode": 0, "echo": body})


async def _moved(request: web.Request) -> web.Response:
    raise web.HTTPFound("/elsewhere")


async def _elsewhere(request: web.Request) -> web.Response:
    seen.append(("REDIRECTED", "", {}))
    return web.json_response({"errcode": 0})


async def _busy(request: web.Request) -> web.Response:
    return web.Response(status=503)


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/send", _send)
    app.router.add_post("/moved", _moved)
    app.router.add_get("/elsewhere", _elsewhere)
    app.router.add_post("/busy", _busy)
    async with TestServer(app, host="127.0.0.1") as running:
        yield str(running.make_url("")).rstrip("/")


@pytest.fixture
async def client() -> AsyncIterator[PlatformClient]:
    async with aiohttp.ClientSession() as session, PlatformClient(json_session=session) as http:
        yield http


async def test_a_json_call_goes_through_the_session_with_query_and_body(server: str, client: PlatformClient) -> None:
    seen.clear()
    answer = await request_json(client, "POST", f"{server}/send", "test API", params={"access_token": "t"},
                                json={"text": {"content": "你好"}})
    assert answer == {"errcode": 0, "echo": {"text": {"content": "你好"}}}
    assert seen == [("POST", "access_token=t", {"text": {"content": "你好"}})]


async def test_a_redirect_is_not_followed_and_failures_are_typed(server: str, client: PlatformClient) -> None:
    seen.clear()
    with pytest.raises(PermanentSendError, match="HTTP 302"):
        await request_json(client, "POST", f"{server}/moved", "test API", json={})
    assert seen == [], "a URL the platform did not give is never asked"
    with pytest.raises(RetryableSendError, match="HTTP 503"):
        await request_json(client, "POST", f"{server}/busy", "test API", json={})
    with pytest.raises(RetryableSendError, match="unreachable"):
        await request_json(client, "POST", "http://127.0.0.1:9/send", "test API", json={})


async def test_the_proxy_environment_is_honoured_without_a_session_that_trusts_it(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's session does not read the environment (aiohttp's trust_env does so in a thread on every call):
    the client reads HTTP(S)_PROXY and NO_PROXY itself, as httpx does. The test server stands in for the proxy."""
    monkeypatch.setenv("HTTP_PROXY", server)
    monkeypatch.setenv("NO_PROXY", "localhost")
    seen.clear()
    async with aiohttp.ClientSession() as session, PlatformClient(json_session=session) as http:
        answer = await request_json(http, "POST", "http://127.0.0.1:9/send", "test API", json={"via": "proxy"})
    assert answer["echo"] == {"via": "proxy"}, "nothing listens on port 9: the proxy answered"
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with aiohttp.ClientSession() as session, PlatformClient(json_session=session) as http:
        with pytest.raises(RetryableSendError, match="unreachable"):
            await request_json(http, "POST", "http://127.0.0.1:9/send", "test API", json={})
