"""What becomes of a failed entry (gateway/worker/failures.py) and of a pull's enqueue after a Redis restart
(gateway/worker/pulled.py), on a real redis-server with the worker's own scheduler. Each test is a finding of a
review and fails on the code before its fix:

- a 微信客服 pull that failed past `max_send_attempts` (or once, permanently) was dead-lettered: its cursor had not
  moved and its callback was acknowledged, so a quiet account's customer was never answered;
- a pull's enqueue sent EVALSHA in a pipeline and never loaded the scripts again after a Redis restart;
- a worker that had lost its lease still counted the failure against the new owner, and alerted the operators.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from types import SimpleNamespace

import pytest

from bots.base import InboundMessage, PermanentSendError, PulledItem, PulledPage, ReplyTarget, RetryableSendError
from gateway.config import Settings, WorkerSettings
from gateway.pipeline.job import Job
from gateway.queue.entry import EntryKind, QueueEntry
from gateway.queue.scheduler import Lease
from gateway.state.memory import Scope
from gateway.state.reply_record import Fence
from gateway.worker.failures import failed
from gateway.worker.pulled import PulledWork
from tests.redis.conftest import World

ALERT_BOT = "ops-robot"
KFID = "wk-test"


def services(world: World, **worker: float) -> SimpleNamespace:
    """What `failed` uses of a worker's Services: fast backoffs so that a test can wait them out."""
    settings = SimpleNamespace(
        worker=WorkerSettings(**{"backoff_base_s": 0.02, "backoff_max_s": 0.05, "max_send_attempts": 3, **worker}),
        alert_bot=ALERT_BOT,
    )
    return SimpleNamespace(settings=settings, redis=world.redis, keys=world.keys, scheduler=world.scheduler)


def pull_request(token: str = "tok") -> InboundMessage:
    """A callback's "pull" for account KFID, as bots/wecom_kf/models.py makes it."""
    return InboundMessage(
        platform="wecom-kf", bot_id="kefu", msg_id=f"pull:{KFID}:{token}-{secrets.token_hex(3)}",
        conversation_id=KFID, sender_id=KFID, text=token, msg_type="pull", reply_to=ReplyTarget(chat_id=KFID),
    )  # fmt: skip


def chat_message() -> InboundMessage:
    person = "wm" + secrets.token_hex(4)
    return InboundMessage(
        platform="wecom-kf", bot_id="kefu", msg_id=secrets.token_hex(6), conversation_id=f"{KFID}:{person}",
        sender_id=person, text="你好", reply_to=ReplyTarget(chat_id=KFID, user_id=person),
    )  # fmt: skip


async def queue(world: World, message: InboundMessage, kind: EntryKind) -> str:
    lane = Scope.of(message, "per_user").lane
    await world.scheduler.enqueue(lane, QueueEntry(owner=lane, kind=kind, message=message))
    return lane


async def take(world: World, owner: str = "w", lease_ms: int = 30_000, within_s: float = 5.0) -> Lease:
    """The next lane that falls due (a backoff's delay included), leased; the alert robot's lane is left leased
    (its alerts stay in it, for `alerts` to read)."""
    deadline = time.monotonic() + within_s
    while (lease := await world.scheduler.take(owner, lease_ms, 0)) is None or ALERT_BOT in lease.lane:
        assert time.monotonic() < deadline, "nothing fell due"
        await world.scheduler.sweep()
        await asyncio.sleep(0.01)
    return lease


def job_of(world: World, lease: Lease) -> Job:
    message = lease.entry.message
    record = world.records.open(message.dedup_key, Fence(world.keys.lease(lease.lane), lease.epoch))
    presenter = SimpleNamespace(always_answers=False)
    return Job(lease, message, Scope.of(message, "per_user"), SimpleNamespace(), record, presenter)  # type: ignore[arg-type]


async def dead_letters(world: World) -> int:
    return int(await world.redis.xlen(world.keys.dead_letters))


