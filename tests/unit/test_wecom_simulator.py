"""The simulated WeCom app API is never kinder than WeCom: a token is one app's, a non-member is refused (81013)."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from simulator.wecom.api import wecom_api_router
from simulator.wecom.control import wecom_control_router
from simulator.wecom.state import WeComApiState

APP_A, APP_B = ("wwcorp", "secret-a"), ("wwcorp", "secret-b")


def client() -> httpx.AsyncClient:
    app = FastAPI()
    state = WeComApiState(apps={APP_A, APP_B}, agents={1: APP_A, 2: APP_B})
    app.include_router(wecom_api_router(state))
    app.include_router(wecom_control_router(state))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://wecom")


async def token(http: httpx.AsyncClient, app: tuple[str, str]) -> str:
    answer = await http.get("/cgi-bin/gettoken", params={"corpid": app[0], "corpsecret": app[1]})
    return str(answer.json()["access_token"])


def text(agentid: int, touser: str) -> dict:
    return {"touser": touser, "msgtype": "text", "agentid": agentid, "text": {"content": "hi"}}


async def test_a_token_of_one_app_is_refused_by_another() -> None:
    async with client() as http:
        a = await token(http, APP_A)
        sent = await http.post("/cgi-bin/message/send", params={"access_token": a}, json=text(1, "zhangsan"))
        assert sent.json()["errcode"] == 0
        refused = await http.post("/cgi-bin/message/send", params={"access_token": a}, json=text(2, "zhangsan"))
        assert refused.json()["errcode"] == 40014
        assert len((await http.get("/__sim__/wecom/messages")).json()) == 1


async def test_a_user_who_is_not_a_member_is_refused_and_gets_nothing() -> None:
    """Doc 90236: when every recipient is invalid the call fails with errcode 81013 (not errcode 0 + invaliduser,
    which is the answer when only some of a list are)."""
    async with client() as http:
        await http.post("/__sim__/wecom/unknown-user", json={"userid": "left-the-company"})
        a = await token(http, APP_A)
        answer = await http.post("/cgi-bin/message/send", params={"access_token": a}, json=text(1, "left-the-company"))
        assert answer.json()["errcode"] == 81013 and answer.json()["invaliduser"] == "left-the-company"
        assert (await http.get("/__sim__/wecom/messages")).json() == []


async def test_a_fault_aimed_at_one_member_is_not_spent_on_sends_to_another() -> None:
    """Tests share one simulator: a fault for one member's send must meet that send, whoever else is sent to."""
    async with client() as http:
        await http.post("/__sim__/wecom/faults", json={"errcode": 60020, "times": 1, "after": 1, "touser": "lisi"})
        a = await token(http, APP_A)
        for _ in range(3):
            other = await http.post("/cgi-bin/message/send", params={"access_token": a}, json=text(1, "zhangsan"))
            assert other.json()["errcode"] == 0
        first = await http.post("/cgi-bin/message/send", params={"access_token": a}, json=text(1, "lisi"))
        assert first.json()["errcode"] == 0, "`after` counts only the member's own sends"
        refused = await http.post("/cgi-bin/message/send", params={"access_token": a}, json=text(1, "lisi"))
        assert refused.json()["errcode"] == 60020
        again = await http.post("/cgi-bin/message/send", params={"access_token": a}, json=text(1, "lisi"))
        assert again.json()["errcode"] == 0


async def test_a_fault_aimed_at_a_member_of_a_call_that_names_none_is_refused() -> None:
    async with client() as http:
        refused = await http.post("/__sim__/wecom/faults", json={"endpoint": "gettoken", "touser": "lisi"})
        assert refused.status_code == 422 and "touser" in refused.text
        assert (await http.get("/__sim__/wecom/stats")).json()["pending_faults"] == 0
