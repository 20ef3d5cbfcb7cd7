"""The simulated 微信客服 (Kefu) API alone: sync_msg paging and tokens, send_msg's state rule, quota and msgid
rules, event codes, the service-state machine, account/list, faults, and the signed "pull" callback.

The simulator runs in-process (Starlette's TestClient runs its lifespan); the platform side is driven through
its /__sim__/kf/ control routes."""

from __future__ import annotations

import base64
import errno
import json
import os
import secrets
import stat
import subprocess
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import defusedxml.ElementTree as ET
import httpx
import pytest
import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from bots.base import CallbackRejected
from bots.wecom.crypto import WeComCrypto
from bots.wecom_kf.config import WeComKfConfig
from gateway import cli
from gateway.cli import sim
from simulator import state_file
from simulator.server import create_simulator_app
from simulator.state_file import StateFileError
from simulator.wecom_kf.rules import ERR_MSGID_REPEATED
from simulator.wecom_kf.signer import WeComKfCallbackSigner
from testkit.processes import BOTGW, ROOT, child_env, free_port

CORP, SECRET = "wwkfcorp", "kf-secret"
KF_A, KF_B, KF_C = "wkAAAA", "wkBBBB", "wkCCCC"


def kf_bot() -> WeComKfConfig:
    return WeComKfConfig(
        id="kf",
        token="kf-callback-token",
        encoding_aes_key=base64.b64encode(secrets.token_bytes(32)).decode().rstrip("="),
        corp_id=CORP,
        secret=SECRET,
        open_kfids=[KF_A, KF_B, KF_C],
        accounts={KF_C: {}},  # settings only for an account it serves (the config refuses others)
    )


@pytest.fixture(scope="module")
def sim_client() -> Iterator[TestClient]:
    app = create_simulator_app([kf_bot()], free_port())
    with TestClient(app) as client:  # runs the lifespan
        yield client