async def alerts(world: World) -> list[str]:
    """The operators' alerts queued for the alert robot (gateway/queue/push.py)."""
    found = []
    for lane in await world.redis.zrange(world.keys.scheduler_lanes, 0, -1):
        if ALERT_BOT.encode() in lane:
            for raw in await world.redis.lrange(world.keys.lane(lane.decode()), 0, -1):
                found.append(QueueEntry.from_json(raw).notice or "")
    return found


# -- (A) a pull is never given up -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error", [RetryableSendError("WeCom is busy (-1)", code=-1), PermanentSendError("WeCom errcode 95000", code=95000)]
)
async def test_a_pull_failing_past_max_send_attempts_stays_queued_backing_off_and_alerts_once(
    world: World, error: Exception
) -> None:
    kit = services(world)
    lane = await queue(world, pull_request(), EntryKind.PULL)
    for _ in range(6):  # twice max_send_attempts
        lease = await take(world)
        assert lease.lane == lane and lease.entry.kind == EntryKind.PULL, "the pull was dropped"
        await failed(kit, job_of(world, lease), error)  # type: ignore[arg-type]
    assert await dead_letters(world) == 0, "a pull was given up: nothing pulls again until the next callback"
    assert await world.redis.llen(world.keys.lane(lane)) == 1
    due = await world.redis.zscore(f"{world.keys.core}:sched:delayed", lane)
    assert due is not None, "the pull is not waiting out a backoff"
    told = await alerts(world)
    # told once when it has lasted max_send_attempts; an error that needs the operators (permanent) at once too
    assert len(told) == (1 if error.retryable else 2) and all("still" in alert for alert in told), told


async def test_a_pulls_backoff_is_capped_and_never_overflows(world: World) -> None:
    """A pull failing for days: the delay stays at the cap (minutes by default), 2**n never overflows a float."""
    from gateway.worker.failures import pull_backoff_s

    settings = WorkerSettings()
    delays = [pull_backoff_s(settings, failures) for failures in (1, 2, 20, 2_000)]
    assert delays[0] == settings.backoff_base_s and delays[1] == 2 * settings.backoff_base_s
    assert delays[2] == delays[3] and 60 <= delays[3] <= 600


async def test_a_failed_pull_with_a_newer_pull_behind_it_hands_over_to_the_newer_one(world: World) -> None:
    """The newer callback's Token is fresh (a Token lasts 10 minutes): its pull goes instead, from the same cursor,
    after the same wait (pulls piled up in an outage are not run through at once), and the failures in a row are
    the account's, whichever pull met them."""
    from gateway.worker.failures import pull_backoff_s, pull_failures_key

    kit = services(world, backoff_base_s=0.3, backoff_max_s=0.3)
    lane = await queue(world, pull_request("old"), EntryKind.PULL)
    lease = await take(world)
    for newer in ("new", "newest"):
        await queue(world, pull_request(newer), EntryKind.PULL)
    await failed(kit, job_of(world, lease), RetryableSendError("api freq out of limit", code=45009))  # type: ignore[arg-type]
    assert await world.scheduler.take("w", 30_000, 0) is None, "the newer pull went at once"
    await asyncio.sleep(pull_backoff_s(kit.settings.worker, 1) + 0.1)
    newer = await world.scheduler.take("w", 30_000, 0)
    assert newer is not None and newer.lane == lane and newer.entry.message.text == "new", "not handed over"
    await failed(kit, job_of(world, newer), RetryableSendError("api freq out of limit", code=45009))  # type: ignore[arg-type]
    failures = await world.redis.get(pull_failures_key(kit, newer.entry.message))
    assert failures == b"2", "counted per pull entry, not per account"
    assert await world.scheduler.take("w", 30_000, 0) is None, "the newest pull went at once"
    assert await dead_letters(world) == 0 and await alerts(world) == []


# -- (B) a pull's enqueue after a Redis restart ---------------------------------------------------------------------


