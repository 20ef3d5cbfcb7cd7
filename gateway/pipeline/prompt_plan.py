"""Fitting a request into the engine's context window and the sender's prompt limit: pure token arithmetic
(unit-tested on its own), and the stage that feeds it what it needs from the engine and memory."""

from __future__ import annotations

import dataclasses

from bots.channels import Channel
from bots.text import utf8_len
from gateway import texts
from gateway.pipeline.job import Composed, Job, PromptPlan, Services
from gateway.pipeline.limits import refusal_notice
from gateway.pipeline.parts import IMAGE_TOKEN_BOUND, attachments_text, trimmed
from gateway.pipeline.stage import Next
from gateway.state.limits import Refusal
from gateway.state.memory import Turn, fit_to_budget

TEMPLATE_TOKENS = 16  # the chat template's own tokens around the messages (role markers, generation prompt)
TOKENS_PER_TURN = 6  # the template's tokens around each history turn
MIN_ANSWER_TOKENS = 32  # a message that leaves less room than this for the answer is refused as too long
MAX_BYTES_PER_TOKEN = 6
RESERVED_HISTORY_TOKENS = 128  # files are cut to leave the conversation this much of its history at least
MIN_ATTACHMENT_TOKENS = 64  # less room than this for the files: the question is refused, not answered blind
TRIM_MARGIN = 0.9  # a file cut to a fraction of its tokens is about that fraction: a margin for the estimate


