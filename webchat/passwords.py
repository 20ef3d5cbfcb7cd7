"""Password sign-in on the page, without freezing it and without telling a guesser anything.

- scrypt (about 50 ms of CPU and 16 MiB each) runs in a small thread pool of its own, never on Chainlit's event
  loop: hashlib releases the GIL while it hashes, so the page keeps answering everyone else. The pool has two
  threads, so a burst of sign-ins waits its turn instead of taking every core.
- Failed sign-ins are counted per name and per client address (`login_guard`, moving windows, in this process's
  memory: each page process counts its own). A name or address over its limit is refused before its password is
  looked at, with a message that says when to try again (HTTP 429; webchat/guard.py answers it).
- The decision is taken before scrypt and at once for concurrent attempts: a sign-in reserves its place in every
  window of its name and address (failures counted so far plus the sign-ins still being checked must leave room
  for it), so a burst of twenty wrong passwords for one name at the same instant gets as many 401s as the limit
  allows and 429 for the rest, none of those hashed. A reservation becomes a failure when the password is wrong
  and is given back when it is right: only failures are counted.
- At most `MAX_WAITING` sign-ins wait for a scrypt thread beyond those hashing; more are answered 503 at once.
- An unknown name costs the same scrypt as a known one (WebBotConfig.user), so the time says nothing either.
- A hash that cannot be checked (the configuration refuses malformed ones at start, so only one changed behind its
  back) is a failed sign-in and one warning line, never a traceback, and never the hash.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from limits import RateLimitItem, parse_many
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from bots.web.config import WebBotConfig, WebUser
from webchat.guard import FACTS, Refusal

log = logging.getLogger("botgw.web")

HASH_THREADS = 2
MAX_WAITING = 16  # sign-ins waiting for a scrypt thread beyond the HASH_THREADS hashing; more: 503 at once
MAX_KEY_CHARS = 128
BUSY = "The page is busy signing others in. Please try again in a few seconds."
BUSY_RETRY_S = 2


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
        self._lock = asyncio.Lock()  # the limits are tested and a place reserved in one step
        self._checking: Counter[str] = Counter()  # per key: sign-ins reserved and not yet decided
        self._hashing = 0  # sign-ins hashing or waiting for a thread

    def _keys(self, name: str, address: str) -> list[tuple[RateLimitItem, str]]:
        keys = {"name": name[:MAX_KEY_CHARS], "address": address[:MAX_KEY_CHARS] or "unknown"}
        return [(window, f"{kind}:{keys[kind]}") for kind, windows in self._windows.items() for window in windows]

    async def _reserve(self, keys: list[tuple[RateLimitItem, str]]) -> Refusal | None:
        """A place in every window for this sign-in (None), or why not: no await between the test and the
        reservation but the in-memory storage's, and those under one lock."""
        async with self._lock:
            if self._hashing >= HASH_THREADS + MAX_WAITING:
                return Refusal(BUSY, BUSY_RETRY_S, 503)
            wait = 0
            for window, key in keys:
                if not await self._limiter.test(window, key, cost=1 + self._checking[key]):
                    stats = await self._limiter.get_window_stats(window, key)
                    wait = max(wait, max(1, math.ceil(stats.reset_time - time.time())))
            if wait:
                return Refusal(refusal_text(wait), wait)
            self._checking.update({key for _, key in keys})
            self._hashing += 1
            return None

    async def _release(self, keys: list[tuple[RateLimitItem, str]], failed: bool) -> None:
        async with self._lock:
            self._hashing -= 1
            if failed:  # the reserved place becomes a failure (there was room for it: it was reserved)
                for window, key in keys:
                    await self._limiter.hit(window, key)
            for key in {key for _, key in keys}:
                self._checking[key] -= 1
                if not self._checking[key]:
                    del self._checking[key]

    async def check(self, name: str, password: str) -> WebUser | None:
        facts = FACTS.get()
        keys = self._keys(name, facts.address if facts else "")
        refusal = await self._reserve(keys)
        if refusal is not None:
            if facts is not None:
                facts.refusal = refusal
            return None
        user = None
        try:
            user = await asyncio.get_running_loop().run_in_executor(self._pool, self.bot.user, name, password)
        except (ValueError, TypeError, OverflowError) as exc:  # binascii.Error and hashlib's refusals among them
            log.warning("web bot %r: the sign-in as %r failed: a password_hash of this bot cannot be checked (%s); "
                        "make a new one with `botgw web-password`", self.bot.id, name[:64], type(exc).__name__)
        finally:
            await self._release(keys, failed=user is None)
        return user
