"""The last piece's mark rides on the lease's release (gateway/worker/loop.py): when that release does not happen
(Redis away past the retry, or the worker cancelled by its shutdown's hand-back), the mark must not vanish with
it, or the next worker sends the last piece again (DingTalk has no duplicate check)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.state.reply_record import ReplyRecord
from gateway.worker.loop import Worker


class Releases:
    """A scheduler whose release fails as told, and which records what it was asked."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.calls: list[tuple[str, Any]] = []

    async def release(self, lease: object, outcome: str, **kwargs: Any) -> bool:
        self.calls.append((outcome, kwargs.get("record")))
        if self.error is not None:
            raise self.error
        return True


def job_with_marks() -> SimpleNamespace:
    record = ReplyRecord(redis=None, key="r:1", ttl_s=60)  # type: ignore[arg-type]  # only its memory is used
    record.mark_at_release(sent=3, state="done")
    return SimpleNamespace(record=record)


@pytest.mark.parametrize("error", [RedisConnectionError("away"), asyncio.CancelledError()])
def test_a_release_that_fails_gives_the_last_mark_back(error: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.state.reply_record.MARK_RETRY_S", 0.0)
    job, scheduler = job_with_marks(), Releases(error)
    worker = SimpleNamespace(_scheduler=scheduler)
    with pytest.raises(type(error)):
        asyncio.run(Worker._release_done(worker, object(), 1.0, job))  # type: ignore[arg-type]
    marks = job.record.release_marks()
    assert marks is not None and marks.marks == {"sent": 3, "state": "done"}, "the mark was dropped with the release"


def test_a_cancelled_answer_is_handed_back_with_its_last_mark() -> None:
    job, scheduler = job_with_marks(), Releases(None)
    worker = SimpleNamespace(_scheduler=scheduler)
    asyncio.run(Worker._hand_back_marks(worker, object(), 1.0, job))  # type: ignore[arg-type]
    assert [(outcome, record.marks) for outcome, record in scheduler.calls] == [("retry", {"sent": 3, "state": "done"})]
    assert job.record.release_marks() is None
    asyncio.run(Worker._hand_back_marks(worker, object(), 1.0, job))  # type: ignore[arg-type]
    assert len(scheduler.calls) == 1, "nothing left to hand back: no second release"
