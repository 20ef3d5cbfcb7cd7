"""Tools in the answer path (issue 24): the engine asks for calls, the worker makes the ones the asker may make and
feeds the results back, round after round up to the bot's `max_calls`.

Exactly once: every round and call goes through the ledger (tools/ledger.py) before and after it happens, so a
worker that takes over replays them; a call that started without a recorded result is made again only when the
tool says it is read-only, otherwise the person is told its outcome is unknown. A `confirm` tool is not called when
the model asks: the person is asked, and the call waits (tools/confirmations.py) for their 确认 or 取消, which
`ToolConfirmations` settles before the message would be taken for a question.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import secrets
import time
from typing import Any

from bots.base import SendError
from bots.buttons import ButtonTap, Question
from bots.text import utf8_len, utf8_prefix
from engine.client import Completion, ToolCall
from gateway import metrics, texts
from gateway.pipeline.job import Composed, Job, PromptPlan, Services
from gateway.pipeline.stage import Next
from gateway.state.redis_text import as_text
from tools.audit import AuditRecord
from tools.config import BotTools
from tools.confirmations import PendingCall, reply_verdict
from tools.kit import Offer, ToolKit
from tools.ledger import CallSlot, ToolLedger
from tools.servers import CallResult, ToolSpec

log = logging.getLogger(__name__)

SECOND_TAP_S = 120  # a 确认 this soon after the question was settled is a second tap, answered as one
MAX_SHOWN_CHARS = 200  # an argument shown for confirmation, at most
MIN_RESULT_BYTES = 512  # a tool result is never cut below this, whatever the context window has left


def bot_tools(services: Services, job: Job) -> BotTools | None:
    """The bot's `tools:` when the worker has tool servers at all."""
    if services.tools is None:
        return None
    return services.settings.bot(job.message.bot_id).tools


@dataclasses.dataclass(frozen=True)
class ToolAnswer:
    """The answer the rounds ended with; `remember` is the question as memory keeps it when this message is not it
    (a 确认 continues the question that asked for the call)."""

    completion: Completion
    remember: str | None = None


SUPERSEDE_SLACK_S = 2.0  # see ToolConfirmations._supersede


