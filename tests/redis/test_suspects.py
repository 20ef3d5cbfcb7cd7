"""A suspect (a lane head taken over twice: gateway/worker/loop.py `_handle_alone`) in one worker process on a real
redis-server: it waits for its worker's other messages only so long, then goes back uncounted; a pull that died
alone twice still runs (pulls are never given up) and the operators are told at its 2nd, 4th, 8th... death (when
it runs: not when it goes back unmarked), a message is given up without running; the runs and give-ups are
counted."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from gateway.queue.entry import EntryKind, QueueEntry
from gateway.queue.scheduler import Lease
from gateway.state.memory import Scope
from gateway.worker import loop
from gateway.worker.loop import Worker
from tests.redis.conftest import World
from tests.redis.test_answer_faults import kf_message


async def take(world: World, kind: EntryKind = EntryKind.CHAT) -> Lease:
    message = kf_message()
    lane = Scope.of(message, "per_user").lane
    await world.scheduler.enqueue(lane, QueueEntry(owner=lane, message=message, kind=kind))
    lease = await world.scheduler.take("w", 30_000, 0)
    assert lease is not None and lease.lane == lane
    return lease


def a_worker(world: World) -> tuple[Worker, list[str]]:
    """A Worker with only what `_handle_alone` touches; `_handle` and the give-up record what they were asked."""
    worker = object.__new__(Worker)
    worker._scheduler, worker._held, worker._slot_freed = world.scheduler, {}, asyncio.Event()
    worker._cfg = SimpleNamespace(weight=lambda bot_id: 1.0)  # type: ignore[assignment]
    done: list[str] = []

    async def handle(lease: Lease) -> None:
        done.append(f"ran {lease.entry.kind}")

    async def give_up(lease: Lease) -> bool:
        done.append(f"gave up {lease.entry.kind}")
        return True

    worker._handle, worker._give_up_suspect = handle, give_up  # type: ignore[method-assign]
    return worker, done


async def test_a_suspect_goes_back_uncounted_when_its_workers_other_message_runs_long(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "ALONE_WAIT_S", 0.2)
    worker, done = a_worker(world)
    other = await take(world)
    long_answer = asyncio.create_task(asyncio.sleep(30))
    worker._held[other.lane] = (other, long_answer)
    suspect = await take(world)
    worker._alone = suspect
    worker._held[suspect.lane] = (suspect, asyncio.current_task())  # type: ignore[assignment]
    try:
        await asyncio.wait_for(worker._handle_alone(suspect), timeout=5)
    finally:
        long_answer.cancel()
    assert done == [] and worker._alone is None and worker._slot_freed.is_set()
    assert not await world.scheduler.mark_alone(suspect), "its lease was not released"
    await asyncio.sleep(1.1)  # handed back with a second's delay, then taken again with nothing counted
    again = await world.scheduler.take("w2", 30_000, 0)
    assert again is not None and again.lane == suspect.lane and (again.takeovers, again.deaths) == (0, 0)


def counted() -> dict[str, float]:
    names = ("botgw_messages_run_alone_total", "botgw_poison_messages_given_up_total")
    return {name: REGISTRY.get_sample_value(name) or 0.0 for name in names}


async def test_after_two_deaths_alone_a_message_is_given_up_and_a_pull_still_runs_and_is_told(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[str] = []

    async def alert(services: object, message: object, reason: str, prefix: str = "") -> None:
        told.append(reason)

    monkeypatch.setattr(loop, "alert_operators", alert)
    monkeypatch.setattr(loop, "ALONE_WAIT_S", 0.2)
    worker, done = a_worker(world)
    worker.services = SimpleNamespace()  # type: ignore[assignment]
    before = counted()

    async def suspect(kind: EntryKind, deaths: int, beside: asyncio.Task | None = None) -> None:
        lease = dataclasses.replace(await take(world, kind), takeovers=4 + deaths, deaths=deaths)
        if beside is not None:  # another message of this worker's runs long: the suspect goes back unmarked
            other = await take(world)
            worker._held[other.lane] = (other, beside)
        worker._alone = lease
        await worker._handle_alone(lease)
        worker._held.clear()
        assert worker._alone is None

    long_answer = asyncio.create_task(asyncio.sleep(30))
    try:
        await suspect(EntryKind.PULL, 2, beside=long_answer)
    finally:
        long_answer.cancel()
    assert done == [] and told == [], "a pull that went back without running tells nobody"
    for kind, deaths in [(EntryKind.CHAT, 2), (EntryKind.PULL, 2), (EntryKind.PULL, 3), (EntryKind.PULL, 4)]:
        await suspect(kind, deaths)
    assert done == [f"gave up {EntryKind.CHAT}", *[f"ran {EntryKind.PULL}"] * 3]
    assert [reason.split("alone ")[1].split(" times")[0] for reason in told] == ["2", "4"], told
    after = counted()
    assert {name: after[name] - before[name] for name in after} == {
        "botgw_messages_run_alone_total": 3,
        "botgw_poison_messages_given_up_total": 1,
    }
