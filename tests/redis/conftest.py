"""What the Redis tests of the answer path share: a namespace of their own on the session's real redis-server, with
the stores a worker uses over it."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from gateway.config import WorkerSettings
from gateway.delivery.presenters import Delivery
from gateway.queue.scheduler import Scheduler
from gateway.state.conversations import Conversations
from gateway.state.keys import Keys
from gateway.state.limits import MovingWindowLimiter
from gateway.state.reply_record import ReplyRecords
from gateway.state.streams import StreamStore


@dataclass
class World:
    redis: aioredis.Redis
    redis_url: str
    keys: Keys
    scheduler: Scheduler
    records: ReplyRecords
    conversations: Conversations
    delivery: Delivery


@pytest.fixture
async def world(redis_url: str) -> AsyncIterator[World]:
    client = aioredis.Redis.from_url(redis_url)
    keys = Keys("f" + secrets.token_hex(4))
    conversations = Conversations(client, keys, "per_user")
    pacer = MovingWindowLimiter(redis_url, keys.send_pace_prefix)
    delivery = Delivery(client, keys, StreamStore(client, keys), pacer, WorkerSettings(), conversations)
    scheduler = Scheduler(client, keys)
    await scheduler.load_scripts()
    yield World(client, redis_url, keys, scheduler, ReplyRecords(client, keys, 3600), conversations, delivery)
    await client.aclose()
