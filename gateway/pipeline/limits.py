"""Limits on the answer path: the sender's message windows, and the token budget of the answer.

A refusal is answered with a notice, once per window (a flooding user must not make the bot flood the
platform); a stream, card or page always gets one, as the user is looking at an open answer.
"""

from __future__ import annotations

import contextlib

from redis.exceptions import RedisError

from gateway import metrics
from gateway.pipeline.job import Composed, Job, Services
from gateway.pipeline.stage import Next
from gateway.state.limits import Refusal
from gateway.state.redis_text import as_text


async def refusal_notice(services: Services, job: Job, refusal: Refusal) -> str:
    """The notice for an over-limit message: once per window; a stream, card or page always gets one."""
    metrics.LIMIT_HITS.labels(job.message.platform, refusal.kind).inc()
    text = refusal.notice(services.settings.limits.notices)
    if refusal.kind == "prompt" or job.presenter.always_answers:
        return text
    # The window's notice belongs to the message that claimed it (its dedup key is the value): a retry of that
    # message after a crash before its commit still sends it, where a bare "told" mark would have left the person
    # never told. One round trip: the claim, then who holds it.
    notice_key, claimant = services.keys.limit_notice(refusal.who), job.message.dedup_key
    async with services.redis.pipeline(transaction=False) as pipe:
        pipe.set(notice_key, claimant, nx=True, ex=max(1, refusal.retry_after_s))
        pipe.get(notice_key)
        _, holder = await pipe.execute()
    if holder is not None and as_text(holder) == claimant:
        return text
    return ""  # told already in this window, with another message


class MessageLimits:
    """The sender's (and the group's) message windows, counted once per message however often it is tried."""

    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        message, admission = job.message, job.admission
        if admission is not None and admission.answered:  # asked with the record's first load
            refusal = admission.refusal
        else:
            refusal = await self._services.budgets.admit_message(message.person, job.group_id, message.dedup_key)
        if refusal is not None:
            return await self._services.commit(job, await refusal_notice(self._services, job, refusal))
        return await next(job)


class TokenBudget:
    """Reserve the most the answer can take (prompt bound + max_tokens) before generating; afterwards, settle
    the reservation to what the engine used, failed attempts included, whatever happened."""

    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        assert job.plan is not None, "the prompt is planned before its budget is reserved"
        budgets, message = self._services.budgets, job.message
        reservation = await budgets.reserve(message.person, job.group_id, job.plan.prompt_bound + job.plan.max_tokens)
        if isinstance(reservation, Refusal):
            return await self._services.commit(job, await refusal_notice(self._services, job, reservation))
        try:
            return await next(job)
        finally:
            with contextlib.suppress(RedisError):
                await budgets.settle(reservation, job.tokens_used)
