"""A ready-made notice (a group robot's push, an operator's alert): committed as it is, no engine."""

from __future__ import annotations

from gateway.pipeline.job import Composed, Job, Services
from gateway.pipeline.stage import Next
from gateway.queue.entry import EntryKind


class ReadyNotice:
    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        if job.entry.kind == EntryKind.NOTICE:
            return await self._services.commit(job, job.entry.notice or "")
        return await next(job)
