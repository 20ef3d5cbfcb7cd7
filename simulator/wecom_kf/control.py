"""The simulator's control routes for 微信客服, under /__sim__/kf/: the customer, the human agents and the
platform's events, what customers saw, sessions, accounts, counters and faults (simulator/faults.py)."""

from __future__ import annotations

import secrets
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from simulator.faults import Fault, faults_route
from simulator.wecom_kf.rules import (
    ENDED,
    HUMAN,
    MEDIA_MSGTYPES,
    MSG_CODE_TTL_S,
    NEW,
    WELCOME_CODE_TTL_S,
    WELCOME_QUIET_S,
    Endpoint,
)
from simulator.wecom_kf.state import KfAccount, KfSession, KfState, event_item, media_item, text_item


class KfFault(Fault):
    """A Kefu fault: the shared Fault, its endpoint one of Kefu's API calls and required."""

    endpoint: Endpoint  # type: ignore[assignment]


def kf_control_router(state: KfState) -> APIRouter:
    router = APIRouter()

    def control_account(open_kfid: Any) -> JSONResponse | None:
        if open_kfid not in state.accounts:
            return JSONResponse({"error": f"no account {open_kfid!r} in the simulator"}, status_code=404)
        return None

    @router.post("/__sim__/kf/customer")
    async def customer(request: Request) -> JSONResponse:
        """The customer writes `text` (or `count` messages "text #i"); a fresh callback Token comes back. With
        `msgtype` image, voice, video or file the message is that media instead (`media_id` from /__sim__/kf/media;
        none: a media_id the platform no longer has)."""
        body = await request.json()
        open_kfid, user = body.get("open_kfid"), str(body.get("external_userid", ""))
        if (missing := control_account(open_kfid)) or not user:
            return missing or JSONResponse({"error": "external_userid is required"}, status_code=400)
        msgtype = body.get("msgtype") or "text"
        if msgtype != "text" and msgtype not in MEDIA_MSGTYPES:
            return JSONResponse({"error": f"msgtype is text or one of {', '.join(MEDIA_MSGTYPES)}"}, status_code=400)
        now = time.time()
        send_time = float(body.get("send_time") or now)
        count = body.get("count")
        texts = [str(body.get("text", ""))] if count is None else [f"{body.get('text', '')} #{i}" for i in range(count)]
        sess = state.session(open_kfid, user, now)
        if sess.state == ENDED:  # a customer message in state 4 starts a new session at 0 [ref §6]
            state.sessions[(open_kfid, user)] = sess = KfSession(
                state=NEW,
                started_at=send_time,
                last_welcome_at=sess.last_welcome_at,
                last_api_send_at=sess.last_api_send_at,
            )
            state.session(open_kfid, user, now)  # a backdated start may already be over
        sess.last_customer_at = max(sess.last_customer_at, send_time)
        sess.sent_since_customer = 0
        msgids = []
        for text in texts:
            if msgtype == "text":
                item = text_item(open_kfid, user, text, 3, send_time)
            else:  # sync_msg gives its media_id (wecom-kf.md §2 msg_list; rules.MEDIA_MSGTYPES)
                media_id = str(body.get("media_id") or "MEDIA_" + secrets.token_hex(8))
                item = media_item(open_kfid, user, msgtype, media_id, send_time)
            state.append(open_kfid, item)
            msgids.append(item["msgid"])
        return JSONResponse({"msgids": msgids, "token": state.new_sync_token(open_kfid, body.get("token_ttl_s"))})

    @router.post("/__sim__/kf/refuse")
    async def refuse_messages(request: Request) -> JSONResponse:
        """The customer refuses the account's messages: sends are accepted, then reported failed (fail_type 10)."""
        body = await request.json()
        state.refusing.add((str(body.get("open_kfid", "")), str(body.get("external_userid", ""))))
        return JSONResponse({"refusing": len(state.refusing)})

    @router.post("/__sim__/kf/servicer")
    async def servicer_duty(request: Request) -> JSONResponse:
        """A human agent goes off duty (`on_duty: false`) or comes back."""
        body = await request.json()
        userid = str(body.get("servicer_userid", ""))
        if not userid:
            return JSONResponse({"error": "servicer_userid is required"}, status_code=400)
        (state.off_duty.discard if body.get("on_duty", True) else state.off_duty.add)(userid)
        return JSONResponse({"off_duty": sorted(state.off_duty)})

    @router.post("/__sim__/kf/agent")
    async def agent(request: Request) -> JSONResponse:
        """A human agent (接待人员) writes from the WeCom client: an origin-5 item; the session is now theirs (3)."""
        body = await request.json()
        open_kfid, user = body.get("open_kfid"), str(body.get("external_userid", ""))
        servicer = str(body.get("servicer_userid", ""))
        if (missing := control_account(open_kfid)) or not user or not servicer:
            return missing or JSONResponse({"error": "external_userid, servicer_userid required"}, status_code=400)
        now = time.time()
        sess = state.session(open_kfid, user, now)
        if sess.state == ENDED:
            sess.started_at, sess.lapsed = now, False
        sess.state, sess.servicer_userid = HUMAN, servicer
        item = text_item(open_kfid, user, str(body.get("text", "")), 5, now, servicer)
        state.append(open_kfid, item)
        return JSONResponse({"msgid": item["msgid"], "token": state.new_sync_token(open_kfid, body.get("token_ttl_s"))})

    @router.post("/__sim__/kf/event")
    async def event(request: Request) -> JSONResponse:
        """A system event (origin 4). enter_session may carry a welcome_code; session_status_change moves the state
        and, for change_type 1 and 3, carries a msg_code; msg_send_fail carries fail_msgid and fail_type.
        `code_ttl_s` shortens a code's window (tests), `welcome: false` withholds the welcome_code."""
        body = await request.json()
        open_kfid, user = body.get("open_kfid"), str(body.get("external_userid", ""))
        event_type = str(body.get("event_type", ""))
        if (missing := control_account(open_kfid)) or not user or not event_type:
            return missing or JSONResponse({"error": "external_userid, event_type required"}, status_code=400)
        now = time.time()
        sess = state.session(open_kfid, user, now)
        reserved = {"open_kfid", "external_userid", "event_type", "code_ttl_s", "token_ttl_s", "welcome"}
        payload: dict[str, Any] = {"event_type": event_type, "open_kfid": open_kfid, "external_userid": user}
        payload.update({k: v for k, v in body.items() if k not in reserved})
        code = ""
        if event_type == "enter_session":
            # A welcome_code only if no welcome and no API message reached this customer in the last 48 h.
            quiet = now - max(sess.last_welcome_at, sess.last_api_send_at) > WELCOME_QUIET_S
            if quiet and body.get("welcome", True):
                code = state.new_code("welcome", open_kfid, user, float(body.get("code_ttl_s", WELCOME_CODE_TTL_S)))
                payload["welcome_code"] = code
        elif event_type == "session_status_change":
            change = int(body.get("change_type", 0))
            if change not in (1, 2, 3, 4):
                return JSONResponse({"error": "change_type must be 1, 2, 3 or 4"}, status_code=400)
            new_servicer = str(body.get("new_servicer_userid", ""))
            if change in (1, 2, 4) and not new_servicer:
                return JSONResponse({"error": "new_servicer_userid required"}, status_code=400)
            payload["change_type"] = change
            if change == 3:  # ended
                sess.state, sess.servicer_userid, sess.lapsed = ENDED, "", False
            else:  # 1 taken from the pool, 2 transferred, 4 an ended session taken up again: a human has it
                payload.setdefault("old_servicer_userid", sess.servicer_userid)
                if sess.state == ENDED:
                    sess.started_at, sess.lapsed = now, False
                sess.state, sess.servicer_userid = HUMAN, new_servicer
            # msg_code "仅change_type为1和3时" (WeCom's 接收消息和事件 page as recalled; UNCONFIRMED here).
            if change in (1, 3):
                code = state.new_code("msg", open_kfid, user, float(body.get("code_ttl_s", MSG_CODE_TTL_S)))
                payload["msg_code"] = code
        elif event_type == "msg_send_fail":
            payload.setdefault("fail_msgid", "")
            payload["fail_type"] = int(body.get("fail_type", 0))
        item = event_item(payload, now)
        state.append(open_kfid, item)
        answer = {"msgid": item["msgid"], "token": state.new_sync_token(open_kfid, body.get("token_ttl_s"))}
        return JSONResponse({**answer, "code": code} if code else answer)

    @router.get("/__sim__/kf/sent")
    async def sent(external_userid: str = "", since: float = 0.0) -> list[dict[str, Any]]:
        return [
            vars(item)
            for item in state.delivered
            if (not external_userid or item.touser == external_userid) and item.at >= since
        ]

    @router.get("/__sim__/kf/session")
    async def session(open_kfid: str, external_userid: str) -> dict[str, Any]:
        sess = state.session(open_kfid, external_userid, time.time())
        return {
            "service_state": sess.state,
            "servicer_userid": sess.servicer_userid,
            "sent_since_customer": sess.sent_since_customer,
            "last_customer_at": sess.last_customer_at,
        }

    @router.get("/__sim__/kf/pulled")
    async def pulled(msgid: str) -> JSONResponse:
        """Whether a sync_msg page has returned the log item `msgid` yet: a cursor past it was handed out."""
        for index, (kfid, item) in enumerate(state.log):
            if item.get("msgid") == msgid:
                at = next(i for i, mine in enumerate(state.by_account[kfid]) if mine is item)
                cursors = state.cursors.values()
                past = any(pos > (at if scope else index) for scope, pos in cursors if scope in ("", kfid))
                return JSONResponse({"pulled": past})
        return JSONResponse({"error": f"no log item {msgid!r}"}, status_code=404)

    @router.get("/__sim__/kf/accounts")
    async def accounts(corp_id: str = "") -> list[dict[str, str]]:
        return [vars(a) for a in state.accounts.values() if not corp_id or a.corp_id == corp_id]

    @router.post("/__sim__/kf/account")
    async def add_account(request: Request) -> dict[str, str]:
        body = await request.json()
        kfid = str(body["open_kfid"])
        corp_id, name, avatar = (
            str(body.get(key, default)) for key, default in (("corp_id", ""), ("name", kfid), ("avatar", ""))
        )
        account = KfAccount(kfid, corp_id, name, avatar)
        state.accounts[kfid] = account
        state.by_account.setdefault(kfid, [])
        return vars(account)

    @router.get("/__sim__/kf/stats")
    async def stats() -> dict[str, Any]:
        return {
            **{f"{name}_calls": count for name, count in state.calls.items()},
            "delivered": len(state.delivered),
            "log_items": len(state.log),
            "refusals": {str(code): count for code, count in sorted(state.refusals.items())},
            "pending_faults": state.faults.pending,
        }

    faults_route(router, "kf", state.faults, KfFault)

    @router.post("/__sim__/kf/reset")
    async def reset() -> dict[str, str]:
        """Kefu's state only (/__sim__/reset resets the WeCom app API's, access tokens included)."""
        state.reset()
        return {"status": "reset"}

    return router
