"""微信客服 end to end: the simulated Kefu API, a gateway, workers, real Redis (and the real engine where an
answer's content is checked). Every message arrives the way WeCom delivers it: the customer writes (the
simulator logs it), WeCom POSTs a signed "pull" callback, botgw pulls kf/sync_msg and answers by kf/send_msg.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time

import httpx
import pytest

from bots.wecom_kf.config import WeComKfConfig
from gateway import texts
from gateway.state.keys import Keys
from testkit.configs import random_aes_key, stack_config, write_config
from testkit.processes import BOTGW, Proc, free_port, wait_for, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import Stack
from tests.kf_env import HANDOFF_NOTICE, KFID, Kf, customer


def test_the_same_callback_three_times_is_one_pull_and_one_answer(kf: Kf) -> None:
    person = customer()
    pulls_before = kf.calls("sync_msg")
    token = kf.write(person, "/help")
    for _ in range(2):  # WeCom's retries of the unacknowledged callback
        assert kf.callback(token).status_code == 200
    delivered = kf.wait_sent(person, 1, settle=2.0)
    assert [item["content"] for item in delivered] == [texts.HELP_TEXT]
    assert kf.calls("sync_msg") - pulls_before == 1
    assert kf.session(person)["service_state"] == 1, "the bot took the session (0 → 1) before answering"


def test_welcome_on_enter_session_once_within_20_s(kf: Kf) -> None:
    person = customer()
    started = time.time()
    entered = kf.event(person, "enter_session")
    for _ in range(2):
        assert kf.callback(entered["token"]).status_code == 200
    welcome = kf.wait_sent(person, 1, timeout=20, settle=2.0)
    assert [(item["via"], item["content"]) for item in welcome] == [("send_msg_on_event", "欢迎光临，我是智能客服。")]
    assert welcome[0]["at"] - started < 20


def test_handoff_by_keyword_then_the_bot_is_quiet_until_the_session_ends(kf: Kf) -> None:
    person = customer()
    kf.write(person, "/help")
    kf.wait_sent(person, 1)
    kf.write(person, "转人工！")
    handed = kf.wait_sent(person, 2)
    assert handed[1]["via"] == "send_msg_on_event" and handed[1]["content"] == HANDOFF_NOTICE and handed[1]["code"]
    assert kf.session(person)["service_state"] == 2, "trans to the pool"

    kf.write(person, "还有人吗？")
    kf.sim("POST", "/__sim__/kf/agent", json={"open_kfid": KFID, "external_userid": person,
                                              "servicer_userid": "agent-zhang", "text": "您好，我是小张"})  # fmt: skip
    kf.write(person, "好的谢谢")
    wait_for(lambda: any(turn["content"] == "好的谢谢" for turn in kf.memory(person)), 30, "the pull of the last one")
    time.sleep(1.0)
    assert len(kf.sent(person)) == 2, "the bot spoke while a human held the session"
    contents = [(turn["role"], turn["content"]) for turn in kf.memory(person)]
    assert ("user", "还有人吗？") in contents and ("assistant", "您好，我是小张") in contents

    ended = kf.event(person, "session_status_change", change_type=3)  # the agent ends the session (state 4)
    assert kf.callback(ended["token"]).status_code == 200
    wait_for(lambda: kf.session(person)["service_state"] == 4, 10, "the session to end")
    kf.write(person, "/help")  # a new session starts at 0, and the bot answers again
    again = kf.wait_sent(person, 3)
    assert again[2]["content"] == texts.HELP_TEXT and kf.session(person)["service_state"] == 1


def test_five_messages_in_48_hours_one_kept_for_the_handoff_and_renewed_when_the_customer_writes(kf: Kf) -> None:
    from gateway.cli import main

    person = customer()
    kf.write(person, "/help")
    kf.wait_sent(person, 1)
    kf.enqueue_notice(person, "很长的回答。" * 1200)  # 21,600 bytes: 11 pieces, 3 slots left for answers
    long = kf.wait_sent(person, 4, settle=2.0)
    assert len(long) == 4 and long[3]["content"].endswith(texts.ANSWER_CUT_TEXT), "cut visibly at the quota"
    refused_before = kf.stats()["refusals"].get("95001", 0)
    kf.enqueue_notice(person, "one message too many")
    time.sleep(3.0)
    assert len(kf.sent(person)) == 4, "a 5th answer message would leave no slot for a handoff"

    kf.write(person, "/help")  # the customer writes again: the allowance starts over
    renewed = kf.wait_sent(person, 5)
    assert renewed[4]["content"] == texts.HELP_TEXT and kf.session(person)["sent_since_customer"] == 1
    kf.enqueue_notice(person, "又一个很长的回答。" * 1000)
    assert len(kf.wait_sent(person, 8, settle=2.0)) == 8, "3 more answer messages, the 5th slot kept"

    assert main(["kf", "handoff", "--config", str(kf.path), "--bot", "kefu", "--customer", person]) == 0
    handed = kf.wait_sent(person, 9)
    assert handed[8]["via"] == "send_msg_on_event" and handed[8]["content"] == HANDOFF_NOTICE
    assert kf.session(person)["sent_since_customer"] == 5
    assert kf.stats()["refusals"].get("95001", 0) == refused_before, "botgw never tried a 6th message"


def test_95018_is_a_human_holding_the_session_not_an_error(kf: Kf) -> None:
    person = customer()
    kf.write(person, "/help")
    kf.wait_sent(person, 1)
    dead_before = kf.redis.xlen(Keys(kf.namespace).dead_letters)
    state_calls_before = kf.calls("service_state_get")
    send_calls_before = kf.calls("send_msg")
    kf.sim("POST", "/__sim__/kf/faults", json={"endpoint": "send_msg", "errcode": 95018, "times": 1})
    kf.write(person, "/help")
    wait_for(lambda: kf.calls("send_msg") > send_calls_before, 30, "the send that is refused")
    time.sleep(3.0)
    assert kf.calls("send_msg") - send_calls_before == 1, "a refused send was retried"
    assert len(kf.sent(person)) == 1
    assert kf.redis.xlen(Keys(kf.namespace).dead_letters) == dead_before
    assert kf.calls("service_state_get") > state_calls_before, "the state was not refreshed"
    assert '"level": "ERROR"' not in kf.worker_log()


def test_a_burst_within_the_merge_window_gets_one_answer(kf: Kf, live_engine: str) -> None:
    person = customer()
    for text in ("你好", "我想问一下", "你们几点开门？"):
        kf.write(person, text)
        time.sleep(0.4)
    answer = kf.wait_sent(person, 1, timeout=90, settle=4.0)
    assert len(answer) == 1, "three messages in two seconds are one question"
    users = [turn["content"] for turn in kf.memory(person) if turn["role"] == "user"]
    assert users == ["你好\n我想问一下\n你们几点开门？"]


def test_a_first_start_skips_history_but_never_the_message_that_called_back(kf: Kf) -> None:
    kf.redis.delete(Keys(kf.namespace).pull_cursor("kefu", KFID))  # as on the day the bot is configured
    earlier, caller = customer(), customer()
    kf.write(earlier, "/help", callback=False, send_time=time.time() - 600)
    token = kf.write(caller, "/help", callback=False, send_time=time.time() - 300)  # its callback came late
    assert kf.callback(token).status_code == 200
    assert [item["content"] for item in kf.wait_sent(caller, 1, settle=2.0)] == [texts.HELP_TEXT]
    assert kf.sent(earlier) == [], "history was answered on a first start"


def test_1200_messages_between_two_callbacks_pulled_across_pages_answered_once_despite_a_crash(kf: Kf) -> None:
    first, people = customer(), [customer() for _ in range(1200)]
    kf.write(first, "/help")  # the callback before the 1,200
    kf.wait_sent(first, 1)
    cursor_key = Keys(kf.namespace).pull_cursor("kefu", KFID)
    cursor_before = kf.redis.get(cursor_key)
    assert cursor_before, "the first pull saved its cursor"

    kf.procs.pop("worker-1").stop()
    delivered_before = kf.stats()["delivered"]
    tokens = [kf.write(person, "/help", callback=False) for person in people]
    # Page 2 hangs: the worker has queued page 1 (1,000 items) when it is killed.
    kf.sim("POST", "/__sim__/kf/faults", json={"endpoint": "sync_msg", "after": 1, "delay_s": 15, "times": 1})
    pulls_before = kf.calls("sync_msg")
    assert kf.callback(tokens[-1]).status_code == 200  # the callback after the 1,200
    kf.procs["worker-2"] = start_worker(kf.path, kf.log_dir, f"{kf.namespace}-w2")
    wait_for(lambda: kf.calls("sync_msg") - pulls_before >= 2, 60, "the pull of page 2")
    kf.procs["worker-2"].kill(signal.SIGKILL)
    kf.procs.pop("worker-2").popen.wait(5)
    # What a crash between queueing page 1 and saving its cursor leaves: the old cursor.
    kf.redis.set(cursor_key, cursor_before)
    kf.procs["worker-3"] = start_worker(kf.path, kf.log_dir, f"{kf.namespace}-w3")

    deadline = time.monotonic() + 240
    while kf.stats()["delivered"] - delivered_before < len(people):  # a cheap count, not the whole list
        assert time.monotonic() < deadline, "not every customer was answered in 240 s"
        time.sleep(1.0)
    time.sleep(3.0)
    per_person: dict[str, int] = {}
    for item in kf.sent(""):
        per_person[item["touser"]] = per_person.get(item["touser"], 0) + 1
    assert all(per_person.get(person) == 1 for person in people), "a customer got no answer or two"


class _DictTokens:
    """A TokenStore in a dict (the client's own logic is under test, not Redis)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    async def get(self, name: str) -> str | None:
        return self.values.get(name)

    async def put(self, name: str, token: str, ttl_s: float) -> None:
        self.values[name] = token

    async def invalidate(self, name: str, token: str) -> None:
        if self.values.get(name) == token:
            del self.values[name]

    def refresh_lock(self, name: str):  # type: ignore[no-untyped-def]
        return _NoLock()


class _NoLock:
    async def __aenter__(self) -> object:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_a_token_refused_even_when_fresh_is_retried_not_dead_lettered() -> None:
    """WeCom refusing a just-fetched token (42001 twice) is a RetryableSendError, as for app sends: the message
    is tried again later instead of going to the dead letters."""
    from bots.base import RetryableSendError
    from bots.wecom_kf.client import KfApiClient

    fetched = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/gettoken"):
            fetched.append(1)
            return httpx.Response(200, json={"errcode": 0, "access_token": f"t{len(fetched)}", "expires_in": 7200})
        return httpx.Response(200, json={"errcode": 42001, "errmsg": "access_token expired"})

    config = WeComKfConfig(
        id="kefu", corp_id="wwkf1", secret="s" * 24, token="t" * 8, encoding_aes_key=random_aes_key(),
        open_kfids=["wkA"], api_base="https://qyapi.weixin.qq.com",
    )  # fmt: skip

    async def send() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            await KfApiClient(config, http, _DictTokens()).send_text("wkA", "wmC", "hello", "m1")  # type: ignore[arg-type]

    with pytest.raises(RetryableSendError) as raised:
        asyncio.run(send())
    # the first token, one refetch, and the refused refetch replaced so that the retry starts with a new one
    assert raised.value.code == "token" and len(fetched) == 3


def test_a_handoff_for_a_customer_with_no_session_says_so_and_exits_1(
    kf: Kf, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to print "queued", exit 0, and the worker dead-lettered the move with 95013."""
    from gateway.cli import main

    person = customer()  # never wrote: WeCom reads the session as 4 (ended or never started)
    stats = Keys(kf.namespace).scheduler_stats
    queued_before = int(kf.redis.hget(stats, "enqueued") or 0)
    asked_before, moves_before = kf.calls("service_state_get"), kf.calls("service_state_trans")
    assert main(["kf", "handoff", "--config", str(kf.path), "--bot", "kefu", "--customer", person]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        f"botgw kf handoff: {person} has no open session with {KFID} (ended, or never started): "
        "nothing to hand off until they write again"
    ]
    assert kf.calls("service_state_get") == asked_before + 1, "the platform was asked"
    assert int(kf.redis.hget(stats, "enqueued") or 0) == queued_before, "nothing was queued"
    time.sleep(1.0)
    assert kf.calls("service_state_trans") == moves_before


def test_sim_after_a_handoff_reports_the_human_holding_the_session_as_success(
    kf: Kf, capsys: pytest.CaptureFixture[str]
) -> None:
    """Silence is the right answer while a human (or the queue for one) holds the session: exit 0, said so, and
    without waiting out --timeout."""
    from gateway.cli import main

    person = customer()
    kf.write(person, "/help")
    kf.wait_sent(person, 1)
    assert main(["kf", "handoff", "--config", str(kf.path), "--bot", "kefu", "--customer", person]) == 0
    wait_for(lambda: kf.session(person)["service_state"] == 2, 30, "the worker's move to the queue")
    kf.wait_sent(person, 2)  # the handoff notice
    capsys.readouterr()
    started = time.monotonic()
    argv = ["sim", "wecom-kf", "--config", str(kf.path), "--bot", "kefu", "--customer", person]
    assert main([*argv, "--gateway", kf.gateway_url, "--timeout", "60", "还在吗？"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "no answer (the session is with a human)", err
    assert "Traceback" not in err
    assert time.monotonic() - started < 30, "it waited for an answer that cannot come"
    assert len(kf.sent(person)) == 2
    wait_for(lambda: any(turn["content"] == "还在吗？" for turn in kf.memory(person)), 30, "botgw to keep the message")


def test_the_admin_handoff_asks_the_platform_first_like_the_command(stack: Stack) -> None:
    """POST /admin/kf/{bot}/handoff for a customer with no session: 409 and nothing queued (it used to answer 202
    and the worker dead-lettered the move); for one who wrote: 202, and the session goes to the queue."""
    namespace = "ka" + secrets.token_hex(4)
    sim_port, port = free_port(), free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    token = secrets.token_urlsafe(24)
    bot = {"id": "kefu", "platform": "wecom-kf", "corp_id": "wwka" + secrets.token_hex(5),
           "secret": secrets.token_urlsafe(24), "token": secrets.token_hex(8), "encoding_aes_key": random_aes_key(),
           "api_base": sim_url, "open_kfids": [KFID]}  # fmt: skip
    config = stack_config(stack.config["redis_url"], stack.config["engine"]["base_url"], sim_url, namespace)
    config.update(bots=[bot], admin={"token": token})
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    procs = [Proc([*BOTGW, "sim", "serve", "--config", str(path), "--port", str(sim_port)],
                  stack.log_dir / f"{namespace}-sim.log")]  # fmt: skip
    try:
        wait_http(f"{sim_url}/__sim__/healthz", 30, procs[0])
        procs.append(start_gateway(path, port, stack.log_dir, f"gw-{namespace}"))
        admin = f"{procs[1].admin_url}/admin/kf/kefu/handoff"
        headers = {"Authorization": f"Bearer {token}"}
        nobody = customer()
        unknown = httpx.post(admin.replace("/kefu/", "/nosuch/"), json={"customer": nobody}, headers=headers)
        assert unknown.status_code == 404, unknown.text
        for body in ({"customer": nobody, "open_kfid": "wk-not-served"}, {"customer": nobody, "open_kfid": 5},
                     {"customer": nobody, "servicer": "张三 the agent"}):  # fmt: skip
            assert httpx.post(admin, json=body, headers=headers, timeout=10).status_code == 400, body
        refused = httpx.post(admin, json={"customer": nobody}, headers=headers, timeout=10)
        assert refused.status_code == 409 and "has no open session" in refused.json()["error"], refused.text
        assert not stack.redis.hget(Keys(namespace).scheduler_stats, "enqueued"), "nothing was queued"
        writer = customer()
        httpx.post(f"{sim_url}/__sim__/kf/customer", json={"open_kfid": KFID, "external_userid": writer,
                                                          "text": "你好"}, timeout=10).raise_for_status()
        queued = httpx.post(admin, json={"customer": writer}, headers=headers, timeout=10)
        assert queued.status_code == 202 and queued.json()["queued"] is True, queued.text
    finally:
        for proc in procs:
            proc.stop()
