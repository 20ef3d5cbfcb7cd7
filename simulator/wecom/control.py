"""The simulator's control routes for the WeCom app API, under /__sim__/wecom/ (and /__sim__/reset): what it
delivered, members who left, faults (simulator/faults.py), held sends, token expiry, counters; template cards
shown and taps on them (simulator/wecom/card_routes.py)."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request

from simulator.faults import faults_route
from simulator.wecom.card_routes import aibot_card_routes, app_card_routes
from simulator.wecom.media import aibot_media_router
from simulator.wecom.robots import RESPONSE_URL_LIFETIME_S, RobotState
from simulator.wecom.state import WeComApiState


def wecom_control_router(state: WeComApiState) -> APIRouter:
    router = APIRouter()
    router.include_router(app_card_routes(state))

    @router.post("/__sim__/wecom/unknown-user")
    async def unknown_user(request: Request) -> dict[str, Any]:
        """A member leaves the company (or never was one): message/send lists them as `invaliduser`."""
        state.unknown_users.add(str((await request.json()).get("userid", "")))
        return {"unknown_users": sorted(state.unknown_users)}

    @router.get("/__sim__/wecom/messages")
    async def messages(touser: str = "", since: float = 0.0) -> list[dict[str, Any]]:
        return [
            vars(item)
            for item in state.delivered
            if (not touser or item.touser == touser) and item.at >= since
        ]

    faults_route(router, "wecom", state.faults, aimed=frozenset({"send"}))

    @router.post("/__sim__/wecom/release")
    async def release() -> dict[str, int]:
        held = state.held
        state.release.set()
        state.release = asyncio.Event()
        return {"released": held}

    @router.post("/__sim__/wecom/expire-tokens")
    async def expire_tokens() -> dict[str, int]:
        for token in state.tokens:
            state.tokens[token] = 0.0
        return {"expired": len(state.tokens)}

    @router.get("/__sim__/wecom/stats")
    async def stats(touser: str = "") -> dict[str, int]:
        """Counters of the whole simulator; `send_calls_to`: the message/send calls naming `touser` (tests share
        one simulator, and a test that counts its own sends is not disturbed by another's)."""
        return {
            "send_calls_to": state.send_calls_to[touser] if touser else 0,
            "gettoken_calls": state.gettoken_calls,
            "send_calls": state.send_calls,
            "delivered": len(state.delivered),
            "cards": len(state.cards),
            "cards_dropped": state.cards_dropped,
            "duplicates_dropped": state.duplicates_dropped,
            "dropped_over_rate": state.dropped_over_rate,
            "held": state.held,
            "pending_faults": state.faults.pending,
        }

    @router.post("/__sim__/reset")
    async def reset() -> dict[str, str]:
        state.reset()
        return {"status": "reset"}

    return router


def robots_control_router(state: RobotState) -> APIRouter:
    """Group robots' and AI-bot response URLs' control routes: a fresh response_url, what was pushed and posted;
    the AI bot's encrypted media URLs (simulator/wecom/media.py)."""
    router = APIRouter()
    router.include_router(aibot_media_router(state))
    router.include_router(aibot_card_routes(state))

    @router.post("/__sim__/wecom-ai/response-url")
    async def issue_response_url(request: Request) -> dict[str, str]:
        """A fresh response_url, as WeCom puts one in each AI-bot message callback."""
        token = secrets.token_hex(12)
        body = await request.json() if await request.body() else {}
        state.response_urls_issued[token] = time.time() + float(body.get("ttl_s", RESPONSE_URL_LIFETIME_S))
        return {"response_url": f"{request.base_url}__sim__/wecom-ai/response/{token}"}

    @router.get("/__sim__/wecom/webhook")
    async def pushed(key: str = "") -> dict[str, Any]:
        return {"messages": [m for m in state.pushed if not key or m["key"] == key], "refused": state.refused}

    @router.get("/__sim__/wecom-ai/responses")
    async def responses() -> dict[str, Any]:
        return state.responses

    return router
