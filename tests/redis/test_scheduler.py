"""The scheduler against a real redis-server: lanes, fair turns, the per-user cap, leases and their fencing."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import pytest
from redis.asyncio import Redis

from bots.base import InboundMessage
from gateway.queue.entry import QueueEntry
from gateway.queue.scheduler import SHARE_SIGNATURE_MAX, SHARE_SIGNATURE_MS, Binding, Lease, Scheduler
from gateway.state.keys import Keys
from gateway.state.reply_record import Fence, LeaseLost, RecordMarks, ReplyRecords
from gateway.state.streams import StreamStore


@pytest.fixture
async def scheduler(redis_url: str):
    redis = Redis.from_url(redis_url)
    sched = Scheduler(redis, Keys("s" + secrets.token_hex(4)))
    await sched.load_scripts()
    yield sched
    await redis.aclose()


def entry(owner: str, text: str) -> QueueEntry:
    message = InboundMessage(platform="wecom", bot_id="b", msg_id=text, conversation_id=owner, sender_id=owner,
                             text=text)  # fmt: skip
    return QueueEntry(owner=owner, message=message)


async def put(sched: Scheduler, lane: str, owner: str, text: str, weight: float = 1.0) -> None:
    await sched.enqueue(lane, entry(owner, text), weight)


async def drain_order(sched: Scheduler, cap: int = 0, weights: dict[str, float] | None = None) -> list[str]:
    """Take and finish one entry at a time, as a single worker slot would (releasing with the lane's weight, as the
    worker does with its bot's); the texts in the order served."""
    served = []
    while (lease := await sched.take("w", 5000, cap)) is not None:
        served.append(lease.entry.message.text)
        assert await sched.release(lease, "done", weight=(weights or {}).get(lease.lane, 1.0))
    return served


async def test_turns_go_round_robin_across_users(scheduler: Scheduler) -> None:
    for i in range(5):
        await put(scheduler, "heavy", "u:heavy", f"h{i}")
    for name in ("a", "b", "c"):
        await put(scheduler, name, f"u:{name}", name)
    order = await drain_order(scheduler)
    # one turn each per round: the heavy user's backlog does not hold the others back
    assert order[:4] == ["h0", "a", "b", "c"]
    assert [t for t in order if t.startswith("h")] == [f"h{i}" for i in range(5)]


async def test_weights_give_a_bot_more_turns_per_round(scheduler: Scheduler) -> None:
    for i in range(6):
        await put(scheduler, "vip", "u:vip", f"v{i}", weight=2.0)
        await put(scheduler, "std", "u:std", f"s{i}", weight=1.0)
    order = await drain_order(scheduler, weights={"vip": 2.0, "std": 1.0})
    # two turns for one, while both have work: weight 2 goes to the back of the round half as far
    assert order[:9] == ["v0", "s0", "v1", "v2", "s1", "v3", "v4", "s2", "v5"], order
    assert order[9:] == ["s3", "s4", "s5"]


async def test_one_lane_is_never_leased_twice(scheduler: Scheduler) -> None:
    for i in range(3):
        await put(scheduler, "conv", "u:x", f"m{i}")
    first = await scheduler.take("w1", 5000, 0)
    assert first is not None and first.entry.message.text == "m0"
    assert await scheduler.take("w2", 5000, 0) is None  # m1 waits for m0, without any worker waiting
    assert await scheduler.release(first, "done")
    second = await scheduler.take("w2", 5000, 0)
    assert second is not None and second.entry.message.text == "m1"


async def test_per_user_cap_defers_a_second_lane_until_the_first_ends(scheduler: Scheduler) -> None:
    await put(scheduler, "dm", "u:alice", "dm")
    await put(scheduler, "group", "u:alice", "group")
    await put(scheduler, "other", "u:bob", "bob")
    first = await scheduler.take("w", 5000, 1)
    assert first is not None and first.entry.message.text == "dm"
    second = await scheduler.take("w", 5000, 1)
    assert second is not None and second.entry.message.text == "bob"  # alice's group lane was deferred
    assert await scheduler.take("w", 5000, 1) is None
    await scheduler.release(first, "done")
    third = await scheduler.take("w", 5000, 1)
    assert third is not None and third.entry.message.text == "group"


async def stall_until_swept(sched: Scheduler, lane: str) -> Lease:
    """A lease taken on `lane` whose owner stalls past its lifetime, and the sweep that hands it on."""
    stalled = await sched.take("stalled", 200, 0)
    assert stalled is not None and stalled.lane == lane
    await asyncio.sleep(0.35)
    expired, _ = await sched.sweep()
    assert expired == [lane]
    return stalled


async def assert_fenced(sched: Scheduler, stalled: Lease) -> None:
    """The stalled worker wakes up: it can neither renew, nor write, nor finish the entry."""
    redis, keys = sched._redis, sched._keys
    assert await sched.renew([stalled], 5000) == {stalled.lane}
    fence = Fence(keys.lease(stalled.lane), stalled.epoch)
    record = ReplyRecords(redis, keys, 60).open("d-" + stalled.epoch, fence)
    with pytest.raises(LeaseLost):
        await record.commit("stale answer", "0")
    streams = StreamStore(redis, keys)
    await streams.open("bot", "x", "sid-" + stalled.epoch, limit=3, max_age_s=60)
    assert await streams.update("sid-" + stalled.epoch, "stale", fence=fence) is None
    assert not await sched.release(stalled, "done")


async def test_expired_lease_is_taken_over_and_the_old_owner_is_fenced(scheduler: Scheduler) -> None:
    await put(scheduler, "conv", "u:x", "hello")
    stalled = await stall_until_swept(scheduler, "conv")
    fresh = await scheduler.take("fresh", 5000, 0)
    assert fresh is not None and fresh.epoch != stalled.epoch
    await assert_fenced(scheduler, stalled)
    assert await scheduler.release(fresh, "done")
    assert (await scheduler.counters())["takeovers"] == 1
    assert await scheduler.take("x", 5000, 0) is None


async def test_a_stale_lease_stays_fenced_after_the_lanes_own_keys_expire(scheduler: Scheduler) -> None:
    """Whatever the lane left in Redis that can expire is gone (deleted here) before the lane is taken again: the
    new epoch must still differ from the stalled one, or the stalled worker's writes would pass the fence."""
    redis, keys = scheduler._redis, scheduler._keys
    await put(scheduler, "conv", "u:x", "hello")
    stalled = await stall_until_swept(scheduler, "conv")
    lane_keys = [key async for key in redis.scan_iter(match="*conv*")]
    await redis.delete(*(key for key in lane_keys if key != keys.lane("conv").encode()))
    fresh = await scheduler.take("fresh", 5000, 0)
    assert fresh is not None
    await assert_fenced(scheduler, stalled)
    assert int(fresh.epoch) > int(stalled.epoch)
    assert await scheduler.release(fresh, "done")


async def test_an_older_releases_per_lane_epoch_expires_and_new_epochs_pass_it(scheduler: Scheduler) -> None:
    """Releases before the shared counter kept `…:sched:epoch:<lane>` for ever: taking the lane gives it a
    lifetime (longer than any lease), and the epoch handed out is above it, so its holders stay fenced."""
    redis, keys = scheduler._redis, scheduler._keys
    legacy = f"{keys.core}:sched:epoch:conv"
    await redis.set(legacy, 41)
    await put(scheduler, "conv", "u:x", "hello")
    lease = await scheduler.take("w", 5000, 0)
    assert lease is not None and int(lease.epoch) > 41
    assert 3600 <= await redis.ttl(legacy) <= 86400
    assert await redis.ttl(keys.scheduler_epoch) == -1  # one key for the namespace, never reset


async def keys_without_lifetime(sched: Scheduler) -> list[bytes]:
    """The namespace's keys that never expire."""
    redis = sched._redis
    found = [key async for key in redis.scan_iter(match=f"*{sched._keys.namespace}*")]
    return sorted([key for key in found if await redis.ttl(key) == -1])


async def handle_conversations(sched: Scheduler, prefix: str, count: int) -> None:
    """`count` conversations, each answered, one retried after a delay, one taken over after its worker
    stalled, and one deferred by the per-user cap: every path a lane takes through the scheduler."""
    for i in range(count):
        await put(sched, f"{prefix}{i}", f"u:{prefix}{i % 3}", "hi")
    stalled = await sched.take("stalled", 100, 1)
    assert stalled is not None
    await asyncio.sleep(0.15)
    assert (await sched.sweep())[0] == [stalled.lane]
    retried = False
    while (lease := await sched.take("w", 5000, 1)) is not None:
        if not retried:
            retried = await sched.release(lease, "retry", delay_s=0.01)
            continue
        assert await sched.release(lease, "done")
    while await sched.stats() != (0, 0.0):
        await asyncio.sleep(0.02)
        await sched.sweep()
        while (lease := await sched.take("w", 5000, 1)) is not None:
            assert await sched.release(lease, "done")


async def test_keys_without_a_lifetime_do_not_grow_with_the_conversations(scheduler: Scheduler) -> None:
    """Redis runs with noeviction: a key per conversation that never expires grows without end."""
    await handle_conversations(scheduler, "first", 6)
    after_a_few = await keys_without_lifetime(scheduler)
    await handle_conversations(scheduler, "more", 60)
    assert await keys_without_lifetime(scheduler) == after_a_few


async def test_renewal_keeps_a_lease_alive(scheduler: Scheduler) -> None:
    await put(scheduler, "conv", "u:x", "hello")
    lease = await scheduler.take("w", 300, 0)
    assert lease is not None
    for _ in range(4):
        await asyncio.sleep(0.15)
        assert await scheduler.renew([lease], 300) == set()
        assert (await scheduler.sweep())[0] == []
    assert await scheduler.release(lease, "done")


async def test_retry_with_delay_keeps_the_entry_first_and_runs_it_later(scheduler: Scheduler) -> None:
    await put(scheduler, "conv", "u:x", "first")
    await put(scheduler, "conv", "u:x", "second")
    lease = await scheduler.take("w", 5000, 0)
    assert lease is not None
    assert await scheduler.release(lease, "retry", delay_s=0.3)
    assert await scheduler.take("w", 5000, 0) is None
    started = time.monotonic()
    while (again := await scheduler.take("w", 5000, 0)) is None:
        assert time.monotonic() - started < 5, "the delayed entry never became ready"
        await scheduler.sweep()
        await asyncio.sleep(0.02)
    assert time.monotonic() - started >= 0.2
    assert again.entry.message.text == "first"


async def test_wait_and_take_takes_in_the_round_trip_of_the_wake_up(scheduler: Scheduler) -> None:
    """The blocking pop and the take go out as one pipeline: the take runs as soon as an enqueue wakes it, the
    lease comes back with the wake-up, and a timeout leaves nothing leased."""
    assert await scheduler.wait_and_take("w", 5000, 0, 0.1) == (None, False)

    async def later() -> None:
        await asyncio.sleep(0.2)
        await put(scheduler, "conv", "u:x", "wake")

    task = asyncio.create_task(later())
    started = time.monotonic()
    lease, more = await scheduler.wait_and_take("w", 5000, 0, 5.0)
    assert time.monotonic() - started < 2.0
    await task
    assert isinstance(lease, Lease) and lease.entry.message.text == "wake" and more is False
    assert await scheduler.take("w", 5000, 0) is None  # the lane is leased: nothing else to take
    assert await scheduler.release(lease, "done")


async def test_wait_and_take_loads_the_take_script_again_after_a_flush(scheduler: Scheduler) -> None:
    """A Redis that restarted has lost its scripts: the take is run again after loading them, not dropped."""
    await put(scheduler, "conv", "u:x", "after a restart")
    await scheduler._redis.script_flush()
    lease, _ = await scheduler.wait_and_take("w", 5000, 0, 0.1)
    assert lease is not None and lease.entry.message.text == "after a restart"


async def test_a_release_writes_the_record_marks_under_its_fence_and_only_then(scheduler: Scheduler) -> None:
    """An answer's last mark rides on the release (gateway/delivery/pieces.py): written with it when the lease is
    held, not at all when it passed on (a takeover resends the piece instead of finding it marked by a stale
    worker), and a release sent again after it ran changes nothing."""
    redis, keys = scheduler._redis, scheduler._keys
    await put(scheduler, "conv", "u:x", "hello")
    stale = await scheduler.take("w", 100, 0)
    assert stale is not None
    await asyncio.sleep(0.15)
    assert (await scheduler.sweep())[0] == ["conv"]
    fresh = await scheduler.take("w2", 5000, 0)
    assert fresh is not None
    record = keys.reply("m1")
    marks = RecordMarks(record, 600, {"sent": 1, "state": "done"})
    assert not await scheduler.release(stale, "done", record=marks)
    assert await redis.hgetall(record) == {}
    assert await scheduler.release(fresh, "done", record=marks)
    assert await redis.hgetall(record) == {b"sent": b"1", b"state": b"done"}
    assert 0 < await redis.ttl(record) <= 600
    assert not await scheduler.release(fresh, "done", record=RecordMarks(record, 600, {"state": "failed"}))
    assert await redis.hget(record, "state") == b"done"
    assert await scheduler.stats() == (0, 0.0)


async def test_marks_left_for_the_release_go_with_any_earlier_write(scheduler: Scheduler) -> None:
    """A mark left for the release is never lost to a write that comes first: that write carries it, and a path
    that ends without the release writes it (`flush`); `release_marks` hands it over once."""
    redis, keys = scheduler._redis, scheduler._keys
    record = ReplyRecords(redis, keys, 600).open("m2")
    record.mark_at_release(sent=2)
    await record.mark(buttons_sent="1")
    assert (await record.load()).sent == 2 and record.release_marks() is None
    record.mark_at_release(state="done")
    await record.flush()
    assert (await record.load()).state == "done" and record.release_marks() is None
    record.mark_at_release(state="failed")
    taken = record.release_marks()
    assert taken is not None and taken.marks == {"state": "failed"} and record.release_marks() is None


async def test_a_take_sweeps_first(scheduler: Scheduler) -> None:
    """A take hands on an expired lease and makes a due delay ready before it pops, so that a busy worker's sweep
    loop has nothing to add (`swept_at`): the stalled lane is taken at once, with a new epoch."""
    await put(scheduler, "conv", "u:x", "stalled")
    stalled = await scheduler.take("w", 100, 0)
    assert stalled is not None
    await asyncio.sleep(0.15)
    before = scheduler.swept_at
    again = await scheduler.take("w2", 5000, 0)
    assert again is not None and again.lane == "conv" and again.epoch != stalled.epoch
    assert scheduler.swept_at > before
    assert (await scheduler.counters())["takeovers"] == 1
    assert not await scheduler.release(stalled, "done"), "the stalled owner is fenced"
    assert await scheduler.release(again, "retry", delay_s=0.1)
    await asyncio.sleep(0.15)
    due = await scheduler.take("w2", 5000, 0)
    assert due is not None and due.entry.message.text == "stalled"


async def test_dead_letter_is_written_with_the_release(scheduler: Scheduler) -> None:
    await put(scheduler, "conv", "u:x", "doomed")
    lease = await scheduler.take("w", 5000, 0)
    assert lease is not None
    await scheduler.release(lease, "done", dead_letter={"reason": "test"})
    (_, fields), *_ = await scheduler._redis.xrevrange(scheduler._keys.dead_letters, count=1)
    letter = json.loads(fields[b"entry"])
    assert letter["reason"] == "test" and letter["entry"]["msg"]["text"] == "doomed"
    depth, _ = await scheduler.stats()
    assert depth == 0


async def test_the_stream_store_refuses_an_update_that_does_not_extend_the_text(scheduler: Scheduler) -> None:
    """What the user was shown only grows: an update that is not an extension is refused inside Redis (the
    text stays), so is any update after the finish; the refusal is 'not applied' (False), not a lost lease."""
    redis, keys = scheduler._redis, scheduler._keys
    streams = StreamStore(redis, keys)
    await put(scheduler, "conv", "u:x", "hello")
    lease = await scheduler.take("w", 5000, 0)
    assert lease is not None
    fence = Fence(keys.lease("conv"), lease.epoch)
    assert await streams.open("bot", "x", "sid", limit=3, max_age_s=60)
    assert await streams.update("sid", "Hello, wor", fence=fence) is True
    for not_an_extension in ("Hello", "Hello, WORLD", "Jello, world", ""):
        assert await streams.update("sid", not_an_extension, fence=fence) is False, not_an_extension
        assert (await streams.get("sid")).content == "Hello, wor"
    assert await streams.update("sid", "Hello, world", fence=fence) is True
    assert await streams.update("sid", "Hello, world!", finish=True, fence=fence) is True
    assert await streams.update("sid", "Hello, world! And more", fence=fence) is False, "a finished stream changed"
    state = await streams.get("sid")
    assert (state.content, state.finished) == ("Hello, world!", True)


async def test_an_entry_no_worker_can_read_becomes_a_dead_letter_and_the_lane_goes_on(scheduler: Scheduler) -> None:
    """Written by hand or by a broken client: taking it must not end the worker's take loop (a ValidationError
    there stopped every answer), nor leave it at the head for ever."""
    from gateway.config import Settings
    from gateway.queue.dead_letters import DeadLetters, UnreadableLetter

    raw = json.dumps({"id": "x1", "t": 1, "u": "u:x", "kind": "dance", "msg": {"text": "?"}})
    stats = scheduler._keys.scheduler_stats
    await scheduler._scripts["enqueue"](keys=[stats], args=[scheduler._ns, 0, "conv", raw, 1.0, "", 0])
    await put(scheduler, "conv", "u:x", "after it")
    assert await scheduler.take("w", 5000, 0) is None, "the unreadable head was handed out"
    lease = await scheduler.take("w", 5000, 0)
    assert lease is not None and lease.entry.message.text == "after it", "the lane stopped at the bad entry"
    letters = DeadLetters(scheduler._redis, scheduler._keys, scheduler, Settings(bots=[]))
    (letter,) = await letters.list()
    assert letter.entry is None and '"dance"' in letter.raw and "unreadable queue entry" in letter.reason
    assert letter.summary()["raw"].startswith("{") and letter.shown()["entry"] == {"raw": letter.raw}
    with pytest.raises(UnreadableLetter, match="cannot be replayed"):
        await letters.replay(letter.letter_id)


async def test_a_dead_letter_the_previous_release_wrote_without_an_owner_is_replayed(scheduler: Scheduler) -> None:
    """微信客服 msg_send_fail letters used to be written as {kind, id, msg}: no `u`, no `t`."""
    from gateway.config import Settings
    from gateway.queue.dead_letters import DeadLetters

    message = entry("wecom-kf:ww:wm1", "it never arrived").message
    old = {"reason": "msg_send_fail", "entry": {"kind": "chat", "id": "m9", "msg": message.model_dump(mode="json")}}
    await scheduler._redis.xadd(scheduler._keys.dead_letters, {"entry": json.dumps(old)})
    letters = DeadLetters(scheduler._redis, scheduler._keys, scheduler, Settings(bots=[]))
    (letter,) = await letters.list()
    assert letter.entry is not None and letter.message.text == "it never arrived"
    assert await letters.replay(letter.letter_id) == "queued"
    lease = await scheduler.take("w", 5000, 0)
    assert lease is not None and lease.entry.message.text == "it never arrived" and lease.entry.owner


async def test_a_head_that_is_not_even_json_is_dead_lettered_and_the_conversation_goes_on(scheduler: Scheduler) -> None:
    """The scripts decode heads (their time, owner and id): a head that is not JSON used to fail the take script
    after its pop, leaving the lane neither ready nor leased, the conversation silent for good."""
    await put(scheduler, "conv", "u:x", "first")
    await scheduler._redis.rpush(scheduler._keys.lane("conv"), "not json {")
    await put(scheduler, "conv", "u:x", "third")
    first = await scheduler.take("w", 5000, 0)
    assert first is not None and first.entry.message.text == "first"
    assert await scheduler.release(first, "done")
    assert await scheduler.take("w", 5000, 0) is None, "the garbage was handed out"
    third = await scheduler.take("w", 5000, 0)
    assert third is not None and third.entry.message.text == "third", "the conversation stopped at the garbage"
    (_, fields), *_ = await scheduler._redis.xrevrange(scheduler._keys.dead_letters, count=1)
    assert json.loads(fields[b"entry"])["raw"] == "not json {"


async def test_a_head_counts_its_takeovers_and_only_the_deaths_it_ran_alone(scheduler: Scheduler) -> None:
    """The worker runs a head taken over twice alone (gateway/worker/loop.py); the take tells it how often its head
    was taken over, and how often while marked alone; a companion taken over with it counts no deaths."""
    await put(scheduler, "poison", "u:p", "crashes its worker")
    await put(scheduler, "poison", "u:p", "the next message")
    await put(scheduler, "companion", "u:c", "slow")

    async def take_both_and_die(alone: bool) -> dict[str, Lease]:
        leases = {}
        while len(leases) < 2:
            lease = await scheduler.take("doomed", 50, 0)
            assert lease is not None
            leases[lease.lane] = lease
        if alone:
            assert await scheduler.mark_alone(leases["poison"])
        await asyncio.sleep(0.1)  # both leases expire: the worker died
        await scheduler.sweep()
        return leases

    first = await take_both_and_die(alone=False)
    assert (first["poison"].takeovers, first["poison"].deaths) == (0, 0)
    second = await take_both_and_die(alone=False)
    assert (second["poison"].takeovers, second["poison"].deaths) == (1, 0)
    third = await take_both_and_die(alone=True)
    assert (third["poison"].takeovers, third["poison"].deaths) == (2, 0)
    assert (third["companion"].takeovers, third["companion"].deaths) == (2, 0)
    fourth = await take_both_and_die(alone=False)
    assert (fourth["poison"].takeovers, fourth["poison"].deaths) == (3, 1)
    assert (fourth["companion"].takeovers, fourth["companion"].deaths) == (3, 0)  # it was not the one alone
    # the one death alone, counted once for the gateways' botgw_deaths_alone (its worker's own counts died with it)
    assert (await scheduler.counters()).get("deaths_alone") == 1

    # A stale lease cannot mark itself alone; the head's release ends its counts, and the lane's next message
    # starts from none.
    taken = [await scheduler.take("w", 5000, 0) for _ in range(2)]
    poison, companion = sorted((lease for lease in taken if lease), key=lambda lease: lease.lane != "poison")
    assert (poison.lane, poison.takeovers, poison.deaths, companion.lane) == ("poison", 4, 1, "companion")
    assert not await scheduler.mark_alone(fourth["poison"])
    assert await scheduler.release(poison, "done", dead_letter={"reason": "given up"})
    assert await scheduler.release(companion, "done")
    gauges = await scheduler.gauges()  # what a gateway's scrape exports, in one round trip
    assert (gauges.depth, gauges.dead_letters, gauges.deaths_alone) == (1, 1, 1)  # "the next message" waits
    following = await scheduler.take("w", 5000, 0)
    assert following is not None and following.entry.message.text == "the next message"
    assert (following.takeovers, following.deaths) == (0, 0)
    assert await scheduler.release(following, "done")
    suspects = [f"{scheduler._ns}:sched:suspect:{lane}" for lane in ("poison", "companion")]
    assert not await scheduler._redis.exists(*suspects)


async def test_a_signature_carries_the_messages_of_its_moment_and_no_later_one(scheduler: Scheduler) -> None:
    """DingTalk HTTP signs the timestamp alone: its pushes in one millisecond share a pair (a second one was refused
    as a replay), and a pair reused later with another message is a replay; a binding of an earlier release (a
    string key) keeps its one message."""
    redis = scheduler._redis
    keys = Keys("b" + secrets.token_hex(4))

    async def bind(signature: str, message_id: str) -> int:
        async with redis.pipeline(transaction=False) as pipe:
            scheduler.queue_bind(pipe, Binding(keys.signature_binding("bot", signature), message_id, 3600))
            return int((await pipe.execute())[0])

    assert [await bind("t1:s1", m) for m in ("m1", "m1", "m2", "m1")] == [1, 1, 1, 1]
    assert await bind("t1:s1", "m3") == 1
    key = keys.signature_binding("bot", "t1:s1")
    await redis.hset(key, "@", int(time.time() * 1000) - SHARE_SIGNATURE_MS - 500)  # the moment has passed
    assert await bind("t1:s1", "m4") == -1, "a pair reused after its moment carried another message"
    assert await bind("t1:s1", "m2") == 1, "a message the pair came with is still its own (a platform's retry)"
    assert 0 < await redis.ttl(key) <= 3600
    many = [await bind("t2:s2", f"n{i}") for i in range(SHARE_SIGNATURE_MAX + 2)]
    assert many == [1] * SHARE_SIGNATURE_MAX + [-1, -1], "more pushes than one millisecond carries"
    assert await bind("t1:s1", "@") == -1, "an id that is the hash's own field name (the body is not signed)"
    assert await bind("t4:s4", "@") == 1 and await bind("t4:s4", "x") == 1, "a first id '@' is an id like any"
    await redis.set(keys.signature_binding("bot", "t3:s3"), "old", ex=60)  # bound by the release before
    assert [await bind("t3:s3", "old"), await bind("t3:s3", "other")] == [1, -1]
