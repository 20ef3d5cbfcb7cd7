"""The page's sign-in callbacks that reach the platform, per client network (webchat/call_budget.py): only calls
that signed nobody in spend the budget, and a burst waits for its turns, so a flood of forged codes makes no more
platform calls than the budget plus the calls already in flight."""

from __future__ import annotations

import asyncio
import time

import pytest

from webchat.call_budget import (
    CALLS_AT_ONCE_PER_NETWORK,
    FAILED_CALLS_PER_NETWORK,
    WAITING_PER_NETWORK,
    Busy,
    CallBudget,
    OverBudget,
)

ALLOWED = FAILED_CALLS_PER_NETWORK


async def test_calls_that_sign_someone_in_never_spend_the_budget() -> None:
    """An office behind one NAT address signing in at nine o'clock: every call good, none refused."""
    budget = CallBudget()
    for _ in range(ALLOWED * 3):
        async with budget.turn("203.0.113.7"):
            pass
    async with budget.turn("203.0.113.7"):
        pass


async def test_failed_calls_spend_the_budget_of_their_network_only() -> None:
    budget = CallBudget()
    for _ in range(ALLOWED):
        async with budget.turn("203.0.113.7") as turn:
            turn.failed()
    with pytest.raises(OverBudget):
        async with budget.turn("203.0.113.7"):
            pytest.fail("a turn past the budget")
    async with budget.turn("203.0.113.8"):
        pass


async def test_a_burst_of_forged_codes_makes_no_more_calls_than_the_budget_and_those_in_flight() -> None:
    """All at once: without turns, every call of the burst would pass the check before the first failure counted."""
    budget = CallBudget()
    calls = 0
    in_flight = 0
    most_in_flight = 0

    async def forged() -> bool:
        nonlocal calls, in_flight, most_in_flight
        try:
            async with budget.turn("198.51.100.1") as turn:
                calls += 1
                in_flight += 1
                most_in_flight = max(most_in_flight, in_flight)
                await asyncio.sleep(0.01)  # the platform's answer
                in_flight -= 1
                turn.failed()
                return True
        except OverBudget:
            return False

    made = await asyncio.gather(*(forged() for _ in range(WAITING_PER_NETWORK)))
    assert most_in_flight == CALLS_AT_ONCE_PER_NETWORK
    assert calls == ALLOWED, calls  # a call in flight counts as a failure until it is known not to be one
    assert sum(made) == calls and len(budget._turns) == 0  # nothing kept for a network with no call


async def test_too_many_waiting_calls_of_one_network_are_refused_at_once() -> None:
    budget = CallBudget()
    release = asyncio.Event()
    entered = 0

    async def good() -> str:
        nonlocal entered
        try:
            async with budget.turn("192.0.2.1"):
                entered += 1
                await release.wait()
                return "called"
        except Busy:  # a crowd, not failures: the page says "again in a few seconds", not "wait a minute"
            return "busy"
        except OverBudget:
            return "refused"

    tasks = [asyncio.create_task(good()) for _ in range(CALLS_AT_ONCE_PER_NETWORK + WAITING_PER_NETWORK + 3)]
    await asyncio.sleep(0.05)
    assert entered == CALLS_AT_ONCE_PER_NETWORK
    release.set()
    outcomes = await asyncio.gather(*tasks)
    assert outcomes.count("busy") == 3 and outcomes.count("refused") == 0
    assert outcomes.count("called") == CALLS_AT_ONCE_PER_NETWORK + WAITING_PER_NETWORK


async def test_a_flood_spaced_to_the_window_still_makes_no_more_calls_than_the_budget() -> None:
    """Failures spread over the window first, then a steady flood: each time one failure leaves the window, the
    calls waiting must not all go out (only the first one's failure would have counted, and the pace would hold)."""
    budget = CallBudget(failed_calls=10, window_s=0.5)
    started: list[float] = []

    async def forged() -> None:
        try:
            async with budget.turn("198.51.100.2") as turn:
                started.append(time.monotonic())
                await asyncio.sleep(0.02)
                turn.failed()
        except OverBudget:
            pass

    for _ in range(10):  # spread over the window
        await forged()
        await asyncio.sleep(0.05)
    end = time.monotonic() + 1.5
    while time.monotonic() < end:  # then a flood, four at a time
        await asyncio.gather(*(forged() for _ in range(4)))
        await asyncio.sleep(0.005)
    most = max(sum(1 for t in started if at <= t < at + 0.5) for at in started)
    assert most <= 10, most


async def test_the_page_tells_a_crowd_to_come_back_in_seconds_and_forged_codes_to_wait_a_minute() -> None:
    """The sign-in guard (webchat/oauth.py) in front of a platform that is slow to answer: past the calls in flight
    and waiting, one more good sign-in gets the busy page with a short Retry-After, not the failed one."""
    from webchat.oauth import BUSY, BUSY_RETRY_AFTER_S, TOO_MANY, CompanyLoginGuard

    release = asyncio.Event()

    async def platform_slow_then_refusing(scope: dict, receive: object, send: object) -> None:
        await release.wait()  # Chainlit's callback, waiting on WeCom; nobody is signed in (a refused code)
        await send({"type": "http.response.start", "status": 302, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    guard = CompanyLoginGuard(platform_slow_then_refusing, ("wecom",))

    async def callback(number: int) -> tuple[int, dict[bytes, bytes], bytes]:
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/auth/oauth/wecom/callback",
            "query_string": f"code=c{number}&state=s{number}".encode(),
            "headers": [(b"cookie", f"oauth_state=s{number}".encode())],
            "client": ("198.51.100.20", 40000 + number),
        }
        answer: dict[str, object] = {}

        async def send(message: dict) -> None:
            answer.setdefault(message["type"], message)

        await guard(scope, None, send)  # type: ignore[arg-type]
        start, body = answer["http.response.start"], answer.get("http.response.body", {"body": b""})
        return start["status"], dict(start["headers"]), body["body"]  # type: ignore[index]

    room = CALLS_AT_ONCE_PER_NETWORK + WAITING_PER_NETWORK
    held = [asyncio.create_task(callback(n)) for n in range(room)]
    await asyncio.sleep(0.05)
    status, headers, body = await callback(room)
    assert status == 429 and headers[b"retry-after"] == str(BUSY_RETRY_AFTER_S).encode()
    assert BUSY.split(".")[0].encode() in body and b"failed" not in body
    release.set()
    assert [answer[0] for answer in await asyncio.gather(*held)][:ALLOWED] == [302] * ALLOWED
    # Those 68 signed nobody in: the network's minute is spent, and the next one is told to wait that minute.
    status, headers, body = await callback(room + 1)
    assert status == 429 and headers[b"retry-after"] == b"60" and TOO_MANY.split(".")[0].encode() in body
