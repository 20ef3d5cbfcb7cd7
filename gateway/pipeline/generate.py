"""The engine's part of the answer path: what an engine failure becomes, waiting for a ready engine, and the
generation itself (streamed into the user's stream or card where the platform shows one, resumable)."""

from __future__ import annotations

import dataclasses
import logging
import time

from bots.text import utf8_len
from engine.client import Completion, EngineError
from engine.observability import expert_usage, export_expert_usage, format_expert_trace
from engine.pool import EngineUnavailable
from gateway import metrics, texts
from gateway.delivery.presenters import Presenter
from gateway.pipeline.job import Composed, Job, PromptPlan, Services
from gateway.pipeline.parts import remembered_turn, user_content, user_text
from gateway.pipeline.prompt_plan import system_prompt, system_tokens, user_turn_tokens
from gateway.pipeline.stage import Next
from gateway.pipeline.tool_use import ToolRounds, bot_tools
from gateway.state.limits import Refusal
from gateway.state.memory import Turn

log = logging.getLogger(__name__)

STREAM_ATTEMPTS = 3


class EngineFailures:
    """An engine error after the stages inside it: a request too long is told to the user; a failure that may
    pass hands the message back (raised) until its attempts are used up; then the user is told to try later."""

    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        services = self._services
        try:
            return await next(job)
        except EngineError as exc:
            metrics.ENGINE_ERRORS.labels(str(exc.retryable)).inc()
            if exc.too_long:
                log.info("the engine found the request too long; the user is told", extra={"error": str(exc)})
                limit = services.engine.max_model_len or 0
                who = f"user:{job.message.person}"
                refusal = Refusal("prompt", who, str(limit), 0, size=utf8_len(job.message.text))
                return await services.commit(job, refusal.notice(services.settings.limits.notices))
            failures = int(await services.redis.get(services.keys.entry_failures(job.lease.entry_id)) or 0)
            if exc.retryable and failures + 1 < services.settings.worker.max_send_attempts:
                raise  # the message is handed back and tried again later
            log.error("engine failed; the user is told to try later", extra={"error": str(exc)})
            return await services.commit(job, texts.ENGINE_UNAVAILABLE_TEXT)


class EngineReady:
    """Wait for a ready engine; a user kept waiting past wait_notice_after_s is told once that it is starting."""

    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        engine, settings = self._services.engine, self._services.settings.engine
        vision = bool(job.images)  # a picture waits for an engine that sees
        if not engine.ready:
            waited = time.time() - job.message.received_at
            if not await engine.wait_ready(max(0.0, settings.wait_notice_after_s - waited), vision=vision):
                if await job.presenter.notice(texts.ENGINE_STARTING_TEXT, once="wait_notice"):
                    log.info("engine not ready; told the user their answer is coming")
                if not await engine.wait_ready(settings.max_wait_s, vision=vision):
                    raise EngineUnavailable("no engine became ready")
        return await next(job)


class Generate:
    """Ask the engine and commit its answer with the exchange in memory (the last stage)."""

    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        services, message, plan = self._services, job.message, job.plan
        assert plan is not None, "the prompt is planned before generation"
        prompt = [
            {"role": "system", "content": system_prompt(services, job)},
            *({"role": turn.role, "content": turn.content} for turn in plan.history),
            {"role": "user", "content": user_content(user_text(job), job.images)},
        ]
        remember = remembered_turn(message.text, job.images)
        tools = bot_tools(services, job)
        offer = await services.tools.offer(tools, message.person, job.group_id) if services.tools and tools else None
        counted = False  # the tool rounds count every round's tokens themselves
        if services.tools and tools and (job.tool_resume or (offer and offer.tools)):
            assert offer is not None
            outcome = await ToolRounds(services, services.tools, tools).answer(job, prompt, plan, offer, remember)
            if isinstance(outcome, Composed):
                return outcome
            completion, remember, counted = outcome.completion, outcome.remember or remember, True
        elif job.presenter.streams:
            await job.presenter.open(job.state)
            completion = await self._stream_to_user(job, prompt, plan)
        else:
            completion = await services.engine.chat(prompt, max_tokens=plan.max_tokens, temperature=message.temperature)
        if offer is not None and offer.unavailable:
            job.answer_notes.append(texts.TOOL_UNAVAILABLE_NOTE.format(servers=", ".join(offer.unavailable)))
        if not counted:
            job.tokens_used += completion.prompt_tokens + completion.completion_tokens
        if job.presenter.streams:  # a whole (unstreamed) answer has no first token of its own
            metrics.ENGINE_LATENCY.labels("first_token").observe(completion.first_token_s)
        metrics.ENGINE_LATENCY.labels("total").observe(completion.total_s)
        metrics.ENGINE_TOKENS.labels(message.platform, "prompt").inc(completion.prompt_tokens)
        metrics.ENGINE_TOKENS.labels(message.platform, "completion").inc(completion.completion_tokens)
        answer = completion.text if completion.text.strip() else texts.EMPTY_ANSWER_TEXT
        if job.grounding is not None:
            answer = job.grounding.cite(answer)
        if job.answer_notes:
            answer = "\n\n".join([answer, *job.answer_notes])
        if completion.routed_experts:
            answer = await self._record_experts(job, completion.routed_experts, answer)
        user_tokens = user_turn_tokens(plan, completion.prompt_tokens, system_tokens(services, job, separator=0))
        exchange = (
            Turn("user", remember, user_tokens),
            Turn("assistant", completion.text, completion.completion_tokens),
        )
        return await services.commit(job, answer, exchange)

    async def _stream_to_user(self, job: Job, prompt: list[dict], plan: PromptPlan) -> Completion:
        """Generate into the user's stream or card as the engine writes. If a worker or engine died mid-answer,
        what the user already sees is continued (vLLM's continue_final_message), never replaced: the text
        shown joins the prompt and leaves the answer that much less room, so the request still fits the
        context window and the whole answer stays within the tokens reserved for it."""
        engine, presenter = self._services.engine, job.presenter
        for attempt in range(STREAM_ATTEMPTS):
            shown = await presenter.shown()
            shown_tokens = await engine.count_tokens(shown) if shown else 0
            max_tokens = plan.max_tokens - shown_tokens
            if max_tokens <= 0:  # the answer shown already used all its room: it is finished as it stands
                return Completion(shown, 0, 0, "length", 0.0, 0.0)
            writer = _Writer(presenter, shown)
            messages, extra = prompt, None
            if shown:
                messages = [*prompt, {"role": "assistant", "content": shown}]
                extra = {"continue_final_message": True, "add_generation_prompt": False}
            try:
                completion = await engine.chat(
                    messages,
                    max_tokens=max_tokens,
                    temperature=job.message.temperature,
                    on_delta=writer.add,
                    extra=extra,
                    failover=False,
                )
            except EngineError as exc:
                written = writer.text[len(shown) :]
                job.tokens_used += plan.prompt_bound + shown_tokens + await self._count_or_bound(written)
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
            return await self._services.engine.count_tokens(text)
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
        return f"{answer}\n\n{trace}" if self._services.settings.engine.attach_expert_trace else answer


class _Writer:
    """The text so far of one streamed attempt, shown to the user at most every `presenter.interval_s`."""

    def __init__(self, presenter: Presenter, shown: str) -> None:
        self._presenter = presenter
        self.text = shown
        self._pushed_at = 0.0

    async def add(self, delta: str) -> None:
        self.text += delta
        if time.monotonic() - self._pushed_at >= self._presenter.interval_s:
            self._pushed_at = time.monotonic()
            await self._presenter.show(self.text)
