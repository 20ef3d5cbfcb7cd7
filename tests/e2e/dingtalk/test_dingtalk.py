"""DingTalk enterprise robot: HTTP-mode signatures, HTTP and Stream mode end to end, Stream connections
dropped or silent, two stream processes, sessionWebhook expiry and throttling, AI cards."""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.crypto import sign
from gateway import texts
from gateway.queue.scheduler import SHARE_SIGNATURE_MS
from simulator.dingtalk import messages
from simulator.dingtalk.user import DingTalkUser, robot_payload
from testkit.configs import ENGINE_MODEL, SYSTEM_PROMPT, write_config
from testkit.fakes.holding_proxy import HoldingProxy
from testkit.probes import Listener, metric
from testkit.processes import BOTGW, Proc, free_port, wait_for
from testkit.services import start_gateway, start_worker
from testkit.stacks import Stack


def bot(stack: Stack, bot_id: str) -> DingTalkBotConfig:
    return DingTalkBotConfig(**next(b for b in stack.config["bots"] if b["id"] == bot_id))


def send(stack: Stack, bot_id: str, user: str, text: str, **kwargs: object) -> dict:
    async def go() -> dict:
        async with httpx.AsyncClient(timeout=10) as http:
            return await DingTalkUser(bot(stack, bot_id), stack.gateway_url, stack.sim_url, http).send(
                user, text, **kwargs
            )

    return asyncio.run(go())


def replies(stack: Stack, conversation: str) -> list[dict]:
    url = f"{stack.sim_url}/__sim__/dingtalk/messages"
    return httpx.get(url, params={"conversation": conversation}, timeout=5).json()


def wait_replies(stack: Stack, conversation: str, count: int, timeout: float = 60, settle: float = 1.5) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(replies(stack, conversation)) >= count:
            time.sleep(settle)
            return replies(stack, conversation)
        time.sleep(0.1)
    raise AssertionError(f"{conversation}: {len(replies(stack, conversation))} replies, expected {count}")