class ToolConfirmations:
    """A 确认 or 取消 from the person a call waits for settles it (once); from anyone else it is just a message."""

    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        services, message = self._services, job.message
        tools = bot_tools(services, job)
        tap = message.tap
        if tap is not None and (tools is None or services.tools is None):  # a card of a bot that no longer has tools
            return await services.commit(job, "")
        verdict = tap.choice if tap is not None else (
            reply_verdict(message.text) if tools is not None and not job.images else None)
        if tools is None or services.tools is None:
            return await next(job)
        if verdict is None:
            await self._supersede(job)
            return await next(job)
        kit = services.tools
        key = services.keys.tool_confirmation(job.scope.lane)
        pending = await kit.confirmations.get(key)
        if tap is not None:  # a button names its question: only that one, only by its asker
            if pending is None or pending.id != tap.question_id or pending.bot != message.bot_id:
                # told, whoever waits here now: the tapper's card may say their choice was taken
                return await services.commit(job, texts.TOOL_BUTTON_STALE_TEXT)
            if pending.asker != message.person:  # someone else's tap does nothing (in a group, says nothing)
                metrics.TOOL_CONFIRMATIONS.labels("refused").inc()
                return await services.commit(job, "")
        elif (pending is None or pending.asker != message.person or pending.bot != message.bot_id
                or message.received_at < pending.asked_at  # an older 确认 (a replay) is not to this question
                or not await self._was_asked(pending)):
            return await next(job)
        settled = await kit.confirmations.settle(key, message.dedup_key, "expired" if pending.expired() else verdict)
        if tap is not None:
            await self._card_answered(job, tap, settled.verdict)
        slot = CallSlot(pending.round, pending.index)
        ledger = await ToolLedger.open(services.redis, services.keys.tool_ledger(pending.call_set))
        if settled.by != message.dedup_key:  # it was settled already, and stays as it was
            if tap is not None and not (settled.verdict == "confirmed" and verdict == "confirmed"
                                        and not ledger.started(slot)):
                return await services.commit(job, "")  # a second tap does nothing: the first one was answered
            if settled.verdict == "confirmed" and verdict == "confirmed" and not ledger.started(slot):
                if not ledger.confirmed(slot):  # the first answer's worker died before it wrote the mark
                    await ledger.mark_confirmed(slot)
                job.tool_resume = pending  # confirmed, yet never run (refused by a limit then): this one runs it
                return await next(job)
            if time.time() - settled.at > SECOND_TAP_S:  # long after: a yes or no of a new conversation
                return await next(job)
            said = {"confirmed": texts.TOOL_ALREADY_CONFIRMED_TEXT, "expired": texts.TOOL_CONFIRM_EXPIRED_TEXT}
            return await services.commit(job, said.get(settled.verdict, texts.TOOL_CANCELLED_TEXT).format(
                tool=pending.tool))
        if settled.verdict == "expired":
            if settled.first:
                metrics.TOOL_CONFIRMATIONS.labels("expired").inc()
                await self._audit(kit, pending, "cancelled", "timeout")
            return await services.commit(job, texts.TOOL_CONFIRM_EXPIRED_TEXT.format(tool=pending.tool))
        if settled.verdict == "cancelled":
            if settled.first:
                metrics.TOOL_CONFIRMATIONS.labels("cancelled").inc()
                await self._audit(kit, pending, "cancelled", "")
            return await services.commit(job, texts.TOOL_CANCELLED_TEXT.format(tool=pending.tool))
        if not ledger.confirmed(slot):
            await ledger.mark_confirmed(slot)
            metrics.TOOL_CONFIRMATIONS.labels("given").inc()
            await self._audit(kit, pending, "confirmed", "")
        job.tool_resume = pending
        return await next(job)

    async def _was_asked(self, pending: PendingCall) -> bool:
        """Whether the waiting call is the one its asking message asked (that message's record names it, under its
        lease): a worker that lost the message could still replace its successor's waiting call with its own, never
        shown, in the moment between its lease check and the write (the two keys share no cluster slot). A button
        names its question itself; a record from before the id was kept names none, and is taken at its word."""
        if not pending.asked_by:
            return True
        asked = await self._services.redis.hget(self._services.keys.reply(pending.asked_by), "question_id")
        return not asked or as_text(asked) == pending.id

    async def _supersede(self, job: Job) -> None:
        """A message of the asker's that is no verdict moves the conversation on: the call waiting for their yes is
        cancelled, and they are told with whatever this message gets (Job.notices). Left waiting, a casual 是 or
        yes minutes later, to some other question of the bot's, would have run it (found by a review). Not by the
        asking message's own retry, nor by what the asker wrote before the question was asked (queued behind the
        asking message; platform times are whole seconds, hence the slack)."""
        kit, message = self._services.tools, job.message
        assert kit is not None
        key = self._services.keys.tool_confirmation(job.scope.lane)
        pending, settled = await kit.confirmations.waiting(key)
        if pending is None:
            return
        if settled is None:
            if (pending.asker != message.person or pending.bot != message.bot_id or pending.expired()
                    or message.dedup_key == pending.asked_by
                    or message.received_at < pending.shown_at + SUPERSEDE_SLACK_S):  # fmt: skip
                return
            settled = await kit.confirmations.settle(key, message.dedup_key, "cancelled")
            if settled.first:
                metrics.TOOL_CONFIRMATIONS.labels("superseded").inc()
                await self._audit(kit, pending, "cancelled", "superseded")
        if settled.by == message.dedup_key and settled.verdict == "cancelled":  # this message's, retried or not
            job.notices.append(texts.TOOL_SUPERSEDED_NOTE.format(tool=pending.tool))

    async def _card_answered(self, job: Job, tap: ButtonTap, verdict: str) -> None:
        """The asker's tapped card says how the question was settled and takes no more taps, where the platform
        lets botgw update it; best effort (the answer in the conversation says it too)."""
        buttons = job.adapter.buttons
        if buttons is None:
            return
        try:
            await buttons.answered(job.message.reply_to, tap, texts.TOOL_CARD_LABELS[verdict])
        except SendError as exc:
            log.warning("the tapped card could not be updated", extra={"error": str(exc)})

    async def _audit(self, kit: ToolKit, pending: PendingCall, kind: str, outcome: str) -> None:
        await kit.audit.record(
            AuditRecord(time.time(), pending.bot, pending.asker, pending.tool, kind,  # type: ignore[arg-type]
                        pending.arguments, outcome, 0)  # type: ignore[arg-type]
        )


