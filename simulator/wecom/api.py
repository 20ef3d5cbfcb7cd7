"""A local stand-in for WeCom's server API (qyapi): gettoken and message/send (text, markdown, template cards).

It answers like WeCom (errcodes, token expiry, the 2048-byte cut, enable_duplicate_check, the
per-member allowance of 30 messages a minute and 1,000 an hour, past which WeCom drops what an
app sends), records every message it "delivers", and takes faults on demand (simulator/faults.py), so that
tests, benchmarks and the local playground can drive every path of a real deployment.
Control endpoints live under /__sim__/wecom/ (simulator/wecom/control.py).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from simulator.wecom.cards import APP_LIMITS, REFUSED, ShownCard, card_problem
from simulator.wecom.media import app_media_router
from simulator.wecom.state import Delivered, WeComApiState

TEXT_CUT_BYTES = 2048
# message/send markdown.content: "不能超过2048个字节" (doc 90236, platform-protocols.md §C). What WeCom does with
# more is UNCONFIRMED: refused here (40058, the length errcode the group robot answers), the harsher reading.
MARKDOWN_MAX_BYTES = 2048
TOKEN_LIFETIME_S = 7200
# 发送应用消息: one app may send one member at most 30 messages a minute and 1,000 an hour; "超过部分会被丢弃不下发".
# Whether the dropped send is answered with an errcode is UNCONFIRMED: the harsher reading is played, errcode 0
# and a msgid as for a delivered message, so that only a sender that never goes past the allowance loses nothing.
# (The per-app daily quota, 账号上限数×200 人次/天, is not played: no test comes near it.)
MEMBER_ALLOWANCES = ((60.0, 30), (3600.0, 1000))
RESPONSE_CODE_LIFETIME_S = 72 * 3600  # doc 94888: "只能在72小时内调用"
MSGTYPES = ("text", "markdown", "template_card")  # what message/send plays (template cards: simulator/wecom/cards.py)


def _error(errcode: int, errmsg: str) -> JSONResponse:
    return JSONResponse({"errcode": errcode, "errmsg": errmsg})


_UNREADABLE = object()  # a message/send body that is not JSON
# A body that is not JSON: 47001 "data format error" is the WeChat family's global return code for it (WeChat's
# Global_Return_Code page; WeChat's developer forum answers it for form-encoded bodies). That WeCom's message/send
# answers the same is UNCONFIRMED; botgw sends only JSON it built and depends on no code for this, so any errcode
# would do: the refusal is what is played.
DATA_FORMAT_ERROR = (47001, "data format error")


def wecom_api_router(state: WeComApiState) -> APIRouter:
    """WeCom's API routes over the shared state (the control routes: simulator/wecom/control.py; media/get:
    simulator/wecom/media.py)."""
    router = APIRouter()
    router.include_router(app_media_router(state))

    @router.get("/cgi-bin/gettoken")
    async def gettoken(corpid: str = "", corpsecret: str = "") -> JSONResponse:
        state.gettoken_calls += 1
        fault = state.faults.take("gettoken")
        if fault and fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault and fault.errcode is not None:
            return _error(fault.errcode, fault.errmsg or "simulated")
        if (corpid, corpsecret) not in state.apps:
            return _error(40001, "invalid credential")
        token = secrets.token_urlsafe(48)
        state.tokens[token] = time.time() + TOKEN_LIFETIME_S
        state.token_apps[token] = (corpid, corpsecret)  # an access_token is one app's (gettoken is per secret)
        return JSONResponse({"errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": TOKEN_LIFETIME_S})

    @router.post("/cgi-bin/message/send")
    async def message_send(request: Request, access_token: str = "") -> JSONResponse:
        state.send_calls += 1
        # Read once, before the faults: a fault aimed at a member (`touser`) meets only the sends to them. What does
        # not parse is refused below, after the faults and the token, as before.
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            body = _UNREADABLE
        touser = str(body["touser"]) if isinstance(body, dict) and "touser" in body else None
        state.send_calls_to[touser or ""] += 1
        fault = state.faults.take("send", touser)
        if fault and fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault and fault.hold:
            state.held += 1
            await state.release.wait()
            state.held -= 1
        elif fault and fault.http_status:
            return JSONResponse({"error": "simulated"}, status_code=fault.http_status)
        elif fault and fault.errcode is not None:
            if fault.errcode in (40014, 42001):
                state.tokens.pop(access_token, None)
            return _error(fault.errcode, fault.errmsg or "simulated")
        refused = state.token_refusal(access_token)
        if refused:
            return _error(*refused)
        if body is _UNREADABLE:
            return _error(*DATA_FORMAT_ERROR)
        msgtype = body.get("msgtype")
        if msgtype not in MSGTYPES or not body.get("touser") or not isinstance(body.get(msgtype), dict):
            return _error(40008, "invalid message type")
        owner = state.agents.get(int(body.get("agentid") or 0))
        if owner is not None and state.token_apps.get(access_token) != owner:
            # Another app's token: UNCONFIRMED which errcode WeCom gives; refused as an invalid token (the harsher
            # reading: nothing is delivered, and a client that mixes up its apps' tokens keeps failing).
            return _error(40014, "invalid access_token for this agentid")
        listed = str(body["touser"]).split("|")
        invalid = [user for user in listed if user in state.unknown_users]
        if invalid:
            # Doc 90236 (message/send): some recipients invalid, the send goes on and answers them in invaliduser;
            # all of them ("全部接收人无权限或不存在"), the call fails with errcode 81013. botgw sends to one member,
            # so a non-member is 81013; the partial answer is played for a list, delivering nothing here either.
            code, message = (81013, "user & party & tag all invalid") if len(invalid) == len(listed) else (0, "ok")
            return JSONResponse({"errcode": code, "errmsg": message, "invaliduser": "|".join(invalid), "msgid": ""})
        if msgtype == "template_card":
            return _send_card(state, body)
        content = str(body[msgtype].get("content", ""))
        encoded = content.encode("utf-8")
        if msgtype == "markdown" and len(encoded) > MARKDOWN_MAX_BYTES:
            return _error(40058, f"markdown.content exceed max length {MARKDOWN_MAX_BYTES}")
        truncated = len(encoded) > TEXT_CUT_BYTES
        if truncated:
            content = encoded[:TEXT_CUT_BYTES].decode("utf-8", errors="ignore")
        if body.get("enable_duplicate_check"):
            # The option and its interval (default 1800 s, at most 4 h) are doc 90236's; the answer to a repeat (errcode
            # 0 with the earlier msgid, nothing delivered) and what counts as the same message are UNCONFIRMED.
            window = float(body.get("duplicate_check_interval", 1800))
            if not 0 < window <= 14400:
                return _error(40058, "invalid duplicate_check_interval")  # UNCONFIRMED code; refused, not clamped
            for earlier in state.delivered:
                same = earlier.touser == body["touser"] and earlier.content == content and earlier.msgtype == msgtype
                if same and earlier.agentid == body.get("agentid") and time.time() - earlier.at < window:
                    state.duplicates_dropped += 1
                    return JSONResponse({"errcode": 0, "errmsg": "ok", "msgid": earlier.msgid})
        msgid = secrets.token_hex(12)
        now = time.time()
        agentid, member = int(body.get("agentid", 0)), str(body["touser"])  # botgw sends to one member at a time
        if over_allowance(state, agentid, member, now):
            return JSONResponse({"errcode": 0, "errmsg": "ok", "invaliduser": "", "msgid": msgid})
        state.delivered.append(
            Delivered(
                msgid, int(body.get("agentid", 0)), str(body["touser"]), content, time.time(), truncated,
                bool(body.get("enable_duplicate_check")), str(msgtype),
            )
        )
        return JSONResponse({"errcode": 0, "errmsg": "ok", "invaliduser": "", "msgid": msgid})

    @router.post("/cgi-bin/message/update_template_card")
    async def update_template_card(request: Request, access_token: str = "") -> JSONResponse:
        """Doc 94888 更新模版卡片消息, the buttons' update (更新按钮为不可点击状态): the card's buttons become one
        that cannot be tapped, named `button.replace_name`, for the `userids` listed. A response_code (from the
        card's send or from a tap's event) works once and within 72 h. UNCONFIRMED, played the harsher way: the
        errcode of an unknown, used or expired code is not documented (REFUSED, as for a refused card); an
        update to a whole new card (documented) is not played and is refused."""
        refused = state.token_refusal(access_token)
        if refused:
            return _error(*refused)
        try:
            body = await request.json()
        except ValueError:
            return _error(*DATA_FORMAT_ERROR)
        button = body.get("button") if isinstance(body, dict) else None
        name = button.get("replace_name") if isinstance(button, dict) else None
        code = body.get("response_code") if isinstance(body, dict) else None
        if not isinstance(code, str) or not isinstance(name, str) or not name.strip():
            return _error(REFUSED, "response_code and button.replace_name are required (only buttons are updated)")
        issued = state.response_codes.pop(code, None)
        if issued is None or time.time() - issued[1] > RESPONSE_CODE_LIFETIME_S:
            return _error(REFUSED, "invalid response_code")
        card, userids = issued[0], body.get("userids")
        if card is not None and isinstance(userids, list) and card.touser in userids:
            card.replaced = name
        return JSONResponse({"errcode": 0, "errmsg": "ok", "invaliduser": []})

    return router


def over_allowance(state: WeComApiState, agentid: int, member: str, now: float) -> bool:
    """The member's allowance from this app is used up: what is sent now is dropped (and counted)."""
    mine = state.sent_at(agentid, member)
    if any(sum(1 for at in mine if now - at < window_s) >= allowed for window_s, allowed in MEMBER_ALLOWANCES):
        state.dropped_over_rate += 1
        return True
    return False


def _send_card(state: WeComApiState, body: dict[str, Any]) -> JSONResponse:
    """A template card (doc 90236 模板卡片消息), taken as simulator/wecom/cards.py says; the answer carries the
    response_code message/send documents for interactive cards."""
    card = body["template_card"]
    problem = card_problem(card, APP_LIMITS)
    if problem:
        return _error(REFUSED, f"invalid template_card: {problem}")
    agentid, member, now = int(body.get("agentid") or 0), str(body["touser"]), time.time()
    answer = {"errcode": 0, "errmsg": "ok", "invaliduser": "", "msgid": secrets.token_hex(12),
              "response_code": secrets.token_urlsafe(32)}  # fmt: skip
    if (agentid, card["task_id"]) in state.task_ids:
        state.cards_dropped += 1
        return JSONResponse(answer)
    state.task_ids.add((agentid, card["task_id"]))
    shown = None
    if not over_allowance(state, agentid, member, now):
        shown = ShownCard(str(agentid), member, card, now)
        state.cards.append(shown)
    state.response_codes[answer["response_code"]] = (shown, now)
    return JSONResponse(answer)
