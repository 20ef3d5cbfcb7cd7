"""What becomes of a message that could not be answered now: handed back with a backoff, or given up as a dead
letter with the operators told (withheld by the platform's rules: gateway/pipeline/gate.py `withheld`).

A pulled channel's pull (微信客服) is never given up: its callback was acknowledged and its cursor has not moved, so
nothing would pull that account again until its next callback; it backs off to `PULL_BACKOFF_CAP_FACTOR` times
`backoff_max_s` and the operators are told once that it is still being retried.

Only the lease holder counts a failure or ends a message: a worker that stalled and lost its lease finds its
fenced release refused, and changes nothing its successor sees (no count, no dead letter, no alert)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from redis.exceptions import RedisError

from bots.base import InboundMessage, SendError
from engine.client import EngineError
from gateway import metrics, texts
from gateway.config import WorkerSettings
from gateway.pipeline.job import Job, Services
from gateway.queue.entry import EntryKind
from gateway.queue.push import enqueue_push
from gateway.queue.scheduler import Outcome
from gateway.state.pulse import PULSE
from gateway.state.reply_record import LeaseLost, while_redis_returns

log = logging.getLogger(__name__)
FAILURES_TTL_S = 86400
# A pull's backoff cap, in units of worker.backoff_max_s (30 s by default: 5 minutes). A pull that keeps failing
# waits this long at most between attempts: WeCom's sync_msg without a fresh callback Token is strictly rate-limited.
PULL_BACKOFF_CAP_FACTOR = 10
# How long the reply record of a dead letter is kept: a replay within it resumes the answer the record holds.
DEAD_RECORD_TTL_S = 30 * 86400
_MAX_DOUBLINGS = 32  # 2**n of a pull failing for days stays a finite float


async def failed(services: Services, job: Job, exc: Exception) -> None:
    """A failure that may pass (engine restarting, Redis blip): hand the message back with a backoff; after
    `max_send_attempts` failures, or a permanent send error, end it and keep it as a dead letter (a pull: never).
    The failure is counted only once the fenced release held: a stale worker's failure is not the new owner's."""
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
        pull = job.entry.kind == EntryKind.PULL
        key = pull_failures_key(services, job.message) if pull else services.keys.entry_failures(job.lease.entry_id)
        failures = int(await services.redis.get(key) or 0) + 1  # with this one, counted below if still ours
        if pull:
            await _pull_failed(services, job, exc, failures, permanent=permanent)
            return
        if permanent or failures >= settings.max_send_attempts:
            await give_up(services, job, f"failed {failures} times: {exc}")
            return
        delay = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** min(failures - 1, _MAX_DOUBLINGS))
        if not await services.scheduler.release(job.lease, "retry", delay_s=delay, weight=_weight(services, job)):
            _lost(job)
            return
        await _count(services, key)
        log.warning("handling a message failed; it will be tried again", extra={"error": str(exc), "in_s": delay})
    except (RedisError, LeaseLost) as again:
        log.warning("could not record the failure; the lease will expire", extra={"error": str(again)})


def pull_backoff_s(settings: WorkerSettings, failures: int) -> float:
    """The wait before a failed pull's next attempt: doubling from backoff_base_s, capped at minutes."""
    cap = max(settings.backoff_max_s * PULL_BACKOFF_CAP_FACTOR, settings.backoff_base_s)
    return min(cap, settings.backoff_base_s * 2 ** min(failures - 1, _MAX_DOUBLINGS))


def pull_failures_key(services: Services, message: InboundMessage) -> str:
    """A pulled account's failures in a row, whichever pull entry met them: each callback queues a pull of its own,
    and a count per entry would start again at every one (the alert never due, the backoff never growing)."""
    return services.keys.entry_failures(f"pull:{message.bot_id}:{message.conversation_id}")


async def pull_succeeded(services: Services, message: InboundMessage) -> None:
    """The account pulled: its failures in a row start again from none."""
    with contextlib.suppress(RedisError):
        await services.redis.delete(pull_failures_key(services, message))