class Kf:
    """The simulator, seen by a test: the bot's API calls and the platform's control routes."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.access_token = self.gettoken()

    def gettoken(self) -> str:
        answer = self.client.get("/cgi-bin/gettoken", params={"corpid": CORP, "corpsecret": SECRET}).json()
        assert answer["errcode"] == 0, answer
        return answer["access_token"]

    def api(self, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        params = {"access_token": self.access_token if token is None else token}
        response = self.client.post(f"/cgi-bin/kf/{path}", params=params, json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def control(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post(f"/__sim__/kf/{path}", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def customer(self, user: str, text: str = "你好", open_kfid: str = KF_A, **extra: Any) -> dict[str, Any]:
        return self.control("customer", {"open_kfid": open_kfid, "external_userid": user, "text": text, **extra})

    def event(self, user: str, event_type: str, open_kfid: str = KF_A, **extra: Any) -> dict[str, Any]:
        body = {"open_kfid": open_kfid, "external_userid": user, "event_type": event_type, **extra}
        return self.control("event", body)

    def sync(self, **body: Any) -> dict[str, Any]:
        return self.api("sync_msg", body)

    def send(self, user: str, text: str = "answer", open_kfid: str = KF_A, **extra: Any) -> dict[str, Any]:
        body = {"touser": user, "open_kfid": open_kfid, "msgtype": "text", "text": {"content": text}, **extra}
        return self.api("send_msg", body)

    def send_on_event(self, code: str, text: str = "welcome", **extra: Any) -> dict[str, Any]:
        return self.api("send_msg_on_event", {"code": code, "msgtype": "text", "text": {"content": text}, **extra})

    def trans(self, user: str, service_state: int, servicer: str = "", open_kfid: str = KF_A) -> dict[str, Any]:
        body = {"open_kfid": open_kfid, "external_userid": user, "service_state": service_state}
        if servicer:
            body["servicer_userid"] = servicer
        return self.api("service_state/trans", body)

    def state(self, user: str, open_kfid: str = KF_A) -> dict[str, Any]:
        return self.api("service_state/get", {"open_kfid": open_kfid, "external_userid": user})

    def session(self, user: str, open_kfid: str = KF_A) -> dict[str, Any]:
        return self.client.get("/__sim__/kf/session", params={"open_kfid": open_kfid, "external_userid": user}).json()

    def sent(self, user: str) -> list[dict[str, Any]]:
        return self.client.get("/__sim__/kf/sent", params={"external_userid": user}).json()

    def stats(self) -> dict[str, Any]:
        return self.client.get("/__sim__/kf/stats").json()

    def fault(self, **fault: Any) -> None:
        self.control("faults", fault)


@pytest.fixture
def kf(sim_client: TestClient) -> Kf:
    assert sim_client.post("/__sim__/kf/reset").status_code == 200
    assert sim_client.post("/__sim__/reset").status_code == 200  # the shared WeCom token table
    return Kf(sim_client)


def user_id() -> str:
    return "wm" + secrets.token_hex(8)


def test_kefu_secret_gets_tokens_and_kefu_routes_check_them(kf: Kf) -> None:
    user = user_id()
    token = kf.customer(user)["token"]
    assert kf.sync(token=token, open_kfid=KF_A)["errcode"] == 0
    wrong = kf.client.get("/cgi-bin/gettoken", params={"corpid": CORP, "corpsecret": "not-it"}).json()
    assert wrong["errcode"] == 40001
    for path, body in (
        ("sync_msg", {"token": token, "open_kfid": KF_A}),
        ("send_msg", {"touser": user, "open_kfid": KF_A, "msgtype": "text", "text": {"content": "x"}}),
        ("account/list", {}),
        ("service_state/get", {"open_kfid": KF_A, "external_userid": user}),
    ):
        assert kf.api(path, body, token="forged")["errcode"] == 40014, path
    kf.client.post("/__sim__/wecom/expire-tokens")
    assert kf.sync(token=token, open_kfid=KF_A)["errcode"] == 42001
    assert kf.sent(user) == []


def test_paging_1200_messages_with_cursor_and_has_more(kf: Kf) -> None:
    user = user_id()
    wrote = kf.customer(user, "q", count=1200)
    kf.customer(user_id(), "other account", open_kfid=KF_B)
    token = wrote["token"]

    first = kf.sync(token=token, open_kfid=KF_A)
    assert first["errcode"] == 0
    assert len(first["msg_list"]) == 1000 and first["has_more"] == 1
    assert 0 < len(first["next_cursor"].encode()) <= 64
    second = kf.sync(token=token, open_kfid=KF_A, cursor=first["next_cursor"], limit=1000)
    assert len(second["msg_list"]) == 200 and second["has_more"] == 0
    pulled = first["msg_list"] + second["msg_list"]
    assert [item["msgid"] for item in pulled] == wrote["msgids"]
    assert [item["text"]["content"] for item in pulled] == [f"q #{i}" for i in range(1200)]
    assert {item["open_kfid"] for item in pulled} == {KF_A}, "another account's messages leaked into this pull"

    caught_up = kf.sync(token=token, open_kfid=KF_A, cursor=second["next_cursor"])
    assert caught_up["msg_list"] == [] and caught_up["has_more"] == 0
    again = kf.sync(token=token, open_kfid=KF_A)
    assert again["msg_list"][0]["msgid"] == wrote["msgids"][0], "without a cursor the pull starts from the beginning"

    small = kf.sync(token=token, open_kfid=KF_A, limit=7)
    assert len(small["msg_list"]) == 7 and small["has_more"] == 1
    assert kf.sync(token=token, open_kfid=KF_A, limit=1001)["errcode"] == 40058
    assert kf.sync(token=token, open_kfid=KF_A, cursor="not-a-cursor")["errcode"] == 40058
    assert kf.sync(token=token, open_kfid=KF_A, cursor="x" * 65)["errcode"] == 40058
    b_token = kf.customer(user_id(), open_kfid=KF_B)["token"]
    assert kf.sync(token=b_token, open_kfid=KF_B, cursor=first["next_cursor"])["errcode"] == 40058
    assert kf.sync(token=token, open_kfid="wkNOPE")["errcode"] == 95004


def test_items_carry_origin_and_api_sends_are_never_pulled(kf: Kf) -> None:
    user = user_id()
    kf.customer(user, "我想问一下")
    assert kf.send(user, "bot answer")["errcode"] == 0
    kf.control("agent", {"open_kfid": KF_A, "external_userid": user, "servicer_userid": "zhangsan", "text": "我来"})
    token = kf.event(user, "msg_send_fail", fail_msgid="m1", fail_type=6)["token"]
    items = kf.sync(token=token, open_kfid=KF_A)["msg_list"]
    assert [item["origin"] for item in items] == [3, 5, 4]
    customer, agent, event = items
    assert customer["external_userid"] == user and customer["open_kfid"] == KF_A
    assert customer["msgtype"] == "text" and customer["text"] == {"content": "我想问一下"}
    assert isinstance(customer["send_time"], int) and abs(customer["send_time"] - time.time()) < 5
    assert "servicer_userid" not in customer
    assert agent["servicer_userid"] == "zhangsan" and agent["text"]["content"] == "我来"
    assert event["msgtype"] == "event" and "external_userid" not in event, "events name the customer inside `event`"
    assert event["event"] == {
        "event_type": "msg_send_fail",
        "open_kfid": KF_A,
        "external_userid": user,
        "fail_msgid": "m1",
        "fail_type": 6,
    }
    assert all("bot answer" not in str(item) for item in items)
    assert kf.state(user) == {"errcode": 0, "errmsg": "ok", "service_state": 3, "servicer_userid": "zhangsan"}


def test_empty_page_with_has_more_on_fault(kf: Kf) -> None:
    user = user_id()
    wrote = kf.customer(user, "hello", count=3)
    kf.fault(endpoint="sync_msg", empty_page=True, times=1)
    empty = kf.sync(token=wrote["token"], open_kfid=KF_A)
    assert empty["errcode"] == 0 and empty["msg_list"] == [] and empty["has_more"] == 1
    rest = kf.sync(token=wrote["token"], open_kfid=KF_A, cursor=empty["next_cursor"])
    assert [item["msgid"] for item in rest["msg_list"]] == wrote["msgids"] and rest["has_more"] == 0

    kf.fault(endpoint="sync_msg", max_items=1, times=1)
    short = kf.sync(token=wrote["token"], open_kfid=KF_A)
    assert len(short["msg_list"]) == 1 and short["has_more"] == 1
    kf.fault(endpoint="sync_msg", errcode=-1, after=1)
    assert kf.sync(token=wrote["token"], open_kfid=KF_A)["errcode"] == 0
    assert kf.sync(token=wrote["token"], open_kfid=KF_A)["errcode"] == -1
    kf.fault(endpoint="sync_msg", http_status=503)
    assert kf.client.post("/cgi-bin/kf/sync_msg", params={"access_token": kf.access_token}, json={}).status_code == 503


def test_callback_token_expires_and_untokened_pulls_are_rate_limited(kf: Kf) -> None:
    user = user_id()
    fresh = kf.customer(user)["token"]
    stale = kf.customer(user, token_ttl_s=-1)["token"]
    assert kf.sync(token=fresh, open_kfid=KF_A)["errcode"] == 0
    assert kf.sync(token=stale, open_kfid=KF_A)["errcode"] == 95007
    assert kf.sync(token="ENCnever-issued", open_kfid=KF_A)["errcode"] == 95007
    assert kf.sync(token=fresh, open_kfid=KF_B)["errcode"] == 95007, "a Token pulls the account it came for"
    assert kf.sync(token=fresh)["errcode"] == 0, "without open_kfid, every account"

    assert kf.sync(open_kfid=KF_A)["errcode"] == 0
    assert kf.sync(open_kfid=KF_A)["errcode"] == 0
    assert kf.sync(open_kfid=KF_A)["errcode"] == 45009
    assert kf.sync(token=fresh, open_kfid=KF_A)["errcode"] == 0, "with the Token, no such limit"
    stats = kf.stats()
    assert stats["sync_msg_without_token_calls"] == 3
    assert stats["refusals"]["95007"] == 3 and stats["refusals"]["45009"] == 1


def test_five_messages_per_customer_message_then_95001(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    for i in range(5):
        assert kf.send(user, f"piece {i}")["errcode"] == 0
    assert kf.send(user, "sixth")["errcode"] == 95001
    assert kf.session(user)["sent_since_customer"] == 5
    assert [item["content"] for item in kf.sent(user)] == [f"piece {i}" for i in range(5)]
    kf.customer(user, "还有一个问题")
    assert kf.session(user)["sent_since_customer"] == 0
    assert kf.send(user, "sixth, now allowed")["errcode"] == 0
    assert len(kf.sent(user)) == 6
    assert kf.stats()["refusals"]["95001"] == 1


def test_nothing_after_48_hours(kf: Kf) -> None:
    user = user_id()
    kf.customer(user, send_time=time.time() - 49 * 3600)
    assert kf.send(user)["errcode"] == 95002
    assert kf.state(user)["service_state"] == 4
    kf.customer(user, "I am back")
    assert kf.state(user)["service_state"] == 0
    assert kf.send(user)["errcode"] == 0


def test_msgid_optional_checked_and_never_twice(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    generated = kf.send(user)["msgid"]
    assert generated and len(generated.encode()) <= 32
    assert kf.send(user, msgid="turn-42_piece-0")["msgid"] == "turn-42_piece-0"
    assert kf.send(user, "retry", msgid="turn-42_piece-0")["errcode"] == ERR_MSGID_REPEATED
    assert kf.send(user, "retry", msgid=generated)["errcode"] == ERR_MSGID_REPEATED
    assert kf.send(user, msgid="has space")["errcode"] == 40058
    assert kf.send(user, msgid="x" * 33)["errcode"] == 40058
    assert kf.send(user, msgid="x" * 32)["errcode"] == 0
    assert [item["msgid"] for item in kf.sent(user)] == [generated, "turn-42_piece-0", "x" * 32]
    code = kf.event(user, "session_status_change", change_type=3)["code"]  # a msg_code, from the session's end
    assert kf.send_on_event(code, msgid="turn-42_piece-0")["errcode"] == ERR_MSGID_REPEATED


def test_text_over_2048_bytes_is_refused_whole(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    assert kf.send(user, "字" * 682)["errcode"] == 0  # 2046 bytes
    assert kf.send(user, "字" * 683)["errcode"] == 40058  # 2049 bytes
    assert kf.send(user, "")["errcode"] == 44004
    assert kf.api("send_msg", {"touser": user, "open_kfid": KF_A, "msgtype": "image", "image": {}})["errcode"] == 40008
    assert len(kf.sent(user)) == 1
    assert kf.session(user)["sent_since_customer"] == 1, "a refused send uses no quota"


@pytest.mark.parametrize("reach", ["pool", "agent_trans", "agent_wrote", "ended"])
def test_95018_unless_state_0_or_1(kf: Kf, reach: str) -> None:
    user = user_id()
    kf.customer(user)
    assert kf.state(user)["service_state"] == 0
    assert kf.send(user, "in state 0")["errcode"] == 0
    if reach == "pool":
        assert kf.trans(user, 2)["errcode"] == 0
    elif reach == "agent_trans":
        assert kf.trans(user, 3, servicer="lisi")["errcode"] == 0
    elif reach == "agent_wrote":
        kf.control("agent", {"open_kfid": KF_A, "external_userid": user, "servicer_userid": "lisi", "text": "hi"})
    else:
        assert kf.trans(user, 1)["errcode"] == 0 and kf.trans(user, 4)["errcode"] == 0
    expected = {"pool": 2, "agent_trans": 3, "agent_wrote": 3, "ended": 4}[reach]
    assert kf.state(user)["service_state"] == expected
    assert kf.send(user, "must not arrive")["errcode"] == 95018
    assert [item["content"] for item in kf.sent(user)] == ["in state 0"]


def test_state_1_is_sendable(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    assert kf.trans(user, 1)["errcode"] == 0
    assert kf.state(user)["service_state"] == 1
    assert kf.send(user)["errcode"] == 0


ROUTE_TO = {0: [], 1: [(1, "")], 2: [(2, "")], 3: [(3, "wangwu")], 4: [(1, ""), (4, "")]}


@pytest.mark.parametrize("start", [0, 1, 2, 3, 4])
def test_only_the_allowed_trans_moves(kf: Kf, start: int) -> None:
    allowed = {0: {1, 2, 3}, 1: {1, 2, 3, 4}, 2: {2, 3, 4}, 3: {3, 4}, 4: set()}[start]
    for target in range(5):
        user = user_id()
        kf.customer(user)
        for state, servicer in ROUTE_TO[start]:
            assert kf.trans(user, state, servicer=servicer)["errcode"] == 0
        assert kf.state(user)["service_state"] == start
        answer = kf.trans(user, target, servicer="zhaoliu" if target == 3 else "")
        if target in allowed:
            assert answer["errcode"] == 0, (start, target, answer)
            assert kf.state(user)["service_state"] == target
        else:
            assert answer["errcode"] == (95013 if start == 4 else 95016), (start, target, answer)
            assert kf.state(user)["service_state"] == start


def test_trans_hands_out_msg_codes(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    assert "msg_code" not in kf.trans(user, 1)
    queued = kf.trans(user, 2)
    assert queued["msg_code"], "the first move to the pool gives a code"
    assert "msg_code" not in kf.trans(user, 3, servicer="qianqi"), "only the first move to 2 or 3"
    assert kf.trans(user, 3)["errcode"] == 95014, "a human agent must be named"
    assert kf.state(user) == {"errcode": 0, "errmsg": "ok", "service_state": 3, "servicer_userid": "qianqi"}
    ended = kf.trans(user, 4)
    assert ended["msg_code"] and ended["msg_code"] != queued["msg_code"]
    assert kf.send_on_event(queued["msg_code"], "正在为您转接人工客服")["errcode"] == 0
    assert kf.send_on_event(queued["msg_code"], "again")["errcode"] == 40058, "once"
    assert kf.send_on_event(ended["msg_code"], "再见")["errcode"] == 0
    delivered = kf.sent(user)
    assert [(item["via"], item["content"]) for item in delivered] == [
        ("send_msg_on_event", "正在为您转接人工客服"),
        ("send_msg_on_event", "再见"),
    ]
    assert delivered[0]["code"] == queued["msg_code"]
    kf.customer(user, "新问题")
    assert kf.state(user)["service_state"] == 0, "a customer message after the end starts a new session"
    assert kf.send(user)["errcode"] == 0


def test_welcome_code_once_and_within_its_window(kf: Kf) -> None:
    user = user_id()
    entered = kf.event(user, "enter_session", scene="123")
    code = entered["code"]
    items = kf.sync(token=entered["token"], open_kfid=KF_A)["msg_list"]
    assert items[-1]["event"]["welcome_code"] == code and items[-1]["event"]["scene"] == "123"
    assert kf.send_on_event(code, "您好")["errcode"] == 0
    assert kf.send_on_event(code, "您好 again")["errcode"] == 40058
    assert [(item["via"], item["code"]) for item in kf.sent(user)] == [("send_msg_on_event", code)]
    assert "code" not in kf.event(user, "enter_session"), "no second welcome within 48 hours"

    late = user_id()
    expired = kf.event(late, "enter_session", code_ttl_s=-1)["code"]
    assert kf.send_on_event(expired, "too late")["errcode"] == 40058
    assert kf.send_on_event("never-issued", "x")["errcode"] == 40058
    assert kf.sent(late) == []

    served = user_id()
    kf.customer(served)
    assert kf.send(served)["errcode"] == 0
    assert "code" not in kf.event(served, "enter_session"), "no welcome to a customer the API wrote to lately"


def test_event_replies_count_toward_the_quota(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    for i in range(4):
        assert kf.send(user, f"piece {i}")["errcode"] == 0
    first = kf.trans(user, 2)["msg_code"]
    assert kf.send_on_event(first, "转人工")["errcode"] == 0
    assert kf.session(user)["sent_since_customer"] == 5
    end = kf.trans(user, 4)["msg_code"]
    assert kf.send_on_event(end, "bye")["errcode"] == 95001
    assert len(kf.sent(user)) == 5


def test_a_welcome_days_later_is_not_held_to_an_old_quota(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    for _ in range(5):
        assert kf.send(user)["errcode"] == 0
    sess = kf.client.app.state.kf.sessions[(KF_A, user)]
    for name in ("started_at", "last_customer_at", "last_api_send_at"):
        setattr(sess, name, getattr(sess, name) - 49 * 3600)  # three days ago, as far as the simulator knows
    code = kf.event(user, "enter_session")["code"]
    assert kf.send_on_event(code, "欢迎回来")["errcode"] == 0
    assert kf.send(user)["errcode"] == 95002, "but send_msg still waits for the customer"


def test_session_status_change_events_move_the_state(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    assert kf.trans(user, 2)["errcode"] == 0
    taken = kf.event(user, "session_status_change", change_type=1, new_servicer_userid="sunba")
    assert taken["code"]
    assert kf.state(user)["service_state"] == 3 and kf.state(user)["servicer_userid"] == "sunba"
    moved = kf.event(user, "session_status_change", change_type=2, new_servicer_userid="zhoujiu")
    assert "code" not in moved and kf.state(user)["servicer_userid"] == "zhoujiu"
    ended = kf.event(user, "session_status_change", change_type=3)
    assert ended["code"] and kf.state(user)["service_state"] == 4
    items = kf.sync(token=ended["token"], open_kfid=KF_A)["msg_list"]
    changes = [item["event"] for item in items if item["origin"] == 4]
    assert [c["change_type"] for c in changes] == [1, 2, 3]
    assert changes[0]["msg_code"] == taken["code"] and "msg_code" not in changes[1]
    assert changes[1]["old_servicer_userid"] == "sunba" and changes[1]["new_servicer_userid"] == "zhoujiu"
    assert kf.send_on_event(taken["code"], "您好，我是客服孙八")["errcode"] == 0


def test_account_list(kf: Kf) -> None:
    listed = kf.api("account/list", {"offset": 0, "limit": 100})
    assert listed["errcode"] == 0
    assert [a["open_kfid"] for a in listed["account_list"]] == [KF_A, KF_B, KF_C]
    assert all(a["name"] and a["avatar"].startswith("https://") for a in listed["account_list"])
    assert [a["open_kfid"] for a in kf.api("account/list", {"offset": 1, "limit": 1})["account_list"]] == [KF_B]
    assert kf.api("account/list", {"offset": 3, "limit": 10})["account_list"] == []
    assert kf.api("account/list", {"limit": 101})["errcode"] == 40058
    assert kf.api("account/list", {"offset": -1})["errcode"] == 40058


def test_send_faults_and_a_lost_answer(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    kf.fault(endpoint="send_msg", errcode=-1)
    assert kf.send(user, "first try", msgid="t1-p0")["errcode"] == -1
    assert kf.sent(user) == [], "a refused send is not delivered"
    kf.fault(endpoint="send_msg", http_status=502, deliver=True)
    lost = kf.client.post(
        "/cgi-bin/kf/send_msg",
        params={"access_token": kf.access_token},
        json={"touser": user, "open_kfid": KF_A, "msgid": "t1-p0", "msgtype": "text", "text": {"content": "x"}},
    )
    assert lost.status_code == 502
    assert [item["msgid"] for item in kf.sent(user)] == ["t1-p0"], "delivered although the answer was lost"
    assert kf.send(user, "x", msgid="t1-p0")["errcode"] == ERR_MSGID_REPEATED, "so the retry is refused"
    kf.fault(endpoint="send_msg", errcode=42001)
    assert kf.send(user)["errcode"] == 42001
    assert kf.send(user)["errcode"] == 40014, "the token the fault expired stays expired"
    stats = kf.stats()
    assert stats["send_msg_calls"] == 5 and stats["delivered"] == 1


def test_service_state_faults_and_counters(kf: Kf) -> None:
    user = user_id()
    kf.customer(user)
    kf.fault(endpoint="service_state_trans", errcode=-1, times=2)
    assert kf.trans(user, 1)["errcode"] == -1
    assert kf.trans(user, 1)["errcode"] == -1
    assert kf.trans(user, 1)["errcode"] == 0
    kf.fault(endpoint="service_state_get", errcode=-1)
    assert kf.state(user)["errcode"] == -1
    kf.fault(endpoint="account_list", errcode=-1)
    assert kf.api("account/list", {})["errcode"] == -1
    stats = kf.stats()
    assert stats["service_state_trans_calls"] == 3 and stats["service_state_get_calls"] == 1
    assert stats["refusals"]["-1"] == 4 and stats["pending_faults"] == 0


def test_signed_kf_callback_decrypts_for_the_bot() -> None:
    bot = kf_bot()
    callback = WeComKfCallbackSigner(bot).kf_msg_or_event("ENCsometoken", KF_A, timestamp=1700000000)
    outer = ET.fromstring(callback.body)
    assert outer.findtext("ToUserName") == CORP and outer.find("AgentID") is None
    crypto = WeComCrypto(bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), CORP)
    params, encrypted = callback.params, outer.findtext("Encrypt")
    assert params["timestamp"] == "1700000000"
    plaintext = crypto.verify_and_decrypt(params["msg_signature"], params["timestamp"], params["nonce"], encrypted)
    inner = ET.fromstring(plaintext)
    assert {child.tag: child.text for child in inner} == {
        "ToUserName": CORP,
        "CreateTime": "1700000000",
        "MsgType": "event",
        "Event": "kf_msg_or_event",
        "Token": "ENCsometoken",
        "OpenKfId": KF_A,
    }
    other = WeComCrypto("another-token", bot.encoding_aes_key.get_secret_value(), CORP)
    with pytest.raises(CallbackRejected):
        other.verify(params["msg_signature"], params["timestamp"], params["nonce"], encrypted)
    wrong_corp = WeComCrypto(bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), "wwother")
    with pytest.raises(CallbackRejected):
        wrong_corp.decrypt(encrypted)


def test_playground_command_is_wired() -> None:
    args = cli.build_parser().parse_args(
        ["sim", "wecom-kf", "--config", "c.yaml", "--bot", "kf", "--customer", "wm1", "--open-kfid", KF_A, "你好"]
    )
    assert args.run is sim.wecom_kf
    assert (args.customer, args.open_kfid, args.text) == ("wm1", KF_A, "你好")


def test_playground_command_round_trip(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`botgw sim wecom-kf`: the customer writes, the gateway gets a callback it can verify, pulls with its Token and
    answers; the command prints the answer."""
    sim_port, gw_port = free_port(), free_port()
    bot = kf_bot().model_copy(update={"api_base": f"http://127.0.0.1:{sim_port}"})
    crypto = WeComCrypto(bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), CORP)
    gateway = FastAPI()
    pulled: list[dict[str, Any]] = []

    @gateway.post("/callback/kf")
    async def callback(request: Request, msg_signature: str, timestamp: str, nonce: str) -> dict[str, str]:
        encrypted = ET.fromstring(await request.body()).findtext("Encrypt")
        inner = ET.fromstring(crypto.verify_and_decrypt(msg_signature, timestamp, nonce, encrypted))
        async with httpx.AsyncClient(base_url=bot.api_base) as http:
            params = {"corpid": CORP, "corpsecret": SECRET}
            token = (await http.get("/cgi-bin/gettoken", params=params)).json()["access_token"]
            body = {"token": inner.findtext("Token"), "open_kfid": inner.findtext("OpenKfId")}
            page = (await http.post("/cgi-bin/kf/sync_msg", params={"access_token": token}, json=body)).json()
            pulled.extend(page["msg_list"])
            for item in page["msg_list"]:
                answer = {"touser": item["external_userid"], "open_kfid": item["open_kfid"], "msgtype": "text"}
                answer["text"] = {"content": "echo: " + item["text"]["content"]}
                await http.post("/cgi-bin/kf/send_msg", params={"access_token": token}, json=answer)
        return {"status": "ok"}

    servers = [
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
        for app, port in ((create_simulator_app([bot], sim_port), sim_port), (gateway, gw_port))
    ]
    threads = [threading.Thread(target=server.run, daemon=True) for server in servers]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 20
        while not all(server.started for server in servers):
            assert time.monotonic() < deadline, "servers did not start"
            time.sleep(0.05)
        settings = types.SimpleNamespace(bots=[bot])
        monkeypatch.setattr(sim, "load_settings", lambda path: settings)
        argv = ["sim", "wecom-kf", "--config", "unused.yaml", "--bot", "kf", "--customer", "wmplay"]
        code = cli.main([*argv, "--gateway", f"http://127.0.0.1:{gw_port}", "--timeout", "10", "你好"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out.strip() == "[send_msg] echo: 你好"
        assert [(item["origin"], item["open_kfid"]) for item in pulled] == [(3, KF_A)], "the bot's first account"
        silent = ["--gateway", f"http://127.0.0.1:{gw_port}", "--timeout", "0.5", "--open-kfid", "wkNOPE", "x"]
        assert cli.main([*argv, *silent]) == 1, "an unknown account: the simulator refuses the customer message"
    finally:
        for server in servers:
            server.should_exit = True
        for thread in threads:
            thread.join(10)


def test_with_a_state_file_a_restart_forgets_nothing_a_real_kefu_remembers(tmp_path: Path) -> None:
    """`sim serve --state FILE` (the playground's): the log, a cursor handed out, the session and what the customer
    saw are there after a restart; a cursor never issued is still refused, as before (never kinder)."""
    path, user = tmp_path / "simulator.json", user_id()
    with TestClient(create_simulator_app([kf_bot()], free_port(), path)) as client:
        before = Kf(client)
        before.customer(user, "第一条")
        page = before.sync(token=before.customer(user, "第二条")["token"], open_kfid=KF_A)
        assert [item["text"]["content"] for item in page["msg_list"]] == ["第一条", "第二条"]
        before.api("service_state/trans", {"open_kfid": KF_A, "external_userid": user, "service_state": 1})
        assert before.send(user, "答复")["errcode"] == 0
        later = before.customer(user, "第三条")
        assert client.get("/__sim__/kf/pulled", params={"msgid": later["msgids"][0]}).json() == {"pulled": False}
    assert path.exists() and not list(tmp_path.glob(".*.tmp")), "written whole, by a rename"

    with TestClient(create_simulator_app([kf_bot()], free_port(), path)) as client:
        after = Kf(client)  # a new access token: the old one is forgotten, which costs the gateway one refetch
        resumed = after.sync(token=later["token"], open_kfid=KF_A, cursor=page["next_cursor"])
        assert resumed["errcode"] == 0 and [item["text"]["content"] for item in resumed["msg_list"]] == ["第三条"]
        assert client.get("/__sim__/kf/pulled", params={"msgid": later["msgids"][0]}).json() == {"pulled": True}
        assert after.session(user)["service_state"] == 1 and after.session(user)["sent_since_customer"] == 0
        assert [item["content"] for item in after.sent(user)] == ["答复"]
        unknown = after.sync(token=after.customer(user)["token"], open_kfid=KF_A, cursor="never-issued")
        assert unknown["errcode"] == 40058, "an unknown cursor is refused after a restart as before it"


def test_a_state_file_that_cannot_be_read_stops_the_start_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "simulator.json"
    path.write_text('{"format": 1, "kf": {"log": "half', encoding="utf-8")
    with pytest.raises(StateFileError, match=r"simulator\.json is unreadable .*remove it"):
        create_simulator_app([kf_bot()], free_port(), path)
    assert path.read_text(encoding="utf-8").endswith("half"), "left as it was for a look"


def test_without_a_state_file_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with TestClient(create_simulator_app([kf_bot()], free_port())) as client:
        Kf(client).customer(user_id())
    assert list(tmp_path.iterdir()) == []


def a_saved_state(path: Path) -> dict[str, Any]:
    """A state file as the simulator writes it, with every kind of thing it keeps (for the tests to spoil)."""
    user = user_id()
    with TestClient(create_simulator_app([kf_bot()], free_port(), path)) as client:
        kf = Kf(client)
        kf.sync(token=kf.customer(user, "你好")["token"], open_kfid=KF_A)
        kf.customer(user, "照片", msgtype="image")
        assert kf.send_on_event(kf.event(user, "enter_session")["code"])["errcode"] == 0  # a welcome, delivered
        kf.control("agent", {"open_kfid": KF_A, "external_userid": user, "servicer_userid": "lisi", "text": "在"})
        kf.control("refuse", {"open_kfid": KF_B, "external_userid": user})
        kf.control("servicer", {"servicer_userid": "wangwu", "on_duty": False})
        kf.customer(user, "hi", open_kfid=KF_B)
        kf.api("service_state/trans", {"open_kfid": KF_B, "external_userid": user, "service_state": 1})
        assert kf.send(user, "答复", open_kfid=KF_B)["errcode"] == 0  # refused by the customer: msg_send_fail
        kf.send(user, "first", open_kfid=KF_C)  # refused (95018), nothing kept
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_kind_of_log_item_and_session_comes_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "simulator.json"
    saved = a_saved_state(path)
    assert {item["msgtype"] for _, item in saved["kf"]["log"]} == {"text", "image", "event"}
    assert saved["kf"]["delivered"] and saved["kf"]["codes"] and saved["kf"]["refusing"] and saved["kf"]["off_duty"]
    with TestClient(create_simulator_app([kf_bot()], free_port(), path)) as client:
        kf = Kf(client)
        everything = kf.client.app.state.kf.snapshot()
    assert everything == saved["kf"], "a restart changed what the simulator keeps"


def spoiled(saved: dict[str, Any], change: str) -> bytes:
    """The saved state with one thing wrong (each is something the file was once seen or could be made to hold)."""
    kf = saved["kf"]
    cursor = next(iter(kf["cursors"]))
    if change == "cursors-a-list":
        kf["cursors"] = []  # used to be an AttributeError: the simulator "failed unexpectedly"
    elif change == "deeply-nested":
        return b"[" * 100_000 + b"]" * 100_000  # used to be a RecursionError
    elif change == "deep-inside-an-event":
        deep = '"x": ' + "[" * 5000 + "]" * 5000 + ', "event_type"'
        return json.dumps(saved).replace('"event_type"', deep, 1).encode()
    elif change == "session-state-a-string":
        kf["sessions"][0][2]["state"] = "1"
    elif change == "session-unknown-state":
        kf["sessions"][0][2]["state"] = 7
    elif change == "log-item-a-number":
        kf["log"][0][1] = 5
    elif change == "text-item-without-text":
        del kf["log"][0][1]["text"]
    elif change == "cursor-position-a-string":
        kf["cursors"][cursor][1] = "SECRETVALUE"
    elif change == "code-of-unknown-kind":
        next(iter(kf["codes"].values()))["kind"] = "gift"
    elif change == "extra-key":
        kf["delivered"][0]["colour"] = "SECRETVALUE"
    elif change == "missing-key":
        del kf["used_msgids"]
    elif change == "format-2":
        saved["format"] = 2
    elif change == "a-list":
        return b"[]"
    elif change == "not-utf-8":
        return b'{"format": 1, "kf": "\xff\xfe"}'
    elif change == "cut-short":
        return json.dumps(saved).encode()[:-40]
    return json.dumps(saved).encode()


SPOILED = {
    "cursors-a-list": "kf.cursors: Input should be an object",
    "deeply-nested": "the file: Invalid JSON: recursion limit exceeded",
    "deep-inside-an-event": "the file: Invalid JSON: recursion limit exceeded",
    "session-state-a-string": "kf.sessions[0][2].state: Input should be 0, 1, 2, 3 or 4",
    "session-unknown-state": "kf.sessions[0][2].state: Input should be 0, 1, 2, 3 or 4",
    "log-item-a-number": "kf.log[0][1]: Input should be an object",
    "text-item-without-text": "kf.log[0][1]: Value error, a text item carries no body",
    "cursor-position-a-string": "kf.cursors[…][1]: Input should be a valid integer",
    "code-of-unknown-kind": "kf.codes[…].kind: Input should be 'welcome' or 'msg'",
    "extra-key": "kf.delivered[0][…]: Extra inputs are not permitted",
    "missing-key": "kf.used_msgids: Field required",
    "format-2": "format: Input should be 1",
    "a-list": "the file: Input should be an object",
    "not-utf-8": "the file: Invalid JSON",
    "cut-short": "the file: Invalid JSON: EOF while parsing",
}


@pytest.mark.parametrize("change", list(SPOILED))
def test_a_state_file_of_the_wrong_shape_is_refused_with_one_line(tmp_path: Path, change: str) -> None:
    path = tmp_path / "simulator.json"
    saved = a_saved_state(path)
    cursors = list(saved["kf"]["cursors"])
    bad = spoiled(saved, change)
    path.write_bytes(bad)
    with pytest.raises(StateFileError) as refused:
        create_simulator_app([kf_bot()], free_port(), path)
    said = str(refused.value)
    assert "\n" not in said and said.startswith(f"the simulator state {path} is unreadable ({SPOILED[change]}")
    assert said.endswith("); remove it to start the simulated platforms empty (`make clean` removes the whole "
                         "playground)")
    assert "SECRETVALUE" not in said and not any(cursor in said for cursor in cursors), "a value of the file shown"
    assert path.read_bytes() == bad, "left as it was for a look"


def kf_config(folder: Path) -> Path:
    bot = kf_bot()
    config = {"bots": [{"id": bot.id, "platform": "wecom-kf", "corp_id": CORP, "secret": SECRET, "token": "kfclitoken",
                        "encoding_aes_key": bot.encoding_aes_key.get_secret_value(), "open_kfids": [KF_A, KF_B, KF_C],
                        "accounts": {KF_C: {}}}]}  # fmt: skip
    path = folder / "botgw.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.mark.parametrize("content", [b'{"format": 1, "kf": {"cursors": []}}', b"[" * 100_000])
def test_botgw_sim_serve_with_a_bad_state_file_exits_2_with_one_line(tmp_path: Path, content: bytes) -> None:
    state = tmp_path / "simulator.json"
    state.write_bytes(content)
    argv = [*BOTGW, "sim", "serve", "--config", str(kf_config(tmp_path)), "--port", str(free_port())]
    done = subprocess.run([*argv, "--state", str(state)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"botgw sim serve: the simulator state {state} is unreadable (")


def test_the_state_file_is_this_user_s_only_and_rewritten_only_when_the_state_changed(tmp_path: Path) -> None:
    path, user = tmp_path / "simulator.json", user_id()
    old_umask = os.umask(0o022)
    try:
        with TestClient(create_simulator_app([kf_bot()], free_port(), path)) as client:
            kf = Kf(client)
            kf.customer(user)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, "it holds the Tokens and codes handed out"
            written = path.stat().st_ino
            assert kf.api("account/list", {})["errcode"] == 0 and kf.state(user)["errcode"] == 0  # reads only
            assert path.stat().st_ino == written, "rewritten though nothing it keeps changed"
            kf.trans(user, 1)
            assert path.stat().st_ino != written
    finally:
        os.umask(old_umask)


def test_a_failed_write_leaves_no_temporary_file_and_fails_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path, user = tmp_path / "simulator.json", user_id()
    with TestClient(create_simulator_app([kf_bot()], free_port(), path)) as client:
        kf = Kf(client)
        kf.customer(user, "第一条")
        before = path.read_bytes()

        def full_disk(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(state_file.os, "fsync", full_disk)
        answer = client.post("/__sim__/kf/customer", json={"open_kfid": KF_A, "external_userid": user, "text": "x"})
        assert answer.status_code == 503 and answer.json()["errcode"] == -1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["simulator.json"], "a temporary file was left"
        assert path.read_bytes() == before, "the file still holds the last state written"
        assert f"cannot write the simulator state {path}: No space left on device" in caplog.text
        monkeypatch.undo()

        kf.customer(user, "第三条")  # writes again, with everything since
        path.unlink()
        path.mkdir()  # a rename over a directory fails: the temporary file was made and must go
        answer = client.post(f"/cgi-bin/kf/service_state/trans?access_token={kf.access_token}",
                             json={"open_kfid": KF_A, "external_userid": user, "service_state": 1})  # fmt: skip
        assert answer.status_code == 503
        assert sorted(p.name for p in tmp_path.iterdir()) == ["simulator.json"], "a temporary file was left"
        path.rmdir()
    saved = json.loads(path.read_text(encoding="utf-8"))  # written on the way out
    assert [item["text"]["content"] for _, item in saved["kf"]["log"]] == ["第一条", "x", "第三条"]
