"""A piece's send begun in one round trip (ReplyRecord.begin_send, a single Redis): every pacing window counted or
none, in the same lists the `limits` library keeps (so the two keep one count), the piece's repeats numbered, the
record marked, and nothing at all when the lease has passed on. Against the session's real redis-server."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.state.keys import Keys
from gateway.state.limits import MovingWindowLimiter, window
from gateway.state.memory import Turn, turns_of
from gateway.state.reply_record import Fence, LeaseLost, ReplyRecords


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.Redis.from_url(redis_url)
    yield made
    await made.aclose()


def windows(pacer: MovingWindowLimiter, key: str, *specs: str) -> list[tuple[str, int, int]]:
    return [(pacer.window_key(key, window(spec)), window(spec).amount, window(spec).get_expiry()) for spec in specs]


async def test_every_window_counts_the_send_or_none_does(client: aioredis.Redis, redis_url: str) -> None:
    keys = Keys("b" + secrets.token_hex(4))
    pacer = MovingWindowLimiter(redis_url, keys.send_pace_prefix)
    records = ReplyRecords(client, keys, 3600)
    paced = windows(pacer, "bot:alice", "2/61 seconds", "4/3601 seconds")
    first, second, third = (records.open(f"m{i}") for i in range(3))
    assert await first.begin_send(paced, None, {"started": 1}) == (0.0, 0)
    assert (await pacer.hit("bot:alice", [window("4/3601 seconds")])).allowed  # the library's own hit, in the same list
    wait_s, _ = await second.begin_send(paced, None, {"started": 1})
    assert wait_s == 0, "the minute window held 1 of 2, the hour 2 of 4"
    wait_s, _ = await third.begin_send(paced, None, {"started": 1})
    assert 59 < wait_s <= 61, "the minute window is full: the wait until its oldest send leaves it"
    assert (await third.load()).started == 0, "refused: nothing marked"
    hour = [window("4/3601 seconds")]
    assert (await pacer.hit("bot:alice", hour)).allowed, "the refused send took no slot of the hour: its 4th is free"
    assert not (await pacer.hit("bot:alice", hour)).allowed, "and now the hour is full"
    assert await client.llen(paced[0][0]) == 2


async def test_repeats_are_numbered_and_a_lost_lease_changes_nothing(client: aioredis.Redis, redis_url: str) -> None:
    keys = Keys("b" + secrets.token_hex(4))
    records = ReplyRecords(client, keys, 3600)
    counter = keys.recent_send("bot", "digest")
    numbers = []
    for attempt in range(3):
        record = records.open(f"r{attempt}")
        _, count = await record.begin_send([], (counter, 60, "v0", 4), {"started": 1})
        numbers.append((count, (await record.load()).variants))
    assert numbers == [(1, {0: 0}), (2, {0: 1}), (3, {0: 2})]
    assert 0 < await client.ttl(counter) <= 60

    await client.hset("lease", "epoch", "7")
    fenced = records.open("f", Fence("lease", "6"))
    with pytest.raises(LeaseLost):
        await fenced.begin_send([("pace:x", 1, 60)], (counter, 60, "v0", 4), {"started": 1})
    assert await client.get(counter) == b"3" and not await client.exists("pace:x")
    assert not await client.exists(keys.reply("f"))


async def test_a_commit_rides_on_the_first_begin_and_stays_when_the_send_must_wait(client: aioredis.Redis) -> None:
    """The answer's commit kept for the first send's begin (ReplyRecord.commit_rides_on_send) is written by that
    begin, before its pacing: a full window refuses the send but not the commit, and the exchange is in memory once.
    A lost lease writes neither, and a read before the begin writes the commit alone first."""
    keys = Keys("b" + secrets.token_hex(4))
    records = ReplyRecords(client, keys, 3600)
    await client.hset("lease", "epoch", "7")
    memory = keys.memory("lane")
    exchange = (Turn("user", "你好", 2), Turn("assistant", "您好", 2))

    full = [("pace:full", 1, 60)]
    await client.lpush("pace:full", "9999999999")  # a send counted in the future: the window stays full
    record = records.open("m1", Fence("lease", "7"))
    record.commit_rides_on_send = True
    assert await record.commit("您好", "1.0", memory, exchange, 600, 10) == "您好"
    assert not await client.exists(keys.reply("m1")), "written before the begin: no round trip saved"
    wait_s, _ = await record.begin_send(full, None, {"started": 1})
    assert wait_s > 0
    state = await record.load()
    assert (state.text, state.state, state.started) == ("您好", "committed", 0)
    assert [turn.content for turn in turns_of(await client.lrange(memory, 0, -1))] == ["你好", "您好"]
    assert 0 < await client.ttl(memory) <= 600 and 0 < await client.ttl(keys.reply("m1")) <= 3600
    assert await record.begin_send([], None, {"started": 1}) == (0.0, 0)
    assert await client.llen(memory) == 2, "the exchange went into memory once"

    read_first = records.open("m2", Fence("lease", "7"))
    read_first.commit_rides_on_send = True
    await read_first.commit("again", "1.0", memory, exchange, 600, 10)
    assert (await read_first.load()).text == "again"

    stale = records.open("m3", Fence("lease", "6"))
    stale.commit_rides_on_send = True
    await stale.commit("stale", "1.0", memory, exchange, 600, 10)
    with pytest.raises(LeaseLost):
        await stale.begin_send([], None, {"started": 1})
    assert not await client.exists(keys.reply("m3"))
    assert await client.llen(memory) == 4
