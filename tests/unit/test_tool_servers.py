"""tools/servers.py against the demo MCP server (testkit/fakes/demo_mcp.py) as a real process, over Streamable HTTP
(started by the test) and stdio (started by the client itself): the tool list and its read-only flags, the asker's
identity in `_meta` and in HTTP headers, a list refreshed on notifications/tools/list_changed, a server that is down,
that never answers, that dies or restarts, a tool that hangs, and one that answers with an error."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from mcp import types
from pydantic import SecretStr

from testkit.fakes.demo_mcp import start_demo_mcp, stdio_command
from testkit.processes import ROOT, free_port
from tools.config import ToolServerSettings, ToolsSettings
from tools.servers import RESULT_CHARS, ServerUnavailable, ToolServers, offerable, result_text

SECRET = "s3cret-token-of-the-rooms-server"
FAST_S = 3.0  # "quickly" on a busy two-core machine


def settings_for(server: ToolServerSettings) -> ToolsSettings:
    return ToolsSettings(servers={"rooms": server}, list_ttl_s=300)


def http_settings(url: str, timeout_s: float = 15.0) -> ToolServerSettings:
    return ToolServerSettings(url=url, headers={"Authorization": SecretStr(f"Bearer {SECRET}")}, timeout_s=timeout_s)


def stdio_settings(calls: Path, timeout_s: float = 15.0) -> ToolServerSettings:
    env = {"PYTHONPATH": SecretStr(str(ROOT)), "ROOMS_TOKEN": SecretStr(SECRET)}
    return ToolServerSettings(command=stdio_command(calls), env=env, timeout_s=timeout_s)


def calls_of(path: Path, tool: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line["tool"] == tool]


@pytest.fixture(autouse=True)
def default_loop_policy() -> None:
    """stdio servers are child processes: asyncio's default policy watches them. A test elsewhere in the session may
    have started uvicorn, which installs uvloop's policy (it has no child watcher for asyncio's own loop)."""
    if not isinstance(asyncio.get_event_loop_policy(), asyncio.DefaultEventLoopPolicy):
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())


@pytest.fixture(scope="module")
def http_server(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    calls = tmp_path_factory.mktemp("demo-mcp") / "calls.jsonl"
    proc, url = start_demo_mcp(log_dir, calls, name="demo-mcp-tool-servers")
    yield url, calls
    proc.stop()


@pytest.fixture(params=["http", "stdio"])
def server(
    request: pytest.FixtureRequest, http_server: tuple[str, Path], tmp_path: Path
) -> tuple[ToolServerSettings, Path, str]:
    """The demo server over either transport: its settings, its calls file, the transport."""
    if request.param == "http":
        url, calls = http_server
        return http_settings(url), calls, "http"
    calls = tmp_path / "calls.jsonl"
    return stdio_settings(calls), calls, "stdio"


@pytest.fixture
async def rooms(server: tuple[ToolServerSettings, Path, str]) -> AsyncIterator[tuple[ToolServers, Path, str]]:
    """ToolServers with that one server, named `rooms`."""
    settings, calls, transport = server
    servers = ToolServers(settings_for(settings))
    yield servers, calls, transport
    await servers.aclose()


async def test_tools_are_listed_with_their_read_only_flag(rooms: tuple[ToolServers, Path, str]) -> None:
    servers, _, _ = rooms
    specs = {spec.name: spec for spec in await servers.tools("rooms")}
    assert {"list_rooms", "book", "hang", "add_tool"} <= set(specs)
    assert specs["list_rooms"].read_only is True
    assert specs["book"].read_only is False
    assert specs["add_tool"].read_only is False  # no annotation at all
    book = specs["book"]
    assert (book.qualified, book.exposed) == ("rooms.book", "rooms__book")
    function = book.openai()["function"]
    assert function["name"] == "rooms__book"
    assert function["parameters"]["required"] == ["room", "start"]
    assert "预订会议室" in function["description"]
    assert await servers.tools("rooms") == list(specs.values())


async def test_a_call_carries_the_askers_identity(rooms: tuple[ToolServers, Path, str]) -> None:
    servers, calls, transport = rooms
    start = f"{transport} {time.time()}"
    result = await servers.call(
        "rooms", "book", {"room": "泰山厅", "start": start, "title": "周会"},
        user="wecom:zhangsan", bot="assistant", idempotency_key="key-1-" + start,
    )  # fmt: skip
    assert result.outcome == "ok", result
    assert "预订号 B" in result.text and "泰山厅" in result.text
    assert 0 <= result.duration_ms < 15_000
    seen = calls_of(calls, "book")[-1]
    assert seen["arguments"] == {"room": "泰山厅", "start": start, "title": "周会"}
    assert seen["meta"] == {
        "botgw/user": "wecom:zhangsan",
        "botgw/bot": "assistant",
        "botgw/idempotency_key": "key-1-" + start,
    }
    assert seen["idempotency_key"] == "key-1-" + start
    assert seen["header_user"] == ("wecom:zhangsan" if transport == "http" else None)

    # the same key again: the server answers with the first booking (it gets the key to make that possible)
    again = await servers.call(
        "rooms", "book", {"room": "泰山厅", "start": start}, user="wecom:zhangsan", bot="assistant",
        idempotency_key="key-1-" + start,
    )  # fmt: skip
    assert again.outcome == "ok" and "同一请求" in again.text

    # an identity that is not plain ASCII goes into the header percent-encoded, and as it is into _meta
    result = await servers.call(
        "rooms", "list_rooms", {"start": start}, user="dingtalk:李雷", bot="assistant", idempotency_key="key-2"
    )
    assert result.outcome == "ok" and "泰山厅" not in result.text and "松山厅（8 人）" in result.text
    seen = calls_of(calls, "list_rooms")[-1]
    assert seen["meta"]["botgw/user"] == "dingtalk:李雷"
    assert seen["header_user"] == (quote("dingtalk:李雷", safe=":") if transport == "http" else None)


async def test_an_error_result_is_an_error(rooms: tuple[ToolServers, Path, str]) -> None:
    servers, _, _ = rooms
    result = await servers.call(
        "rooms", "book", {"room": "不存在厅", "start": "明天"}, user="wecom:zhangsan", bot="assistant",
        idempotency_key="key-error",
    )  # fmt: skip
    assert result.outcome == "error"
    assert "没有这个会议室：不存在厅" in result.text


async def test_a_hanging_tool_times_out_and_the_next_call_works(server: tuple[ToolServerSettings, Path, str]) -> None:
    settings, calls, transport = server
    timeout_s = 3.0
    servers = ToolServers(settings_for(settings.model_copy(update={"timeout_s": timeout_s})))
    try:
        await servers.tools("rooms")  # the session is up: the time below is the call's alone
        began = time.monotonic()
        result = await servers.call("rooms", "hang", {}, user="wecom:zhangsan", bot="b", idempotency_key="key-hang")
        took = time.monotonic() - began
        assert result.outcome == "timeout", result
        assert "rooms.hang" in result.text and "3 s" in result.text
        assert timeout_s - 0.1 <= took <= timeout_s + 1.0
        assert calls_of(calls, "hang"), "the call reached the server"

        began = time.monotonic()
        result = await servers.call("rooms", "list_rooms", {}, user="wecom:zhangsan", bot="b", idempotency_key="k")
        assert result.outcome == "ok", result
        assert "华山厅" in result.text
        assert time.monotonic() - began < FAST_S, f"{transport}: the session is still good"
    finally:
        await servers.aclose()


async def test_the_list_is_refreshed_when_the_server_says_it_changed(log_dir: Path, tmp_path: Path) -> None:
    """Over HTTP, another client adds the tool: only the notification can tell this client; over stdio the server
    is this client's own child, so the same client adds it."""
    proc, url = start_demo_mcp(log_dir, tmp_path / "calls.jsonl", name="demo-mcp-list-changed")
    watcher = ToolServers(settings_for(http_settings(url)))
    changer = ToolServers(settings_for(http_settings(url)))
    stdio = ToolServers(settings_for(stdio_settings(tmp_path / "stdio-calls.jsonl")))
    try:
        for servers, adder in ((watcher, changer), (stdio, stdio)):
            assert "cancel_booking" not in {spec.name for spec in await servers.tools("rooms")}
            added = await adder.call("rooms", "add_tool", {}, user="admin", bot="b", idempotency_key="key-add")
            assert added.outcome == "ok", added
            deadline = time.monotonic() + 5
            while "cancel_booking" not in (names := {spec.name: spec for spec in await servers.tools("rooms")}):
                assert time.monotonic() < deadline, "the list was not refreshed (its TTL is 300 s)"
                await asyncio.sleep(0.05)
            assert names["cancel_booking"].read_only is False
    finally:
        for servers in (watcher, changer, stdio):
            await servers.aclose()
        proc.stop()