class ToolRounds:
    """The rounds of one answer that may call tools."""

    def __init__(self, services: Services, kit: ToolKit, tools: BotTools) -> None:
        self._services = services
        self._kit = kit
        self._tools = tools
        self._progress = ""  # what a streamed reply shows of the calls so far (the answer extends it)
        self._call_set = ""  # the ledger's name: the question's dedup key
        self._withheld: set[str] = set()  # tools that timed out while changing something: never offered again

    async def answer(self, job: Job, prompt: list[dict[str, Any]], plan: PromptPlan, offer: Offer,
                     remember: str) -> ToolAnswer | Composed:
        """Run the rounds from the ledger's last step; a Composed when the answer is a question to the asker or a
        note (a confirmation, an unknown outcome), else the engine's final answer."""
        services, pending = self._services, job.tool_resume
        self._call_set = pending.call_set if pending is not None else job.message.dedup_key
        ledger = await ToolLedger.open(services.redis, services.keys.tool_ledger(self._call_set))
        if ledger.empty:
            if pending is not None:  # the question's ledger is gone (older than a week): nothing to continue
                return await services.commit(job, texts.TOOL_CONFIRM_EXPIRED_TEXT.format(tool=pending.tool))
            await ledger.start(prompt, remember)
        if job.presenter.streams:  # the stream or card is there from the start, as for an answer without tools
            await job.presenter.open(job.state)
        messages = ledger.base()
        calls_made, limit, number = 0, self._tools.max_calls, 0
        remembered = ledger.remember() if pending else None
        while True:
            assistant = ledger.round(number)
            if assistant is None:
                last = calls_made >= limit or number > limit  # no more calls: the engine answers from the results
                completion = await self._ask(job, messages, plan, offer, with_tools=not last)
                if last or not completion.tool_calls:
                    text = completion.text
                    if last and (completion.tool_calls or not text.strip()):
                        text = texts.TOOL_LIMIT_TEXT.format(count=limit)
                    return ToolAnswer(dataclasses.replace(completion, text=self._progress + text), remembered)
                assistant = await ledger.record_round(number, assistant_message(completion))  # the first writer's
            messages.append(assistant)
            for index, call in enumerate(_calls(assistant)):
                if calls_made >= limit:
                    result = CallResult("error", f"error: the limit of {limit} tool calls is reached; not run", 0)
                else:
                    outcome = await self._call(job, ledger, CallSlot(number, index), call, offer)
                    if isinstance(outcome, Composed):
                        return outcome
                    result, calls_made = outcome, calls_made + 1
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": self._fit(result.text, messages, plan, offer)})
            number += 1

    def _offered(self, offer: Offer) -> list[dict[str, Any]]:
        return [spec.openai() for name, spec in offer.tools.items() if name not in self._withheld]

    async def _ask(self, job: Job, messages: list[dict[str, Any]], plan: PromptPlan, offer: Offer, *,
                   with_tools: bool) -> Completion:
        """One round: the whole answer (the calls are known only at its end), every token counted."""
        services = self._services
        completion = await services.engine.chat(
            messages, max_tokens=plan.max_tokens, temperature=job.message.temperature,
            tools=self._offered(offer) if with_tools else None,
        )
        job.tokens_used += completion.prompt_tokens + completion.completion_tokens
        return completion

    async def _call(self, job: Job, ledger: ToolLedger, slot: CallSlot, call: ToolCall,
                    offer: Offer) -> CallResult | Composed:
        """One call, made at most once: its recorded result, or a refusal, or the asker asked first, or made."""
        services, kit, message = self._services, self._kit, job.message
        spec = offer.tools.get(call.name)
        recorded = ledger.result(slot)
        if recorded is not None:
            if recorded.outcome == "timeout" and spec is not None and not spec.read_only:
                self._withheld.add(spec.exposed)
            return recorded
        arguments, problem = parse_arguments(call.arguments)
        if spec is None or spec.exposed in self._withheld or problem:
            why = problem or f"no tool {call.name!r} is available to this user now"
            result = CallResult("error", f"error: {why}", 0)
            await self._record(job, ledger, slot, call.name.replace("__", ".", 1), arguments, result, "refused")
            return result
        confirmed_first = self._tools.confirms(spec.server, spec.name)
        if confirmed_first and not ledger.confirmed(slot):
            return await self._ask_confirmation(job, ledger, slot, spec, arguments)
        first = await ledger.mark_started(slot)  # only one worker ever gets to make it
        if not first and (confirmed_first or not spec.read_only):  # started before: it may have run
            result = CallResult("error", "error: outcome unknown (interrupted); not repeated", 0)
            await self._record(job, ledger, slot, spec.qualified, arguments, result, "unknown")
            return await services.commit(job, texts.TOOL_OUTCOME_UNKNOWN_TEXT.format(tool=spec.qualified))
        await self._show_progress(job, spec)
        result = await kit.servers.call(
            spec.server, spec.name, arguments, user=message.person, bot=message.bot_id,
            idempotency_key=idempotency_key(ledger.key, slot),
        )
        metrics.TOOL_CALL_SECONDS.labels(spec.qualified).observe(result.duration_ms / 1000)
        changes = confirmed_first or not spec.read_only
        if result.outcome == "lost" and changes:  # sent, and maybe done: never again, and the person is told
            await self._record(job, ledger, slot, spec.qualified, arguments, result, "unknown")
            return await services.commit(job, texts.TOOL_OUTCOME_UNKNOWN_TEXT.format(tool=spec.qualified))
        if result.outcome == "timeout":
            timeout = services.settings.tools.servers[spec.server].timeout_s
            said = f"error: the tool did not answer within {timeout:g} s"
            if changes:  # it may still have run: the model must not try it again in this answer
                self._withheld.add(spec.exposed)
                said += "; it may have run, so it must not be called again now: tell the user to check"
            result = dataclasses.replace(result, text=said)
        outcome = "error" if result.outcome in ("unavailable", "lost") else result.outcome
        await self._record(job, ledger, slot, spec.qualified, arguments, result, outcome)
        return result

    async def _record(self, job: Job, ledger: ToolLedger, slot: CallSlot, tool: str, arguments: dict[str, Any],
                      result: CallResult, outcome: str) -> None:
        """The result in the ledger (it happened), then in the audit trail and the metrics. A result another worker
        recorded first is kept; a call this worker made is audited all the same (its real outcome), while its
        "unknown" or refusal beside another's record is not."""
        if await ledger.mark_result(slot, result) != result and outcome in ("unknown", "refused"):
            return
        metrics.TOOL_CALLS.labels(tool, outcome).inc()
        await self._kit.audit.record(AuditRecord(time.time(), job.message.bot_id, job.message.person, tool, "call",
                                                 arguments, outcome, result.duration_ms))  # type: ignore[arg-type]

    async def _ask_confirmation(self, job: Job, ledger: ToolLedger, slot: CallSlot, spec: ToolSpec,
                                arguments: dict[str, Any]) -> Composed:
        services, message, tools = self._services, job.message, self._tools
        pending = PendingCall(
            id=secrets.token_hex(8), asker=message.person, bot=message.bot_id, tool=spec.qualified,
            arguments=arguments, call_set=self._call_set,
            round=slot.round, index=slot.index, expires_at=time.time() + tools.confirm_ttl_s,
            asked_at=message.received_at, asked_by=message.dedup_key, shown_at=time.time(),
        )
        # Under the lease, checked right before: a worker that stalled and lost the message replaced its successor's
        # waiting call with its own (other arguments, never shown), which the asker's 确认 would then run (found by
        # a review). The waiting call's key is not in the lease's cluster slot, so the check comes just before.
        await job.record.mark(question_id=pending.id)
        await self._kit.confirmations.ask(services.keys.tool_confirmation(job.scope.lane), pending, tools.confirm_ttl_s)
        metrics.TOOL_CONFIRMATIONS.labels("asked").inc()
        await self._kit.audit.record(AuditRecord(time.time(), message.bot_id, message.person, spec.qualified,
                                                 "confirm_asked", arguments, "", 0))
        in_words = arguments_in_words(arguments, spec)
        question = texts.TOOL_CONFIRM_TEXT.format(
            tool=spec.qualified, arguments=in_words, minutes=max(1, round(tools.confirm_ttl_s / 60)),
        )
        buttons = Question(pending.id, texts.TOOL_CONFIRM_TITLE.format(tool=spec.qualified), in_words)
        job.state.question = buttons.to_json()  # the state the delivery reads was loaded before the pipeline ran
        await job.record.mark(question=job.state.question)  # before the commit: a retry delivers both
        return await services.commit(job, question)

    async def _show_progress(self, job: Job, spec: ToolSpec) -> None:
        """Where the platform shows a growing reply (the AI bot's stream, a DingTalk card, the page), say which
        tool runs; message platforms get only the answer."""
        presenter = job.presenter
        if not presenter.streams:
            return
        self._progress += texts.TOOL_RUNNING_TEXT.format(tool=spec.qualified) + "\n\n"
        await presenter.show(self._progress)

    def _fit(self, text: str, messages: list[dict[str, Any]], plan: PromptPlan, offer: Offer) -> str:
        """A result cut (with a note) to what the context window has left beside the answer, UTF-8 bytes being an
        upper bound of tokens."""
        context = self._services.engine.max_model_len
        if not context:
            return text
        used = sum(utf8_len(json.dumps(item, ensure_ascii=False)) for item in [*messages, *self._offered(offer)])
        room = max(MIN_RESULT_BYTES, context - plan.max_tokens - used)
        if utf8_len(text) <= room:
            return text
        return utf8_prefix(text, room - utf8_len(texts.TOOL_RESULT_CUT)) + texts.TOOL_RESULT_CUT


