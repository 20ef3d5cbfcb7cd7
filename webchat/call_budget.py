"""How often one client network may make the page ask WeCom or DingTalk to exchange a sign-in code.

The callback's state check compares the query with a cookie the client chose, so a script can send the page any
code, and each one used to cost a platform call (and the corporation's API quota: 45009 stops every sign-in, the
console's too). Counting every call per network refused people, though: a company behind one NAT address signing
in at nine o'clock makes more than 30 calls a minute, all of them good. So the budget counts only the calls that
signed nobody in (a code the platform refused, a person outside the organisation, a platform error), and holds
each network to a few calls at a time: the calls of a burst wait their turn, so a flood of forged codes is refused
once its failures are counted, instead of all going out before the first one came back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from limits import parse
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

FAILED_CALLS_PER_NETWORK = "30/minute"  # calls that signed nobody in, per client network
CALLS_AT_ONCE_PER_NETWORK = 4  # a sign-in's exchange takes a platform round trip or two: a wave queues briefly
WAITING_PER_NETWORK = 64  # calls of one network waiting for a turn past the ones in flight; more are refused


class OverBudget(Exception):
    """This network's failed calls of the last minute are used up, or too many of its calls wait already."""


@dataclass
class _Turns:
    """One network's calls in flight (the semaphore) and how many hold or wait for a turn."""

    semaphore: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CALLS_AT_ONCE_PER_NETWORK))
    holders: int = 0


class Turn:
    """A call's turn: `failed()` says it signed nobody in, which spends the network's budget."""

    def __init__(self, budget: CallBudget, network: str) -> None:
        self._budget = budget
        self._network = network

    async def failed(self) -> None:
        await self._budget.spend(self._network)


class CallBudget:
    """Per client network: failed calls a minute (moving window, `limits`) and calls at once (a semaphore)."""

    def __init__(self, failed_calls: str = FAILED_CALLS_PER_NETWORK) -> None:
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._failed_calls = parse(failed_calls)
        self._turns: dict[str, _Turns] = {}  # only networks with a call waiting or in flight

    async def _left(self, network: str) -> bool:
        return await self._limiter.test(self._failed_calls, "failed", network)

    async def spend(self, network: str) -> None:
        await self._limiter.hit(self._failed_calls, "failed", network)

    @asynccontextmanager
    async def turn(self, network: str) -> AsyncIterator[Turn]:
        """Wait for one of the network's turns; OverBudget (before any call) when its failures are used up, before
        or while it waited, or when too many of its calls wait already."""
        if not await self._left(network):
            raise OverBudget(network)
        turns = self._turns.setdefault(network, _Turns())
        if turns.holders >= CALLS_AT_ONCE_PER_NETWORK + WAITING_PER_NETWORK:
            raise OverBudget(network)
        turns.holders += 1
        try:
            async with turns.semaphore:
                if not await self._left(network):  # the calls ahead of this one failed while it waited
                    raise OverBudget(network)
                yield Turn(self, network)
        finally:
            turns.holders -= 1
            if turns.holders == 0:
                del self._turns[network]