def answer_token_cap(adapter: Channel, max_tokens: int) -> int:
    """`max_tokens`, lowered where the platform caps a whole answer (`adapter.max_answer_bytes`, e.g. the AI
    bot's stream plus one response_url post) so that a visible cut stays rare: a token of ERNIE's
    vocabulary is seldom more than MAX_BYTES_PER_TOKEN bytes of UTF-8 (two Chinese characters)."""
    cap = adapter.max_answer_bytes
    return min(max_tokens, max(MIN_ANSWER_TOKENS, cap // MAX_BYTES_PER_TOKEN)) if cap else max_tokens


@dataclasses.dataclass(frozen=True)
class Room:
    """The limits a prompt must fit: the engine's context window and the sender's prompt limit (None: none)."""

    context: int | None
    max_prompt: int | None
    max_tokens: int  # the answer's tokens wanted

    @property
    def prompt_room(self) -> int | None:
        """The most the prompt may take (None: unbounded)."""
        room = [limit for limit in (self.context and self.context - self.max_tokens, self.max_prompt) if limit]
        return min(room) if room else None

    def needs_exact_count(self, system_tokens: int, message_bytes: int) -> bool:
        """Whether the message's UTF-8 length (an upper bound of its tokens) is too big to settle the question:
        the engine's tokenizer must count it."""
        room = self.prompt_room
        return room is not None and system_tokens + message_bytes + TEMPLATE_TOKENS > room


def plan_prompt(
    room: Room, system_tokens: int, message_tokens: int, turns: list[Turn], history_budget: int, who: str
) -> PromptPlan | Refusal:
    """System prompt + history + message + answer within `room`: the newest turns that fit the history
    budget, a smaller answer for a long message (but at least MIN_ANSWER_TOKENS), or a refusal.
    `message_tokens` is the message's exact size or an upper bound of it."""
    context, max_prompt, max_tokens = room.context, room.max_prompt, room.max_tokens
    fixed = system_tokens + message_tokens + TEMPLATE_TOKENS
    if max_prompt and fixed > max_prompt:
        return Refusal("prompt", who, str(max_prompt), 0, size=message_tokens)
    if context and fixed + MIN_ANSWER_TOKENS > context:
        return Refusal("prompt", who, str(context - MIN_ANSWER_TOKENS), 0, size=message_tokens)
    if context and fixed + max_tokens > context:
        max_tokens = context - fixed  # a long message leaves less room for the answer, but still some
    history_room = history_budget
    for limit in (context and context - max_tokens, max_prompt):
        if limit:
            history_room = min(history_room, limit - fixed)
    sized = [dataclasses.replace(turn, tokens=turn.tokens + TOKENS_PER_TURN) for turn in turns]
    history = fit_to_budget(sized, max(0, history_room))
    bound = fixed + sum(turn.tokens for turn in history)
    return PromptPlan(turns[len(turns) - len(history) :], max_tokens, bound, None)


def user_turn_tokens(plan: PromptPlan, prompt_tokens: int, system_tokens: int) -> int:
    """The new message's size for memory: counted exactly when the plan had to, else what the engine's prompt
    count leaves after the history and the system prompt (at least 1)."""
    if plan.message_tokens:
        return plan.message_tokens
    history = sum(turn.tokens for turn in plan.history)
    return max(1, prompt_tokens - history - system_tokens)


def base_prompt(services: Services, job: Job) -> str:
    return job.adapter.system_prompt_for(job.message) or services.settings.system_prompt


def passages(job: Job) -> str:
    return job.grounding.passages if job.grounding else ""


def system_prompt(services: Services, job: Job) -> str:
    """The bot's prompt, then the knowledge passages (the operator's words: a file a user sent is the user's,
    and goes in the user's turn, gateway/pipeline/parts.py user_text)."""
    base = base_prompt(services, job)
    return f"{base}\n\n{passages(job)}" if passages(job) else base


def system_tokens(services: Services, job: Job, *, separator: int = 2) -> int:
    """The size in tokens of what the prompt holds besides history and the question: the bot's prompt as
    counted (once per process), the knowledge passages bounded by their UTF-8 length (they change with every
    question) plus the separator's tokens, and the files (in the user's turn) as the planning counted them."""
    files = job.attachment_tokens + separator if job.attachments else 0
    return system_tokens_before_files(services, job, separator) + files


def system_tokens_before_files(services: Services, job: Job, separator: int = 2) -> int:
    counted = services.system_tokens.get(base_prompt(services, job), 0)
    return counted + (utf8_len(passages(job)) + separator if passages(job) else 0)


def message_bound(job: Job) -> int:
    """The new message's size at most: its UTF-8 length, and IMAGE_TOKEN_BOUND per picture."""
    return utf8_len(job.message.text) + IMAGE_TOKEN_BOUND * len(job.images)


class PromptPlanning:
    """Load the conversation's memory and plan the request; a message too long for any plan gets a notice."""

    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        services, engine = self._services, self._services.engine
        base = base_prompt(services, job)
        if base not in services.system_tokens:
            services.system_tokens[base] = await engine.count_tokens(base)
        read = job.record.memory  # read with the reply record when the job was loaded, as a rule
        turns = read if read is not None else await services.memory.load(job.scope.lane)
        room = Room(
            engine.max_model_len,
            services.budgets.max_prompt_tokens(job.message.person, job.group_id),
            answer_token_cap(job.adapter, services.settings.engine.max_tokens),
        )
        size, exact = message_bound(job), None
        if job.attachments and not await self._fit_attachments(job, room, size):
            return await services.commit(job, texts.FILE_TOO_LONG_TEXT)
        system = system_tokens(services, job)
        if room.needs_exact_count(system, size):
            size = exact = await engine.count_tokens(job.message.text) + IMAGE_TOKEN_BOUND * len(job.images)
        plan = plan_prompt(room, system, size, turns, services.settings.memory.token_budget,
                           f"user:{job.message.person}")  # fmt: skip
        if isinstance(plan, Refusal):
            return await services.commit(job, await refusal_notice(services, job, plan))
        job.plan = dataclasses.replace(plan, message_tokens=exact)
        return await next(job)

    async def _fit_attachments(self, job: Job, room: Room, message_size: int) -> bool:
        """Set what the files take of the prompt, cutting them (with a note under the answer) where they do not
        fit beside the bot's prompt, the message and a little history; False: not even a useful part fits."""
        services = self._services
        text = attachments_text(job.attachments)
        bound = utf8_len(text)
        job.attachment_tokens = bound
        prompt_room = room.prompt_room
        if prompt_room is None:
            return True
        before = system_tokens_before_files(services, job) + 2
        free = prompt_room - before - message_size - TEMPLATE_TOKENS - RESERVED_HISTORY_TOKENS
        if bound <= free:
            job.attachment_tokens = bound
            return True
        exact = await services.engine.count_tokens(text)
        if exact <= free:
            job.attachment_tokens = exact
            return True
        if free < MIN_ATTACHMENT_TOKENS:
            return False
        fraction = free / exact * TRIM_MARGIN
        job.attachments = trimmed(job.attachments, fraction)
        job.attachment_tokens = free
        job.answer_notes.append(texts.FILE_TRIMMED_NOTE.format(percent=max(1, int(fraction * 100))))
        return True
