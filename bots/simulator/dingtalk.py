"""DingTalk's side, for the simulator: OpenAPI (token, robot messages, AI cards), sessionWebhooks,
and the Stream gateway (connections/open plus a WebSocket speaking the frame protocol).

The Stream gateway pushes each robot message once to one random live connection of the app,
and never again, ack or no ack: DingTalk's robot messages are "fire-forgot" ("不会因为网络
超时而重复推送"). A message pushed into a connection that died silently is lost, and so is
one pushed while the app has no connection at all (whether DingTalk holds it meanwhile is
UNCONFIRMED: the harsher reading). Connections go through a TCP relay that can be frozen on
demand: a "silent" connection, open but passing nothing, which only a keepalive that notices
the missing pong can detect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

TOKEN_LIFETIME_S = 7200
TICKET_LIFETIME_S = 90
BOT_TOPIC = "/v1.0/im/bot/messages/get"


@dataclass
class PendingFrame:
    client_id: str
    message_id: str
    frame: str
    sent_at: float = 0.0
    deliveries: int = 0


@dataclass
class DingTalkState:
    """What the simulated DingTalk knows and has shown."""

    apps: set[tuple[str, str]] = field(default_factory=set)
    tokens: dict[str, float] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    cards: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    tickets: dict[str, tuple[str, float]] = field(default_factory=dict)
    connections: dict[str, list[WebSocket]] = field(default_factory=dict)
    pending: dict[str, PendingFrame] = field(default_factory=dict)
    acked: list[str] = field(default_factory=list)
    opened: int = 0
    dropped_offline: int = 0  # robot messages pushed while the app had no live connection

    def fault(self, endpoint: str) -> dict[str, Any] | None:
        for fault in self.faults:
            if fault.get("endpoint", "send") == endpoint:
                fault["times"] = fault.get("times", 1) - 1
                if fault["times"] <= 0:
                    self.faults.remove(fault)
                return fault
        return None


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


def _error(errcode: int, errmsg: str) -> JSONResponse:
    return JSONResponse({"errcode": errcode, "errmsg": errmsg})


def dingtalk_router(state: DingTalkState, relay: FreezableRelay) -> APIRouter:
    router = APIRouter()

    def token_ok(request: Request) -> bool:
        expires = state.tokens.get(request.headers.get("x-acs-dingtalk-access-token", ""))
        return bool(expires and expires > time.time())

    def refuse_send(request: Request, *, needs_token: bool) -> JSONResponse | None:
        """The answer DingTalk gives instead of sending: no valid token, or an injected fault (130101…)."""
        if needs_token and not token_ok(request):
            return JSONResponse({"code": "InvalidAuthentication", "message": "token"}, 401)
        fault = state.fault("send")
        if fault:
            return _error(int(fault["errcode"]), fault.get("errmsg", "send too fast"))
        return None

    def record(**fields: Any) -> None:
        state.messages.append({**fields, "at": time.time()})

    @router.post("/v1.0/oauth2/accessToken")
    async def access_token(request: Request) -> JSONResponse:
        body = await request.json()
        if (body.get("appKey"), body.get("appSecret")) not in state.apps:
            return JSONResponse({"code": "InvalidAuthentication", "message": "bad appKey/appSecret"}, 400)
        token = secrets.token_hex(16)
        state.tokens[token] = time.time() + TOKEN_LIFETIME_S
        return JSONResponse({"accessToken": token, "expireIn": TOKEN_LIFETIME_S})

    @router.post("/robot/sendBySession")
    async def send_by_session(request: Request, session: str = "") -> JSONResponse:
        info = state.sessions.get(session)
        if info is None or info["expires_at"] < time.time():
            return _error(300001, "session expired")
        if refusal := refuse_send(request, needs_token=False):
            return refusal
        body = await request.json()
        record(
            via="session", conversation=info["conversation"], user=info["user"], group=info["group"],
            content=str((body.get("text") or body.get("markdown") or {}).get("content", body.get("text", ""))),
            at_user_ids=(body.get("at") or {}).get("atUserIds", []),
        )
        return _error(0, "ok")

    @router.post("/v1.0/robot/groupMessages/send")
    async def group_send(request: Request) -> JSONResponse:
        if refusal := refuse_send(request, needs_token=True):
            return refusal
        body = await request.json()
        content = json.loads(body["msgParam"]).get("content", "")
        record(via="openapi", conversation=body["openConversationId"], user="", group=True, content=content,
               at_user_ids=[])
        return JSONResponse({"processQueryKey": secrets.token_hex(8)})

    @router.post("/v1.0/robot/oToMessages/batchSend")
    async def single_send(request: Request) -> JSONResponse:
        if refusal := refuse_send(request, needs_token=True):
            return refusal
        body = await request.json()
        content = json.loads(body["msgParam"]).get("content", "")
        for user in body["userIds"]:
            record(via="openapi", conversation="", user=user, group=False, content=content, at_user_ids=[])
        return JSONResponse({"processQueryKey": secrets.token_hex(8)})

    async def card_event(request: Request, op: str) -> JSONResponse:
        if not token_ok(request):
            return JSONResponse({"code": "InvalidAuthentication", "message": "token"}, 401)
        body = await request.json()
        track = body.get("outTrackId", "")
        params = (body.get("cardData") or {}).get("cardParamMap") or {}
        event = {"op": op, "at": time.time(), "flowStatus": params.get("flowStatus"),
                 "content": body.get("content", params.get("msgContent")), "finalize": body.get("isFinalize")}
        if op == "deliver":
            event["openSpaceId"] = body.get("openSpaceId")
        state.cards.setdefault(track, []).append(event)
        return JSONResponse({"success": True, "result": {"outTrackId": track}})

    card_routes = [
        ("POST", "/v1.0/card/instances", "create"),
        ("POST", "/v1.0/card/instances/deliver", "deliver"),
        ("PUT", "/v1.0/card/instances", "status"),
        ("PUT", "/v1.0/card/streaming", "stream"),
    ]

    def card_route(op: str) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def route(request: Request) -> JSONResponse:
            return await card_event(request, op)

        return route

    for method, path, op in card_routes:
        router.add_api_route(path, card_route(op), methods=[method])

    # -- Stream mode -------------------------------------------------------------------------

    @router.post("/v1.0/gateway/connections/open")
    async def open_connection(request: Request) -> JSONResponse:
        body = await request.json()
        if (body.get("clientId"), body.get("clientSecret")) not in state.apps:
            return JSONResponse({"code": "InvalidAuthentication", "message": "bad clientId/clientSecret"}, 401)
        ticket = secrets.token_urlsafe(24)
        state.tickets[ticket] = (body["clientId"], time.time() + TICKET_LIFETIME_S)
        return JSONResponse({"endpoint": f"ws://127.0.0.1:{relay.port}/__sim__/dingtalk/ws", "ticket": ticket})

    @router.websocket("/__sim__/dingtalk/ws")
    async def stream_socket(socket: WebSocket, ticket: str = "") -> None:
        client_id, expires = state.tickets.pop(ticket, ("", 0.0))
        if not client_id or expires < time.time():
            await socket.close(code=4401)
            return
        await socket.accept()
        state.opened += 1
        state.connections.setdefault(client_id, []).append(socket)
        try:
            while True:
                ack = json.loads(await socket.receive_text())
                message_id = str((ack.get("headers") or {}).get("messageId", ""))
                if ack.get("code") == 200 and state.pending.pop(message_id, None):
                    state.acked.append(message_id)
        except (WebSocketDisconnect, RuntimeError, ValueError):
            pass
        finally:
            state.connections[client_id].remove(socket)

    @router.post("/__sim__/dingtalk/stream/push")
    async def push(request: Request) -> dict[str, str]:
        body = await request.json()
        message_id = secrets.token_hex(12)
        frame = {
            "specVersion": "1.0",
            "type": "CALLBACK",
            "headers": {"topic": BOT_TOPIC, "messageId": message_id, "contentType": "application/json",
                        "time": str(int(time.time() * 1000)), "appId": body["client_id"]},
            "data": json.dumps(body["payload"], ensure_ascii=False),
        }
        state.pending[message_id] = PendingFrame(body["client_id"], message_id, json.dumps(frame, ensure_ascii=False))
        return {"message_id": message_id}

    @router.post("/__sim__/dingtalk/stream/drop")
    async def drop() -> dict[str, int]:
        sockets = [s for group in state.connections.values() for s in group]
        for socket in sockets:
            with contextlib.suppress(Exception):
                await socket.close(code=1011)
        return {"dropped": len(sockets)}

    @router.post("/__sim__/dingtalk/stream/silence")
    async def silence() -> dict[str, int]:
        return {"silenced": relay.freeze()}

    @router.get("/__sim__/dingtalk/stream/stats")
    async def stream_stats() -> dict[str, Any]:
        return {
            "opened": state.opened,
            "live": {client: len(sockets) for client, sockets in state.connections.items()},
            "pending": sum(1 for p in state.pending.values() if not p.sent_at),
            "unacked": sum(1 for p in state.pending.values() if p.sent_at),  # pushed once, no ack: maybe lost
            "acked": len(state.acked),
            "dropped_offline": state.dropped_offline,
        }

    # -- playground and test controls ---------------------------------------------------------

    @router.post("/__sim__/dingtalk/session")
    async def new_session(request: Request) -> dict[str, Any]:
        body = await request.json()
        session = secrets.token_hex(16)
        expires_at = time.time() + float(body.get("ttl_s", 5400))
        state.sessions[session] = {
            "conversation": body["conversation"], "user": body["user"], "group": bool(body.get("group")),
            "expires_at": expires_at,
        }
        return {"url": f"{request.base_url}robot/sendBySession?session={session}", "expires_ms": int(expires_at * 1000)}

    @router.get("/__sim__/dingtalk/messages")
    async def messages(conversation: str = "", user: str = "") -> list[dict[str, Any]]:
        return [
            m for m in state.messages
            if (not conversation or m["conversation"] == conversation) and (not user or m["user"] == user)
        ]

    @router.get("/__sim__/dingtalk/cards")
    async def cards() -> dict[str, list[dict[str, Any]]]:
        return state.cards

    @router.post("/__sim__/dingtalk/faults")
    async def add_fault(request: Request) -> dict[str, int]:
        state.faults.append(await request.json())
        return {"pending_faults": len(state.faults)}

    return router


async def deliver_stream_frames(state: DingTalkState) -> None:
    """Push each new frame once to a random live connection of its app; never push it again."""
    while True:
        await asyncio.sleep(0.05)
        now = time.time()
        for frame in list(state.pending.values()):
            if frame.sent_at:
                continue  # fire and forget: an unacked robot message is not resent
            sockets = state.connections.get(frame.client_id) or []
            if not sockets:
                state.pending.pop(frame.message_id, None)
                state.dropped_offline += 1
                continue
            frame.sent_at, frame.deliveries = now, frame.deliveries + 1
            with contextlib.suppress(Exception):
                await random.choice(sockets).send_text(frame.frame)
