"""The commit that rides on the first send's begin (issue 22): a Redis blip around that begin must leave
the answer committed once, with its exchange in memory once, whether the reply of a begin that ran was lost (the
begin is tried again) or the begin never reached Redis and Redis stays away (the commit is kept for the next write,
which the failure path's flush makes); and a blip on the trip of a write that flushes a kept commit first must not
drop it (found by a review: it is let go only once written)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.state import reply_record
from gateway.state.keys import Keys
from gateway.state.memory import Turn, turns_of
from gateway.state.reply_record import Fence, ReplyRecords


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.Redis.from_url(redis_url)
    yield made
    await made.aclose()


EXCHANGE = (Turn("user", "你好", 2), Turn("assistant", "您好", 2))


async def test_a_begin_whose_reply_was_lost_commits_once(client: aioredis.Redis) -> None:
    keys = Keys("v" + secrets.token_hex(4))
    lease, memory = keys.lease("lane"), keys.memory("lane")
    await client.hset(lease, "epoch", "3")
    record = ReplyRecords(client, keys, 3600).open("m1", Fence(lease, "3"))
    record.commit_rides_on_send = True
    record._scripts = dict(record._scripts)
    real, runs = record._scripts["begin_send"], []

    async def ran_then_lost(**kwargs):
        result = await real(**kwargs)
        runs.append(result)
        if len(runs) == 1:
            raise RedisConnectionError("Connection reset by peer")  # it ran; its reply never came
        return result

    record._scripts["begin_send"] = ran_then_lost
    assert await record.commit("您好", "1.0", memory, EXCHANGE, 600, 10) == "您好"
    assert await record.begin_send([], None, {"started": 1}) == (0.0, 0)
    assert len(runs) == 2, "the begin was tried again"
    state = await record.load()
    assert (state.text, state.state, state.started) == ("您好", "committed", 1)
    assert [t.content for t in turns_of(await client.lrange(memory, 0, -1))] == ["你好", "您好"], "exchange once"


async def test_a_begin_that_never_ran_keeps_the_commit_for_the_failure_paths_flush(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reply_record, "MARK_RETRY_S", 0.2)
    keys = Keys("v" + secrets.token_hex(4))
    lease, memory = keys.lease("lane"), keys.memory("lane")
    await client.hset(lease, "epoch", "3")
    record = ReplyRecords(client, keys, 3600).open("m2", Fence(lease, "3"))
    record.commit_rides_on_send = True
    record._scripts = dict(record._scripts)

    async def away(**kwargs):
        raise RedisConnectionError("Error 111 connecting: Connection refused")

    real = record._scripts["begin_send"]
    record._scripts["begin_send"] = away
    await record.commit("您好", "1.0", memory, EXCHANGE, 600, 10)
    with pytest.raises(RedisConnectionError):
        await record.begin_send([], None, {"started": 1})
    assert not await client.exists(keys.reply("m2")), "nothing reached Redis"
    await record.flush()  # gateway/worker/failures.failed, once Redis is back
    state = await record.load()
    assert (state.text, state.state, state.started) == ("您好", "committed", 0), "committed, no send begun"
    assert await client.llen(memory) == 2
    record._scripts["begin_send"] = real
    assert await record.begin_send([], None, {"started": 1}) == (0.0, 0)
    assert await client.llen(memory) == 2, "the commit was not carried a second time"


async def test_a_blip_on_the_flushed_commit_does_not_drop_it(client: aioredis.Redis) -> None:
    keys = Keys("v" + secrets.token_hex(4))
    records = ReplyRecords(client, keys, 3600)
    lease = keys.lease("lane")
    await client.hset(lease, "epoch", "7")
    memory = keys.memory("lane")
    record = records.open("m1", Fence(lease, "7"))
    record.commit_rides_on_send = True
    record._scripts = dict(record._scripts)  # this record's own: the blip hits only its commit
    real_commit, calls = record._scripts["commit"], []

    async def commit_that_blips_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:  # the connection dropped before the command reached Redis
            raise RedisConnectionError("Connection closed by server.")
        return await real_commit(**kwargs)

    record._scripts["commit"] = commit_that_blips_once
    # an empty answer (gateway/worker/dispatch.answer marks it done at once; on WeCom app / group robot / DingTalk
    # text, single Redis, reachable today via a tool tap that does nothing or an empty ready notice, both without an
    # exchange: the exchange here only shows what else the same drop would lose)
    await record.commit("", "1.0", memory, (Turn("user", "hi", 1),), 600, 10)
    await record.mark(state="done")  # flushes the commit first; retried while Redis is away
    raw = await client.hgetall(keys.reply("m1"))
    assert raw.get(b"state") == b"done"
    assert b"text" in raw, f"done without the commit: {raw}"
    assert [t.content for t in turns_of(await client.lrange(memory, 0, -1))] == ["hi"], "the exchange was lost"
