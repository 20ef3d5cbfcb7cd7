"""WeCom's side of group robots (webhook/send) and of AI-bot response_url, for the simulator.

Group robots: WeCom accepts 20 messages a minute per robot and refuses the rest (45009);
text is capped at 2048 bytes, markdown at 4096. An AI bot's response_url takes one message
within an hour of being issued (a second post, or one after the hour, is refused; the errcodes
are UNCONFIRMED), markdown up to 20,480 bytes, or a template card in a one-to-one chat (simulator/wecom/cards.py).
Both record what a user would have seen. (The response URL itself
is the simulator's own, under /__sim__/wecom-ai/response/; the routes that issue one and read what was posted are
in simulator/wecom/control.py.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from simulator.wecom.cards import AIBOT_LIMITS, REFUSED, ShownCard, card_problem

ROBOT_PER_MINUTE = 20
CAPS = {"text": 2048, "markdown": 4096}
RESPONSE_URL_CAP = 20480
RESPONSE_URL_LIFETIME_S = 3600.0


@dataclass
class RobotState:
    """Messages pushed to group robots and posted to AI-bot response URLs."""

    pushed: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0
    expired_posts: int = 0
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    response_urls_issued: dict[str, float] = field(default_factory=dict)  # token -> expires at
    response_url_chats: dict[str, tuple[str, str]] = field(default_factory=dict)  # token -> (userid, chattype)
    cards: list[ShownCard] = field(default_factory=list)  # template cards posted to response URLs and shown
    task_ids: set[str] = field(default_factory=set)  # every card's task_id (WeCom: unique per bot)
    cards_dropped: int = 0  # cards answered ok and never shown (a reused task_id)
    media: dict[str, Any] = field(default_factory=dict)  # AI-bot media URL token -> StoredMedia (wecom/media.py)

    def reset(self) -> None:
        self.pushed.clear()
        self.responses.clear()
        self.response_urls_issued.clear()
        self.response_url_chats.clear()
        self.cards.clear()
        self.task_ids.clear()
        self.cards_dropped = 0
        self.media.clear()
        self.refused = 0


def _error(errcode: int, errmsg: str) -> JSONResponse:
    return JSONResponse({"errcode": errcode, "errmsg": errmsg})


def robots_router(state: RobotState) -> APIRouter:
    router = APIRouter()

    @router.post("/cgi-bin/webhook/send")
    async def webhook_send(request: Request, key: str = "") -> JSONResponse:
        # The limits are platform-protocols.md §D's (20 a minute per robot, the byte caps); the errcodes here (93000,
        # 40008, 40058, 45009) are UNCONFIRMED for the robot webhook: botgw reads any non-zero errcode as refused,
        # and paces itself to 20 a minute so as never to learn what WeCom does past it (drops: bots/wecom/webhook.py).
        if not key:
            return _error(93000, "invalid webhook url")
        body = await request.json()
        msgtype = body.get("msgtype")
        if msgtype not in CAPS:
            return _error(40008, "invalid message type")
        content = str((body.get(msgtype) or {}).get("content", ""))
        if len(content.encode("utf-8")) > CAPS[msgtype]:
            return _error(40058, f"content exceed max length {CAPS[msgtype]}")
        now = time.time()
        recent = [item for item in state.pushed if item["key"] == key and now - item["at"] < 60]
        if len(recent) >= ROBOT_PER_MINUTE:
            state.refused += 1
            return _error(45009, "api freq out of limit")
        state.pushed.append({"key": key, "msgtype": msgtype, "content": content, "at": now})
        return JSONResponse({"errcode": 0, "errmsg": "ok"})

    @router.post("/__sim__/wecom-ai/response/{token}")
    async def response_url(token: str, request: Request) -> JSONResponse:
        if token not in state.response_urls_issued:
            return _error(93000, "invalid response_url")
        if token in state.responses:
            return _error(60207, "response_url can only be used once")
        if state.response_urls_issued[token] < time.time():
            state.expired_posts += 1
            return _error(60207, "response_url expired")
        body = await request.json()
        if body.get("msgtype") not in ("markdown", "template_card") or not isinstance(body.get(body["msgtype"]), dict):
            return _error(40008, "invalid message type")
        if body["msgtype"] == "template_card":
            return _post_card(state, token, body["template_card"])
        content = str((body.get("markdown") or {}).get("content", ""))
        if len(content.encode("utf-8")) > RESPONSE_URL_CAP:
            return _error(40058, "content exceed max length")
        state.responses[token] = {"msgtype": body.get("msgtype"), "content": content, "at": time.time()}
        return JSONResponse({"errcode": 0, "errmsg": "ok"})

    return router


def _post_card(state: RobotState, token: str, card: dict[str, Any]) -> JSONResponse:
    """A template card posted to a response_url: only for a one-to-one chat's, checked and shown as
    simulator/wecom/cards.py says; the URL is used once it takes a card (shown, or dropped for a reused task_id)."""
    user, chattype = state.response_url_chats.get(token, ("", ""))
    if chattype != "single":
        return _error(REFUSED, "template_card only through the response_url of a one-to-one chat")
    problem = card_problem(card, AIBOT_LIMITS)
    if problem:
        return _error(REFUSED, f"invalid template_card: {problem}")
    now = time.time()
    state.responses[token] = {"msgtype": "template_card", "content": "", "template_card": card, "at": now}
    if card["task_id"] in state.task_ids:
        state.cards_dropped += 1
    else:
        state.task_ids.add(card["task_id"])
        state.cards.append(ShownCard(token, user, card, now))
    return JSONResponse({"errcode": 0, "errmsg": "ok"})
