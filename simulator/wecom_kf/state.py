"""What the simulated 微信客服 remembers: accounts, logs, sessions, codes, deliveries, faults; and the log items
sync_msg hands out."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from bots.wecom_kf.config import WeComKfConfig
from simulator.faults import FaultQueue
from simulator.wecom_kf.rules import CALLBACK_TOKEN_TTL_S, ENDED, SESSION_LIFETIME_S
from simulator.wecom_kf.snapshot import KfSnapshot


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
    faults: FaultQueue = field(default_factory=FaultQueue)
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


def new_msgid() -> str:
    return secrets.token_hex(16)


def text_item(open_kfid: str, user: str, text: str, origin: int, send_time: float, servicer: str = "") -> dict:
    item = _item(open_kfid, user, origin, send_time, servicer)
    item["msgtype"] = "text"
    item["text"] = {"content": text}
    return item


def media_item(open_kfid: str, user: str, msgtype: str, media_id: str, send_time: float) -> dict[str, Any]:
    """A customer's image, voice, video or file: its type's object holds `media_id` alone (rules.MEDIA_MSGTYPES)."""
    item = _item(open_kfid, user, 3, send_time)
    item["msgtype"] = msgtype
    item[msgtype] = {"media_id": media_id}
    return item


def _item(open_kfid: str, user: str, origin: int, send_time: float, servicer: str = "") -> dict[str, Any]:
    item: dict[str, Any] = {
        "msgid": new_msgid(),
        "open_kfid": open_kfid,
        "external_userid": user,
        "send_time": int(send_time),
        "origin": origin,
    }
    if servicer:
        item["servicer_userid"] = servicer
    return item


def event_item(event: dict[str, Any], send_time: float) -> dict[str, Any]:
    # Events carry open_kfid and external_userid inside `event` only. Whether the top level has them too is
    # UNCONFIRMED: ooiai/wxkefu-rs src/sync_msg.rs fills a missing top-level open_kfid from event.open_kfid, so the
    # harsher reading, that they are absent, is played.
    return {"msgid": new_msgid(), "send_time": int(send_time), "origin": 4, "msgtype": "event", "event": event}