async def _pull_failed(services: Services, job: Job, exc: Exception, failures: int, *, permanent: bool) -> None:
    """A pull is tried again until it works, however long and whatever the error: given up, the account's waiting
    messages would stay at the platform until its next callback, which a quiet account may never send. A newer
    pull queued right behind takes over after the same wait (the same saved cursor, with its callback's fresh
    Token: a Token lasts 10 minutes, and without one sync_msg is strictly rate-limited), so a queue of pulls piled
    up in an outage is not run through at once. The operators are told at once of an error that needs them (a
    permanent one: an untrusted IP, a revoked secret), and of any other once it has lasted max_send_attempts."""
    settings, message = services.settings.worker, job.message
    metrics.PULL_RETRIES.labels(message.platform, message.bot_id).inc()
    extra = {"bot_id": message.bot_id, "channel": message.conversation_id, "error": str(exc), "failures": failures}
    delay = pull_backoff_s(settings, failures)
    behind = await services.scheduler.following(job.lease, 1)
    newer_behind = bool(behind) and behind[0].kind == EntryKind.PULL
    outcome: Outcome = "done" if newer_behind else "retry"
    if not await services.scheduler.release(job.lease, outcome, delay_s=delay, weight=_weight(services, job)):
        _lost(job)
        return
    await _count(services, pull_failures_key(services, message))
    log.warning("a pull failed; it will be tried again until it works",
                extra={**extra, "in_s": delay, "by": "the newer pull" if newer_behind else "itself"})  # fmt: skip
    if (permanent and failures == 1) or failures == settings.max_send_attempts:
        cap = pull_backoff_s(settings, _MAX_DOUBLINGS + 1)
        reason = (f"pulling {message.bot_id}'s account {message.conversation_id} failed {failures} times ({exc}); "
                  f"still retrying, at most every {cap:g} s, until it works")  # fmt: skip
        await alert_operators(services, message, reason, prefix="botgw: ")


async def give_up(services: Services, job: Job, reason: str) -> bool:
    """End the message: its stream or card gets a final failed state, the entry becomes a dead letter. Nothing is
    counted or told when the release finds the lease gone: the message is its new owner's to answer (False).

    The record's "failed" is written by the release itself, with the dead letter, under the lease: written before it
    (a stall, a Redis blip in between), the next owner took the record's "failed" for done and dropped the message
    with no dead letter and no alert (found by a review). The record then outlives the usual dedup_ttl_s by
    DEAD_RECORD_TTL_S, so that a replay weeks later still resumes the answer it holds rather than composing one
    anew after the pieces already sent.

    The failure is shown (a stream, a card, the page) only after that release held: shown before it, a worker that
    then stalled and lost the message left its successor a finished stream, and the successor's answer was
    dropped behind "unavailable" (found by a review). The message is nobody's then: the notice is written unfenced,
    and the record keeps its 30 days."""
    # with the epoch that wrote it: a release that ran but whose answer was lost is retried, finds the lease gone,
    # and is then known for its own by the record (else nobody was told, and the notice was never shown)
    job.record.mark_at_release(state="failed", reason=reason[:300], failed_by=job.lease.epoch)
    marks = job.record.release_marks()
    assert marks is not None
    marks = dataclasses.replace(marks, ttl_s=max(marks.ttl_s, DEAD_RECORD_TTL_S))
    scheduler, dead = services.scheduler, {"reason": reason[:500]}
    if not await while_redis_returns(lambda: scheduler.release(job.lease, "done", dead_letter=dead, record=marks)):
        state = await job.record.load()
        if not (state.state == "failed" and state.failed_by == job.lease.epoch):
            _lost(job)
            return False
    if job.presenter.always_answers:
        await _show_failure(job)
    metrics.REPLIES.labels(job.message.platform, "failed").inc()
    PULSE.failed(job.message.bot_id)
    log.error("a message could not be answered", extra={"lane": job.lease.lane, "reason": reason[:300]})
    await alert_operators(services, job.message, reason)
    return True


async def _show_failure(job: Job) -> None:
    """Give the stream, card or page the user watches its failed end, once the message is a dead letter."""
    job.presenter.fence = job.record.fence = None  # released: no lease left to hold, and nobody else answers it
    job.record.ttl_s = max(job.record.ttl_s, DEAD_RECORD_TTL_S)
    try:
        await job.presenter.fail(texts.ENGINE_UNAVAILABLE_TEXT, await job.record.load())
    except Exception as exc:  # the notice is a courtesy: the record still says failed (a replay resets it)
        log.warning("the failure notice could not be shown", extra={"error": str(exc)[:300]})


async def _count(services: Services, key: str) -> None:
    """One more failure of the entry, in one round trip (the release that made it ours to count came first)."""
    pipe = services.redis.pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, FAILURES_TTL_S)
    await pipe.execute()


def _weight(services: Services, job: Job) -> float:
    return services.settings.worker.weight(job.message.bot_id)


def _lost(job: Job) -> None:
    metrics.LEASES_LOST.inc()
    log.warning("lost the lease of a failed message; its new owner decides", extra={"lane": job.lease.lane})


async def alert_operators(
    services: Services, message: InboundMessage, reason: str, prefix: str = "botgw: a message could not be answered: "
) -> None:
    """Tell the operators' group robot (alert_bot) that a message could not be answered (or, `prefix`, more)."""
    alert_bot = services.settings.alert_bot
    if not alert_bot or message.bot_id == alert_bot:
        return  # no alert robot, or the failure is the alert robot's own: do not loop
    with contextlib.suppress(RedisError):
        await enqueue_push(services.scheduler, alert_bot, f"{prefix}{reason[:300]}")
