"""微信客服 under faults, end to end: the simulated Kefu API fails once where a review found a once-only step
marked before its call, and a customer's photo is followed by a question. Gateway and worker are processes;
the same fixture as tests/e2e/wecom_kf/test_kf.py (own namespace, own simulator)."""

from __future__ import annotations

import time

import httpx
import pytest

from gateway import texts
from testkit.processes import wait_for
from tests.kf_env import HANDOFF_NOTICE, KFID, Kf, customer

BUSY = {"errcode": -1, "errmsg": "system busy"}  # WeCom's documented transient answer, retried by botgw


def test_a_photo_then_a_question_within_the_merge_window_gets_the_question_answered(kf: Kf, live_engine: str) -> None:
    person = customer()
    kf.write(person, "", msgtype="image")
    kf.write(person, "这是什么问题？")
    answers = kf.wait_sent(person, 1, timeout=90, settle=4.0)
    assert len(answers) == 1 and answers[0]["content"] != texts.TEXT_ONLY_TEXT, "the question was lost"
    users = [turn["content"] for turn in kf.memory(person) if turn["role"] == "user"]
    assert users == ["这是什么问题？"]


def test_a_handoff_keyword_right_behind_a_question_is_a_handoff_not_part_of_it(kf: Kf) -> None:
    person = customer()
    kf.write(person, "/help")
    kf.write(person, "转人工")
    sent = kf.wait_sent(person, 2, timeout=30, settle=3.0)
    assert [item["content"] for item in sent] == [texts.HELP_TEXT, HANDOFF_NOTICE]
    assert kf.session(person)["service_state"] == 2


@pytest.mark.parametrize("failing", ["service_state_trans", "send_msg_on_event"])
def test_a_handoff_whose_move_or_notice_fails_once_is_finished_on_the_retry_once(kf: Kf, failing: str) -> None:
    person = customer()
    kf.write(person, "/help")
    kf.wait_sent(person, 1)
    kf.sim("POST", "/__sim__/kf/faults", json={"endpoint": failing, **BUSY, "times": 1})
    kf.write(person, "转人工")
    handed = kf.wait_sent(person, 2, timeout=60, settle=3.0)
    assert [(item["via"], item["content"]) for item in handed[1:]] == [("send_msg_on_event", HANDOFF_NOTICE)]
    assert kf.session(person)["service_state"] == 2, "the customer who asked for a human stayed with the bot"


def test_a_welcome_whose_send_fails_once_is_sent_on_the_retry(kf: Kf) -> None:
    person = customer()
    kf.sim("POST", "/__sim__/kf/faults", json={"endpoint": "send_msg_on_event", **BUSY, "times": 1})
    entered = kf.event(person, "enter_session")
    assert kf.callback(entered["token"]).status_code == 200
    welcome = kf.wait_sent(person, 1, timeout=20, settle=2.0)
    assert [item["content"] for item in welcome] == ["欢迎光临，我是智能客服。"], "the welcome was taken for sent"


def test_a_cursor_the_platform_refuses_is_dropped_and_the_pull_starts_again(kf: Kf) -> None:
    from gateway.state.keys import Keys

    cursor_key = Keys(kf.namespace).pull_cursor("kefu", "wk-test-support")
    first = customer()
    kf.write(first, "/help")
    kf.wait_sent(first, 1)
    kf.redis.set(cursor_key, "a-cursor-this-simulator-never-issued")  # as after `make stop && make run`
    dead_before = kf.redis.xlen(Keys(kf.namespace).dead_letters)
    person = customer()
    kf.write(person, "/help")
    answers = kf.wait_sent(person, 1, timeout=30)
    assert [item["content"] for item in answers] == [texts.HELP_TEXT], "the account went silent"
    wait_for(lambda: kf.redis.get(cursor_key) not in (None, b"a-cursor-this-simulator-never-issued"), 10, "a cursor")
    time.sleep(1.0)
    assert kf.redis.xlen(Keys(kf.namespace).dead_letters) == dead_before, "the refused pull became a dead letter"
    assert kf.sent(first) and len(kf.sent(first)) == 1, "history was answered again after the reset"


def test_a_message_the_platform_reports_undelivered_is_recorded_against_its_reply_and_dead_lettered(kf: Kf) -> None:
    from gateway.state.keys import Keys

    keys = Keys(kf.namespace)
    person = customer()
    kf.sim("POST", "/__sim__/kf/refuse", json={"open_kfid": KFID, "external_userid": person})
    dead_before, sends_before = kf.redis.xlen(keys.dead_letters), kf.calls("send_msg")
    kf.write(person, "/help")  # accepted by send_msg, then reported by the platform: msg_send_fail, fail_type 10
    wait_for(lambda: kf.calls("send_msg") > sends_before, 20, "the send")
    kf.write(customer(), "/help")  # the next callback's pull finds the platform's report in the log

    def marked() -> bool:
        return any(kf.redis.hget(key, "send_failed") == b"10:0" for key in kf.redis.scan_iter(keys.reply("*")))

    wait_for(marked, 20, "the reply record to say its piece was not delivered")
    assert kf.sent(person) == []
    time.sleep(1.0)
    assert kf.redis.xlen(keys.dead_letters) == dead_before, "the customer's own refusal is no operator's business"