async def test_a_server_that_is_down_is_unavailable_quickly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as silent:  # listens (the kernel accepts), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        cases = {
            "refused": (http_settings(f"http://127.0.0.1:{free_port()}/mcp"), "cannot connect", FAST_S),
            "silent": (http_settings(f"http://127.0.0.1:{silent.getsockname()[1]}/mcp", 1.5), "1.5 s", 1.5 + 1),
            "exits": (
                ToolServerSettings(
                    command=[sys.executable, "-c", "raise SystemExit(3)"], env=stdio_settings(Path()).env
                ),
                "closed the connection",
                FAST_S,
            ),
            "no program": (ToolServerSettings(command=["/nonexistent/rooms-mcp"]), "cannot be started", FAST_S),
        }
        for case, (server, why, bound) in cases.items():
            servers = ToolServers(settings_for(server))
            try:
                began = time.monotonic()
                with pytest.raises(ServerUnavailable) as raised:
                    await servers.tools("rooms")
                assert time.monotonic() - began < bound, case
                assert "'rooms'" in str(raised.value) and why in str(raised.value), (case, str(raised.value))
                assert SECRET not in str(raised.value)

                began = time.monotonic()
                result = await servers.call("rooms", "book", {}, user="u", bot="b", idempotency_key="k")
                assert result.outcome == "unavailable", (case, result)
                assert time.monotonic() - began < bound, case
                assert SECRET not in result.text
            finally:
                await servers.aclose()
    assert SECRET not in caplog.text
    assert (await ToolServers(settings_for(http_settings("http://127.0.0.1:1/mcp"))).call(
        "nope", "book", {}, user="u", bot="b", idempotency_key="k"
    )).outcome == "unavailable"  # fmt: skip


