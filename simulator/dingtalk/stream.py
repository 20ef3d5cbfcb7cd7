"""DingTalk's Stream gateway, for the simulator: connections/open plus a WebSocket speaking the frame protocol.

A connection gets only the CALLBACK topics it subscribed to in connections/open (S12 protocol.md: the
subscriptions list): robot messages (/v1.0/im/bot/messages/get), card callbacks (/v1.0/card/instances/callback).
The Stream gateway pushes each robot message once to one random live connection of the app,
and never again, ack or no ack: DingTalk's robot messages are "fire-forgot" ("不会因为网络
超时而重复推送"). A message pushed into a connection that died silently is lost, and so is
one pushed while the app has no connection at all (whether DingTalk holds it meanwhile is
UNCONFIRMED: the harsher reading). Connections go through a TCP relay that can be frozen on
demand: a "silent" connection, open but passing nothing, which only a keepalive that notices
the missing pong can detect. The gateway sends SYSTEM frames as DingTalk does: a `ping` every
`system_ping_s` (its real interval is UNCONFIRMED), which must be acked with its data echoed,
and, on demand, a `disconnect`. DingTalk's protocol doc (S12 protocol.md, "disconnect 请求处理":
"客户端不需要对此推送信息做任何响应， 服务端在静默10s之后会主动断开 tcp 连接") has the server go
silent on that connection and close it 10 s later: from the disconnect on, the connection gets
no push and no ping (a push goes to another live connection of the app, or is dropped as offline
when there is none), and it is closed `grace_s` later (10 s at DingTalk) whatever the client does.
Whether DingTalk still honours an ack that comes in on it meanwhile is UNCONFIRMED: the harsher
reading, it is read and not honoured (counted in `acks_after_disconnect`; a card callback's
response in it changes no card). A push can also be made to reach every live connection of
the app (`to_all`), each copy under its own frame id: what a client's dedup must survive.
(The pushes, disconnects, drops and silences a test orders: control.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from simulator.dingtalk.cards import apply_callback_response
from simulator.dingtalk.state import DingTalkState

TICKET_LIFETIME_S = 90
_CLOSING: set[asyncio.Task[None]] = set()  # connections told to disconnect, waiting out their grace


class FreezableRelay:
    """A TCP relay in front of the simulator's own port; freeze() makes current connections go silent."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._pairs: list[asyncio.Event] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server:
            self._server.close()

    def freeze(self) -> int:
        """Stop passing bytes on every current connection, without closing any."""
        for frozen in self._pairs:
            frozen.set()
        count = len(self._pairs)
        self._pairs = []
        return count

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frozen = asyncio.Event()
        self._pairs.append(frozen)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    if frozen.is_set():
                        await asyncio.Event().wait()  # silent: hold everything, forever
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))



def stream_router(state: DingTalkState, relay: FreezableRelay) -> APIRouter:
    router = APIRouter()

    @router.post("/v1.0/gateway/connections/open")
    async def open_connection(request: Request) -> JSONResponse:
        body = await request.json()
        if (body.get("clientId"), body.get("clientSecret")) not in state.apps:
            # Undocumented (UNCONFIRMED); what DingTalk answers in public logs of dingtalk-stream's
            # open_connection: HTTP 401 {"code":"authFailed","message":"鉴权失败"} (zfanswer/dify-on-dingtalk#28,
            # agentscope-ai/QwenPaw#1027). Played as seen (not the token endpoint's answer, api.py).
            return JSONResponse({"code": "authFailed", "message": "鉴权失败"}, 401)
        ticket = secrets.token_urlsafe(24)
        state.tickets[ticket] = (body["clientId"], time.time() + TICKET_LIFETIME_S)
        subscriptions = body.get("subscriptions") if isinstance(body.get("subscriptions"), list) else []
        state.ticket_topics[ticket] = {
            str(s.get("topic")) for s in subscriptions if isinstance(s, dict) and s.get("type") == "CALLBACK"
        }
        return JSONResponse({"endpoint": f"ws://127.0.0.1:{relay.port}/__sim__/dingtalk/ws", "ticket": ticket})

    @router.websocket("/__sim__/dingtalk/ws")
    async def stream_socket(socket: WebSocket, ticket: str = "") -> None:
        client_id, expires = state.tickets.pop(ticket, ("", 0.0))
        topics = state.ticket_topics.pop(ticket, set())
        if not client_id or expires < time.time():
            # A ticket used twice or after its 90 s is refused (platform-protocols.md §G); how (the close code) is
            # UNCONFIRMED: closed before the handshake completes, which a client sees as a failed connect.
            await socket.close(code=4401)
            return
        await socket.accept()
        state.opened += 1
        state.connections.setdefault(client_id, []).append(socket)
        state.socket_topics[socket] = topics
        try:
            while True:
                ack = json.loads(await socket.receive_text())
                message_id = str((ack.get("headers") or {}).get("messageId", ""))
                if socket in state.draining:  # told to disconnect: the ack is not honoured (UNCONFIRMED, module doc)
                    state.acks_after_disconnect += 1
                elif message_id in state.pings:
                    sent = state.pings.pop(message_id)
                    if ack.get("code") == 200 and json.loads(ack.get("data") or "null") == json.loads(sent):
                        state.pings_acked += 1
                elif ack.get("code") == 200 and (frame := state.pending.pop(message_id, None)):
                    state.acked.append(message_id)
                    if frame.card:
                        apply_callback_response(state, frame.card, ack.get("data"))
        except (WebSocketDisconnect, RuntimeError, ValueError):
            pass
        finally:
            if socket in state.connections[client_id]:
                state.connections[client_id].remove(socket)
            state.draining.discard(socket)
            state.socket_topics.pop(socket, None)

    return router


