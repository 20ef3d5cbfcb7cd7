"""The worker's loop: take a ready turn, keep its lease alive, hand on stalled ones, drain on SIGTERM.

A worker only holds work that can run now (gateway/queue/scheduler.py): the next turn of some conversation,
fair across users. Everything it does to a message is fenced by its lease, so a worker that stalled and lost
the message can change nothing; heartbeats renew only leases still held and keep running through the SIGTERM
drain. Waits that are not work (a send allowance, a backoff after a failure) hand the message back with a delay
instead of holding a slot.

Exactly-once delivery is built from at-least-once pieces: the answer and the conversation memory are committed
together in the reply record before anything is sent (gateway/pipeline/), so a worker that takes over resends
the same answer without asking the engine again. What one entry becomes is gateway/worker/dispatch.py; what a
failure becomes, gateway/worker/failures.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from bots.base import ConversationTaken, InboundMessage
from bots.channels import Channel
from engine.asr import Transcriber
from gateway import metrics
from gateway.delivery.presenters import Delivery, Paced, presenter_for
from gateway.logs import request_id
from gateway.pipeline.build import answer_pipeline
from gateway.pipeline.commands import parse_command
from gateway.pipeline.gate import withheld
from gateway.pipeline.job import Job, Services
from gateway.pipeline.stage import Next
from gateway.queue.entry import EntryKind
from gateway.queue.scheduler import Lease
from gateway.runtime import Runtime
from gateway.state.conversations import Conversations
from gateway.state.limits import Admission, Budgets, MovingWindowLimiter
from gateway.state.memory import ConversationMemory, Scope
from gateway.state.pulse import start_pulse
from gateway.state.redis_client import is_cluster_url
from gateway.state.reply_record import Fence, LeaseLost, ReplyRecords, while_redis_returns
from gateway.state.riders import Rider
from gateway.state.streams import StreamStore
from gateway.worker.dispatch import run_entry
from gateway.worker.failures import alert_operators, failed, give_up
from gateway.worker.pulled import PulledWork
from tools.confirmations import reply_verdict
from tools.kit import ToolKit

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 1.0  # at least this often, by the sweep loop or a take: a stalled lease or a delay is never missed
# A message that ends or stalls every worker that runs it (a crash in a library, a CPU-bound step on hostile input)
# would be taken over for ever, taking each worker's other messages down with it. Taken over this often, its head
# runs alone: its worker finishes the others and takes no more meanwhile, so a death then is the message's own...
SUSPECT_AFTER_TAKEOVERS = 2
# ... and after this many deaths while alone it is given up (a dead letter, the operators told) instead of run.
DEATHS_ALONE_ALLOWED = 2
ALONE_WAIT_S = 60.0  # the longest a suspect waits for its worker's other messages; then it goes back to the queue
HAND_BACK_GRACE_S = 5.0  # at shutdown, how long a piece on its way may take to finish before its answer is cancelled


def worker_services(runtime: Runtime, conversations: Conversations) -> Services:
    """The collaborators every job of this process shares, opened on the runtime's Redis and clients."""
    settings, redis, keys = runtime.settings, runtime.redis, runtime.keys
    options = settings.redis_options()
    delivery = Delivery(
        redis,
        keys,
        StreamStore(redis, keys),
        MovingWindowLimiter(settings.redis_url, keys.send_pace_prefix, **options),
        settings.worker,
        conversations,
        single_slot=not is_cluster_url(settings.redis_url),
    )
    return Services(
        settings=settings,
        redis=redis,
        keys=keys,
        engine=runtime.engine,
        scheduler=runtime.scheduler,
        memory=ConversationMemory(redis, keys, settings.memory.ttl_s, settings.memory.max_turns),
        budgets=Budgets(redis, settings.redis_url, keys, settings.limits, **options),
        conversations=conversations,
        delivery=delivery,
        records=ReplyRecords(redis, keys, settings.effective_dedup_ttl_s()),
        http=runtime.http,
        transcriber=Transcriber(settings.asr, runtime.http) if settings.asr else None,
        tools=ToolKit(settings.tools, redis, keys) if settings.tools.servers else None,
    )