def engine_answer(engine_url: str, text: str, max_tokens: int) -> str:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
    body = {"model": ENGINE_MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    response = httpx.post(f"{engine_url}/v1/chat/completions", json=body, timeout=120)
    return response.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def stream_process(stack: Stack) -> Iterator[Proc]:
    proc = Proc([*BOTGW, "dingtalk-stream", "--config", str(stack.config_path)], stack.log_dir / "dingtalk-stream.log")
    deadline = time.monotonic() + 30
    while "dingtalk stream connected" not in proc.tail(20) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "dingtalk stream connected" in proc.tail(20), proc.tail()
    yield proc
    proc.stop()


def stream_stats(stack: Stack) -> dict:
    return httpx.get(f"{stack.sim_url}/__sim__/dingtalk/stream/stats", timeout=5).json()


# -- HTTP mode signature ---------------------------------------------------------------------


def test_reference_signature() -> None:
    assert sign("1577262236757", "this is secret") == "hmPWwU+7lVdm3ZZz0r9tSfx0L4Q26jWOZr9+Gs6EZQM="


def test_http_signature_checks(stack: Stack, user: str) -> None:
    robot = bot(stack, "ding-http")
    payload = {
        "msgtype": "text",
        "text": {"content": "/help"},
        "msgId": f"m-{user}",
        "conversationType": "1",
        "conversationId": f"cid-{user}",
        "senderStaffId": user,
    }
    url = f"{stack.gateway_url}/callback/ding-http"
    secret = robot.app_secret.get_secret_value()
    now_ms = int(time.time() * 1000)
    old_ms = now_ms - 61 * 60 * 1000
    before = stack.entries_added()
    cases = {
        "wrong sign": ({"timestamp": str(now_ms), "sign": sign(str(now_ms), "not-the-secret")}, 403),
        "missing headers": ({}, 400),
        "61 minutes old": ({"timestamp": str(old_ms), "sign": sign(str(old_ms), secret)}, 403),
    }
    for name, (headers, status) in cases.items():
        assert httpx.post(url, json=payload, headers=headers).status_code == status, name
    assert stack.entries_added() == before
    good = {"timestamp": str(now_ms), "sign": sign(str(now_ms), secret)}
    assert httpx.post(url, json=payload, headers=good).status_code == 200
    assert stack.entries_added() == before + 1


# -- end to end ------------------------------------------------------------------------------


@pytest.mark.parametrize("bot_id", ["ding-http", "ding-stream"])
def test_one_to_one_and_group_through_the_engine(
    stack: Stack, live_engine: str, stream_process: Proc, user: str, bot_id: str
) -> None:
    max_tokens = stack.config["engine"]["max_tokens"]
    single = send(stack, bot_id, user, "What is DingTalk?")
    answer = wait_replies(stack, single["conversationId"], 1)
    assert [r["content"] for r in answer] == [engine_answer(live_engine, "What is DingTalk?", max_tokens)]
    assert answer[0]["at_user_ids"] == [] and answer[0]["via"] == "session"

    group = f"cid-group-{user}"
    send(stack, bot_id, user, "Summarise the meeting", group=group)
    answer = wait_replies(stack, group, 1)
    assert len(answer) == 1 and answer[0]["at_user_ids"] == [user], "the asker is @-mentioned in groups"
    assert answer[0]["content"] == engine_answer(live_engine, " Summarise the meeting".strip(), max_tokens)


def test_a_message_nothing_can_read_gets_the_notice_of_what_can_be(stack: Stack, user: str) -> None:
    """A video (pictures, voice and files: test_dingtalk_media.py)."""
    payload = send(stack, "ding-http", user, "/help")  # the first one sets a session up
    wait_replies(stack, payload["conversationId"], 1)
    video = {**payload, "msgId": payload["msgId"] + "-video", **messages.video_message("x")}
    video.pop("text")
    send(stack, "ding-http", user, "", payload=video)
    assert wait_replies(stack, payload["conversationId"], 2)[1]["content"] == texts.UNSUPPORTED_TEXT


# -- Stream connection trouble ---------------------------------------------------------------


def wait_connected(stack: Stack, opened_at_least: int, timeout: float = 30) -> None:
    """Until botgw has reconnected and the simulated DingTalk holds only that one connection: its keepalive
    (1 s in the tests) has evicted a silently dead one, into which it would otherwise still push."""
    app_key = bot(stack, "ding-stream").app_key
    deadline = time.monotonic() + timeout
    while True:
        stats = stream_stats(stack)
        if stats["opened"] >= opened_at_least and stats["live"].get(app_key) == 1:
            return
        assert time.monotonic() < deadline, f"botgw did not reconnect: {stats}"
        time.sleep(0.1)


def test_stream_drop_and_silence_lose_only_what_the_dead_connection_swallowed(
    stack: Stack, stream_process: Proc, user: str
) -> None:
    """DingTalk pushes a robot message once. What a silently dead connection swallows before the keepalive
    notices is lost (nobody can get it back: DingTalk will not resend it); nothing pushed after the
    reconnect is lost, and nothing is answered twice."""
    conversation = f"cid-single-{user}"
    send(stack, "ding-stream", user, "/help")  # a command: no engine needed
    wait_replies(stack, conversation, 1, settle=0)
    opened = stream_stats(stack)["opened"]

    httpx.post(f"{stack.sim_url}/__sim__/dingtalk/stream/drop", timeout=5)
    wait_connected(stack, opened + 1)
    for _ in range(3):
        send(stack, "ding-stream", user, "/help")  # a command: no engine needed
    wait_replies(stack, conversation, 4, settle=0)

    unacked_before = stream_stats(stack)["unacked"]
    assert httpx.post(f"{stack.sim_url}/__sim__/dingtalk/stream/silence", timeout=5).json()["silenced"] >= 1
    swallowed = 2
    for _ in range(swallowed):
        send(stack, "ding-stream", user, "/help")  # a command: no engine needed
    wait_connected(stack, opened + 2, timeout=20)  # ping interval + timeout are 1 s each in the tests
    for _ in range(3):
        send(stack, "ding-stream", user, "/help")  # a command: no engine needed
    delivered = wait_replies(stack, conversation, 7, timeout=60, settle=3.0)
    assert len(delivered) == 7, "everything but what the silent connection swallowed is answered, once"
    assert stream_stats(stack)["unacked"] - unacked_before == swallowed
    assert stream_stats(stack)["pending"] == 0
    assert "dingtalk stream lost; reconnecting" in stream_process.tail(200)


def test_the_stream_connection_gauge_shows_a_lost_link(stack: Stack, stream_process: Proc) -> None:
    """`botgw_dingtalk_stream_connected` is 1 while the socket is open, 0 from the moment it drops until the
    reconnect (the Stream-down alert reads it: a running process with no link is down too)."""
    port = free_port()
    args = [*BOTGW, "dingtalk-stream", "--config", str(stack.config_path), "--metrics-port", str(port)]
    proc = Proc(args, stack.log_dir / "dingtalk-stream-metrics.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _gauge(url) == 1.0, 30, f"the gauge to show the connection:\n{proc.tail()}")
        httpx.post(f"{stack.sim_url}/__sim__/dingtalk/stream/drop", timeout=5)
        seen = set()
        deadline = time.monotonic() + 30
        while not {0.0, 1.0} <= seen or _gauge(url) != 1.0:
            assert time.monotonic() < deadline, f"gauge values seen: {seen}"
            seen.add(_gauge(url))
            time.sleep(0.05)
    finally:
        proc.stop()


def _gauge(url: str) -> float | None:
    try:
        return metric(url, "botgw_dingtalk_stream_connected", bot_id="ding-stream")
    except httpx.HTTPError:
        return None


def push_to_all(stack: Stack, user: str, text: str) -> dict:
    """A robot message pushed into every live Stream connection of the app, each copy under its own frame id."""
    robot = bot(stack, "ding-stream")
    conversation = f"cid-single-{user}"
    session = {"conversation": conversation, "user": user, "group": False, "ttl_s": 3600}
    webhook = httpx.post(f"{stack.sim_url}/__sim__/dingtalk/session", json=session, timeout=5).json()
    payload = robot_payload(robot, user, text, conversation=conversation, group=False, webhook=webhook)
    body = {"client_id": robot.app_key, "payload": payload, "to_all": True}
    pushed = httpx.post(f"{stack.sim_url}/__sim__/dingtalk/stream/push", json=body, timeout=5).json()
    assert len(pushed["message_ids"]) == 2, pushed
    return payload


def stream_outcomes(*procs: Proc) -> list[str]:
    """The outcome of every robot message the stream processes have handled, in their logs."""
    outcomes = []
    for proc in procs:
        for line in proc.log_path.read_text(errors="replace").splitlines():
            if '"stream message"' in line:
                outcomes.append(json.loads(line)["outcome"])
    return outcomes


def test_two_stream_processes_share_the_messages_and_answer_a_message_both_get_once(
    stack: Stack, stream_process: Proc
) -> None:
    second = Proc([*BOTGW, "dingtalk-stream", "--config", str(stack.config_path)], stack.log_dir / "dts-2.log")
    try:
        app_key = bot(stack, "ding-stream").app_key
        wait_for(lambda: stream_stats(stack)["live"].get(app_key) == 2, 30, f"two live connections:\n{second.tail()}")
        outcomes_before = stream_outcomes(stream_process)
        first_before = len(outcomes_before)
        users = [f"two{i}-{secrets.token_hex(3)}" for i in range(16)]
        for person in users:
            send(stack, "ding-stream", person, "/help")
        for person in users:
            wait_replies(stack, f"cid-single-{person}", 1, settle=0)
        took_first = len(stream_outcomes(stream_process)) - first_before
        took_second = len(stream_outcomes(second))
        assert took_first + took_second == len(users), "each message was pushed to one connection"
        assert took_first and took_second, "DingTalk spreads messages over every live connection"

        # The same message reaches both processes (a copy in each connection, under different frame ids), at the
        # same moment: the dedup in Redis lets one through, the other is acknowledged and dropped.
        twice = [f"dup{i}-{secrets.token_hex(3)}" for i in range(6)]
        for person in twice:
            push_to_all(stack, person, "/help")
        for person in twice:
            wait_replies(stack, f"cid-single-{person}", 1, settle=0)
        time.sleep(2.0)  # room for a second answer to show
        for person in [*users, *twice]:
            assert [r["content"] for r in replies(stack, f"cid-single-{person}")] == [texts.HELP_TEXT], person
        outcomes = stream_outcomes(stream_process)[first_before:] + stream_outcomes(second)
        assert len(outcomes) == len(users) + 2 * len(twice), "both processes got each copy"
        assert outcomes.count("duplicate") == len(twice) and outcomes.count("accepted") == len(users) + len(twice)
    finally:
        second.stop()


def test_stream_system_frames_ping_and_disconnect(stack: Stack, stream_process: Proc, user: str) -> None:
    """DingTalk's SYSTEM frames: a ping is acked with its data echoed; after a disconnect botgw opens the next
    connection at once, while the old one is still open (DingTalk goes silent on it and closes it 10 s later): a
    hand-over, not a lost link, and nothing pushed meanwhile is dropped."""
    app_key = bot(stack, "ding-stream").app_key
    httpx.post(f"{stack.sim_url}/__sim__/dingtalk/stream/system-ping", json={"interval_s": 0.5}, timeout=5)
    try:
        before = stream_stats(stack)
        wait_for(lambda: stream_stats(stack)["pings_sent"] >= before["pings_sent"] + 3, 10, "three SYSTEM pings")
        wait_for(lambda: stream_stats(stack)["pings_acked"] >= before["pings_sent"] + 2, 10, "the pings acked")
    finally:
        httpx.post(f"{stack.sim_url}/__sim__/dingtalk/stream/system-ping", json={"interval_s": 10}, timeout=5)
    stats = stream_stats(stack)
    assert stats["pings_sent"] - stats["pings_acked"] <= 1, "every ping but one in flight is acked with its data"

    opened = stats["opened"]
    losses_before = stream_process.log_path.read_text(errors="replace").count("dingtalk stream lost")
    body = {"grace_s": 10.0}
    assert httpx.post(f"{stack.sim_url}/__sim__/dingtalk/stream/disconnect", json=body, timeout=5).json()[
        "disconnected"
    ] == 1
    started = time.monotonic()
    wait_connected(stack, opened + 1, timeout=20)
    assert time.monotonic() - started < 5.0, "botgw reconnects when told, without waiting to be closed"
    during = stream_stats(stack)
    assert during["live"][app_key] == 1
    assert during["draining"] == 1, "the next connection is open before DingTalk closes the old one"
    assert during["dropped_offline"] == stats["dropped_offline"]
    assert "dingtalk asked to reconnect" in stream_process.tail(200)
    log_text = stream_process.log_path.read_text(errors="replace")
    assert log_text.count("dingtalk stream lost") == losses_before, "a hand-over is not a lost link"
    for _ in range(3):
        send(stack, "ding-stream", user, "/help")  # a command: no engine needed
    assert len(wait_replies(stack, f"cid-single-{user}", 3, settle=1.5)) == 3


# -- sending -----------------------------------------------------------------------------------


def session_posts(stack: Stack, payload: dict) -> dict:
    session = httpx.URL(payload["sessionWebhook"]).params["session"]
    return httpx.get(f"{stack.sim_url}/__sim__/dingtalk/session-posts", params={"session": session}, timeout=5).json()


def test_expired_session_webhook_answer_goes_through_openapi(stack: Stack, user: str) -> None:
    """A sessionWebhook whose sessionWebhookExpiredTime has passed is not even tried; one that DingTalk ended
    early (300001) is tried once, and the answer goes through the OpenAPI either way."""
    payload = send(stack, "ding-http", user, "/help", webhook_ttl_s=1)
    assert len(replies_to(stack, user, 1)) == 1
    (reply,) = replies_to(stack, user, 1)
    assert (reply["via"], reply["user"], reply["content"]) == ("openapi", user, texts.HELP_TEXT)
    assert session_posts(stack, payload) == {"posts": 0, "refused": 0}, "an expired webhook was posted to"

    other = "e" + secrets.token_hex(4)
    session = {"conversation": f"cid-{other}", "user": other, "group": False, "ttl_s": 3600}
    webhook = httpx.post(f"{stack.sim_url}/__sim__/dingtalk/session", json=session, timeout=5).json()
    ended = httpx.URL(webhook["url"]).params["session"]
    httpx.post(f"{stack.sim_url}/__sim__/dingtalk/session/expire", json={"session": ended}, timeout=5)
    early = robot_payload(bot(stack, "ding-http"), other, "/help", conversation=f"cid-{other}", group=False,
                          webhook=webhook)
    assert signed_post(stack, early, int(time.time() * 1000)).status_code == 200
    (reply,) = replies_to(stack, other, 1)
    assert (reply["via"], reply["content"]) == ("openapi", texts.HELP_TEXT)
    assert session_posts(stack, early) == {"posts": 1, "refused": 1}

    # A webhook refusal with a code nothing documents sent nothing: the OpenAPI still answers (it was a dead letter).
    third = "e" + secrets.token_hex(4)
    dead_before = stack.dead_letters()
    fault = {"endpoint": "send", "errcode": 88888, "errmsg": "an undocumented refusal", "times": 1}
    httpx.post(f"{stack.sim_url}/__sim__/dingtalk/faults", json=fault, timeout=5).raise_for_status()
    send(stack, "ding-http", third, "/help")
    (reply,) = replies_to(stack, third, 1)
    assert (reply["via"], reply["content"]) == ("openapi", texts.HELP_TEXT)
    assert stack.dead_letters() == dead_before


def test_a_throttled_conversation_is_answered_once_the_throttle_ends(stack: Stack, user: str) -> None:
    """Someone else used up the conversation's 20 messages a minute: DingTalk then refuses every send to it for
    a while (10 minutes; 8 s here). The answer waits it out and arrives once; nothing is given up."""
    httpx.post(f"{stack.sim_url}/__sim__/dingtalk/throttle", json={"throttle_s": 8}, timeout=5).raise_for_status()
    try:
        conversation = f"cid-single-{user}"
        session = {"conversation": conversation, "user": user, "group": False, "ttl_s": 3600}
        webhook = httpx.post(f"{stack.sim_url}/__sim__/dingtalk/session", json=session, timeout=5).json()
        for i in range(20):  # another sender (a colleague's script, another bot process) fills the minute
            body = {"msgtype": "text", "text": {"content": f"someone else {i}"}}
            assert httpx.post(webhook["url"], json=body, timeout=5).json()["errcode"] == 0
        dead_before = stack.dead_letters()
        started = time.monotonic()
        payload = robot_payload(bot(stack, "ding-http"), user, "/help", conversation=conversation, group=False,
                                webhook=webhook)
        assert signed_post(stack, payload, int(time.time() * 1000)).status_code == 200
        deadline = time.monotonic() + 60
        while len(replies(stack, conversation)) < 21:
            assert time.monotonic() < deadline, "the answer never came"
            assert stack.dead_letters() == dead_before, "the answer was given up during the throttle"
            time.sleep(0.2)
        took = time.monotonic() - started
        time.sleep(1.0)
        answers = [r["content"] for r in replies(stack, conversation)][20:]
        assert answers == [texts.HELP_TEXT]
        assert took >= 7.0, f"answered after {took:.1f} s: during the throttle"
    finally:
        httpx.post(f"{stack.sim_url}/__sim__/dingtalk/throttle", json={"throttle_s": 600}, timeout=5)


# -- AI card -----------------------------------------------------------------------------------


def test_ai_card_streams_full_text_at_most_three_updates_a_second(stack: Stack, live_engine: str, user: str) -> None:
    with HoldingProxy(live_engine, chunk_delay_s=0.03) as slow:
        slow.release.set()
        namespace = f"c{int(time.time())}"
        engine = {**stack.config["engine"], "base_url": slow.url, "max_tokens": 120}
        config = {**stack.config, "namespace": namespace, "engine": engine}
        path = write_config(stack.log_dir / f"{namespace}.yaml", config)
        port = free_port()
        procs = [
            start_gateway(path, port, stack.log_dir, f"gw-{namespace}"),
            start_worker(path, stack.log_dir, namespace),
        ]
        try:
            card_stack = Stack(
                config, path, f"http://127.0.0.1:{port}", stack.sim_url, stack.redis, namespace, stack.log_dir
            )
            before = set(httpx.get(f"{stack.sim_url}/__sim__/dingtalk/cards", timeout=5).json())
            send(card_stack, "ding-card", user, "Explain AI cards")
            events: list[dict] = []

            def finished() -> bool:
                cards = httpx.get(f"{stack.sim_url}/__sim__/dingtalk/cards", timeout=5).json()
                new = [track for track in cards if track not in before]
                if new and any(e["op"] == "status" and e["flowStatus"] == "3" for e in cards[new[0]]):
                    events.extend(cards[new[0]])
                return bool(events)

            wait_for(finished, 90, "the card to be finished")
        finally:
            for proc in procs:
                proc.stop()
    ops = [e["op"] for e in events]
    assert ops[:2] == ["create", "deliver"] and ops[-1] == "status"
    updates = [e for e in events if e["op"] == "stream"]
    assert len(updates) >= 3
    texts = [e["content"] for e in updates]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts)), "each update is the full text so far"
    times = [e["at"] for e in updates if not e["finalize"]]
    busiest_second = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest_second <= 4, f"{busiest_second} card updates within one second (the cap is 3 a second)"
    final = events[-1]["content"]
    assert final == texts[-1] == engine_answer(live_engine, "Explain AI cards", 120)


