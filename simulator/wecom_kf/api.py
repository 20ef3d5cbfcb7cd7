"""A local stand-in for WeCom's 微信客服 (Kefu) API, and the signed callback that tells a bot to pull.

What it plays (reference: /work/shared/reference/wecom-kf.md, cited below as [ref §n]):
- kf/sync_msg: each account's message log (origin 3 customer, 4 event, 5 human agent; never what the API sent),
  paged by an opaque next_cursor with has_more; the callback Token is valid 10 minutes.
- kf/send_msg and kf/send_msg_on_event: the session-state rule (0 or 1 only, else 95018), the 5-messages-per-48-h
  quota renewed by the customer's next message, msgid rules, welcome_code/msg_code used once within 20 s.
- kf/service_state/get and kf/service_state/trans: the state machine, with the msg_code trans hands out.
- kf/account/list.
- a customer's photo, voice and file: sync_msg names them by media_id, WeCom's media/get serves them (media.py).
It records every message it "delivers", takes faults on demand (simulator/faults.py), and the tests drive the
customer, the human agents and the platform's events through control routes under /__sim__/kf/
(simulator/wecom_kf/control.py). Started with `--state FILE` (the playground), it
keeps what the real platform never forgets (logs, cursors, sessions) across restarts (simulator/state_file.py);
a cursor it never issued is refused either way. Errcodes, limits and states, with their sources: rules.py.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from simulator.wecom.state import WeComApiState
from simulator.wecom_kf.checks import KfCalls
from simulator.wecom_kf.media import kf_media_router
from simulator.wecom_kf.rules import (
    ACCOUNT_LIST_MAX,
    ALLOWED_MOVES,
    CURSOR_MAX_BYTES,
    ENDED,
    ERR_BAD_TRANSITION,
    ERR_FREQ,
    ERR_INVALID_PARAM,
    ERR_NOT_SERVICER,
    ERR_QUOTA,
    ERR_SESSION_ENDED,
    ERR_SESSION_STATE,
    ERR_SYNC_TOKEN,
    ERR_WINDOW,
    HUMAN,
    MSG_CODE_TTL_S,
    POOL,
    QUOTA_WINDOW_S,
    SEND_QUOTA,
    SENDABLE_STATES,
    SYNC_LIMIT_MAX,
    SYNC_TOKEN_MAX_BYTES,
    UNTOKENED_SYNC_ALLOWANCE,
)
from simulator.wecom_kf.state import KfState


def kf_router(state: KfState, wecom: WeComApiState) -> APIRouter:
    """Kefu's API routes (tokens from the shared WeCom token table; the checks: checks.py; the control routes:
    control.py)."""
    router = APIRouter()
    calls = KfCalls(state, wecom)
    refuse, before, after_delivery, json_body = calls.refuse, calls.before, calls.after_delivery, calls.json_body
    check_account, check_text, check_msgid = calls.check_account, calls.check_text, calls.check_msgid
    deliver = calls.deliver
    # A customer's media goes into WeCom's one media table, which media/get serves (simulator/wecom_kf/media.py).
    router.include_router(kf_media_router(wecom))

    # ---- the platform's routes -------------------------------------------------------------------------------

    @router.post("/cgi-bin/kf/sync_msg")
    async def sync_msg(request: Request, access_token: str = "") -> JSONResponse:
        fault, refused = await before("sync_msg", access_token)
        if refused:
            return refused
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        open_kfid = body.get("open_kfid") or ""
        if open_kfid and (refused := check_account(open_kfid)):
            return refused
        now = time.time()
        token = body.get("token") or ""
        if token:
            issued = state.sync_tokens.get(token) if isinstance(token, str) else None
            if len(str(token).encode()) > SYNC_TOKEN_MAX_BYTES or issued is None or issued[1] < now:
                return refuse(ERR_SYNC_TOKEN, "invalid msg token")
            if open_kfid and issued[0] != open_kfid:  # UNCONFIRMED: a Token pulls the account it was issued for
                return refuse(ERR_SYNC_TOKEN, "invalid msg token")
        else:
            state.count("sync_msg_without_token")
            window_s, allowed = UNTOKENED_SYNC_ALLOWANCE
            state.untokened_calls[:] = [at for at in state.untokened_calls if now - at < window_s]
            if len(state.untokened_calls) >= allowed:
                return refuse(ERR_FREQ, "api freq out of limit")
            state.untokened_calls.append(now)
        limit = body.get("limit", SYNC_LIMIT_MAX)
        if limit in (None, 0):
            limit = SYNC_LIMIT_MAX
        # UNCONFIRMED: a limit out of [1, 1000] is refused rather than clamped.
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= SYNC_LIMIT_MAX:
            return refuse(ERR_INVALID_PARAM, "invalid limit")
        if (body.get("voice_format") or 0) not in (0, 1):
            return refuse(ERR_INVALID_PARAM, "invalid voice_format")
        cursor = body.get("cursor") or ""
        position = 0
        if cursor:
            # UNCONFIRMED: an unknown cursor, or one from another account's pull, is refused rather than read as
            # "from the beginning" (a puller that loses its cursor must notice).
            known = state.cursors.get(cursor) if isinstance(cursor, str) else None
            if len(str(cursor).encode()) > CURSOR_MAX_BYTES or known is None or known[0] != open_kfid:
                return refuse(ERR_INVALID_PARAM, "invalid cursor")
            position = known[1]
        source = state.by_account.get(open_kfid, []) if open_kfid else [item for _, item in state.log]
        take = limit
        if fault and fault.empty_page:
            take = 0
        elif fault and fault.max_items is not None:
            take = min(take, fault.max_items)
        page = source[position : position + take]
        end = position + len(page)
        has_more = end < len(source) or bool(fault and (fault.empty_page or fault.max_items is not None))
        return JSONResponse(
            {
                "errcode": 0,
                "errmsg": "ok",
                "next_cursor": state.new_cursor(open_kfid, end),
                "has_more": int(has_more),
                "msg_list": page,
            }
        )

    @router.post("/cgi-bin/kf/send_msg")
    async def send_msg(request: Request, access_token: str = "") -> JSONResponse:
        fault, refused = await before("send_msg", access_token)
        if refused:
            return refused
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        open_kfid, user = body.get("open_kfid"), body.get("touser")
        if refused := check_account(open_kfid):
            return refused
        if not isinstance(user, str) or not user:
            return refuse(ERR_INVALID_PARAM, "invalid touser")
        content, refused = check_text(body)
        if refused:
            return refused
        msgid, refused = check_msgid(open_kfid, body)
        if refused:
            return refused
        now = time.time()
        sess = state.session(open_kfid, user, now)
        if sess.state == ENDED and sess.lapsed:
            return refuse(ERR_WINDOW, "send msg out of 48 hours")
        # (The quota's own 48 h, from the customer's last message, never outlasts the session's, from its first:
        # a session past them has lapsed, answered 95002 just above.)
        if sess.state not in SENDABLE_STATES:
            return refuse(ERR_SESSION_STATE, "send msg session status invalid")
        if sess.sent_since_customer >= SEND_QUOTA:
            return refuse(ERR_QUOTA, "send msg count exceed limit")
        deliver(sess, open_kfid, user, msgid, content, "send_msg", "")
        return after_delivery(fault, {"errcode": 0, "errmsg": "ok", "msgid": msgid})

    @router.post("/cgi-bin/kf/send_msg_on_event")
    async def send_msg_on_event(request: Request, access_token: str = "") -> JSONResponse:
        fault, refused = await before("send_msg_on_event", access_token)
        if refused:
            return refused
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        code = body.get("code")
        issued = state.codes.get(code) if isinstance(code, str) else None
        now = time.time()
        if issued is None or issued.used or issued.expires_at < now:
            return refuse(ERR_INVALID_PARAM, "invalid code")
        # Once: the code is spent by this call even if the rest of it is refused (UNCONFIRMED; harsher).
        issued.used = True
        content, refused = check_text(body)
        if refused:
            return refused
        msgid, refused = check_msgid(issued.open_kfid, body)
        if refused:
            return refused
        sess = state.session(issued.open_kfid, issued.external_userid, now)
        if now - sess.last_customer_at > QUOTA_WINDOW_S:
            sess.sent_since_customer = 0  # a welcome to a customer back after days: no window is running
        # Whether event replies count toward the 5-message quota is UNCONFIRMED; played: they do.
        if sess.sent_since_customer >= SEND_QUOTA:
            return refuse(ERR_QUOTA, "send msg count exceed limit")
        deliver(sess, issued.open_kfid, issued.external_userid, msgid, content, "send_msg_on_event", code)
        return after_delivery(fault, {"errcode": 0, "errmsg": "ok", "msgid": msgid})

    @router.post("/cgi-bin/kf/service_state/get")
    async def service_state_get(request: Request, access_token: str = "") -> JSONResponse:
        _, refused = await before("service_state_get", access_token)
        if refused:
            return refused
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        open_kfid, user = body.get("open_kfid"), body.get("external_userid")
        if refused := check_account(open_kfid):
            return refused
        if not isinstance(user, str) or not user:
            return refuse(ERR_INVALID_PARAM, "invalid external_userid")
        sess = state.session(open_kfid, user, time.time())
        # The field is servicer_userid as in WeCom's page (silenceper/wechat's struct tags it "service_userid").
        return JSONResponse(
            {"errcode": 0, "errmsg": "ok", "service_state": sess.state, "servicer_userid": sess.servicer_userid}
        )

    @router.post("/cgi-bin/kf/service_state/trans")
    async def service_state_trans(request: Request, access_token: str = "") -> JSONResponse:
        _, refused = await before("service_state_trans", access_token)
        if refused:
            return refused
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        open_kfid, user, target = body.get("open_kfid"), body.get("external_userid"), body.get("service_state")
        if refused := check_account(open_kfid):
            return refused
        if not isinstance(user, str) or not user:
            return refuse(ERR_INVALID_PARAM, "invalid external_userid")
        if not isinstance(target, int) or isinstance(target, bool) or target not in ALLOWED_MOVES:
            return refuse(ERR_INVALID_PARAM, "invalid service_state")
        now = time.time()
        sess = state.session(open_kfid, user, now)
        if sess.state == ENDED:
            return refuse(ERR_SESSION_ENDED, "session already ended")
        if target not in ALLOWED_MOVES[sess.state]:
            return refuse(ERR_BAD_TRANSITION, f"service state {sess.state} cannot change to {target}")
        servicer = body.get("servicer_userid") or ""
        if target == HUMAN and not (isinstance(servicer, str) and servicer):
            return refuse(ERR_NOT_SERVICER, "invalid servicer_userid")
        if target == HUMAN and servicer in state.off_duty:  # not on duty or not activated (wecom-kf.md, trans)
            return refuse(ERR_NOT_SERVICER, "servicer is not on duty")
        sess.state = target
        sess.servicer_userid = servicer if target == HUMAN else ""
        answer: dict[str, Any] = {"errcode": 0, "errmsg": "ok"}
        # "将会话初次变更为service_state为2和3时，返回回复语code，service_state为4时，返回结束语code" (servicestate.go)
        if target in (POOL, HUMAN) and not sess.first_queue_code_given:
            sess.first_queue_code_given = True
            answer["msg_code"] = state.new_code("msg", open_kfid, user, MSG_CODE_TTL_S)
        elif target == ENDED:
            answer["msg_code"] = state.new_code("msg", open_kfid, user, MSG_CODE_TTL_S)
        return JSONResponse(answer)

    @router.post("/cgi-bin/kf/account/list")
    async def account_list(request: Request, access_token: str = "") -> JSONResponse:
        _, refused = await before("account_list", access_token)
        if refused:
            return refused
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        offset, limit = body.get("offset", 0), body.get("limit", ACCOUNT_LIST_MAX)
        valid = all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, limit))
        if not valid or offset < 0 or not 1 <= limit <= ACCOUNT_LIST_MAX:
            return refuse(ERR_INVALID_PARAM, "invalid offset or limit")
        # All accounts of the simulator: it cannot tell one corp's token from another's.
        listed = list(state.accounts.values())[offset : offset + limit]
        return JSONResponse(
            {
                "errcode": 0,
                "errmsg": "ok",
                "account_list": [
                    {"open_kfid": a.open_kfid, "name": a.name, "avatar": a.avatar, "manage_privilege": True}
                    for a in listed
                ],
            }
        )

    return router
