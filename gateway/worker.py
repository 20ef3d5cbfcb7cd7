"""The worker: claim → command? → memory → engine → reply → memory → ack.

Exactly-once delivery is built from at-least-once pieces: each message has a reply
record in Redis (its answer and how many pieces were sent). The answer and the
conversation memory are committed together before anything is sent, so a worker that
takes over a dead worker's message resends the same answer without asking the engine
again, and a piece whose outcome is unknown is resent with the platform's duplicate
check on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, WatchError

from bots.base import InboundMessage, SendError
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.web.adapter import WebAdapter
from bots.wecom.aibot import WeComAIBotAdapter
from engine.client import Completion, EngineError
from engine.observability import expert_usage, export_expert_usage, format_expert_trace
from engine.pool import EngineUnavailable
from gateway import commands, metrics
from gateway.delivery import Delivery
from gateway.limits import MovingWindowLimiter, over_limit_notice
from gateway.logs import request_id
from gateway.memory import ConversationMemory, Turn, fit_to_budget
from gateway.push import PUSH_PLATFORM, enqueue_push
from gateway.queue import Entry
from gateway.runtime import Adapter, Runtime
from gateway.stream_sinks import DingTalkCardSink, StreamSink, WebStreamSink, WeComStreamSink
from gateway.streams import StreamStore

log = logging.getLogger(__name__)

STREAM_ATTEMPTS = 3
STREAM_UPDATE_INTERVAL_S = 0.15
ENGINE_UNAVAILABLE_TEXT = (
    "Sorry, the assistant is unavailable right now. Please try again later. 助手暂时不可用，请稍后再试。"
)


def _text(raw: dict) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


class Worker:
    """One worker process's loop; any number of them share the queue."""

    def __init__(self, runtime: Runtime, consumer: str) -> None:
        self._rt = runtime
        self._settings = runtime.settings
        self._cfg = runtime.settings.worker
        self._consumer = consumer
        self._memory = ConversationMemory(
            runtime.redis, runtime.keys, runtime.settings.memory.ttl_s, runtime.settings.memory.max_turns
        )
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._streams = StreamStore(runtime.redis, runtime.keys)
        self._delivery = Delivery(
            runtime.redis, runtime.keys, self._streams, runtime.settings.worker, runtime.settings.redis_url
        )
        self._limiter = MovingWindowLimiter(
            runtime.settings.redis_url, runtime.settings.limits.per_user, runtime.keys.limits_prefix
        )

    async def run(self, stop: asyncio.Event, drain_s: float = 30.0) -> None:
        """Work until `stop` is set, then let answers in progress finish (up to drain_s)."""
        await self._rt.queue.ensure_group()
        log.info("worker started", extra={"consumer": self._consumer})
        loops = [
            asyncio.create_task(self._read_loop(stop)),
            asyncio.create_task(self._claim_loop(stop)),
            asyncio.create_task(self._heartbeat_loop(stop)),
        ]
        await stop.wait()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        if self._inflight:
            await asyncio.wait(list(self._inflight.values()), timeout=drain_s)
        log.info("worker stopped", extra={"consumer": self._consumer, "left_pending": len(self._inflight)})

    # -- the loops ---------------------------------------------------------------------------

    async def _read_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            free = self._cfg.concurrency - len(self._inflight)
            if free <= 0:
                await asyncio.wait(list(self._inflight.values()), return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                entries = await self._rt.queue.read(self._consumer, free, self._cfg.block_ms)
            except RedisError as exc:
                log.error("queue read failed", extra={"error": str(exc)})
                await asyncio.sleep(1.0)
                continue
            for entry in entries:
                self._start(entry)

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        interval = max(0.05, self._cfg.claim_idle_ms / 2000)
        while not stop.is_set():
            await asyncio.sleep(interval)
            try:
                entries = await self._rt.queue.claim_stale(self._consumer, self._cfg.claim_idle_ms)
            except RedisError as exc:
                log.error("claiming stale entries failed", extra={"error": str(exc)})
                continue
            for entry in entries:
                if entry.entry_id not in self._inflight:
                    metrics.REDELIVERIES.inc()
                    log.warning("took over a stalled message", extra={"entry": entry.entry_id})
                    self._start(entry)

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        interval = max(0.03, self._cfg.claim_idle_ms / 3000)
        while not stop.is_set():
            await asyncio.sleep(interval)
            with contextlib.suppress(RedisError):
                await self._rt.queue.touch(self._consumer, list(self._inflight))

    def _start(self, entry: Entry) -> None:
        task = asyncio.create_task(self._handle(entry))
        self._inflight[entry.entry_id] = task
        task.add_done_callback(lambda _: self._inflight.pop(entry.entry_id, None))

    # -- one entry ---------------------------------------------------------------------------

    async def _handle(self, entry: Entry) -> None:
        request_id.set(entry.fields.get("rid", ""))
        queue = self._rt.queue
        try:
            if not await queue.wait_turn(entry.conversation_key, entry.seq, self._cfg.turn_wait_s):
                log.warning("an earlier message of this conversation is still unanswered; going ahead")
            outcome = await self._answer(entry)
        except Exception as exc:
            await self._failed(entry, exc)
            return
        await queue.finish_turn(entry.conversation_key, entry.seq)
        await queue.ack(entry.entry_id)
        log.info("message handled", extra={"entry": entry.entry_id, "outcome": outcome})

    async def _failed(self, entry: Entry, exc: Exception) -> None:
        """A failure that may pass (engine restarting, Redis blip): leave the entry pending, so that it is
        claimed again after `claim_idle_ms`; after `max_send_attempts` failures, dead-letter it."""
        log.warning("handling a message failed; it stays queued", extra={"entry": entry.entry_id, "error": str(exc)})
        if not isinstance(exc, EngineError):
            log.exception("unexpected failure", extra={"entry": entry.entry_id})
        with contextlib.suppress(RedisError):
            key = self._rt.keys.entry_failures(entry.entry_id)
            failures = await self._rt.redis.incr(key)
            await self._rt.redis.expire(key, 86400)
            if failures >= self._cfg.max_send_attempts:
                await self._give_up(entry, f"failed {failures} times: {exc}")

    async def _failures_so_far(self, entry: Entry) -> int:
        return int(await self._rt.redis.get(self._rt.keys.entry_failures(entry.entry_id)) or 0)

    async def _give_up(self, entry: Entry, reason: str) -> None:
        queue = self._rt.queue
        await queue.dead_letter(entry, reason)
        await queue.finish_turn(entry.conversation_key, entry.seq)
        await queue.ack(entry.entry_id)
        await self._alert_operators(entry, reason)

    async def _alert_operators(self, entry: Entry, reason: str) -> None:
        """Tell the operators' group robot (alert_bot) that a message could not be answered."""
        alert_bot = self._settings.alert_bot
        if not alert_bot or entry.conversation_key.startswith(f"{PUSH_PLATFORM}:"):
            return  # no alert robot, or the failure is the alert robot's own: do not loop
        with contextlib.suppress(RedisError):
            await enqueue_push(self._rt.queue, alert_bot, f"botgw: a message could not be answered: {reason[:300]}")

    async def _answer(self, entry: Entry) -> str:
        message = InboundMessage.model_validate_json(entry.fields["msg"])
        adapter = self._rt.adapters.get(message.bot_id)
        if adapter is None:
            await self._give_up(entry, f"bot {message.bot_id!r} is no longer configured")
            return "unknown_bot"
        record_key = self._rt.keys.reply(message.dedup_key)
        record = _text(await self._rt.redis.hgetall(record_key))
        if record.get("done"):
            return "already_sent"
        text = record.get("text")
        if text is None:
            text = await self._compose(entry, message, record_key, adapter)
        if not text:
            return "nothing_to_send"
        try:
            await self._delivery.deliver(adapter, message, record_key, text, record)
        except SendError as exc:
            metrics.SEND_FAILURES.labels(message.platform, str(exc.code)).inc()
            metrics.REPLIES.labels(message.platform, "send_failed").inc()
            log.error("reply could not be delivered", extra={"code": str(exc.code), "error": str(exc)})
            await self._give_up(entry, str(exc))
            return "send_failed"
        metrics.REPLIES.labels(message.platform, "sent").inc()
        return "sent"

    async def _compose(self, entry: Entry, message: InboundMessage, record_key: str, adapter: Adapter) -> str:
        """The answer: a notice, a command's result, or the engine's reply (committed with memory)."""
        if entry.fields.get("kind") == "notice":
            return await self._commit(record_key, entry.fields.get("notice", ""))
        notice = await self._over_limit_notice(message)
        if notice is not None:
            return await self._commit(record_key, notice)
        if message.msg_type != "text" or not message.text.strip():
            return await self._commit(record_key, commands.TEXT_ONLY_TEXT)
        command = commands.parse_command(message.text)
        if command == "help":
            return await self._commit(record_key, commands.HELP_TEXT)
        if command == "reset":
            await self._memory.clear(message.session_key)
            return await self._commit(record_key, commands.RESET_TEXT)
        try:
            return await self._ask_engine(adapter, message, record_key)
        except EngineError as exc:
            metrics.ENGINE_ERRORS.labels(str(exc.retryable)).inc()
            last_chance = await self._failures_so_far(entry) + 1 >= self._cfg.max_send_attempts
            if exc.retryable and not last_chance:
                raise  # the message stays queued and is tried again later
            log.error("engine failed; the user is told to try later", extra={"error": str(exc)})
            return await self._commit(record_key, ENGINE_UNAVAILABLE_TEXT)

    async def _over_limit_notice(self, message: InboundMessage) -> str | None:
        """None if the user is within their limit; else the notice ("" after the first one of the window)."""
        user = f"{message.platform}:{message.bot_id}:{message.sender_id}"
        decision = await self._limiter.hit(user)
        if decision.allowed:
            return None
        metrics.LIMIT_HITS.labels(message.platform).inc()
        # One notice per window, so that a flooding user does not make us flood the platform.
        notice_key = self._rt.keys.limit_notice(user)
        if await self._rt.redis.set(notice_key, "1", nx=True, ex=decision.retry_after_s):
            return over_limit_notice(decision.retry_after_s)
        return ""

    async def _await_engine(self, adapter: Adapter, message: InboundMessage, record_key: str) -> None:
        """Wait for a ready engine; a user kept waiting past wait_notice_after_s is told once that it is starting."""
        engine = self._rt.engine
        if engine.ready:
            return
        settings = self._settings.engine
        waited = time.time() - message.received_at
        if await engine.wait_ready(max(0.0, settings.wait_notice_after_s - waited)):
            return
        if await self._rt.redis.hsetnx(record_key, "wait_notice", "1"):
            await self._rt.redis.expire(record_key, self._settings.effective_dedup_ttl_s())
            log.info("engine not ready; telling the user their answer is coming")
            await self._delivery.notify(adapter, message, commands.ENGINE_STARTING_TEXT)
        if not await engine.wait_ready(settings.max_wait_s):
            raise EngineUnavailable("no engine became ready")

    async def _ask_engine(self, adapter: Adapter, message: InboundMessage, record_key: str) -> str:
        engine = self._rt.engine
        await self._await_engine(adapter, message, record_key)
        turns = await self._memory.load(message.session_key)
        # Tokens are counted only to trim history; with none, the engine's own prompt count is used below.
        user_tokens = await engine.count_tokens(message.text) if turns else 0
        history = fit_to_budget(turns, max(0, self._settings.memory.token_budget - user_tokens))
        prompt = [
            {"role": "system", "content": self._settings.system_prompt},
            *({"role": turn.role, "content": turn.content} for turn in history),
            {"role": "user", "content": message.text},
        ]
        sink = await self._stream_sink(adapter, message, record_key)
        temperature = message.temperature
        if sink:
            completion = await self._stream_to_user(sink, prompt, temperature)
        else:
            completion = await engine.chat(prompt, temperature=temperature)
        metrics.ENGINE_LATENCY.labels("first_token").observe(completion.first_token_s)
        metrics.ENGINE_LATENCY.labels("total").observe(completion.total_s)
        metrics.ENGINE_TOKENS.labels(message.platform, "prompt").inc(completion.prompt_tokens)
        metrics.ENGINE_TOKENS.labels(message.platform, "completion").inc(completion.completion_tokens)
        answer = completion.text if completion.text.strip() else commands.EMPTY_ANSWER_TEXT
        if completion.routed_experts:
            answer = await self._record_experts(record_key, completion.routed_experts, answer)
        exchange = (
            Turn("user", message.text, user_tokens or completion.prompt_tokens),
            Turn("assistant", completion.text, completion.completion_tokens),
        )
        return await self._commit(record_key, answer, message.session_key, exchange)

    async def _stream_sink(self, adapter: Adapter, message: InboundMessage, record_key: str) -> StreamSink | None:
        """Where the answer is shown as it is written, if this platform shows it so."""
        if isinstance(adapter, WeComAIBotAdapter):
            return WeComStreamSink(self._streams, adapter, message)
        if isinstance(adapter, WebAdapter):
            return WebStreamSink(self._streams, message.reply_to.stream_id)
        if isinstance(adapter, DingTalkRobotAdapter) and adapter.config.ai_card.enabled:
            track_id = adapter.api.new_track_id(message.bot_id, message.conversation_id, message.msg_id)
            created = await self._rt.redis.hsetnx(record_key, "card_track", track_id)
            await self._rt.redis.expire(record_key, self._settings.effective_dedup_ttl_s())
            if not created:
                track_id = (await self._rt.redis.hget(record_key, "card_track")).decode()
            sink = DingTalkCardSink(self._streams, adapter, track_id)
            await sink.open(adapter, message, create=bool(created))
            return sink
        return None

    async def _stream_to_user(
        self, sink: StreamSink, prompt: list[dict[str, str]], temperature: float | None
    ) -> Completion:
        """Generate into the user's stream or card as the engine writes. If a worker or engine died mid-answer,
        what the user already sees is continued (vLLM's continue_final_message), never replaced."""
        for attempt in range(STREAM_ATTEMPTS):
            shown = await sink.shown()
            text = shown
            pushed_at = 0.0

            async def on_delta(delta: str) -> None:
                nonlocal text, pushed_at
                text += delta
                if time.monotonic() - pushed_at >= sink.interval_s:
                    pushed_at = time.monotonic()
                    await sink.show(text)

            messages, extra = prompt, None
            if shown:
                messages = [*prompt, {"role": "assistant", "content": shown}]
                extra = {"continue_final_message": True, "add_generation_prompt": False}
            try:
                completion = await self._rt.engine.chat(
                    messages, temperature=temperature, on_delta=on_delta, extra=extra, failover=False
                )
            except EngineError as exc:
                if not exc.retryable or attempt + 1 == STREAM_ATTEMPTS:
                    raise
                log.warning("engine failed mid-stream; continuing what the user sees", extra={"error": str(exc)})
                continue
            return dataclasses.replace(completion, text=shown + completion.text)
        raise AssertionError("unreachable")

    async def _record_experts(self, record_key: str, routed_experts: str, answer: str) -> str:
        """Export which experts answered (MoE on GPU) and, if the operator wants it, show them in the reply."""
        try:
            usage = expert_usage(routed_experts)
        except ValueError as exc:
            log.warning("routed_experts not understood", extra={"error": str(exc)})
            return answer
        export_expert_usage(usage)
        trace = format_expert_trace(usage)
        await self._rt.redis.hset(record_key, "experts", trace)
        return f"{answer}\n\n{trace}" if self._settings.engine.attach_expert_trace else answer

    async def _commit(
        self, record_key: str, text: str, session_key: str = "", exchange: tuple[Turn, Turn] | None = None
    ) -> str:
        """Store the answer (and the exchange in memory) once; if another worker got there first, use its answer."""
        redis = self._rt.redis
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(record_key)
                existing = await pipe.hget(record_key, "text")
                if existing is not None:
                    return existing.decode() if isinstance(existing, bytes) else existing
                pipe.multi()
                self._queue_record(pipe, record_key, text)
                if exchange:
                    self._memory.append_exchange(pipe, session_key, *exchange)
                await pipe.execute()
            except WatchError:
                existing = await redis.hget(record_key, "text")
                return existing.decode() if isinstance(existing, bytes) else str(existing)
        return text

    def _queue_record(self, pipe: Pipeline, record_key: str, text: str) -> None:
        pipe.hset(record_key, mapping={"text": text, "created": f"{time.time():.3f}"})
        pipe.expire(record_key, self._settings.effective_dedup_ttl_s())
