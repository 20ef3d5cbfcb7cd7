"""The one shape of a stage: `await stage(job, next) -> Composed`.

A stage either answers the job itself (a notice, a refusal, a command's result) or passes it on with
`await next(job)`, and may act around what comes after (the token budget settles what generation used, the
engine-failure stage turns an engine error into a notice). The answer path is a list of stages, built per
adapter from what it declares (gateway/pipeline/build.py); adding a limit is adding a stage there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gateway.pipeline.job import Composed, Job

Next = Callable[[Job], Awaitable[Composed]]


class Stage(Protocol):
    async def __call__(self, job: Job, next: Next) -> Composed: ...


def chain(stages: Sequence[Stage]) -> Next:
    """The stages as one call, first stage outermost. The last stage must answer: falling off the end is a bug."""

    async def end(job: Job) -> Composed:
        raise RuntimeError("the answer pipeline ended without an answer (its last stage must compose one)")

    call: Next = end
    for stage in reversed(stages):
        call = _link(stage, call)
    return call


def _link(stage: Stage, after: Next) -> Next:
    async def run(job: Job) -> Composed:
        return await stage(job, after)

    return run
