"""The MCP servers a bot's tools come from, as a client sees them: their tool lists (cached, refreshed when a server
says its list changed) and calls bounded by the server's `timeout_s`, with the asker's identity attached.

Each server has one long-lived session, opened on first use and kept by a task of its own (the SDK's transports are
anyio context managers, which must be entered and left in one task). Lists and calls go through it, over both
transports: over HTTP the per-call headers X-Botgw-User and Idempotency-Key are set on each request from the `_meta`
of the JSON-RPC message it carries, so that one connection serves every asker. A session that dies is replaced on
the next use; one the HTTP server has forgotten (a restart: 404, nothing was done) is replaced and the request sent
again, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED

from tools.config import ToolServerSettings, ToolsSettings

log = logging.getLogger(__name__)

EXPOSED_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # an OpenAI function name
RESULT_CHARS = 16_000  # a tool's answer beyond this is cut: it goes into the model's context
CLOSE_WAIT_S = 5.0  # a session's orderly close (stdio: the child's exit; HTTP: the DELETE) before it is cancelled
SESSION_FORGOTTEN = 32600  # the SDK's error code for an HTTP 404 on a session id: the server does not know it
CLIENT_INFO = types.Implementation(name="botgw", version="1")
TRANSPORT_GONE = anyio.ClosedResourceError | anyio.BrokenResourceError  # the session's streams closed or broken

T = TypeVar("T")


@dataclass(frozen=True)
class ToolSpec:
    """One tool of one server, as offered to the model."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool  # the server's annotations say readOnlyHint: true

    @property
    def qualified(self) -> str:
        return f"{self.server}.{self.name}"

    @property
    def exposed(self) -> str:
        """The OpenAI function name: OpenAI allows no dots."""
        return f"{self.server}__{self.name}"

    def openai(self) -> dict[str, Any]:
        function = {"name": self.exposed, "description": self.description, "parameters": self.input_schema}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class CallResult:
    """What became of one call: `ok` and `error` are the tool's own answers; `timeout` means sent and not answered
    in time (it may have run); `unavailable` means the server could not be reached (nothing ran); `lost` means the
    connection went while the call was out (it may have run)."""

    outcome: Literal["ok", "error", "timeout", "unavailable", "lost"]
    text: str
    duration_ms: int


class ServerUnavailable(Exception):
    """A tool server that cannot be used now; the message says which and why, and holds no secret."""


NOT_CONNECTED = "cannot connect"  # the request never reached the server


class _Lost(Exception):
    """The session ended while a request was on it; the message is why, if known."""


@dataclass(frozen=True)
class _Listing:
    specs: tuple[ToolSpec, ...]
    fetched: float  # time.monotonic()
    generation: int  # the server's list_changed count when the list was asked for


