"""Retrying a transient failure with exponential backoff (and the platform's own retry_after)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def backoff_delay(attempt: int, base_s: float, cap_s: float, hint_s: float = 0.0) -> float:
    """Delay before retry number `attempt` (1-based): base·2^(attempt-1) with jitter, at least the hint."""
    delay = min(cap_s, base_s * (2 ** (attempt - 1)))
    return max(hint_s, delay * random.uniform(0.8, 1.2))


async def retry(
    call: Callable[[int], Awaitable[T]],
    *,
    attempts: int,
    base_s: float,
    cap_s: float,
    retryable: Callable[[BaseException], bool],
    hint: Callable[[BaseException], float] = lambda exc: 0.0,
    what: str = "call",
) -> T:
    """Run `call(attempt_index)` until it succeeds, a failure is not retryable, or attempts run out."""
    for attempt in range(attempts):
        try:
            return await call(attempt)
        except Exception as exc:
            if attempt + 1 >= attempts or not retryable(exc):
                raise
            delay = backoff_delay(attempt + 1, base_s, cap_s, hint(exc))
            log.warning("%s failed, retrying", what, extra={"error": str(exc), "retry_in_s": round(delay, 2)})
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