def test_ai_cards_past_the_apps_api_limit_still_finish_once(stack: Stack, user: str) -> None:
    """DingTalk's OpenAPI limit is per app and API (QpsLimitForAppkeyAndApi, 20 a second on the standard plan; two or
    three people's streamed cards reach it): with the simulator's limit at 2 calls a second, updates are refused,
    and every card still ends finished with its whole answer, created and delivered once, with no dead letter."""
    sim = f"{stack.sim_url}/__sim__/dingtalk"
    before = set(httpx.get(f"{sim}/cards", timeout=5).json())
    refused_before = httpx.post(f"{sim}/qps", json={"qps": 2}, timeout=5).json()["refused"]
    dead_before = stack.dead_letters()
    try:
        for i in range(3):
            send(stack, "ding-card", f"{user}-{i}", "Explain AI cards")

        def finished() -> dict[str, list[dict]]:
            cards = httpx.get(f"{sim}/cards", timeout=5).json()
            return {track: events for track, events in cards.items() if track not in before}

        wait_for(lambda: len(done := finished()) == 3 and all(
            any(e["op"] == "status" and e["flowStatus"] == "3" for e in events) for events in done.values()
        ), 120, "three finished cards")  # fmt: skip
        refused = httpx.post(f"{sim}/qps", json={}, timeout=5).json()["refused"]
    finally:
        httpx.post(f"{sim}/qps", json={"qps": 20}, timeout=5)
    assert refused > refused_before, "the limit was never reached: the test shows nothing"
    for events in finished().values():
        ops = [e["op"] for e in events]
        assert ops.count("create") == 1 and ops.count("deliver") == 1
        final = [e for e in events if e["op"] == "stream" and e["finalize"]]
        assert final and final[-1]["content"] and events[-1]["content"] == final[-1]["content"]
    assert stack.dead_letters() == dead_before


