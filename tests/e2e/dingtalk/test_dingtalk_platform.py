"""DingTalk as its documents (and public clients' logs) describe it, where botgw once got it wrong: a refused
token is HTTP 400 InvalidAuthentication; oToMessages/batchSend's 200 lists the recipients it did not deliver
to; an ended sessionWebhook may answer 5xx; an AI card's create and deliver fail apart, before or after their
effect. Each on the real redis-server, gateway and worker against the simulator."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable

import httpx
import pytest

from bots.dingtalk.adapter import SESSION_TRIES
from gateway import texts
from simulator.dingtalk.user import robot_payload
from testkit.fakes.stub_engine import answer_for
from testkit.processes import wait_for
from testkit.stacks import Cluster, Stack
from tests.e2e.dingtalk.test_dingtalk import bot, replies_to, send, session_posts, signed_post


def sim(stack: Stack, path: str, body: dict | None = None) -> dict:
    response = httpx.post(f"{stack.sim_url}/__sim__/dingtalk/{path}", json=body or {}, timeout=5)
    response.raise_for_status()
    return response.json()


def test_a_revoked_token_refused_with_400_is_fetched_again(stack: Stack, user: str) -> None:
    """DingTalk refuses a revoked token with HTTP 400 {"code": "InvalidAuthentication"}, not 401: botgw fetches
    a new token once and the answer arrives, instead of a dead letter."""
    send(stack, "ding-http", user, "/help", webhook_ttl_s=1)  # an expired webhook: through the OpenAPI
    replies_to(stack, user, 1)
    assert sim(stack, "tokens/revoke")["revoked"] >= 1
    dead_before = stack.dead_letters()
    send(stack, "ding-http", user, "/help", webhook_ttl_s=1)
    mine = replies_to(stack, user, 2)
    assert [(m["via"], m["content"]) for m in mine] == [("openapi", texts.HELP_TEXT)] * 2
    assert stack.dead_letters() == dead_before


def test_a_flow_controlled_recipient_is_answered_once_the_platform_accepts(stack: Stack, user: str) -> None:
    """batchSend answers 200 with the user in flowControlledStaffIdList while their rate is used up (8 s of it
    here): the answer is not taken as sent, and arrives once, soon after the platform accepts again."""
    sim(stack, "throttle", {"throttle_s": 8})
    try:
        session = {"conversation": f"cid-single-{user}", "user": user, "group": False, "ttl_s": 3600}
        webhook = sim(stack, "session", session)
        for i in range(20):  # another sender fills the person's minute
            body = {"msgtype": "text", "text": {"content": f"someone else {i}"}}
            assert httpx.post(webhook["url"], json=body, timeout=5).json()["errcode"] == 0
        refused_before = sim(stack, "throttle", {"throttle_s": 8})["not_delivered"]
        dead_before = stack.dead_letters()
        started = time.monotonic()
        send(stack, "ding-http", user, "/help", webhook_ttl_s=1)  # answered through the OpenAPI
        mine = replies_to(stack, user, 21)
        took = time.monotonic() - started
        assert [(m["via"], m["content"]) for m in mine[20:]] == [("openapi", texts.HELP_TEXT)]
        assert sim(stack, "throttle", {"throttle_s": 8})["not_delivered"] > refused_before, "never flow-controlled"
        assert 7.0 <= took < 60.0, f"answered after {took:.1f} s"
        assert stack.dead_letters() == dead_before
    finally:
        sim(stack, "throttle", {"throttle_s": 600})


@pytest.mark.parametrize("status", ["invalid", "filtered"])
def test_a_recipient_dingtalk_will_not_deliver_to_is_a_dead_letter_that_says_why(
    stack: Stack, user: str, status: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """batchSend's 200 with the user in invalidStaffIdList (or filteredStaffIdList) is a failed delivery, not
    retried: a dead letter whose reason names the list, in `botgw dlq list`."""
    from gateway.cli import main

    sim(stack, "staff", {"user": user, "status": status})
    try:
        dead_before = stack.dead_letters()
        send(stack, "ding-http", user, "/help", webhook_ttl_s=1)
        wait_for(lambda: stack.dead_letters() > dead_before, 30, "the answer to be dead-lettered")
        capsys.readouterr()
        assert main(["dlq", "list", "--config", str(stack.config_path)]) == 0
        (letter,) = [item for item in json.loads(capsys.readouterr().out) if item["user"] == user]
        assert f"{status}StaffIdList" in letter["reason"] and "failed 1 times" in letter["reason"], letter
    finally:
        sim(stack, "staff", {"user": user, "status": ""})


def test_an_ended_session_webhook_answering_5xx_falls_back_to_the_openapi(stack: Stack) -> None:
    """A sessionWebhook that DingTalk ended and that answers 502 (not 300001) is tried SESSION_TRIES times,
    then the answer goes through the OpenAPI."""
    other = "g" + secrets.token_hex(4)
    session = {"conversation": f"cid-{other}", "user": other, "group": False, "ttl_s": 3600}
    webhook = sim(stack, "session", session)
    sim(stack, "session/expire", {"session": httpx.URL(webhook["url"]).params["session"], "http_status": 502})
    payload = robot_payload(bot(stack, "ding-http"), other, "/help", conversation=f"cid-{other}", group=False,
                            webhook=webhook)  # fmt: skip
    dead_before = stack.dead_letters()
    assert signed_post(stack, payload, int(time.time() * 1000)).status_code == 200
    (reply,) = replies_to(stack, other, 1)
    assert (reply["via"], reply["content"]) == ("openapi", texts.HELP_TEXT)
    assert session_posts(stack, payload) == {"posts": SESSION_TRIES, "refused": SESSION_TRIES}
    assert stack.dead_letters() == dead_before


def cards(stack: Stack) -> dict[str, list[dict]]:
    return httpx.get(f"{stack.sim_url}/__sim__/dingtalk/cards", timeout=5).json()


@pytest.mark.parametrize(
    "fault",
    [
        {"endpoint": "card.deliver", "http_status": 503, "times": 5},  # every try of the first attempt, before
        {"endpoint": "card.deliver", "http_status": 503, "times": 1, "after": True},  # delivered, then a 503
        {"endpoint": "card.create", "http_status": 503, "times": 1, "after": True},  # created, then a 503
    ],
    ids=["deliver-fails", "deliver-fails-after", "create-fails-after"],
)
def test_a_card_whose_create_or_deliver_fails_is_delivered_once_and_finished(
    stack: Stack, cluster: Callable[..., Cluster], user: str, fault: dict
) -> None:
    """A transient failure of the card's create or deliver (before or after its effect) never re-creates a
    card DingTalk has (a second create of one outTrackId is refused: UNCONFIRMED, the harsher reading): the
    user gets one card, delivered once and finished with the answer."""
    made = cluster(delay_s=0.2)
    made.add_gateway()
    made.add_worker("w1")
    before = set(cards(stack))
    sim(stack, "faults", fault)
    question = f"What is a card, {user}?"
    send(made.stack, "ding-card", user, question)
    space = f"dtv1.card//IM_ROBOT.{user}"

    def mine() -> dict[str, list[dict]]:
        return {track: events for track, events in cards(stack).items() if track not in before}

    def finished() -> bool:
        return any(e["op"] == "status" and e["flowStatus"] == "3" for events in mine().values() for e in events)

    wait_for(finished, 60, f"the card to be finished:\n{made.procs['w1'].tail()}")
    time.sleep(1.0)  # room for anything more
    delivered = {t: events for t, events in mine().items() if any(e.get("openSpaceId") == space for e in events)}
    assert len(delivered) == 1, mine()
    (events,) = delivered.values()
    ops = [e["op"] for e in events]
    assert ops.count("create") == 1 and ops.count("deliver") == 1 and ops[:2] == ["create", "deliver"], ops
    answer = answer_for(question)
    assert events[-1]["op"] == "status" and events[-1]["content"] == answer
    assert [e["content"] for e in events if e["op"] == "stream" and e["finalize"]] == [answer]
    assert made.stack.dead_letters() == 0
