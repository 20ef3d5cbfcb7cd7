"""Riders: what a job's stages would ask Redis, sent with the reply record's first load in one round trip
(gateway/state/riders.py). The memory adoption and the message admission must mean the same there as alone."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

import pytest
from redis import asyncio as aioredis

from gateway.state.keys import Keys
from gateway.state.limits import Budgets, LimitSettings
from gateway.state.memory import ConversationMemory
from gateway.state.reply_record import ReplyRecords


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def turn(role: str, content: str) -> str:
    return json.dumps({"role": role, "content": content, "tokens": 3})


async def test_an_adoption_rider_moves_the_old_memory_before_the_load_reads_it(redis: aioredis.Redis) -> None:
    keys = Keys("r" + secrets.token_hex(4))
    memory = ConversationMemory(redis, keys, 3600, 10)
    await memory.load_scripts()  # as the worker does at start
    await redis.rpush(keys.memory("old-name"), turn("user", "earlier"), turn("assistant", "yes"))
    rider = memory.adoption("person", "old-name")
    assert rider is not None
    record = ReplyRecords(redis, keys, 3600).open("m1", memory_key=keys.memory("person"), riders=[rider])
    await record.load()
    assert [t.content for t in record.memory or []] == ["earlier", "yes"], "the load read before the move"
    assert await redis.exists(keys.memory("old-name")) == 0
    assert memory.adoption("person", "old-name") is None, "asked again in the same process"
    assert await memory.adopt("person", "old-name") is False  # the stage after it: nothing left to do


async def test_a_rider_whose_script_redis_lost_leaves_its_stage_to_ask(redis: aioredis.Redis) -> None:
    """After SCRIPT FLUSH (a restarted Redis) the rider fails, the load still reads, and the stage's own call
    (which loads the script) does the adoption, so the memory read is forgotten and read again."""
    keys = Keys("r" + secrets.token_hex(4))
    memory = ConversationMemory(redis, keys, 3600, 10)
    await redis.rpush(keys.memory("old-name"), turn("user", "earlier"))
    await redis.script_flush()
    record = ReplyRecords(redis, keys, 3600).open(
        "m1", memory_key=keys.memory("person"), riders=[memory.adoption("person", "old-name")]  # type: ignore[list-item]
    )
    await record.load()
    assert record.memory == []
    assert await memory.adopt("person", "old-name") is True
    record.forget_memory()
    await record.load()
    assert [t.content for t in record.memory or []] == ["earlier"]


async def test_an_admission_rider_counts_a_message_once_and_refuses_past_the_window(redis: aioredis.Redis) -> None:
    keys = Keys("r" + secrets.token_hex(4))
    budgets = Budgets(redis, "", keys, LimitSettings(per_user="2/minute"))
    records = ReplyRecords(redis, keys, 3600)
    await budgets.load_scripts()

    async def admitted(message_key: str) -> bool:
        admission = budgets.admission("u1", None, message_key)
        assert admission is not None
        await records.open(message_key, memory_key=keys.memory("u1"), riders=[admission]).load()
        assert admission.answered
        return admission.refusal is None

    assert await admitted("m1")
    assert await admitted("m1"), "a retry of the same message was counted again"
    assert await admitted("m2")
    assert not await admitted("m3"), "a third message within the minute was let through"
    refusal = await budgets.admit_message("u1", None, "m3")
    assert refusal is not None and refusal.kind == "messages" and refusal.who == "user:u1"
    assert await budgets.admit_message("u1", None, "m1") is None  # still a member: a retry passes