def assistant_message(completion: Completion) -> dict[str, Any]:
    """The engine's request for calls, as the next request must carry it back."""
    return {
        "role": "assistant",
        "content": completion.text or None,
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in completion.tool_calls
        ],
    }


def _calls(assistant: dict[str, Any]) -> list[ToolCall]:
    return [ToolCall(item["id"], item["function"]["name"], item["function"]["arguments"])
            for item in assistant.get("tool_calls") or ()]


def parse_arguments(text: str) -> tuple[dict[str, Any], str]:
    """The call's arguments as an object, or why they are not one (the model is told, and may try again)."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        return {}, f"the arguments are not JSON ({exc.msg})"
    if not isinstance(value, dict):
        return {}, "the arguments must be a JSON object"
    return value, ""


def arguments_in_words(arguments: dict[str, Any], spec: ToolSpec) -> str:
    """One line per argument, named by its schema title or description where the tool gives one."""
    properties = spec.input_schema.get("properties") or {}
    lines = []
    for name, value in arguments.items():
        described = properties.get(name) or {}
        label = described.get("title") or described.get("description") or name
        shown = json.dumps(value, ensure_ascii=False)  # quoted: a value cannot fake lines of its own
        if len(shown) > MAX_SHOWN_CHARS:
            shown = shown[:MAX_SHOWN_CHARS] + "…"
        lines.append(f"- {str(label)[:MAX_SHOWN_CHARS]}：{shown}")
    return "\n".join(lines) or "（无参数）"


def idempotency_key(ledger_key: str, slot: CallSlot) -> str:
    """The same for every attempt of one call, whichever worker makes it, and unguessable from outside."""
    return hashlib.sha256(f"{ledger_key}|{slot.field}".encode()).hexdigest()[:32]