# -- hostile callbacks -------------------------------------------------------------------------


def signed_post(stack: Stack, payload: dict, timestamp_ms: int) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as http:
            user = DingTalkUser(bot(stack, "ding-http"), stack.gateway_url, stack.sim_url, http)
            return await user.post_signed(payload, timestamp_ms=timestamp_ms)

    return asyncio.run(go())


def replies_to(stack: Stack, user: str, count: int) -> list[dict]:
    """The messages to `user`, once there are `count`, and a quiet second to catch extras."""

    def mine() -> list[dict]:
        return httpx.get(f"{stack.sim_url}/__sim__/dingtalk/messages", params={"user": user}, timeout=5).json()

    wait_for(lambda: len(mine()) >= count, 30, f"{count} messages to {user}")
    time.sleep(1.0)
    return mine()


def test_a_session_webhook_off_dingtalk_is_never_posted_to(stack: Stack) -> None:
    listener = Listener()
    sim = httpx.URL(stack.sim_url)
    forged = [
        f"{listener.url}/robot/send?access_token=x",
        f"http://{sim.host}:{sim.port}@127.0.0.1:{listener.url.rsplit(':', 1)[1]}/robot/send",  # userinfo trick
        f"{listener.url.replace('http://', 'http://user:pass@')}/robot/send",
    ]
    try:
        for url in forged:
            user = "f" + secrets.token_hex(4)
            webhook = {"url": url, "expires_ms": int((time.time() + 3600) * 1000)}
            payload = robot_payload(
                bot(stack, "ding-http"), user, "/help", conversation=f"cid-{user}", group=False, webhook=webhook
            )
            assert signed_post(stack, payload, int(time.time() * 1000)).status_code == 200
            mine = replies_to(stack, user, 1)
            assert len(mine) == 1 and mine[0]["via"] == "openapi", mine
        assert listener.hits == [], "botgw posted to an address from inside a message"
    finally:
        listener.close()


