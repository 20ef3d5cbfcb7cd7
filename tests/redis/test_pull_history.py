"""A 微信客服 account's first pull (no cursor yet): what was written before the bot was configured is history, on a
real redis-server (gateway/worker/pulled.py). Each test is a finding of a review and fails on the code before it:

- a first pull that failed (the trusted IP not yet set up) and was taken over by a newer pull made the first
  customers' messages history, measured from the newer pull's own time: they were never answered;
- an old message of one customer was answered as the callback's cause when the log's last item was another
  customer's event (or a human agent's message).
"""

from __future__ import annotations

import secrets
import time
from types import SimpleNamespace

import pytest

from bots.base import InboundMessage, PulledItem, PulledPage, ReplyTarget, RetryableSendError
from gateway.config import Settings
from gateway.worker.pulled import HISTORY_GRACE_S, PulledWork
from tests.redis.conftest import World

KFID = "wk-history"


def pull_request(token: str, at: float) -> InboundMessage:
    return InboundMessage(
        platform="wecom-kf", bot_id="kefu", msg_id=f"pull:{KFID}:{token}", conversation_id=KFID, sender_id=KFID,
        text=token, msg_type="pull", reply_to=ReplyTarget(chat_id=KFID), received_at=at,
    )  # fmt: skip


def item(kind: str, person: str, at: float) -> PulledItem:
    message = InboundMessage(
        platform="wecom-kf", bot_id="kefu", msg_id=secrets.token_hex(6), conversation_id=f"{KFID}:{person}",
        sender_id=person, text="在吗", msg_type="event" if kind == "event" else "text", received_at=at,
        reply_to=ReplyTarget(chat_id=KFID, user_id=person),
    )  # fmt: skip
    return PulledItem(kind=kind, message=message, event={"event_type": "enter_session"} if kind == "event" else {})


def account(*items: PulledItem, failing: bool = False) -> SimpleNamespace:
    async def pull_page(channel: str, cursor: str, token: str) -> PulledPage:
        if failing:
            raise RetryableSendError("60020: not allowed to access from your ip")
        return PulledPage(items=list(items), next_cursor="c1", has_more=False)

    return SimpleNamespace(pull_page=pull_page, skip_history=True)


async def queued(world: World) -> list[str]:
    ids = []
    while (lease := await world.scheduler.take("w", 30_000, 0)) is not None:
        ids.append(lease.entry.message.msg_id)
        await world.scheduler.release(lease, "done")
    return ids


async def test_a_pull_taking_over_from_a_failing_first_pull_keeps_the_first_customers(world: World) -> None:
    now = time.time()
    first, later = now - 300, now - 5  # the first callback's pull, and a pull four minutes later
    history, a, b = item("message", "wmOld", first - 3600), item("message", "wmA", first), item("message", "wmB", later)
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    with pytest.raises(RetryableSendError):
        await pulled.pull(account(failing=True), pull_request("t1", first), first)  # type: ignore[arg-type]
    await pulled.pull(account(history, a, b), pull_request("t2", later), later)  # type: ignore[arg-type]
    ids = await queued(world)
    assert a.message.msg_id in ids and b.message.msg_id in ids, "a customer who wrote after the first pull was lost"
    assert history.message.msg_id not in ids, "what came before the bot was configured is history"
    # the cursor is saved: history is behind it, and the first pull's time is gone with it
    assert await world.redis.get(world.keys.first_pull("kefu", KFID)) is None


async def test_an_event_last_in_the_log_makes_no_old_message_its_cause(world: World) -> None:
    now = time.time()
    old, entered = item("message", "wmOld", now - 3600), item("event", "wmNew", now - 1)
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    await pulled.pull(account(old, entered), pull_request("t", now), now)  # type: ignore[arg-type]
    ids = await queued(world)
    assert entered.message.msg_id in ids
    assert old.message.msg_id not in ids, "another customer's hour-old message answered as the callback's cause"


async def test_the_customer_message_that_called_back_late_is_never_history(world: World) -> None:
    now = time.time()
    late = item("message", "wmLate", now - HISTORY_GRACE_S - 30)  # its callback came 90 s after it
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    await pulled.pull(account(item("message", "wmOld", now - 3600), late), pull_request("t", now), now)  # type: ignore[arg-type]
    assert await queued(world) == [late.message.msg_id]


async def test_a_refused_cursor_starts_history_from_its_own_pull_whatever_first_pull_time_was_left(
    world: World,
) -> None:
    """A first pull's time left behind (a crash between the cursor's save and the key's removal) made a later reset
    answer days of history again (found by a review)."""
    from bots.base import CursorRefused

    now = time.time()
    await world.redis.set(world.keys.pull_cursor("kefu", KFID), "stale-cursor")
    await world.redis.set(world.keys.first_pull("kefu", KFID), f"{now - 4 * 86400:.6f}")
    old, new = item("message", "wmOld", now - 3 * 86400), item("message", "wmNew", now - 1)

    async def pull_page(channel: str, cursor: str, token: str) -> PulledPage:
        if cursor:
            raise CursorRefused("the saved cursor was refused (40058)", code=40058)
        return PulledPage(items=[old, new], next_cursor="c2", has_more=False)

    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    await pulled.pull(SimpleNamespace(pull_page=pull_page, skip_history=True), pull_request("t", now), now)  # type: ignore[arg-type]
    assert await queued(world) == [new.message.msg_id], "history was answered again after the reset"