async def test_a_pulls_enqueue_loads_the_scripts_again_after_a_redis_restart(world: World) -> None:
    message = chat_message()

    async def pull_page(channel: str, cursor: str, hint: str) -> PulledPage:
        return PulledPage(items=[PulledItem(kind="message", message=message)], next_cursor="c1", has_more=False)

    adapter = SimpleNamespace(pull_page=pull_page, skip_history=False)
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    await world.redis.script_flush()  # as a Redis restarted from its AOF has: the queue, no scripts
    assert await pulled.pull(adapter, pull_request(), time.time()) == "pulled 1 in 1 page(s)"  # type: ignore[arg-type]
    lease = await world.scheduler.take("w", 30_000, 0)
    assert lease is not None and lease.entry.message.msg_id == message.msg_id
    assert await world.redis.get(world.keys.pull_cursor("kefu", KFID)) == b"c1"


# -- (C) a worker that lost its lease ---------------------------------------------------------------------------------


async def lost_lease(world: World, message: InboundMessage) -> tuple[Lease, Lease]:
    """(the stale worker's lease, the new owner's): the first stalled past its lease and was swept."""
    await queue(world, message, EntryKind.CHAT)
    stale = await take(world, "stalled", lease_ms=50)
    await asyncio.sleep(0.1)
    await world.scheduler.sweep()
    return stale, await take(world, "new-owner")


async def test_a_worker_that_lost_its_lease_does_not_count_its_failure_against_the_new_owner(world: World) -> None:
    kit = services(world)
    stale, fresh = await lost_lease(world, chat_message())
    await failed(kit, job_of(world, stale), RetryableSendError("network", code="network"))  # type: ignore[arg-type]
    assert int(await world.redis.get(world.keys.entry_failures(stale.entry_id)) or 0) == 0
    await failed(kit, job_of(world, fresh), RetryableSendError("network", code="network"))  # type: ignore[arg-type]
    assert int(await world.redis.get(world.keys.entry_failures(fresh.entry_id)) or 0) == 1, "the holder's not counted"


async def test_a_worker_that_lost_its_lease_neither_dead_letters_nor_alerts(world: World) -> None:
    """Only the holder's failures end the message: `max_send_attempts` of them, then one dead letter, one alert."""
    kit = services(world)
    stale, lease = await lost_lease(world, chat_message())
    await failed(kit, job_of(world, stale), PermanentSendError("WeCom errcode 40001", code=40001))  # type: ignore[arg-type]
    assert await alerts(world) == [], "the operators were told a message the new owner is answering failed"
    assert await dead_letters(world) == 0
    for attempt in range(1, 4):
        await failed(kit, job_of(world, lease), RetryableSendError("network", code="network"))  # type: ignore[arg-type]
        if attempt < 3:
            assert await dead_letters(world) == 0, "given up sooner: a stale worker's failure was counted"
            lease = await take(world)
    assert await dead_letters(world) == 1 and len(await alerts(world)) == 1


async def test_a_pull_retried_past_its_callbacks_token_life_pulls_without_the_token(world: World) -> None:
    """The Token is good for 10 minutes: a pull still being retried after that is not refused with it first."""
    hints: list[str] = []

    async def pull_page(channel: str, cursor: str, hint: str) -> PulledPage:
        hints.append(hint)
        if hint:
            raise PermanentSendError("WeCom errcode 95007: invalid msg token", code=95007)
        return PulledPage(items=[], next_cursor="c1", has_more=False)

    adapter = SimpleNamespace(pull_page=pull_page, skip_history=False)
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    request = pull_request().model_copy(update={"received_at": time.time() - 11 * 60})
    await pulled.pull(adapter, request, request.received_at)  # type: ignore[arg-type]
    assert hints == [""], "the expired Token was sent first"


async def test_a_failure_notice_that_cannot_be_shown_still_leaves_the_record_failed(world: World) -> None:
    """give_up shows a stream or card its failure, then marks the record failed: a notice that raised (the AI bot's
    stream closed and its response_url taken) skipped the mark, and a replay, which resets only a failed record,
    then found nothing to reset."""
    kit = services(world)
    await queue(world, chat_message(), EntryKind.CHAT)
    lease = await take(world)
    job = job_of(world, lease)

    async def fail(text: str, state: object) -> None:
        raise PermanentSendError("response_url taken", code="stream_closed")

    job.presenter = SimpleNamespace(always_answers=True, fail=fail)  # type: ignore[assignment]
    await failed(kit, job, PermanentSendError("WeCom errcode 40001", code=40001))  # type: ignore[arg-type]
    assert await dead_letters(world) == 1
    assert (await job.record.load()).state == "failed"


