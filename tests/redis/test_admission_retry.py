"""The admission rider is asked on every first load, also for a retry of a message that was refused (and answered
with the refusal notice): a refused message is no member of its windows, so the rider carries the record and counts
nothing for a message already answered; else the retry, once room came back, would take the next message's place
(found by a review of issue 22)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest
from redis import asyncio as aioredis

from gateway.state.keys import Keys
from gateway.state.limits import Budgets, LimitSettings
from gateway.state.reply_record import Fence, ReplyRecords


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_a_retry_of_a_refused_message_is_not_counted(redis: aioredis.Redis) -> None:
    keys = Keys("v" + secrets.token_hex(4))
    budgets = Budgets(redis, "", keys, LimitSettings(per_user="1/2 seconds"))
    records = ReplyRecords(client := redis, keys, 3600)
    await budgets.load_scripts()
    await client.hset(keys.lease("lane"), "epoch", "1")

    async def first_load(message_key: str):
        admission = budgets.admission("u1", None, message_key, keys.reply(message_key))  # as Worker._admission
        assert admission is not None
        record = records.open(message_key, Fence(keys.lease("lane"), "1"), keys.memory("u1"), riders=[admission])
        state = await record.load()
        return admission, record, state

    admission, _, _ = await first_load("m1")
    assert admission.refusal is None
    admission, record, _ = await first_load("m2")
    assert admission.refusal is not None, "the window holds one message"
    await record.commit("您发得太快了", "1.0")  # MessageLimits commits the refusal notice (its send is paced: retry)
    await asyncio.sleep(2.2)  # the window passed while the notice waited for its pacing
    _, _, state = await first_load("m2")  # the retry's first load: the text is there, the pipeline will not run
    assert state.text == "您发得太快了"
    admission, _, _ = await first_load("m3")  # the person's next message
    assert admission.refusal is None, "the refused m2 took m3's place in the window on its retry"


async def test_a_retry_after_its_shortest_window_is_neither_counted_again_nor_refused(redis: aioredis.Redis) -> None:
    """A message admitted once is admitted for good while it is in any window: a retry after the minute (a takeover,
    an engine wait) was counted again in the minute's window, or refused there once others had filled it, while the
    day's still held it (found by a review)."""
    keys = Keys("v" + secrets.token_hex(4))
    budgets = Budgets(redis, "", keys, LimitSettings(per_user="2/2 seconds;100/day"))
    await budgets.load_scripts()
    assert await budgets.admit_message("u1", None, "m") is None
    await asyncio.sleep(2.2)  # m leaves the short window, not the day's
    assert await budgets.admit_message("u1", None, "x") is None
    assert await budgets.admit_message("u1", None, "y") is None  # the short window is full again
    assert await budgets.admit_message("u1", None, "m") is None, "the admitted message was refused on its retry"
    assert await budgets.admit_message("u1", None, "z") is not None, "the short window holds x and y"
    day = [key for key in await redis.keys(f"*{keys.namespace}*") if await redis.type(key) == b"zset"]
    counts = sorted([await redis.zcard(key) for key in day])
    assert counts == [2, 3], f"m was counted again: {counts}"
