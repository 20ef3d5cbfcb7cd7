"""DingTalk's OpenAPI (token, robot messages) and sessionWebhooks, for the simulator.

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
Every message sent is recorded with its `format` (text or markdown), its `content` (text.content, markdown.text,
or msgParam's content / text) and, for markdown, its `title` (required, non-empty: S13 reply_markdown, S14's
markdown type; no length is documented, UNCONFIRMED, so none is checked).
(AI cards: cards.py; downloads of what a person sent: media.py; the Stream gateway: stream.py; the control routes
under /__sim__/dingtalk/: control.py.)
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from simulator.dingtalk.media import media_router
from simulator.dingtalk.state import DingTalkState, error, token_refusal

TOKEN_LIFETIME_S = 7200
SEND_PER_MINUTE = 20
SESSION_MSGTYPES = {"text", "markdown", "actionCard", "link", "feedCard"}
OPENAPI_MSG_KEYS = {"sampleText": ("content",), "sampleMarkdown": ("title", "text")}
BAD_PARAM = 40035  # DingTalk's "不合法的参数"; the exact code for each malformed field is UNCONFIRMED


def dingtalk_api_router(state: DingTalkState) -> APIRouter:
    router = APIRouter()
    router.include_router(media_router(state))

    async def refuse_send(request: Request, *, needs_token: bool) -> JSONResponse | None:
        """The answer DingTalk gives instead of sending: no valid token, or an injected fault: an errcode (130101…),
        `http_status` (a 5xx), or `delay_s` (slow: the send waits that long, then succeeds unless the fault also
        names an errcode or a status)."""
        if needs_token and (refusal := token_refusal(state, request)):
            return refusal
        fault = state.faults.take("send")
        if fault:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.http_status:
                body = {"code": "ServiceUnavailable", "message": "simulated" if fault.errmsg is None else fault.errmsg}
                return JSONResponse(body, fault.http_status)
            if fault.delay_s and fault.errcode is None:
                return None
            if fault.errcode is None:  # nothing to answer with: the call fails (a 500), as it always has
                raise ValueError("a DingTalk send fault without errcode, http_status or delay_s")
            return error(fault.errcode, "send too fast" if fault.errmsg is None else fault.errmsg)
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
        """130101 while the conversation is throttled (sessionWebhook, group messages). The code is the custom
        robot's as seen in public ({"errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"},
        blog.csdn.net/jialiuyang/article/details/118615052); that the v1.0 OpenAPI sends answer a throttle in the
        same errcode shape (under HTTP 200) is UNCONFIRMED: they also meet the documented per-API QPS limit
        (state.py)."""
        return error(130101, "send too fast") if over_rate(conversation) else None

    def record(**fields: Any) -> None:
        now = time.time()
        state.messages.append({**fields, "at": now})
        key = ("group", fields["conversation"]) if fields["group"] else ("user", fields["user"])
        state.sends.setdefault(key, []).append(now)

    def session_bodyerror(body: Any) -> JSONResponse | None:
        """What sessionWebhook refuses: an unknown msgtype, or its content missing (S13 reply_text/markdown)."""
        if not isinstance(body, dict) or body.get("msgtype") not in SESSION_MSGTYPES:
            return error(BAD_PARAM, "invalid msgtype")
        part = body.get(body["msgtype"])
        if body["msgtype"] == "text" and not (isinstance(part, dict) and isinstance(part.get("content"), str)
                                              and part["content"]):
            return error(BAD_PARAM, "text.content missing")
        if body["msgtype"] == "markdown" and not (isinstance(part, dict) and isinstance(part.get("title"), str)
                                                  and isinstance(part.get("text"), str)
                                                  and part["title"].strip() and part["text"]):
            return error(BAD_PARAM, "markdown needs title and text")
        at = body.get("at")
        if at is not None and not (isinstance(at, dict) and isinstance(at.get("atUserIds", []), list)):
            return error(BAD_PARAM, "at.atUserIds must be a list")
        return None

    def openapierror(body: Any, *fields: str) -> JSONResponse | None:
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
        if any(not isinstance(params[name], str) or not params[name].strip() for name in wanted):
            return JSONResponse({"code": "invalidParameter.msgParam", "message": "msgParam fields"}, 400)
        return None

    @router.post("/v1.0/oauth2/accessToken")
    async def access_token(request: Request) -> JSONResponse:
        body = await request.json()
        if (body.get("appKey"), body.get("appSecret")) not in state.apps:
            # UNCONFIRMED: no error of this endpoint is in the reference. Public evidence points to HTTP 400
            # {"code": "invalidClientIdOrSecret", "message": "无效的clientId或者clientSecret"}: the error table of its
            # sibling /v1.0/oauth2/ssoAccessToken in DingTalk's docs, and clients of this one that test for that code.
            # InvalidAuthentication (the code of a refused token, state.py) is kept until a source says otherwise:
            # botgw takes any non-200 from here as a refusal whatever its code (bots/dingtalk/client.py), so neither
            # answer is kinder to it.
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
            # 300001 is in no DingTalk doc (UNCONFIRMED); it is what an ended sessionWebhook answers in public logs:
            # {"errcode":300001,"errmsg":"session 不存在"} (agentscope-ai/agentscope#1318, agentscope-ai/QwenPaw#2221),
            # its HTTP status not shown there (200 played, UNCONFIRMED). Played because it is the
            # only answer seen; the harsher one, a 5xx that says nothing, is control.py's session/expire http_status.
            return error(300001, "session 不存在")
        if refusal := await refuse_send(request, needs_token=False):
            return refusal
        body = await request.json()
        if refusal := session_bodyerror(body):
            return refusal
        key = ("group", info["conversation"]) if info["group"] else ("user", info["user"])
        if refusal := throttle(key):
            return refusal
        shown = shown_session(body)
        record(
            via="session", conversation=info["conversation"], user=info["user"], group=info["group"], **shown,
            at_user_ids=(body.get("at") or {}).get("atUserIds", []),
        )
        return error(0, "ok")

    @router.post("/v1.0/robot/groupMessages/send")
    async def group_send(request: Request) -> JSONResponse:
        if refusal := await refuse_send(request, needs_token=True):
            return refusal
        body = await request.json()
        if refusal := openapierror(body, "openConversationId") or throttle(("group", body["openConversationId"])):
            return refusal
        shown = shown_openapi(body)
        record(via="openapi", conversation=body["openConversationId"], user="", group=True, **shown, at_user_ids=[])
        return JSONResponse({"processQueryKey": secrets.token_hex(8)})

    @router.post("/v1.0/robot/oToMessages/batchSend")
    async def single_send(request: Request) -> JSONResponse:
        if refusal := await refuse_send(request, needs_token=True):
            return refusal
        body = await request.json()
        if refusal := openapierror(body, "userIds"):
            return refusal
        if not isinstance(body["userIds"], list) or not all(isinstance(u, str) and u for u in body["userIds"]):
            return JSONResponse({"code": "invalidParameter.userIds", "message": "userIds"}, 400)
        shown = shown_openapi(body)
        lists: dict[str, list[str]] = {"flowControlledStaffIdList": [], "invalidStaffIdList": [],
                                       "filteredStaffIdList": []}  # fmt: skip
        for user in body["userIds"]:
            status = state.staff_status.get(user, "")
            if status:
                lists[f"{status}StaffIdList"].append(user)
            elif over_rate(("user", user)):
                lists["flowControlledStaffIdList"].append(user)
            else:
                record(via="openapi", conversation="", user=user, group=False, **shown, at_user_ids=[])
        state.not_delivered += sum(len(users) for users in lists.values())
        return JSONResponse({"processQueryKey": secrets.token_hex(8), **lists})

    return router


def shown_session(body: dict[str, Any]) -> dict[str, str]:
    """What a sessionWebhook message shows, as recorded: its format, text and (markdown) title."""
    if body["msgtype"] == "markdown":
        return {"format": "markdown", "content": body["markdown"]["text"], "title": body["markdown"]["title"]}
    part = body.get(body["msgtype"])
    content = part.get("content", part.get("text", "")) if isinstance(part, dict) else ""
    return {"format": "text" if body["msgtype"] == "text" else body["msgtype"], "content": str(content), "title": ""}


def shown_openapi(body: dict[str, Any]) -> dict[str, str]:
    """What an OpenAPI message (sampleText, sampleMarkdown) shows, as recorded."""
    params = json.loads(body["msgParam"])
    if body["msgKey"] == "sampleMarkdown":
        return {"format": "markdown", "content": params["text"], "title": params["title"]}
    return {"format": "text", "content": params["content"], "title": ""}