async def test_a_give_up_whose_lease_passes_on_before_its_release_leaves_the_record_unfailed(world: World) -> None:
    """The record's "failed" comes with the fenced release: written before it, a stall in between left the next
    owner a record it took for done, and the message ended with no answer, no dead letter, no alert (a review)."""
    kit = services(world)
    await queue(world, chat_message(), EntryKind.CHAT)
    stale = await take(world, "stalls", lease_ms=50)
    job = job_of(world, stale)
    release = world.scheduler.release

    async def stall_then_release(*args: object, **kwargs: object) -> bool:
        await asyncio.sleep(0.1)  # the lease runs out meanwhile, and another worker takes the message
        await world.scheduler.sweep()
        owners.append(await take(world, "new-owner"))
        return await release(*args, **kwargs)  # type: ignore[arg-type]

    shown: list[str] = []

    async def fail(text: str, state: object) -> None:  # the stream, card or page the user watches
        shown.append(text)

    owners: list[Lease] = []
    job.presenter = SimpleNamespace(always_answers=True, fail=fail)  # type: ignore[assignment]
    world.scheduler.release = stall_then_release  # type: ignore[method-assign]
    await failed(kit, job, PermanentSendError("WeCom errcode 40001", code=40001))  # type: ignore[arg-type]
    world.scheduler.release = release  # type: ignore[method-assign]
    assert owners, "the message was not taken over"
    assert (await job_of(world, owners[0]).record.load()).state != "failed", "the new owner would drop it"
    assert await dead_letters(world) == 0 and await alerts(world) == []
    assert shown == [], "the failure was shown on a stream the new owner is answering into"
    held = job_of(world, owners[0])
    held.presenter = SimpleNamespace(always_answers=True, fail=fail)  # type: ignore[assignment]
    await failed(kit, held, PermanentSendError("WeCom errcode 40001", code=40001))  # type: ignore[arg-type]
    assert len(shown) == 1 and await dead_letters(world) == 1  # the holder's give-up shows it, after its release


async def test_a_dead_letters_record_outlives_the_dedup_window(world: World) -> None:
    """A replay after dedup_ttl_s found no record and composed a new answer after pieces already sent (a review)."""
    kit = services(world)
    await queue(world, chat_message(), EntryKind.CHAT)
    job = job_of(world, await take(world))
    await job.record.mark(state="committed", text="an answer", sent=1)
    await failed(kit, job, PermanentSendError("WeCom errcode 40001", code=40001))  # type: ignore[arg-type]
    assert await dead_letters(world) == 1
    state = await job.record.load()
    assert state.state == "failed" and state.text == "an answer" and state.sent == 1
    assert await world.redis.ttl(job.record.key) > 29 * 86400


async def test_a_give_up_whose_release_ran_but_whose_answer_was_lost_still_tells(world: World) -> None:
    """The release ran (letter kept, record failed) and its answer was lost: the retry found the lease gone, and the
    give-up took the message for its new owner's, which nobody was: no alert, no notice (found by a review)."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    kit = services(world)
    await queue(world, chat_message(), EntryKind.CHAT)
    job = job_of(world, await take(world))
    shown: list[str] = []

    async def fail(text: str, state: object) -> None:
        shown.append(text)

    job.presenter = SimpleNamespace(always_answers=True, fail=fail)  # type: ignore[assignment]
    release, lost = world.scheduler.release, [True]

    async def answer_lost(*args: object, **kwargs: object) -> bool:
        held = await release(*args, **kwargs)  # type: ignore[arg-type]
        if lost.pop() if lost else False:
            raise RedisTimeoutError("the answer did not come back")
        return held

    world.scheduler.release = answer_lost  # type: ignore[method-assign]
    await failed(kit, job, PermanentSendError("WeCom errcode 40001", code=40001))  # type: ignore[arg-type]
    world.scheduler.release = release  # type: ignore[method-assign]
    assert await dead_letters(world) == 1 and len(await alerts(world)) == 1 and len(shown) == 1