class Worker:
    """One worker process's loops; any number of them share the scheduler."""

    def __init__(self, runtime: Runtime, consumer: str) -> None:
        self._rt = runtime
        self._settings = runtime.settings
        self._cfg = runtime.settings.worker
        self._consumer = consumer
        self._scheduler = runtime.scheduler
        self.pulled = PulledWork(runtime.redis, runtime.keys, runtime.scheduler, runtime.settings)
        self.services = worker_services(runtime, self.pulled.conversations)
        self._pipelines: dict[str, Next] = {
            bot_id: answer_pipeline(adapter, self.services) for bot_id, adapter in runtime.adapters.items()
        }
        self._held: dict[str, tuple[Lease, asyncio.Task[None]]] = {}  # by lane
        self._slot_freed = asyncio.Event()
        self._alone: Lease | None = None  # a suspect held: nothing more is taken until it has run

    # -- the loops ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set; then take nothing new, finish what is held within drain_s, hand back the rest."""
        while True:  # a Redis blip at start must not end the worker (nothing would take the queue's work)
            try:
                await self._scheduler.load_scripts()
                await self.services.memory.load_scripts()
                await self.services.budgets.load_scripts()
                break
            except RedisError as exc:
                log.warning("could not load the scheduler's scripts; trying again", extra={"error": str(exc)})
                if stop.is_set():
                    return
                await asyncio.sleep(1.0)
        log.info("worker started", extra={"consumer": self._consumer})
        taking = asyncio.create_task(self._take_loop(stop))
        keeping = [
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._sweep_loop()),
            start_pulse(self._rt.redis, self._rt.keys, "worker", lambda: self._rt.engine.endpoints),
        ]
        await stop.wait()
        # The take loop ends after its current round trip (a blocking take returns within block_ms): cut off
        # mid-trip, a take that Redis already ran would leave a lease nobody holds until it expires.
        self._slot_freed.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(taking), timeout=self._cfg.block_ms / 1000 + 2.0)
        taking.cancel()
        await asyncio.gather(taking, return_exceptions=True)
        tasks = [task for _, task in self._held.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=self._cfg.drain_s)
        handed_back = await self._hand_back()
        for task in keeping:
            task.cancel()
        await asyncio.gather(*keeping, return_exceptions=True)
        if self.services.tools is not None:
            await self.services.tools.aclose()  # stdio servers are child processes
        if self.services.retriever is not None:
            await self.services.retriever.aclose()  # lets go of an embedded knowledge store's folder
        log.info("worker stopped", extra={"consumer": self._consumer, "handed_back": handed_back})

    async def _hand_back(self) -> int:
        """Stop what is still running after the drain and give it back to the queue at once: no new piece is begun
        (each answer hands itself back before its next one), a piece on its way is let finish for up to
        HAND_BACK_GRACE_S, and what still runs then is cancelled (an engine call: nothing was sent)."""
        self.services.delivery.stopping.set()
        running = [task for _, task in self._held.values()]
        if running:
            await asyncio.wait(running, timeout=HAND_BACK_GRACE_S)
        left = list(self._held.values())
        for _, task in left:
            task.cancel()
        await asyncio.gather(*(task for _, task in left), return_exceptions=True)
        for lease, _ in left:
            with contextlib.suppress(RedisError):
                await self._scheduler.release(lease, "retry", weight=self._weight(lease))
        return len(left)

    async def _take_loop(self, stop: asyncio.Event) -> None:
        lease_ms = self._cfg.claim_idle_ms
        cap = self._settings.limits.max_concurrent_per_user
        look = True  # something may be ready; False once a take said nothing more is: block on the wake list
        while not stop.is_set():
            if len(self._held) >= self._cfg.concurrency or self._alone is not None:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            try:
                if look:
                    lease, look = await self._scheduler.take_next(self._consumer, lease_ms, cap)
                else:  # nothing was ready: block on the wake list and take in the same round trip
                    wait_s = self._cfg.block_ms / 1000
                    lease, look = await self._scheduler.wait_and_take(self._consumer, lease_ms, cap, wait_s)
            except RedisError as exc:
                log.error("taking work failed", extra={"error": str(exc)})
                look = True
                await asyncio.sleep(1.0)
                continue
            if lease is not None:
                self._start(lease)

    async def _heartbeat_loop(self) -> None:
        """Renew the leases still held; a lease found lost stops its answer at once."""
        interval = max(0.03, self._cfg.claim_idle_ms / 3000)
        while True:
            await asyncio.sleep(interval)
            leases = [lease for lease, _ in self._held.values()]
            try:
                lost = await self._scheduler.renew(leases, self._cfg.claim_idle_ms)
            except RedisError as exc:
                log.warning("lease renewal failed", extra={"error": str(exc)})
                continue
            for lease in leases:
                held = self._held.get(lease.lane)
                # Only the lease renewed is judged: it may have ended normally meanwhile, and its lane may
                # already be held again under a new lease, which this answer says nothing about.
                if lease.lane in lost and held is not None and held[0] is lease and not held[1].done():
                    metrics.LEASES_LOST.inc()
                    log.warning("lost the lease of a message; another worker has it", extra={"lane": lease.lane})
                    held[1].cancel()

    async def _sweep_loop(self) -> None:
        """Hand on the leases of workers that died or stalled, and wake delayed lanes that are due. Every take
        sweeps too: when nothing is known to fall due within the second, a sweep is left out while takes come."""
        while True:
            try:
                _, next_due_s = await self._scheduler.sweep()
            except RedisError as exc:
                log.warning("scheduler sweep failed", extra={"error": str(exc)})
                next_due_s = 1.0
            if 0 <= next_due_s < SWEEP_EVERY_S:  # something falls due: sweep right then
                await asyncio.sleep(max(0.02, next_due_s))
                continue
            due_at = time.monotonic() + next_due_s if next_due_s >= 0 else math.inf
            await asyncio.sleep(SWEEP_EVERY_S)
            while (since := (now := time.monotonic()) - self._scheduler.swept_at) < SWEEP_EVERY_S and now < due_at:
                await asyncio.sleep(max(0.02, min(SWEEP_EVERY_S - since, due_at - now)))

    def _start(self, lease: Lease) -> None:
        suspect = lease.takeovers >= SUSPECT_AFTER_TAKEOVERS
        if suspect:
            self._alone = lease
        task = asyncio.create_task(self._handle_alone(lease) if suspect else self._handle(lease))
        self._held[lease.lane] = (lease, task)
        task.add_done_callback(lambda _: self._forget(lease))

    async def _handle_alone(self, lease: Lease) -> None:
        """A suspect (see SUSPECT_AFTER_TAKEOVERS): given up if it died alone often enough, else run once this
        worker's other messages are done (its lease renewed meanwhile), marked alone first. A pull is never given
        up (gateway/worker/failures.py): it only runs alone. Whatever else ends it here is a release, never a lease
        left to expire: an expiry while marked alone would count as its death."""
        request_id.set(lease.entry.request_id or "")
        try:
            if lease.deaths >= DEATHS_ALONE_ALLOWED and lease.entry.kind != EntryKind.PULL:
                if await self._give_up_suspect(lease):
                    metrics.POISON_GIVEN_UP.inc()
                return
            others = [task for held, task in self._held.values() if held is not lease]
            if others and (await asyncio.wait(others, timeout=ALONE_WAIT_S))[1]:
                # A long answer beside it: the suspect goes back (nothing counted) and this worker takes work again.
                await self._scheduler.release(lease, "retry", delay_s=1.0, weight=self._weight(lease))
                return
            if not await self._scheduler.mark_alone(lease):
                return  # lost meanwhile: its new owner decides
            log.warning(
                "running a message alone: it was taken over from workers that died or stalled while holding it",
                extra={"lane": lease.lane, "takeovers": lease.takeovers, "deaths_alone": lease.deaths},
            )
            metrics.RUN_ALONE.inc()
            if lease.deaths >= DEATHS_ALONE_ALLOWED:  # a pull, never given up
                await self._pull_still_dying(lease)
            await self._handle(lease)
        except RedisError as exc:  # Redis away: hand it back once Redis answers (fenced: a no-op if it was released)
            log.warning("could not run a suspect message alone", extra={"lane": lease.lane, "error": str(exc)})
            with contextlib.suppress(RedisError):
                weight = self._weight(lease)
                await while_redis_returns(lambda: self._scheduler.release(lease, "retry", weight=weight))
        finally:
            self._alone = None
            self._slot_freed.set()

    async def _give_up_suspect(self, lease: Lease) -> bool:
        """True if it became a dead letter (False: the lease had passed on)."""
        message = lease.entry.message
        reason = f"it ended or stalled the worker that ran it alone {lease.deaths} times"
        adapter = self._rt.adapters.get(message.bot_id)
        if adapter is None:
            return await self._scheduler.release(lease, "done", dead_letter={"reason": f"{reason}; its bot is gone"})
        return await give_up(self.services, self._job(lease, message, adapter), reason)

    async def _pull_still_dying(self, lease: Lease) -> None:
        """A pull is never given up (its account's messages would wait at the platform for a callback that may
        not come), so no dead letter tells anyone that it keeps ending workers: the operators are told at its 2nd,
        4th, 8th... death alone, once it is marked alone for its next run (a run that goes back unmarked tells
        nothing), and before that run, which may end this worker too: the alert is queued in Redis first."""
        deaths, message = lease.deaths, lease.entry.message
        if deaths & (deaths - 1) == 0:
            reason = (f"pulling {message.bot_id}'s account {message.conversation_id} ended or stalled the worker "
                      f"that ran it alone {deaths} times; it is tried again, alone, by the next worker")  # fmt: skip
            log.error("a pull keeps ending the workers that run it", extra={"lane": lease.lane, "deaths": deaths})
            await alert_operators(self.services, message, reason, prefix="botgw: ")

    def _forget(self, lease: Lease) -> None:
        """The lease is no longer this worker's to renew (released, handed on, or lost); a slot is free."""
        if self._held.get(lease.lane, (None,))[0] is lease:
            del self._held[lease.lane]
        if self._alone is lease:  # also when its task was cancelled before it began
            self._alone = None
        self._slot_freed.set()

    def _weight(self, lease: Lease) -> float:
        return self._cfg.weight(lease.entry.message.bot_id)

    # -- one message -------------------------------------------------------------------------

    async def _handle(self, lease: Lease) -> None:
        entry = lease.entry
        request_id.set(entry.request_id or "")
        message = entry.message
        metrics.QUEUE_WAIT.labels(message.platform, message.bot_id).observe(max(0.0, time.time() - entry.enqueued_at))
        adapter = self._rt.adapters.get(message.bot_id)
        if adapter is None:
            await self._scheduler.release(lease, "done", dead_letter={"reason": f"bot {message.bot_id!r} is gone"})
            return
        weight = self._cfg.weight(message.bot_id)
        job = self._job(lease, message, adapter)  # before anything that can fail: the failure path needs it
        try:
            if await self._may_merge(job):
                merged, wait_s = await self.pulled.merge(
                    lease, message, adapter.merge_window_s, self._answered_alone(adapter)
                )
                if wait_s > 0:  # the person is still writing: look again when the burst is over
                    await self._scheduler.release(lease, "retry", delay_s=wait_s, weight=weight)
                    return
                if merged is not None:
                    lease = dataclasses.replace(lease, entry=merged)
                    job = self._job(lease, merged.message, adapter)
            outcome = await run_entry(job, self.services, self.pulled, self._pipelines[message.bot_id])
            await self._release_done(lease, weight, job)
            self._forget(lease)
            log.info("message handled", extra={"lane": lease.lane, "outcome": outcome})
        except ConversationTaken as taken:
            await withheld(self.services, job, str(taken.code), by_human=taken.by_human)
            await self._scheduler.release(lease, "done", weight=weight, record=job.record.release_marks())
        except LeaseLost:
            metrics.LEASES_LOST.inc()
            log.warning("lost the lease mid-answer; leaving the message to its new owner", extra={"lane": lease.lane})
        except Paced as paced:
            marks = job.record.release_marks()
            await self._scheduler.release(lease, "retry", delay_s=paced.retry_after_s, weight=weight, record=marks)
        except asyncio.CancelledError:
            await self._hand_back_marks(lease, weight, job)
            raise
        except Exception as exc:
            await failed(self.services, job, exc)

    async def _hand_back_marks(self, lease: Lease, weight: float, job: Job) -> None:
        """Cancelled (the hand-back at shutdown) after a send whose mark waits for the release: hand the message
        back with that mark, else the next worker sends the last piece again (DingTalk has no duplicate check).
        The hand-back's own release then finds the lease gone and does nothing."""
        marks = job.record.release_marks()
        if marks is None:
            return
        with contextlib.suppress(RedisError, asyncio.CancelledError):
            await asyncio.shield(self._scheduler.release(lease, "retry", weight=weight, record=marks))

    async def _release_done(self, lease: Lease, weight: float, job: Job) -> None:
        """Drop the handled entry, with the record's last marks (the answer's last piece sent, done) in the same
        step. Those marks must survive a Redis restart as `mark` does (the piece would be sent again): the release
        is retried while Redis is away, which is safe as a release that ran finds its lease gone and does nothing."""
        marks = job.record.release_marks()
        if marks is None:
            await self._scheduler.release(lease, "done", weight=weight)
            return
        scheduler = self._scheduler
        try:
            released = await while_redis_returns(lambda: scheduler.release(lease, "done", weight=weight, record=marks))
        except BaseException:  # Redis away too long, or cancelled: the marks go back for whoever writes next
            job.record.mark_at_release(**marks.marks)  # (failed()'s flush, the hand-back's release)
            raise
        if not released:  # passed on (its new owner resends the last piece), or this release ran before a blip
            log.warning("the release with the answer's last mark found its lease gone", extra={"lane": lease.lane})

    @staticmethod
    async def _may_merge(job: Job) -> bool:
        """A burst is merged into its head only before anything was written for the head: once an answer (or
        any step of one) is recorded, what arrived behind it is answered on its own, never absorbed unseen."""
        entry = job.entry
        if not job.adapter.merge_window_s or entry.kind != EntryKind.CHAT or entry.merged is not None:
            return False
        if job.lease.takeovers >= SUSPECT_AFTER_TAKEOVERS:  # a burst merged into a suspect would share its fate
            return False
        return not await job.record.exists()

    @staticmethod
    def _answered_alone(adapter: Channel) -> Callable[[str], bool]:
        """Texts a burst must not swallow: a command, a 确认 or 取消 (merged into "确认\n谢谢" it is no verdict, and
        the call it confirmed would be cancelled), and on a platform with human agents a handoff keyword."""
        sessions = adapter.sessions

        def alone(text: str) -> bool:
            if parse_command(text) is not None or reply_verdict(text) is not None:
                return True
            return sessions is not None and sessions.wants_human(text)

        return alone

    def _job(self, lease: Lease, message: InboundMessage, adapter: Channel) -> Job:
        services = self.services
        fence = Fence(services.keys.lease(lease.lane), lease.epoch)
        scope = Scope.of(message, self._settings.memory.group)
        # a chat is planned on its memory: read it with the reply record, and send what its stages will ask along
        chat = lease.entry.kind == EntryKind.CHAT
        memory_key = services.keys.memory(scope.lane) if chat else ""
        files_key = services.keys.attachments(scope.lane) if chat else ""
        admission = self._admission(message, adapter) if chat else None
        riders = [rider for rider in (self._adoption(message, scope) if chat else None, admission) if rider]
        record = services.records.open(message.dedup_key, fence, memory_key, files_key, riders)
        presenter = presenter_for(services.delivery, adapter, message, record, fence)
        record.commit_rides_on_send = presenter.begins_with_the_commit
        return Job(lease, message, scope, adapter, record, presenter, admission=admission)

    def _adoption(self, message: InboundMessage, scope: Scope) -> Rider | None:
        """The AdoptMemory stage's question, asked with the record's first load (the memory read there follows)."""
        if scope.lane != message.session_key:
            return None
        return self.services.memory.adoption(message.session_key, message.bot_session_key)

    def _admission(self, message: InboundMessage, adapter: Channel) -> Admission | None:
        """The MessageLimits stage's question, asked with the record's first load where nothing comes before the
        stage that could end the answer uncounted (a platform with human agents has the gate first), and where its
        windows share the record's Redis (a single Redis, not a Cluster). The record goes with it: a retry of an
        answer already recorded (the stage will not run) counts nothing."""
        if adapter.sessions is not None or not self.services.delivery.single_slot:
            return None
        record_key = self.services.keys.reply(message.dedup_key)
        return self.services.budgets.admission(message.person, message.group or None, message.dedup_key, record_key)
