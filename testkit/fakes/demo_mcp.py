"""A demo MCP server for the tests and the playground: meeting rooms (会议室) to look up and to book.

Tools: `list_rooms` (read-only: the rooms free at a time), `book` (changes something: the kind of tool a bot lists in
`confirm`; a repeated idempotency key gets the first booking back instead of a second one), `hang` (does not answer
for an hour: for timeouts) and `add_tool`, which adds `cancel_booking` at runtime and tells every connected client
(notifications/tools/list_changed) that the tool list changed.

Every call appends one JSON line to `--calls FILE` as it starts: {tool, arguments, meta (the call's `_meta`),
header_user (the X-Botgw-User header; null over stdio), idempotency_key (the Idempotency-Key header over HTTP, the
`botgw/idempotency_key` of `_meta` over stdio), ts}. GET /healthz answers once the HTTP server is up.

    python -m testkit.fakes.demo_mcp --transport http --port 8031 [--host 127.0.0.1] [--calls FILE]
    python -m testkit.fakes.demo_mcp --transport stdio [--calls FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import anyio
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.session import ServerSession
from mcp.types import Tool, ToolAnnotations
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from testkit.processes import Proc, free_port, wait_http

ROOMS = {"松山厅": 8, "泰山厅": 12, "黄山厅": 20, "华山厅": 6}  # name -> seats
HANG_S = 3600.0


class RoomsServer(FastMCP):
    """FastMCP that remembers the client sessions it has served, so that a change of its tool list reaches all of
    them (FastMCP itself notifies nobody when a tool is added)."""

    def __init__(self, calls: Path | None, **kwargs: Any) -> None:
        super().__init__("rooms", **kwargs)
        self.calls = calls
        self.sessions: weakref.WeakSet[ServerSession] = weakref.WeakSet()
        self.bookings: dict[str, dict[str, str]] = {}  # booking id -> room, start, title, user
        self.by_key: dict[str, str] = {}  # idempotency key -> booking id

    async def list_tools(self) -> list[Tool]:
        with contextlib.suppress(ValueError, LookupError):
            self.sessions.add(self.get_context().session)
        return await super().list_tools()

    def record(self, ctx: Context, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Append the call to the calls file; return its `_meta`."""
        self.sessions.add(ctx.session)
        request_meta = ctx.request_context.meta
        meta = request_meta.model_dump(by_alias=True, exclude_none=True) if request_meta is not None else {}
        http = ctx.request_context.request
        headers = http.headers if isinstance(http, Request) else None
        line = {
            "tool": tool,
            "arguments": arguments,
            "meta": meta,
            "header_user": headers.get("x-botgw-user") if headers is not None else None,
            "idempotency_key": (
                headers.get("idempotency-key") if headers is not None else meta.get("botgw/idempotency_key")
            ),
            "ts": time.time(),
        }
        if self.calls is not None:
            with self.calls.open("a", encoding="utf-8") as out:
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
        return meta

    async def tools_changed(self) -> None:
        """notifications/tools/list_changed to every session still open."""
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await session.send_tool_list_changed()


def build(calls: Path | None = None, host: str = "127.0.0.1", port: int = 8000) -> RoomsServer:
    server = RoomsServer(calls, host=host, port=port, log_level="WARNING")

    def free_at(start: str) -> list[str]:
        taken = {b["room"] for b in server.bookings.values() if b["start"] == start.strip()}
        return [room for room in ROOMS if room not in taken]

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def list_rooms(ctx: Context, start: str = "") -> str:
        """会议室列表：某个时间（如“明天下午三点”或 ISO 时间）空闲的会议室及座位数。"""
        server.record(ctx, "list_rooms", {"start": start})
        rooms = free_at(start) if start else list(ROOMS)
        return "\n".join(f"{room}（{ROOMS[room]} 人）" for room in rooms) or "没有空闲的会议室"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
    async def book(ctx: Context, room: str, start: str, title: str = "") -> str:
        """预订会议室：room 为会议室名，start 为开始时间（ISO 时间或“明天下午三点”这样的文字），title 为会议主题。"""
        meta = server.record(ctx, "book", {"room": room, "start": start, "title": title})
        key = str(meta.get("botgw/idempotency_key") or "")
        if key and key in server.by_key:
            booking_id = server.by_key[key]
            return f"已预订（同一请求）：{server.bookings[booking_id]['room']}，预订号 {booking_id}"
        if room not in ROOMS:
            raise ToolError(f"没有这个会议室：{room}（有 {'、'.join(ROOMS)}）")
        if room not in free_at(start):
            raise ToolError(f"{room} 在 {start} 已被预订")
        booking_id = f"B{len(server.bookings) + 1:04d}"
        user = str(meta.get("botgw/user") or "")
        server.bookings[booking_id] = {"room": room, "start": start.strip(), "title": title, "user": user}
        if key:
            server.by_key[key] = booking_id
        return f"已预订 {room}，{start}{f'「{title}」' if title else ''}，预订号 {booking_id}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def hang(ctx: Context, seconds: float = HANG_S) -> str:
        """Does not answer for `seconds` (an hour by default): a tool that hangs."""
        server.record(ctx, "hang", {"seconds": seconds})
        await anyio.sleep(seconds)
        return "woke up"

    async def cancel_booking(ctx: Context, booking_id: str) -> str:
        """取消预订：booking_id 为预订号。"""
        server.record(ctx, "cancel_booking", {"booking_id": booking_id})
        if server.bookings.pop(booking_id, None) is None:
            raise ToolError(f"没有这个预订号：{booking_id}")
        return f"已取消 {booking_id}"

    added: list[str] = []

    @server.tool()
    async def add_tool(ctx: Context) -> str:
        """Adds the tool cancel_booking and notifies every client that the tool list changed."""
        server.record(ctx, "add_tool", {})
        if not added:
            added.append("cancel_booking")
            server.add_tool(cancel_booking, annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
        await server.tools_changed()
        return "added cancel_booking"

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return server


def stdio_command(calls: Path | None = None) -> list[str]:
    """The command line of this server over stdio, as a tool server's `command` (run from the repository root)."""
    return [sys.executable, "-m", "testkit.fakes.demo_mcp", "--transport", "stdio"] + (
        ["--calls", str(calls)] if calls is not None else []
    )


def start_demo_mcp(
    log_dir: Path, calls: Path | None = None, name: str = "demo-mcp", port: int | None = None
) -> tuple[Proc, str]:
    """This server over Streamable HTTP as a process (on `port`, or a free one), once it answers; the URL is the MCP
    endpoint, as a tool server's `url` takes it."""
    port = port or free_port()
    args = [sys.executable, "-m", "testkit.fakes.demo_mcp", "--transport", "http", "--port", str(port)]
    proc = Proc(args + (["--calls", str(calls)] if calls is not None else []), log_dir / f"{name}.log")
    wait_http(f"http://127.0.0.1:{port}/healthz", 30, proc)
    return proc, f"http://127.0.0.1:{port}/mcp"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["http", "stdio"], required=True)
    parser.add_argument("--host", default="127.0.0.1", help="HTTP: listen address (0.0.0.0 in a container)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP: port")
    parser.add_argument("--calls", type=Path, default=None, help="append every call to this file as a JSON line")
    args = parser.parse_args()
    server = build(args.calls, args.host, args.port)
    server.run("streamable-http" if args.transport == "http" else "stdio")


if __name__ == "__main__":
    main()
