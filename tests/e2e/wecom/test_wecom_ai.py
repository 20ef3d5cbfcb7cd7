"""WeCom AI bot (智能机器人): JSON crypto, streamed answers across two gateway replicas, takeover
mid-stream, the 20480-byte limit with response_url, and group-robot pacing."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Callable

import httpx

from bots.base import InboundMessage, ReplyTarget
from bots.text import utf8_len, utf8_prefix
from bots.wecom.aibot import RESPONSE_URL_MARGIN_S, RESPONSE_URL_TTL_S, stream_id_for
from bots.wecom.config import WeComAIBotConfig
from gateway import texts
from simulator.wecom.ai_user import StreamView, WeComAIBotUser
from testkit.configs import ENGINE_MODEL, SYSTEM_PROMPT, write_config
from testkit.fakes.holding_proxy import HoldingProxy
from testkit.fakes.stub_engine import answer_for
from testkit.probes import Listener, metric
from testkit.processes import Proc, free_port, wait_for
from testkit.services import start_gateway, start_worker
from testkit.stacks import Cluster, Stack
from tests.conftest import ROBOT_BURST


def ai_bot(stack: Stack) -> WeComAIBotConfig:
    return WeComAIBotConfig(**next(b for b in stack.config["bots"] if b["id"] == "ai"))


def run(coro):
    return asyncio.run(coro)


async def ask(stack: Stack, gateways: list[str], user: str, text: str, interval: float = 0.1) -> StreamView:
    async with httpx.AsyncClient(timeout=30) as http:
        return await WeComAIBotUser(ai_bot(stack), gateways, stack.sim_url, http).ask(user, text, interval_s=interval)


def assert_never_backwards(view: StreamView) -> None:
    for before, after in zip(view.shown, view.shown[1:], strict=False):
        assert after.startswith(before), f"text went backwards: {before[-40:]!r} -> {after[-40:]!r}"


def engine_answer(engine_url: str, text: str, max_tokens: int) -> str:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
    body = {"model": ENGINE_MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    return httpx.post(f"{engine_url}/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"][
        "content"
    ]


def test_json_crypto_and_bad_input(stack: Stack) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            user = WeComAIBotUser(ai_bot(stack), [stack.gateway_url], stack.sim_url, http)
            query = {"msg_signature": "", "timestamp": "", "nonce": ""}
            url = f"{stack.gateway_url}/callback/ai"
            welcome = await user.post({"msgtype": "event", "event": {"eventtype": "enter_chat"}})
            assert welcome == {"msgtype": "text", "text": {"content": "welcome to the test bot"}}

            params, body = user.signed({"msgtype": "text", "text": {"content": "x"}})
            bad_sig = {**params, "msg_signature": "0" * 40}
            assert (await http.post(url, params=bad_sig, content=body)).status_code == 403
            assert (await http.post(url, params=params, content=b"{not json")).status_code == 400
            assert (await http.post(url, params=params, content=b'["a list"]')).status_code == 400
            encrypted, signature = user.crypto.signed_envelope("plain text, not JSON", params["timestamp"], "1")
            not_json = {**params, "nonce": "1", "msg_signature": signature}
            answer = await http.post(url, params=not_json, content=json.dumps({"encrypt": encrypted}).encode())
            assert answer.status_code == 400
            assert (await http.post(url, params=query, content=body)).status_code == 400

    before = stack.entries_added()
    run(scenario())
    assert stack.entries_added() == before


def test_streamed_answer_across_two_replicas(stack: Stack, live_engine: str, user: str) -> None:
    with HoldingProxy(live_engine, chunk_delay_s=0.03) as slow:  # the tiny engine alone answers in one blink
        slow.release.set()
        namespace = "r" + secrets.token_hex(4)
        config = {**stack.config, "namespace": namespace, "engine": {**stack.config["engine"], "base_url": slow.url}}
        path = write_config(stack.log_dir / f"{namespace}.yaml", config)
        ports = [free_port(), free_port()]
        procs = [start_gateway(path, port, stack.log_dir, f"gw{i}-{namespace}") for i, port in enumerate(ports)]
        procs.append(start_worker(path, stack.log_dir, namespace))
        try:
            text = "Tell me about the weather in Beijing"
            gateways = [f"http://127.0.0.1:{port}" for port in ports]
            view = run(ask(stack, gateways, user, text, interval=0.05))
            served = [metric(proc.admin_url, "botgw_callbacks_total", platform="wecom-ai") for proc in procs[:2]]
        finally:
            for proc in procs:
                proc.stop()
    assert view.finished
    assert_never_backwards(view)
    assert view.text == engine_answer(live_engine, text, stack.config["engine"]["max_tokens"])
    # the first callback and every refresh, alternately to each replica (as WeCom's load balancer may)
    callbacks = len(view.refresh_latencies_s) + 1
    assert sorted(served) == [callbacks // 2, callbacks - callbacks // 2], served
    assert len(view.refresh_latencies_s) >= 4
    assert len(view.shown) >= 3, "the answer should be seen growing"


def test_duplicate_first_callback_one_stream_one_engine_call(cluster, user: str) -> None:
    c = cluster(0.3)
    gateway = c.add_gateway()
    c.add_worker("w")

    async def scenario() -> tuple[str, str, StreamView]:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(ai_bot(c.stack), [gateway], c.stack.sim_url, http)
            payload = sim.message_payload(user, "hello twice", await sim.new_response_url())
            first = await sim.post(payload)
            again = await sim.post(payload)  # WeCom's retry of the same callback
            view = await follow(sim, user, first["stream"]["id"])
            return first["stream"]["id"], again["stream"]["id"], view

    first_id, retry_id, view = run(scenario())
    assert first_id == retry_id
    assert view.finished and view.text == answer_for("hello twice")
    time.sleep(1.0)
    assert [r["user"] for r in c.engine_requests()] == ["hello twice"], "the engine was asked once"


async def enqueue_ai_answer(
    stack: Stack, user: str, answer: str, response_url: str, received_at: float | None = None
) -> str:
    """Queue a finished answer for an AI-bot message (as a command's answer is), to test delivery alone."""
    from redis.asyncio import Redis

    from gateway.queue.push import enqueue_notice
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys
    from gateway.state.streams import StreamStore

    message = InboundMessage(
        platform="wecom-ai", bot_id="ai", msg_id=secrets.token_hex(8), conversation_id=user, sender_id=user,
        text="", reply_to=ReplyTarget(
            user_id=user, webhook_url=response_url,
            # as the adapter sets it: the response_url's hour (less a minute) from the message
            webhook_expires_at=(received_at or time.time()) + RESPONSE_URL_TTL_S - RESPONSE_URL_MARGIN_S,
        ),
        **({"received_at": received_at} if received_at is not None else {}),
    )  # fmt: skip
    stream_id = stream_id_for(message.dedup_key)
    message = message.model_copy(update={"reply_to": message.reply_to.model_copy(update={"stream_id": stream_id})})

    redis = Redis.from_url(stack.config["redis_url"])
    keys = Keys(stack.namespace)
    await StreamStore(redis, keys).open("ai", user, stream_id, limit=3, max_age_s=360)
    await enqueue_notice(Scheduler(redis, keys), message, answer, rid="test")
    await redis.aclose()
    return stream_id


async def follow(sim: WeComAIBotUser, user: str, stream_id: str, timeout: float = 30) -> StreamView:
    """Refresh a stream as WeCom does, until it is finished; fails after `timeout`."""
    view = StreamView(stream_id=stream_id)
    deadline = time.monotonic() + timeout
    while not view.finished:
        assert time.monotonic() < deadline, f"stream {stream_id} not finished after {timeout} s: {view.text[-80:]!r}"
        await asyncio.sleep(0.2)
        reply = await sim.post(sim.refresh_payload(user, stream_id))
        view.finished = reply["stream"]["finish"]
        view.shown.append(reply["stream"]["content"])
    return view


def test_answer_over_the_stream_limit_rest_through_response_url_once(stack: Stack, user: str) -> None:
    answer = "".join(f"第{i}段：企业微信智能机器人的回答内容。\n" for i in range(1200))
    assert utf8_len(answer) > 30000

    async def scenario() -> tuple[StreamView, str]:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(ai_bot(stack), [stack.gateway_url], stack.sim_url, http)
            response_url = await sim.new_response_url()
            stream_id = await enqueue_ai_answer(stack, user, answer, response_url)
            view = await follow(sim, user, stream_id)
            return view, response_url.rsplit("/", 1)[1]

    view, token = run(scenario())
    assert view.finished
    time.sleep(1.0)
    responses = httpx.get(f"{stack.sim_url}/__sim__/wecom-ai/responses", timeout=5).json()
    shown, posted = view.text, responses[token]["content"]
    assert responses[token]["msgtype"] == "markdown"
    # The stream shows the answer's first 20,480 bytes; the one post carries what follows, up to where its own
    # 20,480 bytes end with the note saying the answer was cut: joined, nothing skipped, nothing repeated.
    assert shown == utf8_prefix(answer, 20480)
    room = 20480 - utf8_len(texts.ANSWER_CUT_TEXT)
    assert posted == utf8_prefix(answer[len(shown) :], room) + texts.ANSWER_CUT_TEXT
    assert utf8_len(posted) <= 20480 and 20480 - utf8_len(posted) < 4, "the post is as full as it can be"


def test_more_than_three_unfinished_messages_get_a_busy_notice(stack: Stack) -> None:
    namespace = "b" + secrets.token_hex(4)
    config = {**stack.config, "namespace": namespace}
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    port = free_port()
    gateway = start_gateway(path, port, stack.log_dir, name=f"gw-{namespace}")  # no worker: nothing finishes
    try:
        async def scenario() -> list[dict]:
            async with httpx.AsyncClient(timeout=10) as http:
                sim = WeComAIBotUser(ai_bot(stack), [f"http://127.0.0.1:{port}"], stack.sim_url, http)
                url = await sim.new_response_url()
                return [await sim.post(sim.message_payload("busy-user", f"q{i}", url)) for i in range(4)]

        replies = run(scenario())
        assert [r["stream"]["finish"] for r in replies] == [False, False, False, True]
        assert replies[3]["stream"]["content"] == texts.TOO_MANY_STREAMS_TEXT
    finally:
        gateway.stop()


def test_worker_killed_mid_stream_another_finishes_never_backwards(
    stack: Stack, live_engine: str, user: str
) -> None:
    namespace = "k" + secrets.token_hex(4)
    slow = HoldingProxy(live_engine, chunk_delay_s=0.03).__enter__()
    slow.release.set()
    engine = {**stack.config["engine"], "max_tokens": 200, "base_url": slow.url}
    config = {**stack.config, "namespace": namespace, "engine": engine}
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    port = free_port()
    procs: dict[str, Proc] = {"gateway": start_gateway(path, port, stack.log_dir, name=f"gw-{namespace}")}
    procs["a"] = start_worker(path, stack.log_dir, f"{namespace}-a")
    seen_text = threading.Event()
    result: dict[str, StreamView] = {}

    async def follow() -> None:
        async def on_update(text: str) -> None:
            if text:
                seen_text.set()

        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(ai_bot(stack), [f"http://127.0.0.1:{port}"], stack.sim_url, http)
            result["view"] = await sim.ask(user, "Write a very long story", interval_s=0.1, on_update=on_update)

    follower = threading.Thread(target=lambda: asyncio.run(follow()))
    try:
        follower.start()
        assert seen_text.wait(60), "worker A never started streaming"
        procs["a"].kill()
        procs["a"].popen.wait(5)
        procs["b"] = start_worker(path, stack.log_dir, f"{namespace}-b")
        follower.join(240)
        view = result["view"]
        assert view.finished
        assert_never_backwards(view)
        assert "took over a stalled message" in procs["b"].tail(200)
        assert len(view.shown) >= 3
    finally:
        for proc in procs.values():
            proc.stop()
        slow.__exit__()


def test_group_robot_burst_paced_to_twenty_a_minute(stack: Stack, robot_burst: float) -> None:
    """25 pushes queued at once (by the `robot_burst` fixture, when the session's stack started: the minute
    WeCom's pacing makes this take passes while other tests run) arrive in order, 20 a minute, none refused."""
    key = next(b for b in stack.config["bots"] if b["id"] == "robot")["key"]

    def pushed() -> dict:
        return httpx.get(f"{stack.sim_url}/__sim__/wecom/webhook", params={"key": key}, timeout=5).json()

    left = max(5.0, robot_burst + 150 - time.time())
    wait_for(lambda: len(pushed()["messages"]) >= ROBOT_BURST, left, f"the 25 pushes: {pushed()}")
    time.sleep(1.0)  # room for a 26th to show
    state = pushed()
    messages = state["messages"]
    assert [m["content"] for m in messages] == [f"**alert {i}**" for i in range(ROBOT_BURST)]
    assert [m["msgtype"] for m in messages[:2]] == ["markdown", "text"]
    assert state["refused"] == 0, "the robot was sent more than WeCom allows"
    times = [m["at"] for m in messages]
    assert all(times[i + 20] - times[i] >= 60 for i in range(len(times) - 20))
    assert times[20] - times[0] < 75, "the 21st push waited for its minute, not much longer"


def test_a_response_url_off_wecom_is_never_posted_to_and_the_cut_is_visible(stack: Stack, user: str) -> None:
    answer = "".join(f"第{i}段：企业微信智能机器人的回答内容。\n" for i in range(1200))
    listener = Listener()

    async def scenario() -> StreamView:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(ai_bot(stack), [stack.gateway_url], stack.sim_url, http)
            stream_id = await enqueue_ai_answer(stack, user, answer, f"{listener.url}/cgi-bin/aibot/response")
            view = await follow(sim, user, stream_id)
            return view

    try:
        view = run(scenario())
        assert view.finished and utf8_len(view.text) <= 20480
        assert view.text.endswith(texts.ANSWER_CUT_TEXT), "the cut is said, not silent"
        assert answer.startswith(view.text[: -len(texts.ANSWER_CUT_TEXT)])
        time.sleep(0.5)
        assert listener.hits == []
    finally:
        listener.close()


def test_an_expired_response_url_is_not_posted_to_and_the_cut_is_visible(stack: Stack, user: str) -> None:
    """A response_url is good for an hour. An answer longer than the stream whose response_url has expired (its
    message waited that long) cannot go on there: the stream must say where it was cut, as for a response_url
    that cannot be used at all, instead of ending silently at 20,480 bytes."""
    answer = "".join(f"第{i}段：企业微信智能机器人的回答内容。\n" for i in range(1200))

    async def scenario() -> tuple[StreamView, str]:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(ai_bot(stack), [stack.gateway_url], stack.sim_url, http)
            response_url = await sim.new_response_url(ttl_s=0.5)
            await asyncio.sleep(1.0)  # the hour has passed
            received = time.time() - 3601  # its message came an hour ago, with the response_url
            stream_id = await enqueue_ai_answer(stack, user, answer, response_url, received_at=received)
            return await follow(sim, user, stream_id), response_url.rsplit("/", 1)[1]

    view, token = run(scenario())
    assert view.finished and utf8_len(view.text) <= 20480
    time.sleep(1.0)
    assert token not in httpx.get(f"{stack.sim_url}/__sim__/wecom-ai/responses", timeout=5).json()
    assert view.text.endswith(texts.ANSWER_CUT_TEXT), "the answer ended silently at the stream's limit"


def short_stream_cluster(cluster: Callable[..., Cluster], stream_limit_s: float) -> Cluster:
    """A cluster whose AI bot's stream is closed by refresh callbacks after `stream_limit_s` (WeCom allows 6 min)."""
    c = cluster(0.05)
    next(b for b in c.config["bots"] if b["id"] == "ai")["stream_limit_s"] = stream_limit_s
    write_config(c.path, c.config)
    return c


def response_posts(sim_url: str) -> dict:
    return httpx.get(f"{sim_url}/__sim__/wecom-ai/responses", timeout=5).json()


def test_an_answer_later_than_the_stream_limit_reaches_the_person_once_through_response_url(
    cluster: Callable[..., Cluster], user: str
) -> None:
    """The engine (or the workers) slower than the stream's time limit: a refresh closes the stream with the
    apology, and the answer that comes after it cannot go into the stream. The response_url, never used, takes it:
    the person receives the whole answer once, and the stream still shows only the apology."""
    c = short_stream_cluster(cluster, 1.5)
    gateway = c.add_gateway()
    worker = c.add_worker("w")
    text = "a slow question sleep=4"  # the stub engine answers it after 4 s

    async def scenario() -> tuple[StreamView, str]:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(ai_bot(c.stack), [gateway], c.stack.sim_url, http)
            response_url = await sim.new_response_url()
            first = await sim.post(sim.message_payload(user, text, response_url))
            return await follow(sim, user, first["stream"]["id"]), response_url.rsplit("/", 1)[1]

    view, token = run(scenario())
    assert view.finished and view.text == texts.STREAM_TIMEOUT_TEXT, "closed at the limit, before any answer"
    wait_for(lambda: token in response_posts(c.stack.sim_url), 30, "the late answer through response_url")
    time.sleep(1.5)  # room for a second post, or for the worker to log a refused one
    assert response_posts(c.stack.sim_url)[token]["content"] == answer_for(text)
    assert [r["user"] for r in c.engine_requests()] == [text], "the engine was asked once"
    log = worker.log_path.read_text()
    assert log.count("went through response_url") == 1
    assert "could not be posted through response_url" not in log, "a second post was tried"


def test_no_engine_call_for_a_closed_stream_whose_response_url_expired(
    cluster: Callable[..., Cluster], user: str
) -> None:
    """A message that waited over an hour (workers down) finds its stream closed at the time limit and its
    response_url expired: no answer can reach the person, so the engine is not asked and the message fails
    (a dead letter), never counted as sent."""
    from redis.asyncio import Redis

    from gateway.queue.entry import QueueEntry
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys
    from gateway.state.streams import StreamStore

    c = short_stream_cluster(cluster, 1.5)
    worker = c.add_worker("w")
    received = time.time() - 3601

    async def enqueue() -> str:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(ai_bot(c.stack), [], c.stack.sim_url, http)
            response_url = await sim.new_response_url(ttl_s=0.1)
        message = InboundMessage(
            platform="wecom-ai", bot_id="ai", msg_id=secrets.token_hex(8), conversation_id=user, sender_id=user,
            text="asked an hour ago", received_at=received, reply_to=ReplyTarget(
                user_id=user, webhook_url=response_url,
                webhook_expires_at=received + RESPONSE_URL_TTL_S - RESPONSE_URL_MARGIN_S),
        )  # fmt: skip
        stream_id = stream_id_for(message.dedup_key)
        message = message.model_copy(update={"reply_to": message.reply_to.model_copy(update={"stream_id": stream_id})})
        redis = Redis.from_url(c.config["redis_url"])
        keys = Keys(c.namespace)
        streams = StreamStore(redis, keys)
        await streams.open("ai", user, stream_id, limit=3, max_age_s=360)
        await streams.close_late(stream_id, texts.STREAM_TIMEOUT_TEXT)  # as a refresh at the limit does
        await Scheduler(redis, keys).enqueue(message.session_key, QueueEntry(owner=message.conversation_key,
                                                                             message=message))  # fmt: skip
        await redis.aclose()
        return response_url.rsplit("/", 1)[1]

    before = c.stack.dead_letters()
    token = run(enqueue())
    wait_for(lambda: c.stack.dead_letters() > before, 30, "the message to end as a dead letter")
    assert c.engine_requests() == [], "the engine was asked for an answer nobody can receive"
    assert token not in response_posts(c.stack.sim_url)
    assert "response_url cannot be used; not asking the engine" in worker.log_path.read_text()
