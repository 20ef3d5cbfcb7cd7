"""DingTalk's side, for the simulator: OpenAPI (token, robot messages, AI cards), sessionWebhooks,
and the Stream gateway (connections/open plus a WebSocket speaking the frame protocol).

The Stream gateway pushes each robot message once to one random live connection of the app,
and never again, ack or no ack: DingTalk's robot messages are "fire-forgot" ("不会因为网络
超时而重复推送"). A message pushed into a connection that died silently is lost, and so is
one pushed while the app has no connection at all (whether DingTalk holds it meanwhile is
UNCONFIRMED: the harsher reading). Connections go through a TCP relay that can be frozen on
demand: a "silent" connection, open but passing nothing, which only a keepalive that notices
the missing pong can detect. The gateway sends SYSTEM frames as DingTalk does: a `ping` every
`system_ping_s` (its real interval is UNCONFIRMED), which must be acked with its data echoed,
and, on demand, a `disconnect`, after which the connection is closed `grace_s` later (10 s at
DingTalk) whatever the client does. A push can also be made to reach every live connection of
the app (`to_all`), each copy under its own frame id: what a client's dedup must survive.

Sending is checked as DingTalk checks it: the message types and fields of sessionWebhook, the
OpenAPI (robotCode, msgKey, msgParam) and AI cards (create → deliver → update, string params).
A conversation that is sent more than 20 messages in a minute is throttled for 10 minutes:
every send in that time is refused with 130101 (S14 says so of custom robots; that the same
holds per conversation for an enterprise robot is UNCONFIRMED, and the harsher reading is
played: the throttle is not lifted early, whoever sent the excess). oToMessages/batchSend does not
answer 130101: it answers 200 and lists the recipients it did not deliver to (BatchSendOTOResponseBody in
aliyun/dingtalk-sdk robot_1_0: flowControlledStaffIdList, invalidStaffIdList, filteredStaffIdList); the
simulator lists a recipient over the same per-person rate as flow-controlled (which rate DingTalk applies
there is UNCONFIRMED), and staff a test marks invalid or filtered in those lists. A bad, expired or
revoked token is refused with HTTP 400 {"code": "InvalidAuthentication"} (public clients' logs:
satorijs/satori#240, alibabacloud-sdk-php/dingtalk#1), never 401.
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
SEND_PER_MINUTE = 20
THROTTLE_S = 600.0
SESSION_MSGTYPES = {"text", "markdown", "actionCard", "link", "feedCard"}
OPENAPI_MSG_KEYS = {"sampleText": ("content",), "sampleMarkdown": ("title", "text")}
BAD_PARAM = 40035  # DingTalk's "不合法的参数"; the exact code for each malformed field is UNCONFIRMED


@dataclass
class PendingFrame:
    client_id: str
    message_id: str
    frame: str
    sent_at: float = 0.0
    deliveries: int = 0
    socket: Any = None  # a copy for this one connection (to_all); None: any live connection


@dataclass
class DingTalkState:
    """What the simulated DingTalk knows and has shown."""

    apps: set[tuple[str, str]] = field(default_factory=set)
    tokens: dict[str, float] = field(default_factory=dict)
    token_apps: dict[str, str] = field(default_factory=dict)  # app token -> its app's key (appKey)
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
    robots: set[str] = field(default_factory=set)  # robotCodes of the configured apps
    sends: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # conversation -> delivery times
    throttled_until: dict[tuple[str, str], float] = field(default_factory=dict)
    throttle_s: float = THROTTLE_S
    throttled: int = 0  # sends refused with 130101 by the throttle
    session_posts: dict[str, list[int]] = field(default_factory=dict)  # session -> [posts, refused]
    delivered_cards: set[str] = field(default_factory=set)
    staff_status: dict[str, str] = field(default_factory=dict)  # userId -> "invalid" | "filtered" (test controls)
    not_delivered: int = 0  # batchSend recipients listed as not delivered to
    system_ping_s: float = 10.0
    pings: dict[str, str] = field(default_factory=dict)  # ping frame id -> its data, until acked
    pings_sent: int = 0
    pings_acked: int = 0
    disconnects_sent: int = 0

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


TOKEN_REFUSED = {"code": "InvalidAuthentication", "message": "不合法的access_token"}


def dingtalk_router(state: DingTalkState, relay: FreezableRelay) -> APIRouter:
    router = APIRouter()

    def token_refusal(request: Request) -> JSONResponse | None:
        """HTTP 400 InvalidAuthentication for a token DingTalk never issued, that expired or was revoked."""
        expires = state.tokens.get(request.headers.get("x-acs-dingtalk-access-token", ""))
        return None if expires and expires > time.time() else JSONResponse(TOKEN_REFUSED, 400)

    async def refuse_send(request: Request, *, needs_token: bool) -> JSONResponse | None:
        """The answer DingTalk gives instead of sending: no valid token, or an injected fault: an errcode (130101…),
        `http_status` (a 5xx), or `delay_s` (slow: the send waits that long, then succeeds unless the fault also
        names an errcode or a status)."""
        if needs_token and (refusal := token_refusal(request)):
            return refusal
        fault = state.fault("send")
        if fault:
            if fault.get("delay_s"):
                await asyncio.sleep(float(fault["delay_s"]))
            if fault.get("http_status"):
                body = {"code": "ServiceUnavailable", "message": fault.get("errmsg", "simulated")}
                return JSONResponse(body, int(fault["http_status"]))
            if fault.get("delay_s") and "errcode" not in fault:
                return None
            return _error(int(fault["errcode"]), fault.get("errmsg", "send too fast"))
        return None

    def over_rate(conversation: tuple[str, str]) -> bool:
        """Whether the conversation is throttled; a send past 20 in a minute starts 10 minutes of it."""
        now = time.time()
        if state.throttled_until.get(conversation, 0.0) > now:
            state.throttled += 1
            return True
        recent = [at for at in state.sends.get(conversation, []) if now - at < 60]
        state.sends[conversation] = recent
        if len(recent) >= SEND_PER_MINUTE:
            state.throttled_until[conversation] = now + state.throttle_s
            state.sends[conversation] = []  # a new minute starts when the throttle ends
            state.throttled += 1
            return True
        return False

    def throttle(conversation: tuple[str, str]) -> JSONResponse | None:
        """130101 while the conversation is throttled (sessionWebhook, group messages)."""
        return _error(130101, "send too fast") if over_rate(conversation) else None

    def record(**fields: Any) -> None:
        now = time.time()
        state.messages.append({**fields, "at": now})
        key = ("group", fields["conversation"]) if fields["group"] else ("user", fields["user"])
        state.sends.setdefault(key, []).append(now)

    def session_body_error(body: Any) -> JSONResponse | None:
        """What sessionWebhook refuses: an unknown msgtype, or its content missing (S13 reply_text/markdown)."""
        if not isinstance(body, dict) or body.get("msgtype") not in SESSION_MSGTYPES:
            return _error(BAD_PARAM, "invalid msgtype")
        part = body.get(body["msgtype"])
        if body["msgtype"] == "text" and not (isinstance(part, dict) and isinstance(part.get("content"), str)
                                              and part["content"]):
            return _error(BAD_PARAM, "text.content missing")
        if body["msgtype"] == "markdown" and not (isinstance(part, dict) and part.get("title") and part.get("text")):
            return _error(BAD_PARAM, "markdown needs title and text")
        at = body.get("at")
        if at is not None and not (isinstance(at, dict) and isinstance(at.get("atUserIds", []), list)):
            return _error(BAD_PARAM, "at.atUserIds must be a list")
        return None

    def openapi_error(body: Any, *fields: str) -> JSONResponse | None:
        """What the robot OpenAPI refuses: another robotCode, a msgKey it does not know, a msgParam that is not
        the JSON string of that key's fields. (The exact codes are UNCONFIRMED; DingTalk answers HTTP 400.)"""
        if not isinstance(body, dict) or any(not body.get(name) for name in ("robotCode", "msgKey", "msgParam",
                                                                                *fields)):
            return JSONResponse({"code": "MissingParameter", "message": "required field missing"}, 400)
        if body["robotCode"] not in state.robots:
            return JSONResponse({"code": "invalidParameter.robotCode", "message": "robot not found"}, 400)
        wanted = OPENAPI_MSG_KEYS.get(body["msgKey"])
        try:
            params = json.loads(body["msgParam"]) if isinstance(body["msgParam"], str) else None
        except ValueError:
            params = None
        if wanted is None or not isinstance(params, dict) or any(not params.get(name) for name in wanted):
            return JSONResponse({"code": "invalidParameter.msgParam", "message": "msgKey/msgParam"}, 400)
        return None

    @router.post("/v1.0/oauth2/accessToken")
    async def access_token(request: Request) -> JSONResponse:
        body = await request.json()
        if (body.get("appKey"), body.get("appSecret")) not in state.apps:
            return JSONResponse({"code": "InvalidAuthentication", "message": "bad appKey/appSecret"}, 400)
        token = secrets.token_hex(16)
        state.tokens[token] = time.time() + TOKEN_LIFETIME_S
        state.token_apps[token] = body["appKey"]
        return JSONResponse({"accessToken": token, "expireIn": TOKEN_LIFETIME_S})

    @router.post("/robot/sendBySession")
    async def send_by_session(request: Request, session: str = "") -> JSONResponse:
        posts = state.session_posts.setdefault(session, [0, 0])
        posts[0] += 1
        info = state.sessions.get(session)
        if info is None or info["expires_at"] < time.time():
            posts[1] += 1
            if info is not None and info.get("expired_status"):
                return JSONResponse({"code": "ServiceUnavailable", "message": "simulated"}, info["expired_status"])
            return _error(300001, "session expired")
        if refusal := await refuse_send(request, needs_token=False):
            return refusal
        body = await request.json()
        if refusal := session_body_error(body):
            return refusal
        key = ("group", info["conversation"]) if info["group"] else ("user", info["user"])
        if refusal := throttle(key):
            return refusal
        record(
            via="session", conversation=info["conversation"], user=info["user"], group=info["group"],
            content=str((body.get("text") or body.get("markdown") or {}).get("content", body.get("text", ""))),
            at_user_ids=(body.get("at") or {}).get("atUserIds", []),
        )
        return _error(0, "ok")

    @router.post("/v1.0/robot/groupMessages/send")
    async def group_send(request: Request) -> JSONResponse:
        if refusal := await refuse_send(request, needs_token=True):
            return refusal
        body = await request.json()
        if refusal := openapi_error(body, "openConversationId") or throttle(("group", body["openConversationId"])):
            return refusal
        content = json.loads(body["msgParam"]).get("content", "")
        record(via="openapi", conversation=body["openConversationId"], user="", group=True, content=content,
               at_user_ids=[])
        return JSONResponse({"processQueryKey": secrets.token_hex(8)})

    @router.post("/v1.0/robot/oToMessages/batchSend")
    async def single_send(request: Request) -> JSONResponse:
        if refusal := await refuse_send(request, needs_token=True):
            return refusal
        body = await request.json()
        if refusal := openapi_error(body, "userIds"):
            return refusal
        if not isinstance(body["userIds"], list) or not all(isinstance(u, str) and u for u in body["userIds"]):
            return JSONResponse({"code": "invalidParameter.userIds", "message": "userIds"}, 400)
        content = json.loads(body["msgParam"]).get("content", "")
        lists: dict[str, list[str]] = {"flowControlledStaffIdList": [], "invalidStaffIdList": [],
                                       "filteredStaffIdList": []}  # fmt: skip
        for user in body["userIds"]:
            status = state.staff_status.get(user, "")
            if status:
                lists[f"{status}StaffIdList"].append(user)
            elif over_rate(("user", user)):
                lists["flowControlledStaffIdList"].append(user)
            else:
                record(via="openapi", conversation="", user=user, group=False, content=content, at_user_ids=[])
        state.not_delivered += sum(len(users) for users in lists.values())
        return JSONResponse({"processQueryKey": secrets.token_hex(8), **lists})

    def card_error(op: str, body: Any) -> str:
        """Why DingTalk would refuse this card call ('' if it would not), following the SDK's AI card calls
        (S13 card_replier.py, card_instance.py): create → deliver → status/stream updates on a delivered card;
        cardParamMap values are strings; a streaming update carries guid, key, content and isFull/isFinalize."""
        if not isinstance(body, dict) or not body.get("outTrackId"):
            return "outTrackId missing"
        track = body["outTrackId"]
        params = (body.get("cardData") or {}).get("cardParamMap")
        if op in ("create", "status") and (
            not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values())
        ):
            return "cardData.cardParamMap must map names to strings"
        if op == "create":
            if not body.get("cardTemplateId") or body.get("callbackType") != "STREAM":
                return "cardTemplateId and callbackType STREAM needed"
            if not (body.get("imGroupOpenSpaceModel") or body.get("imRobotOpenSpaceModel")):
                return "an open space model is needed"
            # A second create of one outTrackId: DingTalk's answer is UNCONFIRMED; refused (the harsher reading).
            return "card exists" if track in state.cards else ""
        if track not in state.cards:
            return "no such card"
        if op == "deliver":
            space = str(body.get("openSpaceId", ""))
            if space.startswith("dtv1.card//IM_GROUP."):
                ok = (body.get("imGroupOpenDeliverModel") or {}).get("robotCode") in state.robots
            elif space.startswith("dtv1.card//IM_ROBOT."):
                ok = (body.get("imRobotOpenDeliverModel") or {}).get("spaceType") == "IM_ROBOT"
            else:
                ok = False
            if not ok or body.get("userIdType") != 1:
                return "openSpaceId and deliver model do not match"
            # A second deliver of one card: DingTalk's answer is UNCONFIRMED; refused (the harsher reading).
            return "card already delivered" if track in state.delivered_cards else ""
        if track not in state.delivered_cards:
            return "card not delivered"
        if op == "stream":
            if not body.get("guid") or not body.get("key") or not isinstance(body.get("content"), str):
                return "guid, key and content needed"
            if not isinstance(body.get("isFull"), bool) or not isinstance(body.get("isFinalize"), bool):
                return "isFull and isFinalize must be booleans"
        return ""

    async def card_event(request: Request, op: str) -> JSONResponse:
        """A card call, checked as card_error says. An injected fault (endpoint `card.<op>`, `http_status`)
        fails it before its effect, or with `after` once the effect happened (the caller cannot tell which)."""
        if refusal := token_refusal(request):
            return refusal
        body = await request.json()
        if problem := card_error(op, body):
            return JSONResponse({"code": "param.invalid", "message": problem}, 400)
        failed = None
        if fault := state.fault(f"card.{op}"):
            failed = JSONResponse({"code": "ServiceUnavailable", "message": "simulated"}, int(fault["http_status"]))
            if not fault.get("after"):
                return failed
        track = body.get("outTrackId", "")
        params = (body.get("cardData") or {}).get("cardParamMap") or {}
        event = {"op": op, "at": time.time(), "flowStatus": params.get("flowStatus"),
                 "content": body.get("content", params.get("msgContent")), "finalize": body.get("isFinalize")}
        if op == "deliver":
            event["openSpaceId"] = body.get("openSpaceId")
            state.delivered_cards.add(track)
        state.cards.setdefault(track, []).append(event)
        return failed or JSONResponse({"success": True, "result": {"outTrackId": track}})

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
                if message_id in state.pings:
                    sent = state.pings.pop(message_id)
                    if ack.get("code") == 200 and json.loads(ack.get("data") or "null") == json.loads(sent):
                        state.pings_acked += 1
                elif ack.get("code") == 200 and state.pending.pop(message_id, None):
                    state.acked.append(message_id)
        except (WebSocketDisconnect, RuntimeError, ValueError):
            pass
        finally:
            state.connections[client_id].remove(socket)

    @router.post("/__sim__/dingtalk/stream/push")
    async def push(request: Request) -> dict[str, Any]:
        """Push a robot message (once, to one random live connection); `to_all`: a copy to every live one."""
        body = await request.json()
        targets = list(state.connections.get(body["client_id"]) or []) if body.get("to_all") else [None]
        ids = []
        for target in targets:
            message_id = secrets.token_hex(12)
            frame = {
                "specVersion": "1.0",
                "type": "CALLBACK",
                "headers": {"topic": BOT_TOPIC, "messageId": message_id, "contentType": "application/json",
                            "time": str(int(time.time() * 1000)), "appId": body["client_id"]},
                "data": json.dumps(body["payload"], ensure_ascii=False),
            }
            text = json.dumps(frame, ensure_ascii=False)
            state.pending[message_id] = PendingFrame(body["client_id"], message_id, text, socket=target)
            ids.append(message_id)
        return {"message_id": ids[0] if ids else "", "message_ids": ids}

    @router.post("/__sim__/dingtalk/stream/disconnect")
    async def disconnect(request: Request) -> dict[str, int]:
        """SYSTEM disconnect to every live connection; each is closed `grace_s` later (DingTalk: 10 s)."""
        grace_s = float((await request.json()).get("grace_s", 10.0))
        sockets = [s for group in state.connections.values() for s in group]
        for socket in sockets:
            await send_system(socket, "disconnect", {"reason": "simulator"})
            state.disconnects_sent += 1

        async def close_later(socket: WebSocket) -> None:
            await asyncio.sleep(grace_s)
            with contextlib.suppress(Exception):
                await socket.close(code=1000)

        for socket in sockets:
            asyncio.get_running_loop().create_task(close_later(socket))
        return {"disconnected": len(sockets)}

    @router.post("/__sim__/dingtalk/stream/system-ping")
    async def set_ping(request: Request) -> dict[str, float]:
        state.system_ping_s = float((await request.json()).get("interval_s", state.system_ping_s))
        return {"interval_s": state.system_ping_s}

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
            "pings_sent": state.pings_sent,
            "pings_acked": state.pings_acked,
            "disconnects_sent": state.disconnects_sent,
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

    @router.post("/__sim__/dingtalk/session/expire")
    async def expire_session(request: Request) -> dict[str, bool]:
        """End a session before its sessionWebhookExpiredTime (DingTalk may: the webhook then answers 300001).
        With `http_status` the ended webhook answers that (a 5xx) instead: whether DingTalk ever does is
        UNCONFIRMED, and it is the harsher answer (nothing in it says the webhook is gone)."""
        body = await request.json()
        info = state.sessions.get(str(body.get("session", "")))
        if info is not None:
            info["expires_at"] = 0.0
            info["expired_status"] = int(body.get("http_status", 0))
        return {"expired": info is not None}

    @router.post("/__sim__/dingtalk/tokens/revoke")
    async def revoke_tokens() -> dict[str, int]:
        """Revoke every access token issued (a secret reset, DingTalk ending tokens early): they are refused."""
        revoked = len(state.tokens)
        state.tokens.clear()
        return {"revoked": revoked}

    @router.post("/__sim__/dingtalk/staff")
    async def set_staff(request: Request) -> dict[str, Any]:
        """Mark a userId `invalid` (left the organisation) or `filtered` for batchSend; `""` makes it valid."""
        body = await request.json()
        status = str(body.get("status", ""))
        if status not in ("", "invalid", "filtered"):
            return {"error": "status is invalid, filtered or empty"}
        if status:
            state.staff_status[str(body["user"])] = status
        else:
            state.staff_status.pop(str(body["user"]), None)
        return {"user": body["user"], "status": status, "not_delivered": state.not_delivered}

    @router.get("/__sim__/dingtalk/session-posts")
    async def session_posts(session: str) -> dict[str, int]:
        """How often a session's webhook was posted to, and how often it refused (expired)."""
        posts, refused = state.session_posts.get(session, [0, 0])
        return {"posts": posts, "refused": refused}

    @router.post("/__sim__/dingtalk/throttle")
    async def set_throttle(request: Request) -> dict[str, float]:
        """How long a throttled conversation stays throttled (DingTalk: 10 minutes; tests shorten it)."""
        state.throttle_s = float((await request.json()).get("throttle_s", THROTTLE_S))
        return {"throttle_s": state.throttle_s, "throttled": state.throttled, "not_delivered": state.not_delivered}

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
    Every `system_ping_s`, ping every live connection with a SYSTEM frame."""
    last_ping = time.monotonic()
    while True:
        await asyncio.sleep(0.05)
        now = time.time()
        for frame in list(state.pending.values()):
            if frame.sent_at:
                continue  # fire and forget: an unacked robot message is not resent
            sockets = state.connections.get(frame.client_id) or []
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
