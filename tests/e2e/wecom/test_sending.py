"""Delivery to WeCom's message/send through the worker: splitting, token refresh, retries, 60020."""

from __future__ import annotations

import json
import time

from bots.base import InboundMessage, ReplyTarget
from bots.text import utf8_len
from testkit.processes import wait_for
from testkit.stacks import Stack
from tests.conftest import MEMBER_BURST


def enqueue_notice(stack: Stack, user: str, text: str) -> None:
    """Queue an answer that needs no engine (as an over-limit notice is), to exercise delivery alone."""
    import asyncio

    from redis.asyncio import Redis

    from gateway.queue.push import enqueue_notice
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys

    message = InboundMessage(
        platform="wecom", bot_id="app", msg_id=f"n-{user}-{time.time()}", conversation_id=user,
        sender_id=user, text="", reply_to=ReplyTarget(user_id=user),
    )

    async def put() -> None:
        redis = Redis.from_url(stack.config["redis_url"])
        await enqueue_notice(Scheduler(redis, Keys(stack.namespace)), message, text, rid="test")
        await redis.aclose()

    asyncio.run(put())


def test_long_chinese_answer_arrives_in_pieces(stack: Stack, user: str) -> None:
    answer = "".join("企业微信机器人正在回答你的问题，" for _ in range(110))  # 5,280 bytes
    assert utf8_len(answer) > 5000
    enqueue_notice(stack, user, answer)
    delivered = stack.wait_delivered(user, 3)
    assert len(delivered) == 3
    assert all(utf8_len(item["content"]) <= 2048 and not item["truncated"] for item in delivered)
    # Pieces 1 and 2 have the same content; WeCom's duplicate check would drop the second, so it carries an
    # invisible mark (U+200B) that makes it unique.
    assert "".join(item["content"] for item in delivered).replace("\u200b", "") == answer
    assert [item["content"].count("\u200b") for item in delivered] == [0, 1, 0]


def test_expired_token_is_refreshed_once(stack: Stack, user: str) -> None:
    stack.post_callback(stack.signer().text(user, "/help"))
    stack.wait_delivered(user, 1)
    calls_before = stack.sim_stats()["gettoken_calls"]
    stack.fault(errcode=42001, times=1, touser=user)
    stack.post_callback(stack.signer().text(user, "/help"))
    assert len(stack.wait_delivered(user, 2)) == 2
    assert stack.sim_stats()["gettoken_calls"] == calls_before + 1


def test_throttling_and_server_errors_are_retried_with_backoff(stack: Stack, user: str) -> None:
    stack.fault(errcode=45009, times=2, touser=user)
    stack.fault(http_status=503, times=1, touser=user)
    started = time.monotonic()
    enqueue_notice(stack, user, "after the storm")
    delivered = stack.wait_delivered(user, 1, settle=0.5)
    elapsed = time.monotonic() - started
    assert [item["content"] for item in delivered] == ["after the storm"]
    assert stack.sim_stats(user)["send_calls_to"] == 4, "two 45009, one 503, then the send"
    # 45009 asks for at least 2 s before each retry; the 503 backs off too.
    assert elapsed >= 4.0


def test_untrusted_ip_is_not_retried(stack: Stack, user: str) -> None:
    dead_before = stack.redis.xlen(stack.keys.dead_letters)
    stack.fault(errcode=60020, errmsg="not allow to access from your ip", times=1, touser=user)
    enqueue_notice(stack, user, "never arrives")
    wait_for(lambda: stack.redis.xlen(stack.keys.dead_letters) > dead_before, 20, "the message to be dead-lettered")
    time.sleep(1.0)  # room for a retry to show
    assert stack.sim_stats(user)["send_calls_to"] == 1
    assert stack.delivered(user) == []
    dead = json.loads(stack.redis.xrevrange(stack.keys.dead_letters, count=1)[0][1][b"entry"])
    assert "可信IP" in dead["reason"] and dead["entry"]["msg"]["sender_id"] == user
    log = stack.procs["worker"].tail(200)
    assert "60020" in log and stack.bot.secret.get_secret_value() not in log