def test_a_handoff_to_a_servicer_not_on_duty_goes_to_the_queue_and_the_customer_is_told(kf: Kf) -> None:
    from gateway.cli import main

    person = customer()
    kf.write(person, "/help")
    kf.wait_sent(person, 1)
    kf.sim("POST", "/__sim__/kf/servicer", json={"servicer_userid": "agent-off", "on_duty": False})
    args = ["kf", "handoff", "--config", str(kf.path), "--bot", "kefu", "--customer", person, "--servicer", "agent-off"]
    assert main(args) == 0
    handed = kf.wait_sent(person, 2, timeout=30)
    assert handed[1]["content"] == HANDOFF_NOTICE and handed[1]["code"], "the customer was not told"
    assert kf.session(person)["service_state"] == 2, "95014 left the customer with the bot"


def test_a_piece_whose_answer_was_lost_is_resent_refused_and_the_rest_of_the_answer_still_goes(kf: Kf) -> None:
    from gateway.state.keys import Keys

    person = customer()
    kf.write(person, "/help")
    kf.wait_sent(person, 1)
    dead_before = kf.redis.xlen(Keys(kf.namespace).dead_letters)
    refused_before = kf.stats()["refusals"].get("40058", 0)
    # The next send is delivered and its answer lost: the resend with the same msgid is refused (no documented code).
    kf.sim("POST", "/__sim__/kf/faults", json={"endpoint": "send_msg", "deliver": True, "http_status": 502})
    kf.enqueue_notice(person, "".join(f"第{i}段。" for i in range(900)))  # over 5 pieces: the 3 allowed are sent
    sent = kf.wait_sent(person, 4, timeout=60, settle=3.0)
    pieces = [item["content"] for item in sent[1:]]
    assert len(pieces) == 3 and len(set(pieces)) == 3, "a piece was doubled or the rest of the answer dropped"
    assert kf.redis.xlen(Keys(kf.namespace).dead_letters) == dead_before, "the refused resend became a dead letter"
    assert kf.stats()["refusals"].get("40058", 0) == refused_before + 1, "the resend was never refused"


def test_a_kefu_callback_at_the_shared_apps_url_is_pulled_and_answered(kf: Kf) -> None:
    person = customer()
    token = kf.write(person, "/help", callback=False)
    assert kf.callback(token, to="staff").status_code == 200  # the app's one callback URL (`app: staff`)
    answers = kf.wait_sent(person, 1, timeout=30)
    assert [item["content"] for item in answers] == [texts.HELP_TEXT], "the Kefu callback was dropped"


def test_a_kefu_callback_for_an_account_not_served_is_acknowledged_at_the_apps_url_not_refused(kf: Kf) -> None:
    from simulator.wecom_kf.signer import WeComKfCallbackSigner

    signed = WeComKfCallbackSigner(kf.bot).kf_msg_or_event("some-token", "wk-another-account")
    answer = httpx.post(f"{kf.gateway_url}/callback/staff", params=signed.params, content=signed.body, timeout=10)
    assert answer.status_code == 200, "a 400 would make WeCom retry it for ever"


def test_a_pull_failing_longer_than_any_message_is_retried_is_kept_until_the_customer_is_answered(kf: Kf) -> None:
    """sync_msg fails past `max_send_attempts` (5 here: the old give-up, after about 3 s), then recovers: the pull
    was never given up, so the customer is answered with no other callback (a quiet account may send none)."""
    from gateway.state.keys import Keys

    dead = Keys(kf.namespace).dead_letters
    dead_before, pulls_before = kf.redis.xlen(dead), kf.calls("sync_msg")
    failing = kf.config["worker"]["max_send_attempts"] + 1
    kf.sim("POST", "/__sim__/kf/faults", json={"endpoint": "sync_msg", **BUSY, "times": failing})
    person = customer()
    kf.write(person, "/help")  # the one callback
    answers = kf.wait_sent(person, 1, timeout=90)
    assert [item["content"] for item in answers] == [texts.HELP_TEXT], "the customer was never answered"
    assert kf.calls("sync_msg") - pulls_before >= failing + 1
    assert kf.redis.xlen(dead) == dead_before, "the pull became a dead letter"
