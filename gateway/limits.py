"""Per-user message limits with the `limits` library on Redis (moving window, shared by all replicas)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from limits import parse
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter


@dataclass(frozen=True)
class LimitDecision:
    """Whether a message may go to the engine, and if not, in how many seconds it could."""

    allowed: bool
    retry_after_s: int = 0


def _limits_uri(redis_url: str) -> str:
    """redis://… → async+redis://… as the limits library names its async Redis storage."""
    return redis_url if redis_url.startswith("async+") else f"async+{redis_url}"


class MovingWindowLimiter:
    """Counts hits per key in a moving window shared by all replicas (users' messages, a robot's sends)."""

    def __init__(self, redis_url: str, limit: str, key_prefix: str) -> None:
        self._limit = parse(limit)
        self._storage = RedisStorage(_limits_uri(redis_url), implementation="redispy", key_prefix=key_prefix)
        self._limiter = MovingWindowRateLimiter(self._storage)

    async def hit(self, user_key: str) -> LimitDecision:
        if await self._limiter.hit(self._limit, user_key):
            return LimitDecision(True)
        stats = await self._limiter.get_window_stats(self._limit, user_key)
        return LimitDecision(False, max(1, math.ceil(stats.reset_time - time.time())))

    async def reset(self) -> None:
        await self._storage.reset()


def over_limit_notice(retry_after_s: int) -> str:
    """The polite answer an over-limit user gets instead of silence, in English and Chinese."""
    minutes = math.ceil(retry_after_s / 60)
    wait_en = f"about {minutes} minutes" if retry_after_s >= 120 else f"{retry_after_s} seconds"
    wait_zh = f"约 {minutes} 分钟" if retry_after_s >= 120 else f"{retry_after_s} 秒"
    return (
        f"You are sending messages faster than I can answer. Please try again in {wait_en}.\n"
        f"消息太频繁了，请 {wait_zh} 后再试。"
    )
