"""The simulator's control routes for template cards: what each person was shown, and a tap on one of its buttons
(answered with the event WeCom would send; simulator/wecom/cards.py says what is played and why)."""

from __future__ import annotations

import secrets
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from simulator.wecom.cards import ShownCard, aibot_tap_event, app_tap_event, find_card
from simulator.wecom.robots import RESPONSE_URL_LIFETIME_S, RobotState
from simulator.wecom.state import WeComApiState


class Tap(BaseModel):
    """A person taps a button (its key) of a card they were shown."""

    user: str = Field(min_length=1)
    key: str = Field(min_length=1)
    agentid: int | None = None  # the app whose card it is (any of them when omitted)


class ChatOfUrl(BaseModel):
    """Which chat a response_url was issued in: WeCom knows it, the simulator is told."""

    response_url: str = Field(min_length=1)
    user: str = Field(min_length=1)
    chattype: str = Field(pattern="^(single|group)$")


def _shown(cards: list[ShownCard], touser: str) -> list[dict[str, Any]]:
    return [vars(card) for card in cards if not touser or card.touser == touser]


def _tapped(card: ShownCard | None, tap: Tap) -> ShownCard:
    """The card tapped, the tap recorded; 409 for a button of no card the person was shown."""
    if card is None:
        raise HTTPException(409, f"{tap.user} was shown no card with a button {tap.key!r}: WeCom sends no event")
    if card.replaced:  # update_template_card left one button that cannot be tapped (doc 94888)
        raise HTTPException(409, f"the card's buttons were replaced by {card.replaced!r}: nothing can be tapped")
    card.taps.append(tap.key)
    return card


def app_card_routes(state: WeComApiState) -> APIRouter:
    router = APIRouter()

    @router.get("/__sim__/wecom/cards")
    async def cards(touser: str = "") -> list[dict[str, Any]]:
        return _shown(state.cards, touser)

    @router.post("/__sim__/wecom/tap")
    async def tap(tap: Tap) -> dict[str, Any]:
        """The app's event for the tap (doc 90240 fields), to be signed with the app's secrets and posted."""
        owner = "" if tap.agentid is None else str(tap.agentid)
        card = _tapped(find_card(state.cards, tap.user, tap.key, owner), tap)
        event = app_tap_event(card, tap.key, int(card.owner))
        state.response_codes[event["ResponseCode"]] = (card, time.time())
        return {"event": event}

    return router


def aibot_card_routes(state: RobotState) -> APIRouter:
    router = APIRouter()

    @router.post("/__sim__/wecom-ai/response-url/chat")
    async def chat_of_url(chat: ChatOfUrl) -> dict[str, str]:
        """Say which chat a response_url was issued in (the person's side does, with each message)."""
        token = chat.response_url.rstrip("/").rsplit("/", 1)[-1]
        if token not in state.response_urls_issued:
            raise HTTPException(404, "no such response_url")
        state.response_url_chats[token] = (chat.user, chat.chattype)
        return {"status": "ok"}

    @router.get("/__sim__/wecom-ai/cards")
    async def cards(touser: str = "") -> list[dict[str, Any]]:
        return _shown(state.cards, touser)

    @router.post("/__sim__/wecom-ai/tap")
    async def tap(tap: Tap, request: Request) -> dict[str, Any]:
        """The AI bot's event for the tap (doc 100719), with a fresh response_url of the same one-to-one chat."""
        card = _tapped(find_card(state.cards, tap.user, tap.key), tap)
        token = secrets.token_hex(12)
        state.response_urls_issued[token] = time.time() + RESPONSE_URL_LIFETIME_S
        state.response_url_chats[token] = (card.touser, "single")
        response_url = f"{request.base_url}__sim__/wecom-ai/response/{token}"
        return {"event": aibot_tap_event(card, tap.key, response_url)}

    return router