def test_dead_letter_listed_replayed_once_and_purged(stack: Stack, user: str, capsys) -> None:
    from gateway.cli import main

    config = ["--config", str(stack.config_path)]
    dead_before = stack.redis.xlen(stack.keys.dead_letters)
    stack.fault(errcode=60020, errmsg="not allow to access from your ip", times=1, touser=user)
    enqueue_notice(stack, user, "arrives after a replay")
    deadline = time.monotonic() + 20
    while stack.redis.xlen(stack.keys.dead_letters) == dead_before:
        assert time.monotonic() < deadline, "the message was not dead-lettered"
        time.sleep(0.1)
    capsys.readouterr()
    assert main(["dlq", "list", *config]) == 0
    listed = [item for item in json.loads(capsys.readouterr().out) if item["user"] == user]
    assert len(listed) == 1 and "可信IP" in listed[0]["reason"]
    letter_id = listed[0]["id"]
    assert main(["dlq", "replay", letter_id, *config]) == 0  # the fault was for one send only
    assert json.loads(capsys.readouterr().out) == {letter_id: "queued"}
    delivered = stack.wait_delivered(user, 1, settle=1.5)
    # (The refused first try reserved its content for the duplicate check, so the replay may carry a mark.)
    assert [item["content"].rstrip("\u200b") for item in delivered] == ["arrives after a replay"]
    assert main(["dlq", "replay", letter_id, *config]) == 1, "a replayed letter is gone"
    capsys.readouterr()
    assert main(["dlq", "list", *config]) == 0
    assert all(item["user"] != user for item in json.loads(capsys.readouterr().out))
    assert main(["dlq", "purge", *config]) == 2, "purge needs ids or --all"
    assert main(["dlq", "purge", "--all", *config]) == 0
    assert stack.redis.xlen(stack.keys.dead_letters) == 0


def test_a_replayed_half_delivered_answer_sends_each_piece_once(stack: Stack, user: str, capsys) -> None:
    """The second of three pieces is refused for good (60020): the answer becomes a dead letter with its first piece
    delivered. The replay resumes at the second piece; composed afresh, it sent the first one again (and on
    微信客服 that piece's msgid, used already, had it refused and the answer given up at once)."""
    from gateway.cli import main
    from gateway.delivery.pieces import UNIQUE_MARKS

    config = ["--config", str(stack.config_path)]
    answer = "".join(f"第{i}句：企业微信机器人正在回答你的问题。" for i in range(90))  # three pieces, none alike
    dead_before = stack.redis.xlen(stack.keys.dead_letters)
    stack.fault(errcode=60020, errmsg="not allow to access from your ip", times=1, after=1, touser=user)
    enqueue_notice(stack, user, answer)
    wait_for(lambda: stack.redis.xlen(stack.keys.dead_letters) > dead_before, 20, "the message to be dead-lettered")
    assert len(stack.delivered(user)) == 1, "the first piece went out before the refusal"
    capsys.readouterr()
    assert main(["dlq", "list", *config]) == 0
    (letter_id,) = [item["id"] for item in json.loads(capsys.readouterr().out) if item["user"] == user]
    assert main(["dlq", "replay", letter_id, *config]) == 0
    assert json.loads(capsys.readouterr().out) == {letter_id: "queued"}
    delivered = stack.wait_delivered(user, 3, settle=1.5)
    unmarked = [item["content"].translate({ord(mark): None for mark in UNIQUE_MARKS}) for item in delivered]
    assert len(unmarked) == 3 and len(set(unmarked)) == 3, "a piece arrived twice"
    assert "".join(unmarked) == answer


def test_a_members_burst_is_paced_to_thirty_a_minute_and_none_dropped(
    stack: Stack, member_burst: tuple[str, float]
) -> None:
    """35 answers for one member, queued at once (when the session's stack started, so that the minute this
    takes passes while other tests run): WeCom drops, silently, what an app sends one member past 30 a
    minute. All 35 arrive, in order, never more than 30 within a minute."""
    user, queued_at = member_burst
    left = max(5.0, queued_at + 150 - time.time())
    wait_for(lambda: len(stack.delivered(user)) >= MEMBER_BURST, left, f"the {MEMBER_BURST} answers")
    time.sleep(1.0)  # room for an extra one to show
    assert stack.texts(user) == [f"notice {i} of the burst" for i in range(MEMBER_BURST)]
    times = [item["at"] for item in stack.delivered(user)]
    assert all(times[i + 30] - times[i] >= 60 for i in range(len(times) - 30)), "more than 30 within a minute"
    assert times[30] - times[0] < 75, "the 31st waited for its minute, not much longer"
