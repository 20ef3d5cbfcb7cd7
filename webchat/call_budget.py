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
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

FAILED_CALLS_PER_NETWORK = 30  # calls that signed nobody in, per client network, in WINDOW_S
WINDOW_S = 60.0
CALLS_AT_ONCE_PER_NETWORK = 4  # a sign-in's exchange takes a platform round trip or two: a wave queues briefly
WAITING_PER_NETWORK = 64  # calls of one network waiting for a turn past the ones in flight; more are refused
NETWORKS_KEPT = 10_000  # networks with failures remembered; past it the emptied windows are dropped


class OverBudget(Exception):
    """This network's failed calls of the last minute are used up."""


class Busy(OverBudget):
    """Too many of this network's calls wait for a turn already: nothing failed, it is a crowd; try again soon."""


@dataclass
class _Turns:
    """One network's calls: the semaphore of its turns, those in flight, and those in flight or waiting."""

    semaphore: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CALLS_AT_ONCE_PER_NETWORK))
    in_flight: int = 0
    in_flight_or_waiting: int = 0


class Turn:
    """A call's turn: `failed()` says it signed nobody in, which spends the network's budget."""

    def __init__(self, budget: CallBudget, network: str) -> None:
        self._budget = budget
        self._network = network

    def failed(self) -> None:
        self._budget.spend(self._network)


class CallBudget:
    """Per client network: failed calls in a moving minute, and calls at once (a semaphore). A call in flight counts
    as a failure until it is known not to be one, so the calls started never exceed the failures the window has
    room for, however the attacker spaces them."""

    def __init__(self, failed_calls: int = FAILED_CALLS_PER_NETWORK, window_s: float = WINDOW_S) -> None:
        self._allowed = failed_calls
        self._window_s = window_s
        self._failures: dict[str, deque[float]] = {}  # failure times within the window, per network
        self._turns: dict[str, _Turns] = {}  # only networks with a call waiting or in flight

    def _recent(self, network: str) -> int:
        times = self._failures.get(network)
        if times is None:
            return 0
        horizon = time.monotonic() - self._window_s
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[network]
            return 0
        return len(times)

    def _room(self, network: str) -> bool:
        turns = self._turns.get(network)
        return self._recent(network) + (turns.in_flight if turns else 0) < self._allowed

    def spend(self, network: str) -> None:
        if network not in self._failures and len(self._failures) >= NETWORKS_KEPT:
            for other in list(self._failures):
                self._recent(other)  # drops the windows that emptied
        self._failures.setdefault(network, deque()).append(time.monotonic())

    @asynccontextmanager
    async def turn(self, network: str) -> AsyncIterator[Turn]:
        """Wait for one of the network's turns; OverBudget (before any call) when its failures and calls in flight
        leave no room, before or after it waited; Busy when too many of its calls wait already."""
        if not self._room(network):
            raise OverBudget(network)
        turns = self._turns.setdefault(network, _Turns())
        if turns.in_flight_or_waiting >= CALLS_AT_ONCE_PER_NETWORK + WAITING_PER_NETWORK:
            raise Busy(network)
        turns.in_flight_or_waiting += 1
        try:
            async with turns.semaphore:
                if not self._room(network):  # the calls ahead of this one failed, or are still out
                    raise OverBudget(network)
                turns.in_flight += 1  # no await between the check and this: no other call slips in
                try:
                    yield Turn(self, network)
                finally:
                    turns.in_flight -= 1
        finally:
            turns.in_flight_or_waiting -= 1
            if turns.in_flight_or_waiting == 0:
                del self._turns[network]
