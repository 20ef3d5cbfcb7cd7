"""A local stand-in for WeCom's 微信客服 (Kefu) API, and the signed callback that tells a bot to pull.

What it plays (reference: /work/shared/reference/wecom-kf.md, cited below as [ref §n]):
- kf/sync_msg: each account's message log (origin 3 customer, 4 event, 5 human agent; never what the API sent),
  paged by an opaque next_cursor with has_more; the callback Token is valid 10 minutes.
- kf/send_msg and kf/send_msg_on_event: the session-state rule (0 or 1 only, else 95018), the 5-messages-per-48-h
  quota renewed by the customer's next message, msgid rules, welcome_code/msg_code used once within 20 s.
- kf/service_state/get and kf/service_state/trans: the state machine, with the msg_code trans hands out.
- kf/account/list.
It records every message it "delivers", takes faults on demand, and the tests drive the customer, the human agents
and the platform's events through control routes under /__sim__/kf/. Started with `--state FILE` (the playground), it
keeps what the real platform never forgets (logs, cursors, sessions) across restarts (simulator/state_file.py);
a cursor it never issued is refused either way.

Errcodes. Real, with a public source:
  40014 / 42001  access_token invalid / expired (silenceper/wechat work/kf/error.go; as wecom_api.py answers)
  45009          api freq out of limit (silenceper/wechat work/kf/error.go)
  95000 / 95004  invalid open_kfid / open_kfid does not exist (ooiai/wxkefu-rs src/errors.rs)
  95001          over the 5-message limit (wxkefu-rs src/errors.rs; "给该客户发送的消息数量已达上限" in a public TS map)
  95002          past the 48-hour window (wxkefu-rs src/errors.rs)
  95007          invalid or expired msgtoken, i.e. the callback Token of sync_msg (wxkefu-rs; "95007 不合法的msgtoken"
                 in a public C# client, NetCoreTemp WXKF)
  95013          the session has ended (the same C# client, around service_state/trans)
  95018          "send msg session status invalid" (LangBot issues #1546, #1547, #2068, answers copied verbatim)
  40008          invalid message type (WeCom global; wxkefu-rs src/errors.rs)
UNCONFIRMED (chosen here; a gateway must not depend on more than "refused"):
  95016          a trans move the state machine forbids (recalled from WeCom's global errcode page,
                 "不允许这种状态转换"; not found in the searchable sources)
  95014          trans to 3 without a servicer_userid (recalled: "用户不是接待人员")
  40058          a repeated msgid (LangBot #1687 reports "MSG_ID重复" as a refusal, without the number: UNCONFIRMED,
                 answered with the generic invalid-parameter code so that nothing can build on a guessed one)
  40058          a malformed parameter: msgid, cursor, limit, text over 2048 bytes (40058 is what WeCom's robots answer
                 for an over-long text), and an unknown, used or expired welcome_code/msg_code — the three are one
                 answer here, on purpose: a caller cannot tell them apart
  44004          empty text content (recalled WeCom global errcode)
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from bots.wecom_kf.config import WeComKfConfig
from simulator.wecom_api import WeComApiState, next_fault
from simulator.wecom_callback import EnvelopeSigner, SignedCallback, _cdata

SYNC_LIMIT_MAX = 1000  # "默认值和最大值都为1000" (silenceper/wechat work/kf/syncmsg.go)
CURSOR_MAX_BYTES = 64  # "不多于64字节" (syncmsg.go)
SYNC_TOKEN_MAX_BYTES = 128  # "不多于128字节" (syncmsg.go)
CALLBACK_TOKEN_TTL_S = 600.0  # "10分钟内有效" (syncmsg.go)
# Without a callback Token "接口有严格的频率限制" (syncmsg.go); the numbers are UNCONFIRMED. Played: at most 2
# calls without a Token in any 60 s (whole simulator), then 45009: only a puller that passes the Token pages freely.
UNTOKENED_SYNC_ALLOWANCE = (60.0, 2)
SEND_QUOTA = 5  # "最多可发送5条消息" after the customer's message, renewed when they write again (sendmsg.go)
QUOTA_WINDOW_S = 48 * 3600.0  # "48小时内" (sendmsg.go)
# "一个微信用户向一个客服帐号发起咨询后，在48h内，或主动结束会话前…都算是一次会话" (servicestate.go). Whether the 48 h
# run from the session's first or the customer's last message is UNCONFIRMED; played: from the first (harsher), after
# which the session reads as ended (4) and the customer's next message starts a new one.
SESSION_LIFETIME_S = 48 * 3600.0
WELCOME_CODE_TTL_S = 20.0  # "仅可在收到相关事件后20秒内调用，且只可调用一次" (sendmsgonevent.go)
# A msg_code (from trans or session_status_change): once, and within 20 s. The reference gives the 20 s only for the
# end-of-session code; for the others the window is UNCONFIRMED and the same 20 s is played (harsher).
MSG_CODE_TTL_S = 20.0
# A welcome_code comes only if the customer "在过去48小时里未收过欢迎语，且未向该用户发过消息" (sendmsgonevent.go).
WELCOME_QUIET_S = 48 * 3600.0
# The Kefu text cap is UNCONFIRMED ([ref §4]: bots split at WeCom's 2048 bytes). Played: a text over 2048 bytes is
# refused whole (40058) rather than cut — nothing reaches the customer, so only a sender that splits gets through.
TEXT_MAX_BYTES = 2048
MSGID_MAX_BYTES = 32  # "不多于32字节, 字符串取值范围(正则表达式)：[0-9a-zA-Z_-]*" (sendmsg.go)
MSGID_PATTERN = re.compile(r"[0-9a-zA-Z_-]+")
ACCOUNT_LIST_MAX = 100  # account/list limit range [1, 100] (UNCONFIRMED: past it, 40058)

ERR_BAD_JSON = 47001
ERR_TOKEN_INVALID = 40014
ERR_TOKEN_EXPIRED = 42001
ERR_MSGTYPE = 40008
ERR_FREQ = 45009
ERR_INVALID_PARAM = 40058  # UNCONFIRMED uses, see the module docstring
ERR_EMPTY_CONTENT = 44004  # UNCONFIRMED
ERR_OPEN_KFID_INVALID = 95000
ERR_QUOTA = 95001
ERR_WINDOW = 95002
ERR_OPEN_KFID_UNKNOWN = 95004
ERR_SYNC_TOKEN = 95007
ERR_SESSION_ENDED = 95013
ERR_NOT_SERVICER = 95014  # UNCONFIRMED
ERR_BAD_TRANSITION = 95016  # UNCONFIRMED
ERR_SESSION_STATE = 95018
# UNCONFIRMED: the documents say only that a repeated msgid is refused. The simulator answers the generic
# invalid-parameter code, which botgw does not special-case: the harsher reading (no code to recognise).
ERR_MSGID_REPEATED = 40058
FAIL_REFUSED = 10  # msg_send_fail's fail_type: the customer refused the message

# Session states (servicestate.go): 0 new, 1 the API's smart assistant, 2 the pool, 3 a human agent, 4 ended.
NEW, ASSISTANT, POOL, HUMAN, ENDED = 0, 1, 2, 3, 4
# [ref §6]; 4 is final and left only by a customer's new message, never by the API. 0→4 is refused: the official
# trans page lists 1/2/3 as the moves out of 0 (as checked for issue 18), while the reference's K1 summary lists 4
# too; the harsher reading is played.
ALLOWED_MOVES: dict[int, frozenset[int]] = {
    NEW: frozenset({1, 2, 3}),
    ASSISTANT: frozenset({1, 2, 3, 4}),
    POOL: frozenset({2, 3, 4}),
    HUMAN: frozenset({3, 4}),
    ENDED: frozenset(),
}
SENDABLE_STATES = frozenset({NEW, ASSISTANT})

Endpoint = Literal[
    "sync_msg", "send_msg", "send_msg_on_event", "service_state_get", "service_state_trans", "account_list"
]


class KfFault(BaseModel):
    """What the next `times` calls of `endpoint` answer instead of success (as wecom_api.py's Fault)."""

    endpoint: Endpoint
    errcode: int | None = None
    errmsg: str = ""
    http_status: int | None = None
    delay_s: float = 0.0  # slow: wait this long, then answer as the rest of the fault says (or succeed)
    empty_page: bool = False  # sync_msg: an empty msg_list with has_more=1, as the platform may answer [ref §2]
    max_items: int | None = Field(default=None, ge=0)  # sync_msg: fewer items than asked, has_more=1
    deliver: bool = False  # sends: deliver the message, then answer the errcode/http_status (a lost answer)
    times: int = 1
    after: int = 0  # let this many calls of the endpoint through first


@dataclass
class KfDelivered:
    """A message the customer saw, sent through the API."""

    msgid: str
    open_kfid: str
    touser: str
    content: str
    via: str  # send_msg | send_msg_on_event
    code: str
    at: float


@dataclass
class KfAccount:
    open_kfid: str
    corp_id: str
    name: str
    avatar: str


@dataclass
class KfSession:
    """One customer at one account."""

    state: int = ENDED  # "已结束: 会话已经结束或未开始" (servicestate.go): never contacted reads as 4
    servicer_userid: str = ""
    started_at: float = 0.0
    last_customer_at: float = 0.0
    sent_since_customer: int = 0
    lapsed: bool = False  # ended by the 48-hour lifetime, not by a move
    first_queue_code_given: bool = False  # trans gives a code on the *first* move to 2 or 3 of a session
    last_welcome_at: float = 0.0
    last_api_send_at: float = 0.0


@dataclass
class KfCode:
    kind: str  # welcome | msg
    open_kfid: str
    external_userid: str
    expires_at: float
    used: bool = False


class _Saved(BaseModel):
    """A part of a saved state: exactly the keys and JSON types `KfState.snapshot()` writes, nothing coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class SavedAccount(_Saved):
    open_kfid: str
    corp_id: str
    name: str
    avatar: str


class SavedText(_Saved):
    content: str


class SavedMedia(_Saved):
    media_id: str


class SavedEvent(_Saved):
    """An event's payload: the three keys every event has, then whatever the control route was given."""

    model_config = ConfigDict(extra="allow")
    event_type: str
    open_kfid: str
    external_userid: str


class SavedLogItem(_Saved):
    """A sync_msg item as `_text_item` / `_event_item` make it (a photo is a text item with `image` for `text`)."""

    msgid: str
    open_kfid: str = ""
    external_userid: str = ""
    send_time: int
    origin: Literal[3, 4, 5]
    servicer_userid: str = ""
    msgtype: Literal["text", "image", "event"]
    text: SavedText | None = None
    image: SavedMedia | None = None
    event: SavedEvent | None = None

    @model_validator(mode="after")
    def _one_body(self) -> SavedLogItem:
        bodies = {name for name in ("text", "image", "event") if getattr(self, name) is not None}
        if bodies != {self.msgtype}:
            raise ValueError(f"a {self.msgtype} item carries {', '.join(sorted(bodies)) or 'no body'}")
        if self.msgtype == "event" and (self.open_kfid or self.external_userid or self.servicer_userid):
            raise ValueError("an event item carries open_kfid and external_userid inside its event only")
        if self.msgtype != "event" and not (self.open_kfid and self.external_userid):
            raise ValueError(f"a {self.msgtype} item without open_kfid or external_userid")
        return self

    def account(self) -> str:
        return self.event.open_kfid if self.event is not None else self.open_kfid


class SavedSession(_Saved):
    state: Literal[0, 1, 2, 3, 4]
    servicer_userid: str
    started_at: float
    last_customer_at: float
    sent_since_customer: int = Field(ge=0)
    lapsed: bool
    first_queue_code_given: bool
    last_welcome_at: float
    last_api_send_at: float


class SavedCode(_Saved):
    kind: Literal["welcome", "msg"]
    open_kfid: str
    external_userid: str
    expires_at: float
    used: bool


class SavedDelivered(_Saved):
    msgid: str
    open_kfid: str
    touser: str
    content: str
    via: Literal["send_msg", "send_msg_on_event"]
    code: str
    at: float


class KfSnapshot(_Saved):
    """What `KfState.snapshot()` writes, checked whole before `restore()` takes any of it: a file that was edited,
    cut short or written by something else is refused at start rather than breaking a later request."""

    accounts: list[SavedAccount]
    log: list[tuple[str, SavedLogItem]]
    cursors: dict[str, tuple[str, int]]
    sync_tokens: dict[str, tuple[str, float]]
    sessions: list[tuple[str, str, SavedSession]]
    codes: dict[str, SavedCode]
    used_msgids: list[tuple[str, str]]
    delivered: list[SavedDelivered]
    refusing: list[tuple[str, str]]
    off_duty: list[str]

    @model_validator(mode="after")
    def _consistent(self) -> KfSnapshot:
        if any(position < 0 for _, position in self.cursors.values()):
            raise ValueError("a cursor with a negative position")
        if any(item.account() != kfid for kfid, item in self.log):
            raise ValueError("a log item filed under another account than its own")
        return self


@dataclass
class KfState:
    """Everything the simulated Kefu remembers: accounts, logs, sessions, codes, deliveries, faults."""

    accounts: dict[str, KfAccount] = field(default_factory=dict)
    configured: dict[str, KfAccount] = field(default_factory=dict)
    log: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (open_kfid, item), oldest first
    by_account: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cursors: dict[str, tuple[str, int]] = field(default_factory=dict)  # cursor -> (scope: open_kfid or "", position)
    sync_tokens: dict[str, tuple[str, float]] = field(default_factory=dict)  # Token -> (open_kfid, expires_at)
    untokened_calls: list[float] = field(default_factory=list)
    sessions: dict[tuple[str, str], KfSession] = field(default_factory=dict)
    codes: dict[str, KfCode] = field(default_factory=dict)
    used_msgids: set[tuple[str, str]] = field(default_factory=set)  # (open_kfid, msgid), unique per account
    delivered: list[KfDelivered] = field(default_factory=list)
    faults: list[KfFault] = field(default_factory=list)
    refusing: set[tuple[str, str]] = field(default_factory=set)  # (open_kfid, customer) refusing messages
    off_duty: set[str] = field(default_factory=set)  # servicers who are not 正在接待 (trans to them: 95014)
    calls: dict[str, int] = field(default_factory=dict)
    refusals: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_bots(cls, bots: list[WeComKfConfig]) -> KfState:
        """The accounts each configured bot serves (open_kfids and per-account settings); one default if none."""
        accounts: dict[str, KfAccount] = {}
        for bot in bots:
            kfids = list(dict.fromkeys([*(bot.open_kfids or []), *bot.accounts])) or [f"wk_sim_{bot.id}"]
            for index, kfid in enumerate(kfids):
                accounts[kfid] = KfAccount(
                    kfid, bot.corp_id, f"{bot.id} 客服 {index + 1}", f"https://wework.qpic.cn/wwhead/sim/{kfid}/0"
                )
        state = cls(configured=accounts)
        state.reset()
        return state

    def reset(self) -> None:
        self.accounts = dict(self.configured)
        self.log.clear()
        self.by_account = {kfid: [] for kfid in self.accounts}
        for table in (self.cursors, self.sync_tokens, self.sessions, self.codes, self.calls, self.refusals):
            table.clear()
        self.untokened_calls.clear()
        self.used_msgids.clear()
        self.delivered.clear()
        self.faults.clear()

    def count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """What a real Kefu would still know after the simulator restarts: the accounts, every account's log, the
        cursors and callback Tokens it handed out, sessions, codes, msgids used, what customers saw, who refuses
        and who is off duty (simulator/state_file.py writes it). Faults and call counters are the tests'
        instruments, not the platform's memory, and are left out; so are expired Tokens and codes, which read
        exactly as unknown ones."""
        now = time.time()
        return {
            "accounts": [vars(account) for account in self.accounts.values()],
            "log": [[kfid, item] for kfid, item in self.log],
            "cursors": {cursor: list(where) for cursor, where in self.cursors.items()},
            "sync_tokens": {token: list(issued) for token, issued in self.sync_tokens.items() if issued[1] >= now},
            "sessions": [[kfid, user, vars(sess)] for (kfid, user), sess in self.sessions.items()],
            "codes": {code: vars(issued) for code, issued in self.codes.items() if issued.expires_at >= now},
            "used_msgids": sorted([kfid, msgid] for kfid, msgid in self.used_msgids),
            "delivered": [vars(item) for item in self.delivered],
            "refusing": sorted([kfid, user] for kfid, user in self.refusing),
            "off_duty": sorted(self.off_duty),
        }

    def restore(self, saved: KfSnapshot) -> None:
        """Take back a `snapshot()` (checked as a KfSnapshot). The configured accounts keep their configured names;
        accounts added through the control routes come back too."""
        self.reset()
        for account in saved.accounts:
            self.accounts.setdefault(account.open_kfid, KfAccount(**account.model_dump()))
        for kfid in self.accounts:
            self.by_account.setdefault(kfid, [])
        for kfid, item in saved.log:
            self.append(kfid, item.model_dump(exclude_unset=True))
        self.cursors.update(saved.cursors)
        self.sync_tokens.update(saved.sync_tokens)
        self.sessions.update({(kfid, user): KfSession(**sess.model_dump()) for kfid, user, sess in saved.sessions})
        self.codes.update({code: KfCode(**issued.model_dump()) for code, issued in saved.codes.items()})
        self.used_msgids.update(saved.used_msgids)
        self.delivered.extend(KfDelivered(**item.model_dump()) for item in saved.delivered)
        self.refusing.update(saved.refusing)
        self.off_duty.update(saved.off_duty)

    def next_fault(self, endpoint: str) -> KfFault | None:
        return next_fault(self.faults, endpoint)

    def session(self, open_kfid: str, external_userid: str, now: float) -> KfSession:
        """The customer's session, ended first if its 48 hours ran out."""
        sess = self.sessions.setdefault((open_kfid, external_userid), KfSession())
        if sess.state != ENDED and now - sess.started_at > SESSION_LIFETIME_S:
            sess.state, sess.servicer_userid, sess.lapsed = ENDED, "", True
        return sess

    def append(self, open_kfid: str, item: dict[str, Any]) -> None:
        self.log.append((open_kfid, item))
        self.by_account.setdefault(open_kfid, []).append(item)

    def new_cursor(self, scope: str, position: int) -> str:
        cursor = secrets.token_urlsafe(18)  # 24 bytes, opaque
        self.cursors[cursor] = (scope, position)
        return cursor

    def new_sync_token(self, open_kfid: str, ttl_s: float | None = None) -> str:
        token = "ENC" + secrets.token_urlsafe(33)
        self.sync_tokens[token] = (open_kfid, time.time() + (CALLBACK_TOKEN_TTL_S if ttl_s is None else ttl_s))
        return token

    def new_code(self, kind: str, open_kfid: str, external_userid: str, ttl_s: float) -> str:
        code = secrets.token_urlsafe(24)
        self.codes[code] = KfCode(kind, open_kfid, external_userid, time.time() + ttl_s)
        return code


def _msgid() -> str:
    return secrets.token_hex(16)


def _text_item(open_kfid: str, user: str, text: str, origin: int, send_time: float, servicer: str = "") -> dict:
    item: dict[str, Any] = {
        "msgid": _msgid(),
        "open_kfid": open_kfid,
        "external_userid": user,
        "send_time": int(send_time),
        "origin": origin,
    }
    if servicer:
        item["servicer_userid"] = servicer
    item["msgtype"] = "text"
    item["text"] = {"content": text}
    return item


def _event_item(event: dict[str, Any], send_time: float) -> dict[str, Any]:
    # Events carry open_kfid and external_userid inside `event` only. Whether the top level has them too is
    # UNCONFIRMED: ooiai/wxkefu-rs src/sync_msg.rs fills a missing top-level open_kfid from event.open_kfid, so the
    # harsher reading, that they are absent, is played.
    return {"msgid": _msgid(), "send_time": int(send_time), "origin": 4, "msgtype": "event", "event": event}


def kf_router(state: KfState, wecom: WeComApiState) -> APIRouter:
    """Kefu's API routes (tokens from the shared WeCom token table) and the simulator's control routes."""
    router = APIRouter()

    def refuse(errcode: int, errmsg: str) -> JSONResponse:
        state.refusals[errcode] = state.refusals.get(errcode, 0) + 1
        return JSONResponse({"errcode": errcode, "errmsg": errmsg})

    def check_token(access_token: str) -> JSONResponse | None:
        # Any live token of the shared table passes, an app's as well as the Kefu secret's: the simulator does not
        # know which secret issued a token (the real API refuses tokens without 微信客服 rights).
        expires_at = wecom.tokens.get(access_token)
        if expires_at is None:
            return refuse(ERR_TOKEN_INVALID, "invalid access_token")
        if expires_at < time.time():
            return refuse(ERR_TOKEN_EXPIRED, "access_token expired")
        return None

    async def before(endpoint: str, access_token: str) -> tuple[KfFault | None, JSONResponse | None]:
        """Count the call, play a fault that answers early, check the token."""
        state.count(endpoint)
        fault = state.next_fault(endpoint)
        if fault and fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault and not fault.deliver:
            if fault.http_status:
                return fault, JSONResponse({"error": "simulated"}, status_code=fault.http_status)
            if fault.errcode is not None:
                if fault.errcode in (ERR_TOKEN_INVALID, ERR_TOKEN_EXPIRED):
                    wecom.tokens.pop(access_token, None)
                return fault, refuse(fault.errcode, fault.errmsg or "simulated")
        return fault, check_token(access_token)

    def after_delivery(fault: KfFault | None, answer: dict[str, Any]) -> JSONResponse:
        if fault and fault.deliver and fault.http_status:
            return JSONResponse({"error": "simulated"}, status_code=fault.http_status)
        if fault and fault.deliver and fault.errcode is not None:
            return refuse(fault.errcode, fault.errmsg or "simulated")
        return JSONResponse(answer)

    async def json_body(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return refuse(ERR_BAD_JSON, "data format error")
        return body if isinstance(body, dict) else refuse(ERR_BAD_JSON, "data format error")

    def check_account(open_kfid: Any) -> JSONResponse | None:
        if not isinstance(open_kfid, str) or not open_kfid:
            return refuse(ERR_OPEN_KFID_INVALID, "invalid open_kfid")
        if open_kfid not in state.accounts:
            return refuse(ERR_OPEN_KFID_UNKNOWN, "open_kfid not exist")
        return None

    def check_text(body: dict[str, Any]) -> tuple[str, JSONResponse | None]:
        """The text of a send (only text is played: the gateway sends text), or the refusal."""
        if body.get("msgtype") != "text":
            return "", refuse(ERR_MSGTYPE, "invalid message type")
        text = body.get("text")
        content = text.get("content") if isinstance(text, dict) else None
        if not isinstance(content, str) or not content:
            return "", refuse(ERR_EMPTY_CONTENT, "empty content")
        if len(content.encode("utf-8")) > TEXT_MAX_BYTES:
            return "", refuse(ERR_INVALID_PARAM, f"content exceed max length {TEXT_MAX_BYTES}")
        return content, None

    def check_msgid(open_kfid: str, body: dict[str, Any]) -> tuple[str, JSONResponse | None]:
        msgid = body.get("msgid")
        if msgid is None or msgid == "":
            return _msgid(), None
        if not isinstance(msgid, str) or len(msgid.encode()) > MSGID_MAX_BYTES or not MSGID_PATTERN.fullmatch(msgid):
            return "", refuse(ERR_INVALID_PARAM, "invalid msgid")
        if (open_kfid, msgid) in state.used_msgids:
            return "", refuse(ERR_MSGID_REPEATED, "msgid duplicated")
        return msgid, None

    def deliver(sess: KfSession, open_kfid: str, user: str, msgid: str, content: str, via: str, code: str) -> None:
        now = time.time()
        state.used_msgids.add((open_kfid, msgid))
        if (open_kfid, user) in state.refusing:
            # send_msg's success is not delivery (page 96427): the customer refuses messages, so the platform
            # accepted this one (errcode 0), counts it (UNCONFIRMED: the harsher reading) and reports it later as
            # msg_send_fail with fail_type 10 in the account's log (wecom-kf.md §2 events).
            failed = {"event_type": "msg_send_fail", "open_kfid": open_kfid, "external_userid": user,
                      "fail_msgid": msgid, "fail_type": FAIL_REFUSED}  # fmt: skip
            state.append(open_kfid, _event_item(failed, now))
        else:
            state.delivered.append(KfDelivered(msgid, open_kfid, user, content, via, code, now))
        sess.sent_since_customer += 1  # every API message counts, a welcome too (UNCONFIRMED: the harsher reading)
        sess.last_api_send_at = now
        if via == "send_msg_on_event" and state.codes[code].kind == "welcome":
            sess.last_welcome_at = now

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

    # ---- control routes: the customer, the human agents and the platform's events ---------------------------

    def control_account(open_kfid: Any) -> JSONResponse | None:
        if open_kfid not in state.accounts:
            return JSONResponse({"error": f"no account {open_kfid!r} in the simulator"}, status_code=404)
        return None

    @router.post("/__sim__/kf/customer")
    async def customer(request: Request) -> JSONResponse:
        """The customer writes `text` (or `count` messages "text #i"); a fresh callback Token comes back."""
        body = await request.json()
        open_kfid, user = body.get("open_kfid"), str(body.get("external_userid", ""))
        if (missing := control_account(open_kfid)) or not user:
            return missing or JSONResponse({"error": "external_userid is required"}, status_code=400)
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
            item = _text_item(open_kfid, user, text, 3, send_time)
            if body.get("msgtype") == "image":  # a photo: sync_msg gives its media_id (wecom-kf.md §2 msg_list)
                item["msgtype"], item["image"] = "image", {"media_id": "MEDIA_" + secrets.token_hex(8)}
                del item["text"]
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
        item = _text_item(open_kfid, user, str(body.get("text", "")), 5, now, servicer)
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
        item = _event_item(payload, now)
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
            "pending_faults": len(state.faults),
        }

    @router.post("/__sim__/kf/faults")
    async def add_fault(fault: KfFault) -> dict[str, int]:
        state.faults.append(fault)
        return {"pending_faults": len(state.faults)}

    @router.post("/__sim__/kf/reset")
    async def reset() -> dict[str, str]:
        """Kefu's state only (/__sim__/reset resets the WeCom app API's, access tokens included)."""
        state.reset()
        return {"status": "reset"}

    return router


def kf_msg_or_event_xml(corp_id: str, token: str, open_kfid: str, create_time: int) -> str:
    """The inner XML of the callback that says "there is something to pull" [ref §1]."""
    return (
        f"<xml><ToUserName>{_cdata(corp_id)}</ToUserName><CreateTime>{create_time}</CreateTime>"
        f"<MsgType>{_cdata('event')}</MsgType><Event>{_cdata('kf_msg_or_event')}</Event>"
        f"<Token>{_cdata(token)}</Token><OpenKfId>{_cdata(open_kfid)}</OpenKfId></xml>"
    )


class WeComKfCallbackSigner(EnvelopeSigner):
    """Signs and encrypts Kefu callbacks with the bot's token and AES key (receive id: the corp id), as WeCom does;
    a Kefu callback belongs to no app, so its envelope has no AgentID."""

    def __init__(self, bot: WeComKfConfig) -> None:
        super().__init__(bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), bot.corp_id)
        self.bot = bot

    def kf_msg_or_event(self, token: str, open_kfid: str, timestamp: int | None = None) -> SignedCallback:
        ts = timestamp if timestamp is not None else int(time.time())
        return self.sign_plaintext(kf_msg_or_event_xml(self.bot.corp_id, token, open_kfid, ts), timestamp=ts)