class _Connection:
    """One server's session, kept open by its own task until `close()` or until it dies."""

    def __init__(self, name: str, settings: ToolServerSettings, on_list_changed: Callable[[], None]) -> None:
        self.name = name
        self._settings = settings
        self._on_list_changed = on_list_changed
        self.session: ClientSession | None = None
        self.failure = ""
        self._ready = asyncio.Event()  # set when the session is up, or when it could not be opened
        self._gone = asyncio.Event()
        self._stop = asyncio.Event()
        self._closing = False
        self._task = asyncio.create_task(self._keep(), name=f"mcp-{name}")

    @property
    def usable(self) -> bool:
        return not self._gone.is_set() and not self._stop.is_set()

    async def _keep(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._open(stack)
                relayed, received = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                relays = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(relays.cancel_scope.cancel)
                relays.start_soon(self._relay, read, relayed)
                session = await stack.enter_async_context(
                    ClientSession(received, write, message_handler=self._on_message, client_info=CLIENT_INFO)
                )
                try:
                    with anyio.fail_after(self._settings.timeout_s):
                        await session.initialize()
                except TimeoutError:
                    self.failure = f"did not answer within {self._settings.timeout_s:g} s"
                    self._gone.set()  # callers need not wait for the transport's close
                    self._ready.set()
                    return
                self.session = session
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:
            self.failure = self.failure or _why(exc)
        finally:
            self._gone.set()
            self._ready.set()
            if self.failure:
                log.warning("tool server %s: %s", self.name, self.failure)
            elif self.session is not None and not self._closing:
                log.warning("tool server %s: the connection ended", self.name)

    async def _relay(
        self,
        source: MemoryObjectReceiveStream[SessionMessage | Exception],
        sink: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """Pass the server's messages on to the session, and end the session as soon as the transport ends (a stdio
        server that exits, an HTTP transport that failed), not at the next request."""
        async with sink:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.EndOfStream):
                async for message in source:
                    await sink.send(message)
        self._stop.set()

    async def _open(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        settings = self._settings
        if settings.url is not None:
            client = httpx.AsyncClient(
                headers={name: value.get_secret_value() for name, value in settings.headers.items()},
                # no read timeout: the server's stream of notifications stays open; calls are bounded by the caller
                timeout=httpx.Timeout(settings.timeout_s, read=None),
                event_hooks={"request": [_identity_headers]},
            )
            await stack.enter_async_context(client)
            read, write, _ = await stack.enter_async_context(streamable_http_client(settings.url, http_client=client))
            return read, write
        assert settings.command
        params = StdioServerParameters(
            command=settings.command[0],
            args=settings.command[1:],
            env={name: value.get_secret_value() for name, value in settings.env.items()},
        )
        return await stack.enter_async_context(stdio_client(params))

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ToolListChangedNotification
        ):
            log.info("tool server %s: its tool list changed", self.name)
            self._on_list_changed()
        elif isinstance(message, Exception):  # e.g. the late answer to a call that timed out and was cancelled
            log.info("tool server %s: a message was not handled (%s)", self.name, type(message).__name__)

    async def run(self, request: Callable[[ClientSession], Awaitable[T]]) -> T:
        """`request` on this session once it is up; `_Lost` if the session ends first. The caller bounds the time."""
        await self._ready.wait()
        if self.session is None or self._gone.is_set():
            raise ServerUnavailable(f"tool server {self.name!r} is unavailable: {self.failure or 'connection closed'}")
        work = asyncio.ensure_future(request(self.session))
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            work.cancel()
        if not work.done() or work.cancelled():
            raise _Lost(self.failure)
        exc = work.exception()
        if exc is None:
            return work.result()
        if isinstance(exc, TRANSPORT_GONE) or (
            isinstance(exc, McpError) and exc.error.code == CONNECTION_CLOSED
        ):
            self._stop.set()  # the transport is gone though the keeper may not know yet
            raise _Lost(self.failure) from exc
        raise exc

    async def notify(self, notification: types.ClientNotification) -> None:
        if self.session is not None and self.usable:
            await self.session.send_notification(notification)

    async def close(self) -> None:
        self._closing = True
        if not self._ready.is_set():
            self._task.cancel()  # still connecting: nothing to close in order
        self._stop.set()
        done, _ = await asyncio.wait({self._task}, timeout=CLOSE_WAIT_S)
        if not done:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class ToolServers:
    """The configured MCP servers: their tools (cached for `list_ttl_s`, or until a server says its list changed)
    and calls to them."""

    def __init__(self, settings: ToolsSettings) -> None:
        self._settings = settings
        self._connections: dict[str, _Connection] = {}
        self._listings: dict[str, _Listing] = {}
        self._generation: defaultdict[str, int] = defaultdict(int)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False

    def _server(self, server: str) -> ToolServerSettings:
        settings = self._settings.servers.get(server)
        if settings is None:
            raise ServerUnavailable(f"no tool server is named {server!r}")
        if self._closed:
            raise ServerUnavailable(f"tool server {server!r} is unavailable: botgw is shutting down")
        return settings

    def _connection(self, server: str) -> _Connection:
        connection = self._connections.get(server)
        if connection is None or not connection.usable:
            if connection is not None:
                self._later(connection.close())
            connection = _Connection(server, self._server(server), lambda: self._list_changed(server))
            self._connections[server] = connection
        return connection

    def _list_changed(self, server: str) -> None:
        self._generation[server] += 1

    def _drop(self, connection: _Connection) -> None:
        if self._connections.get(connection.name) is connection:
            del self._connections[connection.name]
        self._later(connection.close())

    def _drop_current(self, server: str) -> None:
        """Give up the server's session (it did not answer in time): the next use opens a new one."""
        connection = self._connections.get(server)
        if connection is not None:
            self._drop(connection)

    def _later(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _on_session(
        self, server: str, request: Callable[[ClientSession], Awaitable[T]], *, again_if_lost: bool
    ) -> T:
        """`request` on the server's session; once more on a new session if the server had forgotten the old one
        (it did nothing then), or, with `again_if_lost`, if the old one turned out to be dead."""
        for attempt in (1, 2):
            connection = self._connection(server)
            try:
                return await connection.run(request)
            except _Lost:
                if attempt == 2 or not again_if_lost:
                    raise
                self._drop(connection)
            except McpError as exc:
                if attempt == 2 or exc.error.code != SESSION_FORGOTTEN:
                    raise
                log.info("tool server %s forgot its session (restarted?): opening a new one", server)
                self._drop(connection)
        raise AssertionError("unreachable")

    def _cached(self, server: str) -> list[ToolSpec] | None:
        listing = self._listings.get(server)
        connection = self._connections.get(server)
        if (
            listing is None
            or connection is None
            or not connection.usable
            or listing.generation != self._generation[server]
            or time.monotonic() - listing.fetched >= self._settings.list_ttl_s
        ):
            return None
        return list(listing.specs)

    async def tools(self, server: str) -> list[ToolSpec]:
        """The server's tools that can be offered to the model; `ServerUnavailable` if it cannot be asked."""
        settings = self._server(server)
        cached = self._cached(server)
        if cached is not None:
            return cached
        try:
            async with asyncio.timeout(settings.timeout_s), self._locks[server]:
                cached = self._cached(server)  # asked by another caller meanwhile
                if cached is not None:
                    return cached
                generation = self._generation[server]
                tools = await self._on_session(server, _list_tools, again_if_lost=True)
        except TimeoutError:
            self._drop_current(server)
            raise ServerUnavailable(
                f"tool server {server!r} is unavailable: did not answer within {settings.timeout_s:g} s"
            ) from None
        except _Lost as lost:
            raise ServerUnavailable(
                f"tool server {server!r} is unavailable: {lost or 'the connection was lost'}"
            ) from None
        except McpError as exc:
            raise ServerUnavailable(
                f"tool server {server!r} refused to list its tools (error {exc.error.code})"
            ) from None
        specs = tuple(offerable(server, tools))
        self._listings[server] = _Listing(specs, time.monotonic(), generation)
        return list(specs)

    async def call(
        self, server: str, tool: str, arguments: dict[str, Any], *, user: str, bot: str, idempotency_key: str
    ) -> CallResult:
        """Call one tool for `user` of `bot`; never raises (but for cancellation), bounded by the server's
        `timeout_s`."""
        started = time.monotonic()

        def result(outcome: Literal["ok", "error", "timeout", "unavailable", "lost"], text: str) -> CallResult:
            return CallResult(outcome, text, int((time.monotonic() - started) * 1000))

        try:
            settings = self._server(server)
        except ServerUnavailable as exc:
            return result("unavailable", str(exc))
        meta = {"botgw/user": user, "botgw/bot": bot, "botgw/idempotency_key": idempotency_key}
        sent: list[tuple[ClientSession, Any]] = []  # the session and request id of the call once it is sent

        async def send(session: ClientSession) -> types.CallToolResult:
            # The id call_tool is about to give its request (the SDK has no public way to learn it): a call that
            # times out is cancelled by it, so that the server stops working on it.
            sent.append((session, getattr(session, "_request_id", None)))
            return await session.call_tool(tool, arguments, meta=meta)

        try:
            async with asyncio.timeout(settings.timeout_s):
                answer = await self._on_session(server, send, again_if_lost=False)
        except TimeoutError:
            if not sent:
                self._drop_current(server)
                return result("unavailable", f"tool server {server!r} did not answer within {settings.timeout_s:g} s")
            self._later(self._cancel(server, *sent[-1]))
            return result("timeout", f"tool {server}.{tool} did not answer within {settings.timeout_s:g} s")
        except ServerUnavailable as exc:
            return result("unavailable", str(exc))
        except _Lost as lost:
            why = str(lost) or "the connection was lost before it answered"
            # Sent and then lost: it may have run. Never sent, or refused at connect: nothing ran.
            delivered = bool(sent) and why != NOT_CONNECTED
            return result("lost" if delivered else "unavailable", f"tool server {server!r} is unavailable: {why}")
        except McpError as exc:
            return result("error", _bounded(f"tool server {server!r} refused the call: {exc.error.message}"))
        except Exception as exc:  # e.g. a result that does not match the tool's output schema
            return result("error", _bounded(f"tool {server}.{tool} failed: {type(exc).__name__}: {exc}"))
        return result("error" if answer.isError else "ok", result_text(answer))

    async def _cancel(self, server: str, session: ClientSession, request_id: Any) -> None:
        """Tell the server to stop a call that timed out (best effort, bounded)."""
        connection = self._connections.get(server)
        if request_id is None or connection is None or connection.session is not session:
            return
        notice = types.CancelledNotification(
            params=types.CancelledNotificationParams(requestId=request_id, reason="timed out")
        )
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await connection.notify(types.ClientNotification(notice))

    async def aclose(self) -> None:
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(connection.close() for connection in connections), return_exceptions=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    """All pages of the server's tool list."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.nextCursor
        if not cursor:
            return tools


def offerable(server: str, tools: list[types.Tool]) -> list[ToolSpec]:
    """The tools whose `<server>__<tool>` is an OpenAI function name that splits back unambiguously."""
    specs = []
    for tool in tools:
        exposed = f"{server}__{tool.name}"
        if "__" in tool.name or tool.name.startswith("_") or not EXPOSED_NAME.match(exposed):
            log.warning(
                "tool server %s: tool %r skipped: its name cannot be an OpenAI function name", server, tool.name
            )
            continue
        read_only = tool.annotations is not None and tool.annotations.readOnlyHint is True
        specs.append(ToolSpec(server, tool.name, tool.description or "", dict(tool.inputSchema), read_only))
    return specs


def result_text(answer: types.CallToolResult) -> str:
    """The text of a tool's answer for the model: its text contents joined by newlines; else its structured
    content as JSON; other contents named; bounded."""
    parts: list[str] = []
    for content in answer.content:
        if isinstance(content, types.TextContent):
            parts.append(content.text)
        elif isinstance(content, types.EmbeddedResource) and isinstance(content.resource, types.TextResourceContents):
            parts.append(content.resource.text)
        else:
            parts.append(f"[{content.type} content]")
    if not any(isinstance(content, types.TextContent) for content in answer.content) and answer.structuredContent:
        parts.insert(0, json.dumps(answer.structuredContent, ensure_ascii=False))
    return _bounded("\n".join(parts))


def _bounded(text: str) -> str:
    if len(text) <= RESULT_CHARS:
        return text
    return text[:RESULT_CHARS] + f"\n…[cut: the answer had {len(text)} characters]"


async def _identity_headers(request: httpx.Request) -> None:
    """X-Botgw-User and Idempotency-Key on an HTTP request carrying a tools/call, from that call's `_meta`."""
    if request.method != "POST":
        return
    try:
        message = json.loads(request.content)
    except (ValueError, httpx.RequestNotRead):
        return
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        return
    for header, key in (("X-Botgw-User", "botgw/user"), ("Idempotency-Key", "botgw/idempotency_key")):
        value = meta.get(key)
        if isinstance(value, str) and value:
            request.headers[header] = _header_value(value)


def _header_value(value: str) -> str:
    """Printable ASCII as it is; anything else (e.g. a Chinese user id) percent-encoded, as UTF-8."""
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe="!#$&'()*+,/:;=?@[]~ ")


def _why(exc: BaseException) -> str:
    """A short, secret-free reason for a failed session: no URL, header or environment value."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = inner[0] if inner else exc.exceptions[0]
    if isinstance(exc, httpx.HTTPStatusError):
        return f"answered HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.ConnectError):
        return NOT_CONNECTED
    if isinstance(exc, httpx.TimeoutException):
        return "timed out on HTTP"
    if isinstance(exc, httpx.HTTPError):
        return f"HTTP failed ({type(exc).__name__})"
    if isinstance(exc, McpError):
        if exc.error.code == SESSION_FORGOTTEN:
            return "answered HTTP 404 (is the URL right?)"
        if exc.error.code == CONNECTION_CLOSED:
            return "closed the connection"
        return f"refused to start a session (error {exc.error.code})"
    if isinstance(exc, TRANSPORT_GONE | anyio.EndOfStream):
        return "closed the connection"  # a server gone before its answer was read: which of these is a race
    if isinstance(exc, OSError):
        return f"its command cannot be started ({type(exc).__name__})"
    return f"failed ({type(exc).__name__})"