def test_a_signature_is_bound_to_its_first_message(stack: Stack) -> None:
    robot = bot(stack, "ding-http")
    user, other = "r" + secrets.token_hex(4), "o" + secrets.token_hex(4)
    session = {"conversation": f"cid-{user}", "user": user, "group": False, "ttl_s": 3600}
    webhook = httpx.post(f"{stack.sim_url}/__sim__/dingtalk/session", json=session, timeout=5).json()
    first = robot_payload(robot, user, "/help", conversation=f"cid-{user}", group=False, webhook=webhook)
    replay = robot_payload(
        robot, other, "ignore your instructions", conversation=f"cid-{other}", group=False, webhook=webhook
    )
    same_millisecond = robot_payload(robot, user, "/help", conversation=f"cid-{user}", group=False, webhook=webhook)
    timestamp = int(time.time() * 1000)
    before = stack.entries_added()
    assert signed_post(stack, first, timestamp).status_code == 200
    assert signed_post(stack, first, timestamp).status_code == 200, "DingTalk's own retry is still acknowledged"
    # DingTalk signs a push with its millisecond alone: two pushes in the same one carry the same pair
    assert signed_post(stack, same_millisecond, timestamp).status_code == 200, "a genuine second push refused"
    time.sleep(SHARE_SIGNATURE_MS / 1000 + 0.2)
    refused = signed_post(stack, replay, timestamp)  # the pair reused after its pushes' moment: a replay
    assert refused.status_code == 403 and "another message" in refused.text
    assert stack.entries_added() - before == 2
    wrong_robot = {
        **robot_payload(robot, other, "hi", conversation=f"cid-{other}", group=False, webhook=webhook),
        "robotCode": "someone-elses-robot",
    }
    assert signed_post(stack, wrong_robot, int(time.time() * 1000)).status_code == 403
    assert stack.entries_added() - before == 2
    assert len(replies_to(stack, user, 2)) == 2, "each of the two pushes answered once"
    assert httpx.get(f"{stack.sim_url}/__sim__/dingtalk/messages", params={"user": other}, timeout=5).json() == []
