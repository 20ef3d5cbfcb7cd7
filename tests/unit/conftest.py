"""Fixtures of the unit tests that talk to the session's real redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """An asyncio client of the session's redis-server, closed after the test."""
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()
