"""The worker as several processes see it: fair turns, groups per user or shared, leases under SIGSTOP and
SIGTERM, budgets across two gateways and two workers. The engine is a stub with a fixed answer time
(testkit/fakes/stub_engine.py), so that the times measured are the scheduler's, not generation's."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import signal
import time
from collections.abc import Callable

import httpx
import pytest

from bots.dingtalk.config import DingTalkBotConfig
from bots.wecom.config import WeComAIBotConfig
from simulator.dingtalk.user import DingTalkUser
from simulator.wecom.ai_user import WeComAIBotUser
from testkit.processes import wait_for
from testkit.stacks import Cluster, Stack


def arrival_times(stack: Stack, user: str, count: int, timeout: float) -> list[tuple[float, str]]:
    """(time received by the simulator, text) of each message to `user`, once `count` have come."""
    stack.wait_delivered(user, count, timeout=timeout, settle=0.5)
    return [(float(item["at"]), item["content"]) for item in stack.delivered(user)]


def test_a_flooding_user_does_not_hold_back_the_others(cluster: Callable[..., Cluster]) -> None:
    c = cluster(0.5, limits={"per_user": "1000/minute"})
    c.add_gateway()
    c.add_worker("a")
    c.add_worker("b")
    signer = c.stack.signer()
    heavy = "heavy" + secrets.token_hex(3)
    lights = [f"light{i}" + secrets.token_hex(3) for i in range(5)]
    url = f"{c.gateways[0]}/callback/app"
    with httpx.Client(timeout=10) as http:  # one keep-alive connection: the flood arrives as a burst
        flood_started = time.time()
        for i in range(30):
            body = signer.text(heavy, f"{heavy} question {i}")
            assert http.post(url, params=body.params, content=body.body).status_code == 200
        flood_took = time.time() - flood_started
        time.sleep(0.3)
        sent_at = {}
        for user in lights:
            sent_at[user] = time.time()
            body = signer.text(user, f"{user} question")
            assert http.post(url, params=body.params, content=body.body).status_code == 200
    light_done = []
    for user in lights:
        (at, text), *rest = arrival_times(c.stack, user, 1, timeout=30)
        assert not rest and text == f"answer to: {user} question"
        light_done.append(at)
    light_waits = [done - sent_at[user] for user, done in zip(lights, light_done, strict=True)]
    heavy_answers = arrival_times(c.stack, heavy, 30, timeout=90)
    assert [text for _, text in heavy_answers] == [f"answer to: {heavy} question {i}" for i in range(30)]
    # While the light users waited, the heavy user's backlog got at most the turns its one slot allows.
    first_light_sent = min(sent_at.values())
    heavy_meanwhile = [at for at, _ in heavy_answers if first_light_sent < at <= max(light_done)]
    assert len(heavy_meanwhile) <= 3, f"{len(heavy_meanwhile)} heavy answers went before the light users'"
    if flood_took < 1.0:  # the scenario as measured there: the flood arrived as one burst
        assert max(light_done) < heavy_answers[4][0], "a light user waited behind the heavy user's fifth answer"
    assert max(light_waits) < 0.5 + 1.0, f"light users waited {light_waits} with a 0.5 s engine"


def send_dingtalk(stack: Stack, bot_id: str, user: str, text: str, group: str) -> None:
    bot = DingTalkBotConfig(**next(b for b in stack.config["bots"] if b["id"] == bot_id))

    async def go() -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            await DingTalkUser(bot, stack.gateway_url, stack.sim_url, http).send(user, text, group=group)

    asyncio.run(go())


def group_replies(stack: Stack, group: str) -> list[dict]:
    return httpx.get(f"{stack.sim_url}/__sim__/dingtalk/messages", params={"conversation": group}, timeout=5).json()


@pytest.mark.parametrize("mode", ["per_user", "shared"])
def test_group_members_in_parallel_per_user_in_order_shared(cluster: Callable[..., Cluster], mode: str) -> None:
    delay = 1.0
    c = cluster(delay, memory={"group": mode})
    c.add_gateway()
    c.add_worker("a")
    group = f"cid-{mode}-{secrets.token_hex(4)}"
    members = [f"m{i}{secrets.token_hex(2)}" for i in range(5)]
    started = time.monotonic()
    for member in members:
        send_dingtalk(c.stack, "ding-http", member, f"hello from {member}", group)
    wait_for(lambda: len(group_replies(c.stack, group)) >= 5, 30, "five answers in the group")
    took = time.monotonic() - started
    replies = group_replies(c.stack, group)
    assert sorted(r["content"] for r in replies) == sorted(f"answer to: hello from {m}" for m in members)
    requests = sorted(c.engine_requests(), key=lambda r: r["start"])
    if mode == "per_user":
        assert took < 3 * delay, f"five members took {took:.1f} s with a {delay} s engine: not in parallel"
        assert max(r["start"] for r in requests) - min(r["start"] for r in requests) < delay
    else:
        assert [r["content"] for r in replies] == [f"answer to: hello from {m}" for m in members]
        assert all(b["start"] >= a["end"] for a, b in itertools.pairwise(requests)), "overlapping turns"


def test_stalled_worker_that_lost_its_lease_sends_nothing(cluster: Callable[..., Cluster], user: str) -> None:
    c = cluster(3.0)
    c.add_gateway()
    stalled = c.add_worker("stalled")
    assert c.stack.post_callback(c.stack.signer().text(user, "answer me once")).status_code == 200
    wait_for(lambda: len(c.engine_requests()) == 1, 20, "the first worker to ask the engine")
    stalled.kill(signal.SIGSTOP)  # past claim_idle_ms (1.5 s) its lease expires
    c.add_worker("fresh")
    wait_for(lambda: len(c.engine_requests()) == 2, 20, "the fresh worker to take the message over")
    c.stack.wait_delivered(user, 1, timeout=20, settle=0.2)
    stalled.kill(signal.SIGCONT)  # its engine answer is waiting for it; its lease is gone
    time.sleep(3.0)
    delivered = c.stack.delivered(user)
    assert [d["content"] for d in delivered] == ["answer to: answer me once"]
    assert "lost the lease" in stalled.tail(200)
    assert c.stack.queue_depth() == 0


def test_a_message_that_ends_every_worker_runs_alone_then_is_given_up_and_its_companion_is_answered(
    cluster: Callable[..., Cluster], user: str
) -> None:
    """A message whose every run ends its worker (SIGKILL here, as a crash in a library or an OOM kill would) is
    not taken over for ever: taken over twice it runs alone (its worker finishes its other message first and takes
    no more), and after two deaths alone it becomes a dead letter. Its companion, killed with it twice, is answered
    once and never given up; the worker left goes on answering."""
    c = cluster(3.0)
    c.add_gateway()
    poison, companion, later = f"{user}p", f"{user}c", f"{user}l"
    for who, text in ((poison, "the poison"), (companion, "the companion")):
        assert c.stack.post_callback(c.stack.signer().text(who, text)).status_code == 200

    def asked(text: str) -> int:
        return sum(1 for request in c.engine_requests() if request["user"] == text)

    killed_at = 0.0
    for run in range(1, 5):
        worker = c.add_worker(f"doomed{run}")
        wait_for(lambda run=run: asked("the poison") == run, 40, f"run {run} of the poison:\n{worker.tail()}")
        if run <= 2:  # held together: both are taken over
            wait_for(lambda run=run: asked("the companion") == run, 10, f"run {run} of the companion")
        else:  # taken over twice: run alone, the companion not in this worker's engine calls meanwhile (3 s each)
            assert "running a message alone" in worker.tail(200)
            started = max(r["start"] for r in c.engine_requests() if r["user"] == "the poison")
            beside = [
                r["start"] - started
                for r in c.engine_requests()
                if r["user"] == "the companion" and r["start"] > max(killed_at, started - 2.8)
            ]
            assert not beside, f"the companion ran beside the poison in run {run}: {beside}"
        worker.kill(signal.SIGKILL)
        worker.popen.wait(10)
        killed_at = time.time()

    last = c.add_worker("last")
    wait_for(lambda: c.stack.dead_letters() == 1, 30, f"the poison to be given up:\n{last.tail()}")
    letter = c.stack.redis.xrange(c.stack.keys.dead_letters)[0][1]
    assert b"ran it alone 2 times" in letter[b"entry"], letter
    assert asked("the poison") == 4  # given up without running it a fifth time
    # the two deaths alone, counted by the sweeps that handed it on (the gateways export it: botgw_deaths_alone)
    assert int(c.stack.redis.hget(c.stack.keys.scheduler_stats, "deaths_alone") or 0) == 2
    c.stack.wait_delivered(companion, 1, timeout=30, settle=0.5)
    assert c.stack.texts(companion) == ["answer to: the companion"]
    assert c.stack.texts(poison) == []
    assert c.stack.post_callback(c.stack.signer().text(later, "still there?")).status_code == 200
    c.stack.wait_delivered(later, 1, timeout=30, settle=0.5)
    assert c.stack.texts(later) == ["answer to: still there?"]
    assert c.stack.queue_depth() == 0 and last.popen.poll() is None


def test_sigterm_mid_answer_hands_the_message_on_and_it_is_answered_once(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(2.0, worker={"drain_s": 0.5})
    c.add_gateway()
    first = c.add_worker("first")
    assert c.stack.post_callback(c.stack.signer().text(user, "survive a restart")).status_code == 200
    wait_for(lambda: len(c.engine_requests()) == 1, 20, "the first worker to ask the engine")
    second = c.add_worker("second")
    first.kill(signal.SIGTERM)
    first.popen.wait(10)
    assert "handed_back" in first.tail(20)
    c.stack.wait_delivered(user, 1, timeout=20, settle=2.0)
    assert [d["content"] for d in c.stack.delivered(user)] == ["answer to: survive a restart"]
    assert c.stack.queue_depth() == 0
    assert second.popen.poll() is None


def test_budgets_hold_across_two_gateways_and_two_workers(cluster: Callable[..., Cluster]) -> None:
    vip = "vip" + secrets.token_hex(3)  # a user of its own: the test also runs on the Redis Cluster, same simulator
    budget = 900
    c = cluster(
        0.3,
        limits={
            "per_user": "4/minute",
            "users": {f"wecom:{vip}": {"messages": "100/minute"}},  # the one WeCom corporation's member
            "user": {"tokens_per_day": budget},
            "max_concurrent_per_user": 3,
        },
    )
    c.add_gateway()
    c.add_gateway()
    c.add_worker("a")
    c.add_worker("b")
    signer = c.stack.signer()
    limited = "lim" + secrets.token_hex(3)
    for i in range(12):
        gateway = c.gateways[i % 2]
        for who in (vip, limited):
            body = signer.text(who, f"{who} asks question number {i} " + "x" * 40)
            assert httpx.post(f"{gateway}/callback/app", params=body.params, content=body.body).status_code == 200
    wait_for(lambda: c.stack.queue_depth() == 0, 60, "every message handled")
    time.sleep(0.5)
    requests = c.engine_requests()
    vip_usage = sum(r["usage"] for r in requests if r["user"].startswith(vip + " "))
    assert 0 < vip_usage <= budget, f"vip used {vip_usage} tokens of a {budget} budget"
    vip_msgs = c.stack.delivered(vip)
    answered = [m for m in vip_msgs if m["content"].startswith("answer to:")]
    notices = [m for m in vip_msgs if "tokens" in m["content"]]
    assert answered and len(notices) == 1, [m["content"][:40] for m in vip_msgs]
    limited_msgs = c.stack.delivered(limited)
    assert len([m for m in limited_msgs if m["content"].startswith("answer to:")]) == 4
    assert len([m for m in limited_msgs if "4/minute" in m["content"]]) == 1, "one notice per window"


def test_over_limit_ai_bot_streams_are_finished_with_the_notice(cluster: Callable[..., Cluster], user: str) -> None:
    c = cluster(0.2, limits={"per_user": "2/minute"}, admin={"token": "admin-test-token-of-24-chars"})
    gateway = c.add_gateway()
    c.add_worker("a")
    bot = WeComAIBotConfig(**next(b for b in c.config["bots"] if b["id"] == "ai"))

    async def ask_four() -> list:
        async with httpx.AsyncClient(timeout=30) as http:
            ai_user = WeComAIBotUser(bot, [gateway], c.stack.sim_url, http)
            return [await ai_user.ask(user, f"question {i}", interval_s=0.1) for i in range(4)]

    views = asyncio.run(ask_four())
    assert [v.text for v in views[:2]] == ["answer to: question 0", "answer to: question 1"]
    for view in views[2:]:  # the second over-limit message too: its stream is open, it must be finished
        assert view.finished and "2/minute" in view.text, view.text
    headers = {"Authorization": "Bearer admin-test-token-of-24-chars"}
    corp = next(b["corp_id"] for b in c.config["bots"] if b["id"] == "app")  # the AI bot's corp: the one configured
    shown = httpx.get(f"{gateway}/admin/limits/wecom:{user}", headers=headers, timeout=5).json()
    assert shown[f"user:wecom:{corp}:{user}"]["messages"][0]["used"] == 2
    assert httpx.get(f"{gateway}/admin/limits/wecom:{user}", timeout=5).status_code == 401
    assert httpx.delete(f"{gateway}/admin/limits/wecom:{user}", headers=headers, timeout=5).json()["cleared"] >= 1

    async def ask_again():
        async with httpx.AsyncClient(timeout=30) as http:
            return await WeComAIBotUser(bot, [gateway], c.stack.sim_url, http).ask(user, "after reset", interval_s=0.1)

    assert asyncio.run(ask_again()).text == "answer to: after reset"


def test_a_message_tried_again_after_an_engine_failure_counts_once_in_its_window(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.1, limits={"per_user": "5/minute"}, admin={"token": "admin-test-token-of-24-chars"})
    gateway = c.add_gateway()
    c.add_worker("a")
    body = c.stack.signer().text(user, "fail-once please")
    assert httpx.post(f"{gateway}/callback/app", params=body.params, content=body.body, timeout=10).status_code == 200
    answer = c.stack.wait_delivered(user, 1, timeout=60)
    assert [item["content"] for item in answer] == ["answer to: fail-once please"]
    headers = {"Authorization": "Bearer admin-test-token-of-24-chars"}
    corp = next(b["corp_id"] for b in c.config["bots"] if b["id"] == "app")
    shown = httpx.get(f"{gateway}/admin/limits/wecom:{corp}:{user}", headers=headers, timeout=5).json()
    used = shown[f"user:wecom:{corp}:{user}"]["messages"][0]["used"]
    assert used == 1, "each attempt spent another place in the window"
