"""DingTalk's cards, for the simulator: create → deliver → update, string params, as the SDK's card calls make
them (S13 card_replier.py, card_instance.py): the AI card, and cards with buttons (`sys_full_json_obj`'s
`msgButtons`: a link button `{text, url}` of MarkdownButtonCardInstance, a callback button `{text, id, request: true}`
of CarouselCardInstance). A fault (endpoint `card.<op>`) fails a call before or after its effect
(simulator/faults.py). A card callback's ack may answer `{"response": {cardUpdateOptions, cardData}}`, which updates
the card (open-dingtalk/dingtalk-stream-sdk-go card/model.go CardResponse): `apply_callback_response`. Taps:
card_taps.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from simulator.dingtalk.state import DingTalkState, token_refusal


def cards_router(state: DingTalkState) -> APIRouter:
    router = APIRouter()

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
            if "sys_full_json_obj" in params and buttons_of(params) is None:
                return "sys_full_json_obj.msgButtons: each a {text, url} or a {text, id, request: true}"
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
        if refusal := token_refusal(state, request):
            return refusal
        body = await request.json()
        if problem := card_error(op, body):
            return JSONResponse({"code": "param.invalid", "message": problem}, 400)
        failed = None
        if fault := state.faults.take(f"card.{op}"):
            if fault.http_status is None:  # nothing to answer with: the call fails (a 500), as it always has
                raise ValueError("a DingTalk card fault without http_status")
            failed = JSONResponse({"code": "ServiceUnavailable", "message": "simulated"}, fault.http_status)
            if not fault.deliver:  # `after` on the control route
                return failed
        track = body.get("outTrackId", "")
        params = (body.get("cardData") or {}).get("cardParamMap") or {}
        event = {"op": op, "at": time.time(), "flowStatus": params.get("flowStatus"),
                 "content": body.get("content", params.get("msgContent")), "finalize": body.get("isFinalize")}
        if op == "deliver":
            event["openSpaceId"] = body.get("openSpaceId")
            state.delivered_cards.add(track)
        if op == "create":
            event |= {"template": body["cardTemplateId"], "params": dict(params)}
            token = request.headers.get("x-acs-dingtalk-access-token", "")
            state.card_apps[track] = state.token_apps.get(token, "")
            state.card_params[track] = dict(params)
        elif op == "status":
            state.card_params.setdefault(track, {}).update(params)
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

    return router


def buttons_of(params: dict[str, str]) -> list[dict[str, Any]] | None:
    """The buttons a card shows (`sys_full_json_obj`'s msgButtons); [] for none; None when malformed."""
    raw = params.get("sys_full_json_obj")
    if raw is None:
        return []
    try:
        shown = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    buttons = shown.get("msgButtons", []) if isinstance(shown, dict) else None
    if not isinstance(buttons, list):
        return None
    for button in buttons:
        if not isinstance(button, dict) or not isinstance(button.get("text"), str) or not button["text"]:
            return None
        links = isinstance(button.get("url"), str) and bool(button["url"])
        calls_back = isinstance(button.get("id"), str) and bool(button["id"]) and button.get("request") is True
        if not (links or calls_back):
            return None
    return buttons


def apply_callback_response(state: DingTalkState, track: str, ack_data: Any) -> None:
    """A card callback's ack: its `response` (card/model.go CardResponse) updates the card. With
    cardUpdateOptions.updateCardDataByKey only the keys given change; without it the card's data is replaced
    (what DingTalk does then is UNCONFIRMED: replacing is the harsher reading). Anything unreadable changes nothing."""
    try:
        data = json.loads(ack_data) if isinstance(ack_data, str) else ack_data
    except ValueError:
        return
    response = data.get("response") if isinstance(data, dict) else None
    card_data = response.get("cardData") if isinstance(response, dict) else None
    params = card_data.get("cardParamMap") if isinstance(card_data, dict) else None
    if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
        return
    options = response.get("cardUpdateOptions") if isinstance(response, dict) else None
    by_key = isinstance(options, dict) and options.get("updateCardDataByKey") is True
    state.card_params[track] = {**state.card_params.get(track, {}), **params} if by_key else dict(params)
    state.cards.setdefault(track, []).append({"op": "callback-update", "at": time.time(), "params": dict(params)})
