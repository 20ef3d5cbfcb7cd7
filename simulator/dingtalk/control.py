"""The simulator's control routes for DingTalk, under /__sim__/dingtalk/: Stream pushes and connection trouble,
sessionWebhooks, tokens, staff, the throttle, what was sent and shown, and faults (simulator/faults.py)."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import model_validator

from simulator.dingtalk.card_taps import TapRefused, push_tap
from simulator.dingtalk.media import DOWNLOAD_CODE_TTL_S, store_media
from simulator.dingtalk.state import BOT_TOPIC, THROTTLE_S, DingTalkState, PendingFrame
from simulator.dingtalk.stream import FreezableRelay, hand_over
from simulator.faults import Fault, faults_route


class DingTalkFault(Fault):
    """A DingTalk fault: the shared Fault, where `after` (the name this route has always taken, for a card call)
    means `deliver`: the call takes effect, then fails. A number of calls to let through first is not played."""

    @model_validator(mode="before")
    @classmethod
    def _after_is_deliver(cls, data: Any) -> Any:
        if isinstance(data, dict) and "after" in data:
            after = data["after"]
            data = {key: value for key, value in data.items() if key != "after"}
            data["deliver"] = bool(data.get("deliver")) or bool(after)
        return data


def dingtalk_control_router(state: DingTalkState, relay: FreezableRelay) -> APIRouter:
    router = APIRouter()

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
        """SYSTEM disconnect to every live connection: each goes silent at once (no push, no ping) and is closed
        `grace_s` later (DingTalk: 10 s; stream.py's module doc)."""
        grace_s = float((await request.json()).get("grace_s", 10.0))
        sockets = [s for group in state.connections.values() for s in group]
        for socket in sockets:
            await hand_over(state, socket, grace_s)
            state.disconnects_sent += 1
        return {"disconnected": len(sockets)}

    @router.post("/__sim__/dingtalk/stream/system-ping")
    async def set_ping(request: Request) -> dict[str, float]:
        state.system_ping_s = float((await request.json()).get("interval_s", state.system_ping_s))
        return {"interval_s": state.system_ping_s}

    @router.post("/__sim__/dingtalk/stream/drop")
    async def drop() -> dict[str, int]:
        sockets = [s for group in state.connections.values() for s in group] + list(state.draining)
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
            "draining": len(state.draining),  # told to disconnect, not yet closed: no longer in `live`
            "acks_after_disconnect": state.acks_after_disconnect,
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
        """End a session before its sessionWebhookExpiredTime (DingTalk may: the webhook then answers 300001, a code
        no DingTalk doc lists, UNCONFIRMED: the only answer to an ended session seen in public, api.py).
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

    @router.post("/__sim__/dingtalk/qps")
    async def set_qps(request: Request) -> dict[str, int]:
        """The calls an app may make of one OpenAPI a second (DingTalkState.qps); how many were refused so far."""
        body = await request.json()
        if "qps" in body:
            state.qps = max(1, int(body["qps"]))
        return {"qps": state.qps, "refused": state.qps_refused}

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

    @router.post("/__sim__/dingtalk/media")
    async def upload_media(
        request: Request, robot: str, name: str = "", mime: str = "", ttl_s: float = DOWNLOAD_CODE_TTL_S
    ) -> dict[str, Any]:
        """What a person sends (the raw body: a picture, a recording, a file) kept for `robot` (its robotCode), as
        DingTalk keeps it behind the message's downloadCode; `ttl_s`: how long that code works (media.py)."""
        data = await request.body()
        code = store_media(state, data, mime=mime, name=name, robot=robot, ttl_s=ttl_s)
        return {"downloadCode": code, "size": len(data)}

    @router.post("/__sim__/dingtalk/media/expire")
    async def expire_media(request: Request) -> dict[str, Any]:
        """End a downloadCode now (DingTalk's are temporary): messageFiles/download then refuses it."""
        stored = state.media.get(str((await request.json()).get("downloadCode", "")))
        if stored is not None:
            stored.expires_at = 0.0
        return {"expired": stored is not None, "downloads": state.media_downloads}

    @router.get("/__sim__/dingtalk/cards")
    async def cards() -> dict[str, list[dict[str, Any]]]:
        return state.cards

    @router.get("/__sim__/dingtalk/cards/shown")
    async def cards_shown(conversation: str = "", user: str = "") -> list[dict[str, Any]]:
        """The cards delivered into a group (`conversation`) or a person's chat with the robot (`user`), oldest
        first: each one's outTrackId, template and cardParamMap as it shows now."""
        space = f"dtv1.card//IM_GROUP.{conversation}" if conversation else f"dtv1.card//IM_ROBOT.{user}"
        return [
            {"track": track, "template": events[0].get("template", ""), "params": state.card_params.get(track, {})}
            for track, events in state.cards.items()
            if any(e.get("op") == "deliver" and e.get("openSpaceId") == space for e in events)
        ]

    @router.post("/__sim__/dingtalk/cards/tap", response_model=None)
    async def tap(request: Request) -> dict[str, Any] | JSONResponse:
        """`user` taps the button `button` (its id) of card `track`, in group `conversation` ('' their chat with the
        robot); `stale_view`: on the card as first delivered (card_taps.py). 409 when they could not have."""
        body = await request.json()
        try:
            message_id = push_tap(state, str(body.get("track", "")), str(body.get("user", "")),
                                  str(body.get("button", "")), conversation=str(body.get("conversation", "")),
                                  stale_view=bool(body.get("stale_view")))  # fmt: skip
        except TapRefused as exc:
            return JSONResponse({"error": str(exc)}, 409)
        return {"message_id": message_id}

    faults_route(router, "dingtalk", state.faults, DingTalkFault)

    return router
