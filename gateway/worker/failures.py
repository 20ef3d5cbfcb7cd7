"""What becomes of a message that could not be answered now: handed back with a backoff, or given up as a dead
letter with the operators told (withheld by the platform's rules: gateway/pipeline/gate.py `withheld`)."""

from __future__ import annotations

import contextlib
import logging

from redis.exceptions import RedisError

from bots.base import InboundMessage, SendError
from engine.client import EngineError
from gateway import metrics, texts
from gateway.pipeline.job import Job, Services
from gateway.queue.push import enqueue_push
from gateway.state.pulse import PULSE
from gateway.state.reply_record import LeaseLost

log = logging.getLogger(__name__)
FAILURES_TTL_S = 86400


async def failed(services: Services, job: Job, exc: Exception) -> None:
    """A failure that may pass (engine restarting, Redis blip): hand the message back with a backoff; after
    `max_send_attempts` failures, or a permanent send error, end it and keep it as a dead letter."""
    settings = services.settings.worker
    with contextlib.suppress(RedisError, LeaseLost):
        await job.record.flush()  # a mark left for a release that will not come (gateway/delivery/pieces.py)
    permanent = isinstance(exc, SendError) and not exc.retryable
    if isinstance(exc, SendError):
        metrics.SEND_FAILURES.labels(job.message.platform, str(exc.code)).inc()
        if exc.token_refresh:  # the bot cannot get a token at all: the console's overview says so (60020's hint)
            PULSE.token_error(job.message.bot_id, exc.code, str(exc))
    elif not isinstance(exc, EngineError):
        log.exception("unexpected failure", extra={"lane": job.lease.lane})
    try:
        key = services.keys.entry_failures(job.lease.entry_id)
        failures = int(await services.redis.incr(key))
        await services.redis.expire(key, FAILURES_TTL_S)
        if permanent or failures >= settings.max_send_attempts:
            await give_up(services, job, f"failed {failures} times: {exc}")
            return
        delay = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (failures - 1))
        log.warning("handling a message failed; it will be tried again", extra={"error": str(exc), "in_s": delay})
        await services.scheduler.release(job.lease, "retry", delay_s=delay, weight=settings.weight(job.message.bot_id))
    except (RedisError, LeaseLost) as again:
        log.warning("could not record the failure; the lease will expire", extra={"error": str(again)})


async def give_up(services: Services, job: Job, reason: str) -> None:
    """End the message: its stream or card gets a final failed state, the entry becomes a dead letter."""
    metrics.REPLIES.labels(job.message.platform, "failed").inc()
    PULSE.failed(job.message.bot_id)
    log.error("a message could not be answered", extra={"lane": job.lease.lane, "reason": reason[:300]})
    with contextlib.suppress(Exception):
        state = await job.record.load()
        if job.presenter.always_answers:
            await job.presenter.fail(texts.ENGINE_UNAVAILABLE_TEXT, state)
        await job.record.mark(state="failed", reason=reason[:300])
    await services.scheduler.release(job.lease, "done", dead_letter={"reason": reason[:500]})
    await alert_operators(services, job.message, reason)


async def alert_operators(services: Services, message: InboundMessage, reason: str) -> None:
    """Tell the operators' group robot (alert_bot) that a message could not be answered."""
    alert_bot = services.settings.alert_bot
    if not alert_bot or message.bot_id == alert_bot:
        return  # no alert robot, or the failure is the alert robot's own: do not loop
    with contextlib.suppress(RedisError):
        text = f"botgw: a message could not be answered: {reason[:300]}"
        await enqueue_push(services.scheduler, alert_bot, text)
