"""The checks every 微信客服 API call goes through, as the platform makes them (api.py's routes call them): the call
counted, an injected fault played (simulator/faults.py), the token, the body, the account, a send's text and msgid,
and a delivery recorded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from simulator.faults import Fault
from simulator.wecom.state import WeComApiState
from simulator.wecom_kf.rules import (
    ERR_BAD_JSON,
    ERR_EMPTY_CONTENT,
    ERR_INVALID_PARAM,
    ERR_MSGID_REPEATED,
    ERR_MSGTYPE,
    ERR_OPEN_KFID_INVALID,
    ERR_OPEN_KFID_UNKNOWN,
    ERR_TOKEN_EXPIRED,
    ERR_TOKEN_INVALID,
    FAIL_REFUSED,
    MSGID_MAX_BYTES,
    MSGID_PATTERN,
    TEXT_MAX_BYTES,
)
from simulator.wecom_kf.state import KfDelivered, KfSession, KfState, event_item, new_msgid


class KfCalls:
    """The checks of one simulated Kefu, over its state and the shared WeCom token table."""

    def __init__(self, state: KfState, wecom: WeComApiState) -> None:
        self.state = state
        self.wecom = wecom

    def refuse(self, errcode: int, errmsg: str) -> JSONResponse:
        self.state.refusals[errcode] = self.state.refusals.get(errcode, 0) + 1
        return JSONResponse({"errcode": errcode, "errmsg": errmsg})

    def check_token(self, access_token: str) -> JSONResponse | None:
        # Any live token of the shared table passes, an app's as well as the Kefu secret's: the simulator does not
        # know which secret issued a token (the real API refuses tokens without 微信客服 rights).
        expires_at = self.wecom.tokens.get(access_token)
        if expires_at is None:
            return self.refuse(ERR_TOKEN_INVALID, "invalid access_token")
        if expires_at < time.time():
            return self.refuse(ERR_TOKEN_EXPIRED, "access_token expired")
        return None

    async def before(self, endpoint: str, access_token: str) -> tuple[Fault | None, JSONResponse | None]:
        """Count the call, play a fault that answers early, check the token."""
        self.state.count(endpoint)
        fault = self.state.faults.take(endpoint)
        if fault and fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault and not fault.deliver:
            if fault.http_status:
                return fault, JSONResponse({"error": "simulated"}, status_code=fault.http_status)
            if fault.errcode is not None:
                if fault.errcode in (ERR_TOKEN_INVALID, ERR_TOKEN_EXPIRED):
                    self.wecom.tokens.pop(access_token, None)
                return fault, self.refuse(fault.errcode, fault.errmsg or "simulated")
        return fault, self.check_token(access_token)

    def after_delivery(self, fault: Fault | None, answer: dict[str, Any]) -> JSONResponse:
        if fault and fault.deliver and fault.http_status:
            return JSONResponse({"error": "simulated"}, status_code=fault.http_status)
        if fault and fault.deliver and fault.errcode is not None:
            return self.refuse(fault.errcode, fault.errmsg or "simulated")
        return JSONResponse(answer)

    async def json_body(self, request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return self.refuse(ERR_BAD_JSON, "data format error")
        return body if isinstance(body, dict) else self.refuse(ERR_BAD_JSON, "data format error")

    def check_account(self, open_kfid: Any) -> JSONResponse | None:
        if not isinstance(open_kfid, str) or not open_kfid:
            return self.refuse(ERR_OPEN_KFID_INVALID, "invalid open_kfid")
        if open_kfid not in self.state.accounts:
            return self.refuse(ERR_OPEN_KFID_UNKNOWN, "open_kfid not exist")
        return None

    def check_text(self, body: dict[str, Any]) -> tuple[str, JSONResponse | None]:
        """The text of a send (only text is played: the gateway sends text), or the refusal."""
        if body.get("msgtype") != "text":
            return "", self.refuse(ERR_MSGTYPE, "invalid message type")
        text = body.get("text")
        content = text.get("content") if isinstance(text, dict) else None
        if not isinstance(content, str) or not content:
            return "", self.refuse(ERR_EMPTY_CONTENT, "empty content")
        if len(content.encode("utf-8")) > TEXT_MAX_BYTES:
            return "", self.refuse(ERR_INVALID_PARAM, f"content exceed max length {TEXT_MAX_BYTES}")
        return content, None

    def check_msgid(self, open_kfid: str, body: dict[str, Any]) -> tuple[str, JSONResponse | None]:
        msgid = body.get("msgid")
        if msgid is None or msgid == "":
            return new_msgid(), None
        if not isinstance(msgid, str) or len(msgid.encode()) > MSGID_MAX_BYTES or not MSGID_PATTERN.fullmatch(msgid):
            return "", self.refuse(ERR_INVALID_PARAM, "invalid msgid")
        if (open_kfid, msgid) in self.state.used_msgids:
            return "", self.refuse(ERR_MSGID_REPEATED, "msgid duplicated")
        return msgid, None

    def deliver(
        self, sess: KfSession, open_kfid: str, user: str, msgid: str, content: str, via: str, code: str
    ) -> None:
        now = time.time()
        self.state.used_msgids.add((open_kfid, msgid))
        if (open_kfid, user) in self.state.refusing:
            # send_msg's success is not delivery (page 96427): the customer refuses messages, so the platform
            # accepted this one (errcode 0), counts it (UNCONFIRMED: the harsher reading) and reports it later as
            # msg_send_fail with fail_type 10 in the account's log (wecom-kf.md §2 events).
            failed = {"event_type": "msg_send_fail", "open_kfid": open_kfid, "external_userid": user,
                      "fail_msgid": msgid, "fail_type": FAIL_REFUSED}  # fmt: skip
            self.state.append(open_kfid, event_item(failed, now))
        else:
            self.state.delivered.append(KfDelivered(msgid, open_kfid, user, content, via, code, now))
        sess.sent_since_customer += 1  # every API message counts, a welcome too (UNCONFIRMED: the harsher reading)
        sess.last_api_send_at = now
        if via == "send_msg_on_event" and self.state.codes[code].kind == "welcome":
            sess.last_welcome_at = now
