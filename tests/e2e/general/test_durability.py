"""Nothing lost, nothing doubled, in order: workers killed mid-message or mid-send, messages acked while no worker
ran, the same callback at two gateways at once, a message held longer than a lease with two live workers, two
workers refetching one token, a configuration error reaching the alert robot, Redis restarted during traffic.

Each test runs its own gateways and workers in a namespace of their own (same Redis and simulator) with a stub
engine (testkit/fakes/stub_engine.py) whose answers the test knows exactly, so that it controls which workers are alive
and can check every answer to the byte.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from bots.base import InboundMessage, ReplyTarget
from bots.dingtalk.config import DingTalkBotConfig
from bots.text import utf8_len
from gateway import texts
from testkit.fakes.stub_engine import answer_for
from testkit.processes import Proc, free_port, wait_for
from testkit.stacks import Cluster, Stack


def enqueue_notice(stack: Stack, user: str, text: str) -> None:
    """Queue an answer that needs no engine (as an over-limit notice is), to exercise delivery alone."""
    from redis.asyncio import Redis

    from gateway.queue.push import enqueue_notice as enqueue
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys

    message = InboundMessage(
        platform="wecom", bot_id="app", msg_id=f"n-{user}-{time.time()}", conversation_id=user,
        sender_id=user, text="", reply_to=ReplyTarget(user_id=user),
    )

    async def put() -> None:
        client = Redis.from_url(stack.config["redis_url"])
        await enqueue(Scheduler(client, Keys(stack.namespace)), message, text, rid="test")
        await client.aclose()

    asyncio.run(put())


def takeovers(stack: Stack) -> int:
    return int(stack.redis.hget(stack.keys.scheduler_stats, "takeovers") or 0)


def asked(c: Cluster, text: str) -> int:
    """How often the engine was asked `text`."""
    return sum(1 for r in c.engine_requests() if r["user"] == text)


def test_worker_killed_while_sending_reply_delivered_once(cluster: Callable[..., Cluster], user: str) -> None:
    c = cluster(0.2)
    c.add_gateway()
    stack = c.stack
    c.add_worker("a")
    held_before = stack.sim_stats()["held"]
    stack.fault(hold=True, times=1, touser=user)
    assert stack.post_callback(stack.signer().text(user, "Please answer once")).status_code == 200
    wait_for(lambda: stack.sim_stats()["held"] > held_before, 30, "worker A to start sending")
    c.procs["a"].kill()  # SIGKILL while the send is in flight
    c.procs["a"].popen.wait(5)
    # WeCom received the request: it completes after the sender is gone.
    httpx.post(f"{stack.sim_url}/__sim__/wecom/release", timeout=5)
    c.add_worker("b")
    wait_for(lambda: stack.queue_depth() == 0, 30, "worker B to finish the entry")
    stack.wait_delivered(user, 1, settle=2.0)
    assert stack.texts(user) == [answer_for("Please answer once")]
    assert asked(c, "Please answer once") == 1, "the committed answer is resent, not asked for again"
    assert "took over a stalled message" in c.procs["b"].tail(100)


def test_worker_killed_while_generating_reply_delivered_once(cluster: Callable[..., Cluster], user: str) -> None:
    c = cluster(3.0)
    c.add_gateway()
    stack = c.stack
    c.add_worker("a")
    assert stack.post_callback(stack.signer().text(user, "Write a long essay")).status_code == 200
    wait_for(lambda: asked(c, "Write a long essay") == 1, 20, "worker A to ask the engine")
    c.procs["a"].kill()
    c.procs["a"].popen.wait(5)
    assert stack.delivered(user) == []
    c.add_worker("b")
    stack.wait_delivered(user, 1, timeout=30, settle=2.0)
    assert stack.texts(user) == [answer_for("Write a long essay")]
    assert asked(c, "Write a long essay") == 2, "nothing was committed: worker B asks the engine again"
    record = stack.redis.hgetall(next(iter(stack.redis.scan_iter(stack.keys.reply("wecom:*")))))
    assert record[b"state"] == b"done"
    assert takeovers(stack) == 1


def test_messages_acked_while_no_worker_runs_are_all_answered_once(cluster: Callable[..., Cluster]) -> None:
    c = cluster(0.1)
    c.add_gateway()
    stack = c.stack
    users = [f"r{secrets.token_hex(4)}" for _ in range(10)]
    for user in users:
        assert stack.post_callback(stack.signer().text(user, f"hello from {user}")).status_code == 200
    assert stack.queue_depth() == 10
    c.add_worker("late")
    for user in users:
        stack.wait_delivered(user, 1, timeout=30, settle=0)
    time.sleep(1.5)  # room for a second answer to show
    for user in users:
        assert stack.texts(user) == [answer_for(f"hello from {user}")]
    assert stack.queue_depth() == 0


def test_one_conversation_is_answered_in_order(cluster: Callable[..., Cluster]) -> None:
    """Answers of different lengths (the first takes longest) with three workers: one conversation's still come
    back in the order asked. The control: the same messages from three people come back the other way round,
    so the timings would show any message of the conversation handled before the one ahead of it."""
    c = cluster(0.1, limits={"per_user": "100/minute", "max_concurrent_per_user": 3})
    c.add_gateway()
    stack = c.stack
    for name in ("x", "y", "z"):
        c.add_worker(name)
    signer = stack.signer()
    asked = ["sleep=1.5 first", "sleep=0.8 second", "/help", "sleep=0.05 fourth"]
    user = "o" + secrets.token_hex(4)
    others = [f"p{i}{secrets.token_hex(3)}" for i in range(len(asked))]
    for text in asked:
        assert stack.post_callback(signer.text(user, text)).status_code == 200
    for other, text in zip(others, asked, strict=True):
        assert stack.post_callback(signer.text(other, text)).status_code == 200
    stack.wait_delivered(user, len(asked), timeout=30, settle=1.0)
    got = stack.texts(user)
    assert got == [answer_for(asked[0]), answer_for(asked[1]), texts.HELP_TEXT, answer_for(asked[3])]
    arrived = {}
    for other in others:
        (item,) = stack.wait_delivered(other, 1, timeout=30, settle=0)
        arrived[other] = item["at"]
    assert arrived[others[3]] < arrived[others[1]] < arrived[others[0]], "control: in parallel the order flips"


def post_at_once(calls: list[Callable[[], httpx.Response]]) -> list[int]:
    """Make every call at the same moment (one thread each, released together); their statuses."""
    barrier = threading.Barrier(len(calls))
    statuses: list[int] = [0] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        statuses[index] = calls[index]().status_code

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return statuses


def test_the_same_callback_at_two_gateways_at_once_is_one_entry_and_one_answer(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.3)
    gateways = [c.add_gateway(), c.add_gateway()]
    c.add_worker("a")
    c.add_worker("b")
    stack = c.stack
    before = stack.entries_added()

    wecom = stack.signer().text(user, "asked twice at once")

    def wecom_post(gateway: str) -> Callable[[], httpx.Response]:
        return lambda: httpx.post(f"{gateway}/callback/app", params=wecom.params, content=wecom.body, timeout=10)

    assert post_at_once([wecom_post(g) for g in gateways * 3]) == [200] * 6
    assert stack.entries_added() == before + 1

    robot = DingTalkBotConfig(**next(b for b in c.config["bots"] if b["id"] == "ding-http"))

    async def signed_posts() -> list[Callable[[], httpx.Response]]:
        async with httpx.AsyncClient(timeout=10) as http:
            webhook = (await http.post(f"{stack.sim_url}/__sim__/dingtalk/session", json={
                "conversation": f"cid-{user}", "user": user, "group": False, "ttl_s": 3600})).json()
        from bots.dingtalk.crypto import sign
        from simulator.dingtalk.user import robot_payload

        payload = robot_payload(robot, user, "asked twice at once", conversation=f"cid-{user}", group=False,
                                webhook=webhook)
        ts = str(int(time.time() * 1000))
        headers = {"timestamp": ts, "sign": sign(ts, robot.app_secret.get_secret_value())}
        return [
            (lambda g=g: httpx.post(f"{g}/callback/ding-http", json=payload, headers=headers, timeout=10))
            for g in gateways * 3
        ]

    assert post_at_once(asyncio.run(signed_posts())) == [200] * 6
    assert stack.entries_added() == before + 2
    stack.wait_delivered(user, 1, timeout=30, settle=1.5)
    assert stack.texts(user) == [answer_for("asked twice at once")]
    deadline = time.monotonic() + 30
    while not (ding := dingtalk_replies(stack, f"cid-{user}")):
        assert time.monotonic() < deadline, "no DingTalk answer"
        time.sleep(0.1)
    time.sleep(1.5)
    assert [r["content"] for r in dingtalk_replies(stack, f"cid-{user}")] == [answer_for("asked twice at once")]
    assert ding
    assert asked(c, "asked twice at once") == 2, "one engine call per platform's message"


def dingtalk_replies(stack: Stack, conversation: str) -> list[dict]:
    url = f"{stack.sim_url}/__sim__/dingtalk/messages"
    return httpx.get(url, params={"conversation": conversation}, timeout=5).json()


def test_an_answer_longer_than_the_lease_with_two_live_workers_is_not_taken_over(
    cluster: Callable[..., Cluster], user: str
) -> None:
    """claim_idle_ms is 1.5 s, the engine takes 4 s: the heartbeats keep the lease, the idle worker takes nothing."""
    c = cluster(4.0)
    c.add_gateway()
    c.add_worker("a")
    c.add_worker("b")
    stack = c.stack
    assert stack.post_callback(stack.signer().text(user, "take your time")).status_code == 200
    stack.wait_delivered(user, 1, timeout=30, settle=2.0)
    assert stack.texts(user) == [answer_for("take your time")]
    assert asked(c, "take your time") == 1
    assert takeovers(stack) == 0
    assert not any("took over" in proc.tail(200) or "lost the lease" in proc.tail(200) for proc in c.procs.values())


def test_worker_killed_while_the_second_of_three_pieces_is_sent(cluster: Callable[..., Cluster], user: str) -> None:
    """The worker dies while WeCom holds its send of piece 2 (which WeCom then completes): the next worker resends
    piece 2 with the duplicate check (WeCom drops it) and sends piece 3. Exactly three pieces, in order."""
    c = cluster(0.1)
    c.add_gateway()
    stack = c.stack
    c.add_worker("a")
    answer = "".join(f"第{i:03d}句：企业微信机器人正在回答你的问题。" for i in range(90))
    assert 2 * 2048 < utf8_len(answer) < 3 * 2000
    held_before = stack.sim_stats()["held"]
    stack.fault(hold=True, times=1, after=1, touser=user)
    enqueue_notice(stack, user, answer)
    wait_for(lambda: stack.sim_stats()["held"] > held_before, 30, "worker A to send piece 2")
    assert len(stack.delivered(user)) == 1
    c.procs["a"].kill()
    c.procs["a"].popen.wait(5)
    httpx.post(f"{stack.sim_url}/__sim__/wecom/release", timeout=5)
    c.add_worker("b")
    stack.wait_delivered(user, 3, timeout=30, settle=2.0)
    texts = stack.texts(user)
    assert len(texts) == 3 and "".join(texts) == answer, "three pieces, in order, none twice"
    assert all(utf8_len(item["content"]) <= 2048 for item in stack.delivered(user))
    assert "took over a stalled message" in c.procs["b"].tail(100)


def test_two_workers_hitting_42001_at_once_refetch_the_token_once(cluster: Callable[..., Cluster]) -> None:
    c = cluster(0.1, worker={"concurrency": 1})
    c.add_gateway()
    c.add_worker("a")
    c.add_worker("b")
    stack = c.stack
    first = "t" + secrets.token_hex(4)
    assert stack.post_callback(stack.signer().text(first, "/help")).status_code == 200
    stack.wait_delivered(first, 1, settle=0)  # the namespace's token is fetched and cached
    before = stack.sim_stats()
    # Both workers' sends are held at WeCom, with the token about to expire, and let go together: both meet 42001.
    users = ["t" + secrets.token_hex(4) for _ in range(2)]
    for user in users:
        stack.fault(hold=True, times=1, touser=user)
    httpx.post(f"{stack.sim_url}/__sim__/wecom/expire-tokens", timeout=5).raise_for_status()
    for user in users:
        assert stack.post_callback(stack.signer().text(user, "/help")).status_code == 200
    wait_for(lambda: stack.sim_stats()["held"] == before["held"] + 2, 30, "one send of each worker to be held")
    httpx.post(f"{stack.sim_url}/__sim__/wecom/release", timeout=5).raise_for_status()
    for user in users:
        stack.wait_delivered(user, 1, settle=0)
    time.sleep(1.0)
    after = stack.sim_stats()
    sends = [stack.sim_stats(user)["send_calls_to"] for user in users]
    assert sends == [2, 2], "both sends met the expired token, then went through"
    assert after["gettoken_calls"] - before["gettoken_calls"] == 1, "the token was refetched once, for both"
    assert all(len(stack.delivered(user)) == 1 for user in users)


def test_untrusted_ip_reaches_the_alert_robot_once(cluster: Callable[..., Cluster], user: str) -> None:
    c = cluster(0.1, alert_bot="robot")
    c.add_gateway()
    c.add_worker("a")
    stack = c.stack
    key = next(b for b in c.config["bots"] if b["id"] == "robot")["key"]
    stack.fault(errcode=60020, errmsg="not allow to access from your ip", times=1, touser=user)
    assert stack.post_callback(stack.signer().text(user, "/help")).status_code == 200
    wait_for(lambda: stack.dead_letters() == 1, 30, "the message to be dead-lettered")

    def alerts() -> list[dict]:
        return httpx.get(f"{stack.sim_url}/__sim__/wecom/webhook", params={"key": key}, timeout=5).json()["messages"]

    wait_for(lambda: len(alerts()) >= 1, 30, "the alert robot to be told")
    time.sleep(1.0)
    (alert,) = alerts()
    assert "could not be answered" in alert["content"] and "60020" in alert["content"]
    assert "可信IP" in alert["content"]
    assert stack.bot.secret.get_secret_value() not in alert["content"]
    assert stack.delivered(user) == []


def start_redis(path: Path, port: int, log: Path) -> Proc:
    binary = shutil.which("redis-server")
    assert binary
    args = [binary, "--port", str(port), "--dir", str(path), "--save", "", "--appendonly", "yes",
            "--appendfsync", "always"]
    proc = Proc(args, log)
    client = redis.Redis(port=port)
    wait_for(lambda: _pings(client), 20, "redis-server to start")
    return proc


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_redis_killed_and_restarted_with_aof_during_traffic(
    cluster: Callable[..., Cluster], stack: Stack, tmp_path: Path
) -> None:
    """Redis (appendonly, fsync always) is SIGKILLed and restarted while callbacks arrive. What the gateway
    acknowledged was written: every message, retried by the platform until acknowledged as WeCom does, is
    answered exactly once."""
    port = free_port()
    log = stack.log_dir / f"redis-aof-{port}.log"
    servers = [start_redis(tmp_path, port, log)]
    try:
        c = cluster(0.2, redis_url=f"redis://127.0.0.1:{port}/0", redis_timeout_s=2, redis_connect_timeout_s=1)
        c.add_gateway()
        c.add_worker("a")
        signer = c.stack.signer()
        users = [f"a{i:02d}{secrets.token_hex(3)}" for i in range(30)]
        refused = []

        def deliver(user: str) -> None:  # as WeCom does: the same callback again until it is acknowledged
            callback = signer.text(user, f"hello from {user}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if c.stack.post_callback(callback).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                refused.append(user)
                time.sleep(0.5)
            raise AssertionError(f"{user}'s callback was never acknowledged")

        restart = threading.Timer(2.0, lambda: servers.append(start_redis(tmp_path, port, log)))
        for index, user in enumerate(users):
            if index == 10:
                servers[0].kill()  # SIGKILL: no shutdown save, only the AOF
                servers[0].popen.wait(5)
                restart.start()
            deliver(user)
            time.sleep(0.1)
        restart.join(30)
        assert refused, "the outage was not met: the test proved nothing"
        for user in users:
            c.stack.wait_delivered(user, 1, timeout=60, settle=0)
        time.sleep(1.5)
        for user in users:
            assert c.stack.texts(user) == [answer_for(f"hello from {user}")], user
        wait_for(lambda: c.stack.queue_depth() == 0, 10, "the queue to drain")
        c.close()  # before Redis goes
    finally:
        for server in servers:
            server.stop()
