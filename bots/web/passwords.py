"""Password sign-in on the page, without freezing it and without telling a guesser anything.

- scrypt (about 50 ms of CPU and 16 MiB each) runs in a small thread pool of its own, never on Chainlit's event
  loop: hashlib releases the GIL while it hashes, so the page keeps answering everyone else. The pool has two
  threads, so a burst of sign-ins waits its turn instead of taking every core.
- Failed sign-ins are counted per name and per client address (`login_guard`, moving windows, in this process's
  memory: each page process counts its own). A name or address over its limit is refused before its password is
  looked at, with a message that says when to try again (HTTP 429; bots/web/guard.py answers it).
- An unknown name costs the same scrypt as a known one (WebBotConfig.user), so the time says nothing either.
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

from limits import RateLimitItem, parse_many
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from bots.web.config import WebBotConfig, WebUser
from bots.web.guard import FACTS, Refusal

HASH_THREADS = 2
MAX_KEY_CHARS = 128


def refusal_text(seconds: int) -> str:
    amount, unit = (math.ceil(seconds / 60), "minute") if seconds > 90 else (seconds, "second")
    return f"Too many failed sign-ins. Please wait {amount} {unit}{'s' if amount != 1 else ''} and try again."


class PasswordSignIn:
    """`await PasswordSignIn(bot).check(name, password)`: the user, or None (a wrong password, or refused by the
    limits: then FACTS holds the refusal, which the middleware answers 429)."""

    def __init__(self, bot: WebBotConfig) -> None:
        self.bot = bot
        self._pool = ThreadPoolExecutor(max_workers=HASH_THREADS, thread_name_prefix="botgw-scrypt")
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._windows: dict[str, list[RateLimitItem]] = {
            "name": parse_many(bot.login_guard.per_name),
            "address": parse_many(bot.login_guard.per_address),
        }

    def _keys(self, name: str, address: str) -> list[tuple[RateLimitItem, str]]:
        keys = {"name": name[:MAX_KEY_CHARS], "address": address[:MAX_KEY_CHARS] or "unknown"}
        return [(window, f"{kind}:{keys[kind]}") for kind, windows in self._windows.items() for window in windows]

    async def _refused(self, name: str, address: str) -> Refusal | None:
        wait = 0
        for window, key in self._keys(name, address):
            if not await self._limiter.test(window, key):
                stats = await self._limiter.get_window_stats(window, key)
                wait = max(wait, max(1, math.ceil(stats.reset_time - time.time())))
        return Refusal(refusal_text(wait), wait) if wait else None

    async def check(self, name: str, password: str) -> WebUser | None:
        facts = FACTS.get()
        address = facts.address if facts else ""
        refusal = await self._refused(name, address)
        if refusal is not None:
            if facts is not None:
                facts.refusal = refusal
            return None
        user = await asyncio.get_running_loop().run_in_executor(self._pool, self.bot.user, name, password)
        if user is None:
            for window, key in self._keys(name, address):
                await self._limiter.hit(window, key)
        return user
