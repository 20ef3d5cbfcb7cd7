"""What the simulated DingTalk knows and has shown, and the refusal of a token it would not take (api.py, cards.py,
stream.py and control.py play over it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse

from simulator.faults import FaultQueue

THROTTLE_S = 600.0
BOT_TOPIC = "/v1.0/im/bot/messages/get"
CARD_CALLBACK_TOPIC = "/v1.0/card/instances/callback"


@dataclass
class PendingFrame:
    client_id: str
    message_id: str
    frame: str
    sent_at: float = 0.0
    deliveries: int = 0
    socket: Any = None  # a copy for this one connection (to_all); None: any live connection
    topic: str = BOT_TOPIC  # only a connection that subscribed to it gets the frame
    card: str = ""  # a card callback's outTrackId: the ack's `response` may update that card (cards.py)


@dataclass
class StoredMedia:
    """A picture, recording or file a simulated person sent: what its downloadCode stands for (media.py)."""

    data: bytes
    mime: str
    name: str
    robot: str  # the robotCode of the robot the message went to: only it may download (media.py)
    expires_at: float


@dataclass
class DingTalkState:
    """What the simulated DingTalk knows and has shown."""

    apps: set[tuple[str, str]] = field(default_factory=set)
    tokens: dict[str, float] = field(default_factory=dict)
    token_apps: dict[str, str] = field(default_factory=dict)  # app token -> its app's key (appKey)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    cards: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    faults: FaultQueue = field(default_factory=FaultQueue)  # endpoints: send, card.<op>
    tickets: dict[str, tuple[str, float]] = field(default_factory=dict)
    connections: dict[str, list[WebSocket]] = field(default_factory=dict)  # app -> its live connections
    # Connections sent a SYSTEM disconnect, until they are closed: out of `connections`, so that they get no push and
    # no ping (stream.py: DingTalk goes silent on them).
    draining: set[Any] = field(default_factory=set)
    acks_after_disconnect: int = 0  # acks that came in on a connection after its disconnect: not honoured
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
    card_apps: dict[str, str] = field(default_factory=dict)  # outTrackId -> the appKey whose token created it
    card_params: dict[str, dict[str, str]] = field(default_factory=dict)  # outTrackId -> its cardParamMap now
    card_taps: list[dict[str, Any]] = field(default_factory=list)  # button taps pushed as card callbacks
    ticket_topics: dict[str, set[str]] = field(default_factory=dict)  # ticket -> the CALLBACK topics it subscribed
    socket_topics: dict[Any, set[str]] = field(default_factory=dict)  # live connection -> its CALLBACK topics
    staff_status: dict[str, str] = field(default_factory=dict)  # userId -> "invalid" | "filtered" (test controls)
    not_delivered: int = 0  # batchSend recipients listed as not delivered to
    system_ping_s: float = 10.0
    pings: dict[str, str] = field(default_factory=dict)  # ping frame id -> its data, until acked
    pings_sent: int = 0
    pings_acked: int = 0
    disconnects_sent: int = 0
    media: dict[str, StoredMedia] = field(default_factory=dict)  # downloadCode -> what it stands for
    media_links: dict[str, tuple[str, float]] = field(default_factory=dict)  # downloadUrl token -> (code, expiry)
    media_downloads: int = 0  # bytes served through a downloadUrl
    # Calls an app may make of one OpenAPI a second, past which DingTalk answers Forbidden.AccessDenied.
    # QpsLimitForAppkeyAndApi: 20 on the standard plan (附录B：如何处理钉钉服务端API限流, "每个应用，调用每个接口").
    # The HTTP status is UNCONFIRMED (public reports show 403: DingTalk-Real-AI/dingtalk-openclaw-connector#410).
    # Changeable on /__sim__/dingtalk/qps.
    qps: int = 20
    qps_calls: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (appKey, path) -> last second's
    qps_refused: int = 0


def error(errcode: int, errmsg: str) -> JSONResponse:
    return JSONResponse({"errcode": errcode, "errmsg": errmsg})


TOKEN_REFUSED = {"code": "InvalidAuthentication", "message": "不合法的access_token"}


QPS_REFUSED = {"code": "Forbidden.AccessDenied.QpsLimitForAppkeyAndApi", "message": "api qps limit"}


def token_refusal(state: DingTalkState, request: Request) -> JSONResponse | None:
    """HTTP 400 InvalidAuthentication for a token DingTalk never issued, that expired or was revoked; HTTP 403
    QpsLimitForAppkeyAndApi for a call past its app's calls of that API in the last second (`DingTalkState.qps`; the
    calls let through count, UNCONFIRMED whether refused ones do)."""
    token = request.headers.get("x-acs-dingtalk-access-token", "")
    expires = state.tokens.get(token)
    if not expires or expires <= time.time():
        return JSONResponse(TOKEN_REFUSED, 400)
    api, now = (state.token_apps.get(token, ""), request.url.path), time.monotonic()
    calls = [at for at in state.qps_calls.get(api, []) if now - at < 1.0]
    if len(calls) >= state.qps:
        state.qps_calls[api] = calls
        state.qps_refused += 1
        return JSONResponse(QPS_REFUSED, 403)
    state.qps_calls[api] = [*calls, now]
    return None