async def hand_over(state: DingTalkState, socket: WebSocket, grace_s: float) -> None:
    """Hand a live connection over as DingTalk does (module doc): out of the app's live connections first, so that
    nothing is pushed on it after the SYSTEM disconnect frame, then the frame; closed `grace_s` later."""
    for group in state.connections.values():
        if socket in group:
            group.remove(socket)
    state.draining.add(socket)
    await send_system(socket, "disconnect", {"reason": "connection is expired"})  # protocol.md's example reason

    async def close_later() -> None:
        await asyncio.sleep(grace_s)
        with contextlib.suppress(Exception):
            await socket.close(code=1000)

    closing = asyncio.get_running_loop().create_task(close_later())
    _CLOSING.add(closing)  # held until done: the loop keeps only a weak reference to a task
    closing.add_done_callback(_CLOSING.discard)


async def send_system(socket: WebSocket, topic: str, data: dict[str, Any]) -> str:
    """A SYSTEM frame (ping, disconnect) as DingTalk sends it; its frame id."""
    message_id = secrets.token_hex(12)
    frame = {
        "specVersion": "1.0",
        "type": "SYSTEM",
        "headers": {"topic": topic, "messageId": message_id, "contentType": "application/json",
                    "time": str(int(time.time() * 1000))},
        "data": json.dumps(data),
    }
    with contextlib.suppress(Exception):
        await socket.send_text(json.dumps(frame))
    return message_id


async def deliver_stream_frames(state: DingTalkState) -> None:
    """Push each new frame once to a random live connection of its app (or its own one); never push it again.
    Every `system_ping_s`, ping every live connection with a SYSTEM frame. A connection told to disconnect is no
    longer live (`state.draining`): it gets neither (module doc)."""
    last_ping = time.monotonic()
    while True:
        await asyncio.sleep(0.05)
        now = time.time()
        for frame in list(state.pending.values()):
            if frame.sent_at:
                continue  # fire and forget: an unacked robot message is not resent
            sockets = [s for s in state.connections.get(frame.client_id) or []
                       if frame.topic in state.socket_topics.get(s, ())]
            if frame.socket is not None:
                sockets = [frame.socket] if frame.socket in sockets else []
            if not sockets:
                state.pending.pop(frame.message_id, None)
                state.dropped_offline += 1
                continue
            frame.sent_at, frame.deliveries = now, frame.deliveries + 1
            with contextlib.suppress(Exception):
                await random.choice(sockets).send_text(frame.frame)
        if time.monotonic() - last_ping >= state.system_ping_s:
            last_ping = time.monotonic()
            for socket in [s for group in state.connections.values() for s in group]:
                data = {"opaque": secrets.token_hex(8)}
                state.pings[await send_system(socket, "ping", data)] = json.dumps(data)
                state.pings_sent += 1