async def test_an_http_server_that_restarts_or_dies(log_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    proc, url = start_demo_mcp(log_dir, tmp_path / "calls.jsonl", name="demo-mcp-restarts", port=port)
    servers = ToolServers(settings_for(http_settings(url)))
    try:
        assert await servers.tools("rooms")
        # restarted behind the client's back: the old session is unknown to it (404); a new one is opened
        proc.stop()
        proc, _ = start_demo_mcp(log_dir, tmp_path / "calls.jsonl", name="demo-mcp-restarts", port=port)
        result = await servers.call("rooms", "list_rooms", {}, user="u", bot="b", idempotency_key="k1")
        assert result.outcome == "ok", result

        proc.stop()
        began = time.monotonic()
        result = await servers.call("rooms", "list_rooms", {}, user="u", bot="b", idempotency_key="k2")
        assert result.outcome == "unavailable", result
        assert result.text == "tool server 'rooms' is unavailable: cannot connect"
        with pytest.raises(ServerUnavailable, match="cannot connect"):
            await servers.tools("rooms")
        assert time.monotonic() - began < 2 * FAST_S

        proc, _ = start_demo_mcp(log_dir, tmp_path / "calls.jsonl", name="demo-mcp-restarts", port=port)
        assert {"book", "list_rooms"} <= {spec.name for spec in await servers.tools("rooms")}
        result = await servers.call("rooms", "list_rooms", {}, user="u", bot="b", idempotency_key="k3")
        assert result.outcome == "ok", result
    finally:
        await servers.aclose()
        proc.stop()


def _stdio_children() -> list[int]:
    """This test process's demo MCP children (started by the stdio client)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or b"demo_mcp\x00--transport\x00stdio" not in (entry / "cmdline").read_bytes():
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        if f"\nPPid:\t{os.getpid()}\n" in status:
            pids.append(int(entry.name))
    return pids


async def test_a_stdio_server_that_dies_is_started_again(tmp_path: Path) -> None:
    servers = ToolServers(settings_for(stdio_settings(tmp_path / "calls.jsonl")))
    try:
        assert await servers.tools("rooms")
        (child,) = _stdio_children()
        os.kill(child, signal.SIGKILL)
        await asyncio.sleep(0.5)  # the client learns of the death from the closed pipe, not from the next call
        result = await servers.call("rooms", "list_rooms", {}, user="u", bot="b", idempotency_key="k1")
        assert result.outcome == "ok", result
        assert _stdio_children() not in ([], [child])
    finally:
        await servers.aclose()
    assert not _stdio_children(), "aclose ends the child"


def test_tool_names_that_cannot_be_function_names_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    def tool(name: str, read_only: bool | None = None) -> types.Tool:
        annotations = types.ToolAnnotations(readOnlyHint=read_only) if read_only is not None else None
        return types.Tool(name=name, inputSchema={"type": "object"}, annotations=annotations)

    names = ["ok-name_1", "dotted.name", "double__under", "_leading", "x" * 58, "x" * 57, "空格 name", "ro"]
    specs = offerable("rooms", [tool(name, read_only=name == "ro") for name in names])
    assert [spec.name for spec in specs] == ["ok-name_1", "x" * 57, "ro"]
    assert [spec.read_only for spec in specs] == [False, False, True]
    assert caplog.text.count("skipped") == 5


def test_result_text() -> None:
    def answer(*content: types.ContentBlock, structured: dict[str, Any] | None = None) -> types.CallToolResult:
        return types.CallToolResult(content=list(content), structuredContent=structured)

    text = types.TextContent(type="text", text="第一行")
    assert result_text(answer(text, types.TextContent(type="text", text="二"), structured={"a": 1})) == "第一行\n二"
    assert result_text(answer(structured={"房间": "泰山厅", "n": 2})) == '{"房间": "泰山厅", "n": 2}'
    image = types.ImageContent(type="image", data="AA==", mimeType="image/png")
    assert result_text(answer(image)) == "[image content]"
    long = result_text(answer(types.TextContent(type="text", text="长" * (RESULT_CHARS + 5))))
    assert long.startswith("长" * RESULT_CHARS) and long.endswith(
        f"[cut: the answer had {RESULT_CHARS + 5} characters]"
    )
