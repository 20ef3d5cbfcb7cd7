"""The worker: take a ready turn → limits → command? → memory → engine → reply record → deliver → release.

A worker only holds work that can run now (gateway/queue/scheduler.py): the next turn of some
conversation, fair across users. Everything it does to a message is fenced by its lease,
so a worker that stalled and lost the message can change nothing; heartbeats renew only
leases still held and keep running through the SIGTERM drain. Waits that are not work
(a send allowance, a backoff after a failure) hand the message back with a delay instead
of holding a slot.

Exactly-once delivery is built from at-least-once pieces: the answer and the conversation
memory are committed together in the reply record before anything is sent, so a worker
that takes over resends the same answer without asking the engine again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from bots.base import ConversationTaken, InboundMessage, SendError
from bots.text import utf8_len
from engine.client import Completion, EngineError
from engine.observability import expert_usage, export_expert_usage, format_expert_trace
from engine.pool import EngineUnavailable
from gateway import metrics, texts
from gateway.delivery.presenters import Delivery, Paced, Presenter, presenter_for
from gateway.logs import request_id
from gateway.pipeline.commands import parse_command
from gateway.queue.push import PUSH_PLATFORM, enqueue_push
from gateway.queue.scheduler import Lease
from gateway.runtime import Adapter, Runtime
from gateway.state.limits import Budgets, MovingWindowLimiter, Refusal, Reservation
from gateway.state.memory import ConversationMemory, Scope, Turn, fit_to_budget
from gateway.state.reply_record import Fence, LeaseLost, ReplyRecord, ReplyRecords, ReplyState
from gateway.state.streams import StreamStore
from gateway.worker.pulled import PulledWork
from knowledge.errors import StoreLocked
from knowledge.retrieval import Retriever

log = logging.getLogger(__name__)

STREAM_ATTEMPTS = 3
TEMPLATE_TOKENS = 16  # the chat template's own tokens around the messages (role markers, generation prompt)
TOKENS_PER_TURN = 6  # the template's tokens around each history turn
MIN_ANSWER_TOKENS = 32  # a message that leaves less room than this for the answer is refused as too long
MAX_BYTES_PER_TOKEN = 6
ENGINE_UNAVAILABLE_TEXT = (
    "Sorry, the assistant is unavailable right now. Please try again later. 助手暂时不可用，请稍后再试。"
)


@dataclasses.dataclass
class Job:
    """One leased message and everything the worker built for it."""

    lease: Lease
    message: InboundMessage
    scope: Scope
    adapter: Adapter
    record: ReplyRecord
    presenter: Presenter
    grounding: str = ""  # the knowledge base's passages for the system prompt
    no_answer: bool = False
    cite: Callable[[str], str] | None = None  # adds the sources line to the engine's answer

    @property
    def group_id(self) -> str | None:
        """The group it was written in, qualified (its limits' name), or None one-to-one."""
        return self.message.group or None


@dataclasses.dataclass(frozen=True)
class PromptPlan:
    """A request that fits the engine's context window and the sender's prompt limit."""

    history: list[Turn]
    max_tokens: int
    prompt_bound: int  # tokens the prompt can at most take (for the budget reservation)
    message_tokens: int | None  # the new message's exact size, when it had to be counted


def answer_token_cap(adapter, max_tokens: int) -> int:  # type: ignore[no-untyped-def]
    """`max_tokens`, lowered where the platform caps a whole answer (`adapter.max_answer_bytes`, e.g. the AI
    bot's stream plus one response_url post) so that a visible cut stays rare: a token of ERNIE's
    vocabulary is seldom more than MAX_BYTES_PER_TOKEN bytes of UTF-8 (two Chinese characters)."""
    cap = adapter.max_answer_bytes
    return min(max_tokens, max(MIN_ANSWER_TOKENS, cap // MAX_BYTES_PER_TOKEN)) if cap else max_tokens


class Worker:
    """One worker process's loops; any number of them share the scheduler."""

    def __init__(self, runtime: Runtime, consumer: str) -> None:
        self._rt = runtime
        self._settings = runtime.settings
        self._cfg = runtime.settings.worker
        self._consumer = consumer
        self._scheduler = runtime.scheduler
        mem = runtime.settings.memory
        self._memory = ConversationMemory(runtime.redis, runtime.keys, mem.ttl_s, mem.max_turns)
        options = runtime.settings.redis_options()
        self._budgets = Budgets(
            runtime.redis, runtime.settings.redis_url, runtime.keys, runtime.settings.limits, **options
        )
        self._pulled = PulledWork(runtime.redis, runtime.keys, runtime.scheduler, runtime.settings)
        self._delivery = Delivery(
            runtime.redis,
            runtime.keys,
            StreamStore(runtime.redis, runtime.keys),
            MovingWindowLimiter(runtime.settings.redis_url, runtime.keys.send_pace_prefix, **options),
            runtime.settings.worker,
            self._pulled.conversations,
        )
        self._records = ReplyRecords(runtime.redis, runtime.keys, runtime.settings.effective_dedup_ttl_s())
        self._held: dict[str, tuple[Lease, asyncio.Task[None]]] = {}  # by lane
        self._slot_freed = asyncio.Event()
        self._system_tokens: dict[str, int] = {}
        self._retriever: Retriever | None = None

    # -- the loops ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set; then take nothing new, finish what is held within drain_s, hand back the rest."""
        while True:  # a Redis blip at start must not end the worker (nothing would take the queue's work)
            try:
                await self._scheduler.load_scripts()
                break
            except RedisError as exc:
                log.warning("could not load the scheduler's scripts; trying again", extra={"error": str(exc)})
                if stop.is_set():
                    return
                await asyncio.sleep(1.0)
        log.info("worker started", extra={"consumer": self._consumer})
        taking = asyncio.create_task(self._take_loop(stop))
        keeping = [asyncio.create_task(self._heartbeat_loop()), asyncio.create_task(self._sweep_loop())]
        await stop.wait()
        taking.cancel()
        await asyncio.gather(taking, return_exceptions=True)
        tasks = [task for _, task in self._held.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=self._cfg.drain_s)
        handed_back = await self._hand_back()
        for task in keeping:
            task.cancel()
        await asyncio.gather(*keeping, return_exceptions=True)
        if self._retriever is not None:
            await self._retriever.aclose()  # lets go of an embedded knowledge store's folder
        log.info("worker stopped", extra={"consumer": self._consumer, "handed_back": handed_back})

    async def _hand_back(self) -> int:
        """Stop what is still running after the drain and give it back to the queue at once."""
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
        while not stop.is_set():
            if len(self._held) >= self._cfg.concurrency:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            try:
                lease = await self._scheduler.take(self._consumer, lease_ms, cap)
                if lease is None:
                    await self._scheduler.wait_for_work(self._cfg.block_ms / 1000)
                    continue
            except RedisError as exc:
                log.error("taking work failed", extra={"error": str(exc)})
                await asyncio.sleep(1.0)
                continue
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
        """Hand on the leases of workers that died or stalled, and wake delayed lanes that are due."""
        while True:
            try:
                expired, next_due_s = await self._scheduler.sweep()
            except RedisError as exc:
                log.warning("scheduler sweep failed", extra={"error": str(exc)})
                expired, next_due_s = [], 1.0
            for lane in expired:
                metrics.LEASE_TAKEOVERS.inc()
                log.warning("took over a stalled message", extra={"lane": lane})
            await asyncio.sleep(min(1.0, max(0.02, next_due_s)) if next_due_s >= 0 else 1.0)

    def _start(self, lease: Lease) -> None:
        task = asyncio.create_task(self._handle(lease))
        self._held[lease.lane] = (lease, task)
        task.add_done_callback(lambda _: self._forget(lease))

    def _forget(self, lease: Lease) -> None:
        """The lease is no longer this worker's to renew (released, handed on, or lost); a slot is free."""
        if self._held.get(lease.lane, (None,))[0] is lease:
            del self._held[lease.lane]
        self._slot_freed.set()

    def _weight(self, lease: Lease) -> float:
        return self._cfg.weight(str(lease.entry.get("msg", {}).get("bot_id", "")))

    # -- one message -------------------------------------------------------------------------

    async def _handle(self, lease: Lease) -> None:
        entry = lease.entry
        request_id.set(str(entry.get("rid", "")))
        message = InboundMessage.model_validate(entry["msg"])
        waited = max(0.0, time.time() - float(entry.get("t", 0)) / 1000)
        metrics.QUEUE_WAIT.labels(message.platform, message.bot_id).observe(waited)
        adapter = self._rt.adapters.get(message.bot_id)
        if adapter is None:
            await self._scheduler.release(lease, "done", dead_letter={"reason": f"bot {message.bot_id!r} is gone"})
            return
        weight = self._cfg.weight(message.bot_id)
        job = self._job(lease, message, adapter)  # before anything that can fail: the failure path needs it
        try:
            if await self._may_merge(job):
                merged, wait_s = await self._pulled.merge(
                    lease, message, adapter.merge_window_s, self._answered_alone(adapter)
                )
                if wait_s > 0:  # the person is still writing: look again when the burst is over
                    await self._scheduler.release(lease, "retry", delay_s=wait_s, weight=weight)
                    return
                if merged is not None:
                    lease = dataclasses.replace(lease, entry=merged)
                    message = InboundMessage.model_validate(merged["msg"])
                    job = self._job(lease, message, adapter)
            outcome = await self._run(job)
            await self._scheduler.release(lease, "done", weight=weight)
            self._forget(lease)
            log.info("message handled", extra={"lane": lease.lane, "outcome": outcome})
        except ConversationTaken as taken:
            await self._withheld(job, str(taken.code))
            await self._scheduler.release(lease, "done", weight=weight)
        except LeaseLost:
            metrics.LEASES_LOST.inc()
            log.warning("lost the lease mid-answer; leaving the message to its new owner", extra={"lane": lease.lane})
        except Paced as paced:
            await self._scheduler.release(lease, "retry", delay_s=paced.retry_after_s, weight=weight)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._failed(job, exc)

    @staticmethod
    async def _may_merge(job: Job) -> bool:
        """A burst is merged into its head only before anything was written for the head: once an answer (or
        any step of one) is recorded, what arrived behind it is answered on its own, never absorbed unseen."""
        entry = job.lease.entry
        if not job.adapter.merge_window_s or entry.get("kind") != "chat" or "merged" in entry:
            return False
        return not await job.record.exists()

    @staticmethod
    def _answered_alone(adapter: Adapter) -> Callable[[str], bool]:
        """Texts a burst must not swallow: a command, and on a platform with human agents a handoff keyword."""
        sessions = adapter.sessions

        def alone(text: str) -> bool:
            return parse_command(text) is not None or (sessions is not None and sessions.wants_human(text))

        return alone

    def _job(self, lease: Lease, message: InboundMessage, adapter: Adapter) -> Job:
        fence = Fence(self._rt.keys.lease(lease.lane), lease.epoch)
        record = self._records.open(message.dedup_key, fence)
        presenter = presenter_for(self._delivery, adapter, message, record, fence)
        scope = Scope.of(message, self._settings.memory.group)
        return Job(lease, message, scope, adapter, record, presenter)

    async def _run(self, job: Job) -> str:
        """One entry by its kind: a message (or a ready notice) is answered; a pulled channel's other kinds
        are the pull itself, a human agent's turn, a platform event, an operator's handoff."""
        kind, message, adapter = job.lease.entry.get("kind"), job.message, job.adapter
        if kind == "pull":
            requested_at = float(job.lease.entry.get("t", 0)) / 1000
            return await self._pulled.pull(adapter, message, requested_at, job.record.fence)
        if kind == "agent":
            return await self._pulled.agent_turn(message, job.record, self._rt.keys.memory(job.scope.lane))
        if kind == "event":
            return await self._pulled.event(adapter, message, job.lease.entry, job.record)
        if kind == "handoff":
            servicer = job.lease.entry.get("servicer") or None
            code = await self._pulled.conversations.hand_off(adapter, message, job.record, servicer)
            return f"handed off (code {'yes' if code else 'none'})"
        return await self._answer(job)

    async def _withheld(self, job: Job, reason: str) -> None:
        """The platform will not let the bot speak (a human holds the conversation, the quota is used up):
        the message is done, without a retry, a dead letter or an alert."""
        metrics.WITHHELD.labels(job.message.platform, reason).inc()
        log.info("answer withheld by the platform's rules", extra={"lane": job.lease.lane, "reason": reason})
        if reason == "95018" and job.adapter.sessions is not None:  # a human took it: learn who holds it now
            with contextlib.suppress(RedisError, SendError):
                owner = await job.adapter.sessions.owner(job.message.reply_to)
                await self._pulled.conversations.set_owner(
                    job.message, owner if owner != "bot" else "human", job.record.fence
                )
        with contextlib.suppress(RedisError, LeaseLost):
            await job.record.mark(state="done", reason=f"withheld: {reason}")

    async def _gate(self, job: Job, state: ReplyState) -> str | None:
        """On a platform with human agents, before answering: renew the person's allowance, stay quiet when a
        human holds the conversation, hand it over when asked, and take it when nobody holds it.

        A handoff asked for is finished before the message is remembered and done (and resumed first on a
        retry, whoever holds the conversation by then): a move or notice that failed is tried again."""
        adapter, message, conversations, fence = job.adapter, job.message, self._pulled.conversations, job.record.fence
        memory_key = self._rt.keys.memory(job.scope.lane)
        if adapter.reply_quota is not None:
            await conversations.renew_quota(message, adapter.reply_quota, fence)
        owner = "bot" if state.handoff_code else await conversations.owner(adapter, message, fence)
        if owner == "human":
            await self._pulled.remember_withheld(message, job.record, memory_key)
            await self._withheld(job, "human")
            return "withheld"
        if state.handoff_code or adapter.sessions.wants_human(message.text):
            await conversations.hand_off(adapter, message, job.record)
            await self._pulled.remember_withheld(message, job.record, memory_key)
            await job.record.mark(state="done")
            return "handed_off"
        if owner == "free":
            await conversations.take(adapter, message, fence)
        return None

    async def _failed(self, job: Job, exc: Exception) -> None:
        """A failure that may pass (engine restarting, Redis blip): hand the message back with a backoff;
        after `max_send_attempts` failures, or a permanent send error, end it and keep it as a dead letter."""
        permanent = isinstance(exc, SendError) and not exc.retryable
        if isinstance(exc, SendError):
            metrics.SEND_FAILURES.labels(job.message.platform, str(exc.code)).inc()
        elif not isinstance(exc, EngineError):
            log.exception("unexpected failure", extra={"lane": job.lease.lane})
        try:
            key = self._rt.keys.entry_failures(job.lease.entry_id)
            failures = int(await self._rt.redis.incr(key))
            await self._rt.redis.expire(key, 86400)
            if permanent or failures >= self._cfg.max_send_attempts:
                await self._give_up(job, f"failed {failures} times: {exc}")
                return
            delay = min(self._cfg.backoff_max_s, self._cfg.backoff_base_s * 2 ** (failures - 1))
            log.warning("handling a message failed; it will be tried again", extra={"error": str(exc), "in_s": delay})
            await self._scheduler.release(
                job.lease, "retry", delay_s=delay, weight=self._cfg.weight(job.message.bot_id)
            )
        except (RedisError, LeaseLost) as again:
            log.warning("could not record the failure; the lease will expire", extra={"error": str(again)})

    async def _give_up(self, job: Job, reason: str) -> None:
        """End the message: its stream or card gets a final failed state, the entry becomes a dead letter."""
        metrics.REPLIES.labels(job.message.platform, "failed").inc()
        log.error("a message could not be answered", extra={"lane": job.lease.lane, "reason": reason[:300]})
        with contextlib.suppress(Exception):
            state = await job.record.load()
            if job.presenter.always_answers:
                await job.presenter.fail(ENGINE_UNAVAILABLE_TEXT, state)
            await job.record.mark(state="failed", reason=reason[:300])
        await self._scheduler.release(job.lease, "done", dead_letter={"reason": reason[:500]})
        await self._alert_operators(job.message, reason)

    async def _alert_operators(self, message: InboundMessage, reason: str) -> None:
        """Tell the operators' group robot (alert_bot) that a message could not be answered."""
        alert_bot = self._settings.alert_bot
        if not alert_bot or message.platform == PUSH_PLATFORM:
            return  # no alert robot, or the failure is the alert robot's own: do not loop
        with contextlib.suppress(RedisError):
            await enqueue_push(self._scheduler, alert_bot, f"botgw: a message could not be answered: {reason[:300]}")

    async def _answer(self, job: Job) -> str:
        state = await job.record.load()
        if state.done:
            return "already_sent"
        text = state.text
        if text is None and job.adapter.sessions is not None and job.lease.entry.get("kind") == "chat":
            gated = await self._gate(job, state)
            if gated is not None:
                return gated
        if text is None:
            text = await self._compose(job, state)
            state.text, state.state = text, "committed"
        if not text:
            await job.record.mark(state="done")
            return "nothing_to_send"
        if (job.no_answer or state.no_answer) and job.adapter.sessions is not None:
            # Nothing in the documents: say so, then hand over; done only once the handoff happened, so that a
            # retry after a failed move still makes it.
            await job.presenter.deliver(text, state)
            await self._pulled.conversations.hand_off(job.adapter, job.message, job.record)
            await job.record.mark(state="done")
            metrics.REPLIES.labels(job.message.platform, "sent").inc()
            return "sent; handed off (no answer)"
        await job.presenter.finish(text, state)
        metrics.REPLIES.labels(job.message.platform, "sent").inc()
        return "sent"

    async def _commit(
        self, job: Job, text: str, exchange: tuple[Turn, Turn] | None = None, *, clear_memory: bool = False
    ) -> str:
        memory = self._memory
        memory_key = self._rt.keys.memory(job.scope.lane)
        return await job.record.commit(
            text, f"{time.time():.3f}", memory_key, exchange, memory.ttl_s, memory.max_items, clear_memory=clear_memory
        )

    async def _compose(self, job: Job, state: ReplyState) -> str:
        """The answer: a notice, a command's result, or the engine's reply (committed with memory)."""
        message, entry = job.message, job.lease.entry
        if entry.get("kind") == "notice":
            return await self._commit(job, str(entry.get("notice", "")))
        refusal = await self._budgets.admit_message(message.person, job.group_id, message.dedup_key)
        if refusal is not None:  # (counted once, however often the answer is tried: by the message's key)
            return await self._commit(job, await self._refusal_notice(job, refusal))
        if message.msg_type != "text" or not message.text.strip():
            return await self._commit(job, texts.TEXT_ONLY_TEXT)
        if job.scope.lane == message.session_key:  # first, before a /reset too: what it adopts is cleared with it
            await self._memory.adopt(message.session_key, message.bot_session_key)
        command = parse_command(message.text)
        if command == "help":
            return await self._commit(job, texts.HELP_TEXT)
        if command == "reset":  # the clear is part of the fenced commit: a stale worker wipes nothing
            return await self._commit(job, texts.RESET_TEXT, clear_memory=True)
        try:
            return await self._ask_engine(job, state)
        except EngineError as exc:
            metrics.ENGINE_ERRORS.labels(str(exc.retryable)).inc()
            if exc.too_long:
                log.info("the engine found the request too long; the user is told", extra={"error": str(exc)})
                limit = self._rt.engine.max_model_len or 0
                refusal = Refusal("prompt", f"user:{message.person}", str(limit), 0, size=utf8_len(message.text))
                return await self._commit(job, refusal.notice(self._settings.limits.notices))
            failures = int(await self._rt.redis.get(self._rt.keys.entry_failures(job.lease.entry_id)) or 0)
            if exc.retryable and failures + 1 < self._cfg.max_send_attempts:
                raise  # the message is handed back and tried again later
            log.error("engine failed; the user is told to try later", extra={"error": str(exc)})
            return await self._commit(job, ENGINE_UNAVAILABLE_TEXT)

    async def _refusal_notice(self, job: Job, refusal: Refusal) -> str:
        """The notice for an over-limit message: once per window; a stream, card or page always gets one."""
        metrics.LIMIT_HITS.labels(job.message.platform, refusal.kind).inc()
        text = refusal.notice(self._settings.limits.notices)
        if refusal.kind == "prompt" or job.presenter.always_answers:
            return text
        notice_key = self._rt.keys.limit_notice(refusal.who)
        if await self._rt.redis.set(notice_key, "1", nx=True, ex=max(1, refusal.retry_after_s)):
            return text
        return ""  # told already in this window: do not make a flooding user flood the platform

    async def _await_engine(self, job: Job) -> None:
        """Wait for a ready engine; a user kept waiting past wait_notice_after_s is told once that it is starting."""
        engine = self._rt.engine
        if engine.ready:
            return
        settings = self._settings.engine
        waited = time.time() - job.message.received_at
        if await engine.wait_ready(max(0.0, settings.wait_notice_after_s - waited)):
            return
        if await job.presenter.notice(texts.ENGINE_STARTING_TEXT, once="wait_notice"):
            log.info("engine not ready; told the user their answer is coming")
        if not await engine.wait_ready(settings.max_wait_s):
            raise EngineUnavailable("no engine became ready")

    def _base_prompt(self, job: Job) -> str:
        return job.adapter.system_prompt_for(job.message) or self._settings.system_prompt

    def _system_prompt(self, job: Job) -> str:
        base = self._base_prompt(job)
        return f"{base}\n\n{job.grounding}" if job.grounding else base

    async def _count_system_tokens(self, job: Job) -> int:
        """The system prompt's size in the engine's tokens: the bot's prompt counted once per process, the
        knowledge passages bounded by their UTF-8 length (they change with every question)."""
        base = self._base_prompt(job)
        if base not in self._system_tokens:
            self._system_tokens[base] = await self._rt.engine.count_tokens(base)
        return self._system_tokens[base] + (utf8_len(job.grounding) + 2 if job.grounding else 0)

    async def _plan(self, job: Job, turns: list[Turn]) -> PromptPlan | Refusal:
        """Fit system prompt + history + message + max_tokens into the engine's context window and the
        sender's prompt limit. The message is counted by the engine's tokenizer only when its byte length
        (an upper bound of its tokens) does not settle the question."""
        text = job.message.text
        max_tokens = answer_token_cap(job.adapter, self._settings.engine.max_tokens)
        context = self._rt.engine.max_model_len
        max_prompt = self._budgets.max_prompt_tokens(job.message.person, job.group_id)
        system = await self._count_system_tokens(job)
        room = [limit for limit in (context and context - max_tokens, max_prompt) if limit]
        prompt_room = min(room) if room else None
        message_tokens: int | None = None
        size = utf8_len(text)
        if prompt_room is not None and system + size + TEMPLATE_TOKENS > prompt_room:
            message_tokens = size = await self._rt.engine.count_tokens(text)
        fixed = system + size + TEMPLATE_TOKENS
        if max_prompt and fixed > max_prompt:
            return Refusal("prompt", f"user:{job.message.person}", str(max_prompt), 0, size=size)
        if context and fixed + MIN_ANSWER_TOKENS > context:
            return Refusal("prompt", f"user:{job.message.person}", str(context - MIN_ANSWER_TOKENS), 0, size=size)
        if context and fixed + max_tokens > context:
            max_tokens = context - fixed  # a long message leaves less room for the answer, but still some
        history_room = self._settings.memory.token_budget
        for limit in (context and context - max_tokens, max_prompt):
            if limit:
                history_room = min(history_room, limit - fixed)
        sized = [dataclasses.replace(turn, tokens=turn.tokens + TOKENS_PER_TURN) for turn in turns]
        history = fit_to_budget(sized, max(0, history_room))
        bound = fixed + sum(turn.tokens for turn in history)
        original = turns[len(turns) - len(history) :]
        return PromptPlan(original, max_tokens, bound, message_tokens)

    async def _ground(self, job: Job) -> str | None:
        """Look the question up in the bot's knowledge bases: the passages go into the system prompt, or the
        reply needs no engine (nothing found: `no_answer_text`, flagged; a Q&A row that matches closely)."""
        use = job.adapter.knowledge_for(job.message)
        if use is None:
            return None
        try:
            retrieval = await self._knowledge().retrieve(use, job.message.text, job.message.bot_id)
        except StoreLocked as exc:  # a `botgw kb` command holds the embedded store: try again shortly
            log.info("knowledge store busy; the message waits", extra={"error": str(exc)})
            raise Paced(2.0) from exc
        job.no_answer = retrieval.no_answer
        used = json.dumps(retrieval.record(), ensure_ascii=False)
        await job.record.mark(knowledge=used, **({"no_answer": "1"} if job.no_answer else {}))
        job.grounding = retrieval.system_prompt()
        job.cite = retrieval.with_sources
        return retrieval.reply()

    def _knowledge(self) -> Retriever:
        if self._retriever is None:
            self._retriever = Retriever(self._settings.knowledge, self._rt.http)
        return self._retriever

    async def _ask_engine(self, job: Job, state: ReplyState) -> str:
        message = job.message
        ready = await self._ground(job)
        if ready is not None:
            user = Turn("user", message.text, utf8_len(message.text))
            return await self._commit(job, ready, (user, Turn("assistant", ready, utf8_len(ready))))
        await self._await_engine(job)
        turns = await self._memory.load(job.scope.lane)
        plan = await self._plan(job, turns)
        if isinstance(plan, Refusal):
            return await self._commit(job, await self._refusal_notice(job, plan))
        reservation = await self._budgets.reserve(message.person, job.group_id, plan.prompt_bound + plan.max_tokens)
        if isinstance(reservation, Refusal):
            return await self._commit(job, await self._refusal_notice(job, reservation))
        prompt = [
            {"role": "system", "content": self._system_prompt(job)},
            *({"role": turn.role, "content": turn.content} for turn in plan.history),
            {"role": "user", "content": message.text},
        ]
        completion = await self._generate(job, state, prompt, plan, reservation)
        if job.presenter.streams:  # a whole (unstreamed) answer has no first token of its own
            metrics.ENGINE_LATENCY.labels("first_token").observe(completion.first_token_s)
        metrics.ENGINE_LATENCY.labels("total").observe(completion.total_s)
        metrics.ENGINE_TOKENS.labels(message.platform, "prompt").inc(completion.prompt_tokens)
        metrics.ENGINE_TOKENS.labels(message.platform, "completion").inc(completion.completion_tokens)
        answer = completion.text if completion.text.strip() else texts.EMPTY_ANSWER_TEXT
        if job.cite is not None:
            answer = job.cite(answer)
        if completion.routed_experts:
            answer = await self._record_experts(job, completion.routed_experts, answer)
        history_tokens = sum(turn.tokens for turn in plan.history)
        system = self._system_tokens.get(self._base_prompt(job), 0) + (utf8_len(job.grounding) if job.grounding else 0)
        user_tokens = plan.message_tokens or max(1, completion.prompt_tokens - history_tokens - system)
        exchange = (
            Turn("user", message.text, user_tokens),
            Turn("assistant", completion.text, completion.completion_tokens),
        )
        return await self._commit(job, answer, exchange)

    async def _generate(
        self, job: Job, state: ReplyState, prompt: list[dict[str, str]], plan: PromptPlan, reservation: Reservation
    ) -> Completion:
        """Ask the engine, streaming into the user's stream or card where the platform shows one; the token
        reservation is settled to what the engine used, failed attempts included, whatever happens."""
        spent = [0]  # tokens of attempts that failed (their prompt bound and what they wrote)
        used = 0
        try:
            presenter = job.presenter
            if presenter.streams:
                await presenter.open(state)
                completion = await self._stream_to_user(presenter, prompt, plan, job.message.temperature, spent)
            else:
                completion = await self._rt.engine.chat(
                    prompt, max_tokens=plan.max_tokens, temperature=job.message.temperature
                )
            used = completion.prompt_tokens + completion.completion_tokens
            return completion
        finally:
            with contextlib.suppress(RedisError):
                await self._budgets.settle(reservation, used + spent[0])

    async def _stream_to_user(
        self,
        presenter: Presenter,
        prompt: list[dict[str, str]],
        plan: PromptPlan,
        temperature: float | None,
        spent: list[int],
    ) -> Completion:
        """Generate into the user's stream or card as the engine writes. If a worker or engine died mid-answer,
        what the user already sees is continued (vLLM's continue_final_message), never replaced: the text
        shown joins the prompt and leaves the answer that much less room, so the request still fits the
        context window and the whole answer stays within the tokens reserved for it."""
        for attempt in range(STREAM_ATTEMPTS):
            shown = await presenter.shown()
            shown_tokens = await self._rt.engine.count_tokens(shown) if shown else 0
            max_tokens = plan.max_tokens - shown_tokens
            if max_tokens <= 0:  # the answer shown already used all its room: it is finished as it stands
                return Completion(shown, 0, 0, "length", 0.0, 0.0)
            text = shown
            pushed_at = 0.0

            async def on_delta(delta: str) -> None:
                nonlocal text, pushed_at
                text += delta
                if time.monotonic() - pushed_at >= presenter.interval_s:
                    pushed_at = time.monotonic()
                    await presenter.show(text)

            messages, extra = prompt, None
            if shown:
                messages = [*prompt, {"role": "assistant", "content": shown}]
                extra = {"continue_final_message": True, "add_generation_prompt": False}
            try:
                completion = await self._rt.engine.chat(
                    messages,
                    max_tokens=max_tokens,
                    temperature=temperature,
                    on_delta=on_delta,
                    extra=extra,
                    failover=False,
                )
            except EngineError as exc:
                written = text[len(shown) :]
                spent[0] += plan.prompt_bound + shown_tokens + (await self._count_or_bound(written))
                if not exc.retryable or attempt + 1 == STREAM_ATTEMPTS:
                    raise
                log.warning("engine failed mid-stream; continuing what the user sees", extra={"error": str(exc)})
                continue
            return dataclasses.replace(completion, text=shown + completion.text)
        raise AssertionError("unreachable")

    async def _count_or_bound(self, text: str) -> int:
        """Tokens of `text` by the engine's tokenizer; its UTF-8 length (an upper bound) when that fails too."""
        if not text:
            return 0
        try:
            return await self._rt.engine.count_tokens(text)
        except EngineError:
            return utf8_len(text)

    async def _record_experts(self, job: Job, routed_experts: str, answer: str) -> str:
        """Export which experts answered (MoE on GPU) and, if the operator wants it, show them in the reply."""
        try:
            usage = expert_usage(routed_experts)
        except ValueError as exc:
            log.warning("routed_experts not understood", extra={"error": str(exc)})
            return answer
        export_expert_usage(usage)
        trace = format_expert_trace(usage)
        await job.record.mark(experts=trace)
        return f"{answer}\n\n{trace}" if self._settings.engine.attach_expert_trace else answer
