"""What flows through the answer pipeline (`Job`), what a stage hands back (`Composed`), and the worker's shared
collaborators the stages use (`Services`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import httpx
from redis.asyncio import Redis

from bots.base import InboundMessage
from bots.channels import Channel
from engine.asr import Transcriber
from engine.pool import EnginePool
from gateway.config import Settings
from gateway.delivery.presenters import Delivery, Presenter
from gateway.queue.entry import QueueEntry
from gateway.queue.scheduler import Lease, Scheduler
from gateway.state.conversations import Conversations
from gateway.state.keys import Keys
from gateway.state.limits import Admission, Budgets
from gateway.state.memory import ConversationMemory, Scope, Turn
from gateway.state.reply_record import ReplyRecord, ReplyRecords, ReplyState
from knowledge.retrieval import Retriever
from tools.confirmations import PendingCall
from tools.kit import ToolKit


@dataclasses.dataclass
class Grounding:
    """What the knowledge base gave a question: passages for the system prompt, and how to cite them."""

    passages: str
    cite: Callable[[str], str]  # the engine's answer, with its sources line


@dataclasses.dataclass(frozen=True)
class Attachment:
    """A file the conversation was sent, as text."""

    name: str
    text: str
    part: int = 0  # its place among the message's attachments (kept under it: a retry keeps it once)


@dataclasses.dataclass
class Job:
    """One leased entry and what the stages learnt about it so far (each field is set by one stage)."""

    lease: Lease
    message: InboundMessage
    scope: Scope
    adapter: Channel
    record: ReplyRecord
    presenter: Presenter
    state: ReplyState = dataclasses.field(default_factory=ReplyState)  # the reply record, as loaded
    grounding: Grounding | None = None  # set by the grounding stage
    no_answer: bool = False  # the knowledge base had nothing: say so and hand over (platforms with humans)
    plan: PromptPlan | None = None  # set by the prompt-planning stage
    images: list[str] = dataclasses.field(default_factory=list)  # data: URLs, set by the parts stage
    attachments: list[Attachment] = dataclasses.field(default_factory=list)  # files' text (the parts stage)
    attachment_tokens: int = 0  # what the attachments take of the prompt (the prompt-planning stage)
    answer_notes: list[str] = dataclasses.field(default_factory=list)  # said under the answer (a file cut to fit)
    notices: list[str] = dataclasses.field(default_factory=list)  # said under whatever is committed (a call cancelled)
    tokens_used: int = 0  # what the engine took, failed attempts included (settled by the budget stage)
    tool_resume: PendingCall | None = None  # a confirmed tool call this message continues (the confirmation stage)
    admission: Admission | None = None  # the message's admission, asked with the record's first load (the worker)

    @property
    def entry(self) -> QueueEntry:
        return self.lease.entry

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


@dataclasses.dataclass(frozen=True)
class Composed:
    """What the pipeline decided: the committed answer to deliver ('' = nothing to send), or that the message
    ended without one (`ended`: withheld, handed_off)."""

    text: str
    ended: str = ""


@dataclasses.dataclass
class Services:
    """One worker process's collaborators, shared by every job and stage."""

    settings: Settings
    redis: Redis
    keys: Keys
    engine: EnginePool
    scheduler: Scheduler
    memory: ConversationMemory
    budgets: Budgets
    conversations: Conversations  # who holds a conversation, reply quotas, handoffs (platforms with humans)
    delivery: Delivery
    records: ReplyRecords
    http: httpx.AsyncClient  # the process's client (the embedding engine for knowledge)
    system_tokens: dict[str, int] = dataclasses.field(default_factory=dict)  # a bot prompt's size, counted once
    retriever: Retriever | None = None  # opened on the first grounded question
    transcriber: Transcriber | None = None  # the `asr:` endpoint, when one is configured
    tools: ToolKit | None = None  # MCP servers, audit and confirmations, when `tools.servers` names any

    async def commit(
        self, job: Job, text: str, exchange: tuple[Turn, ...] | None = None, *, clear_memory: bool = False
    ) -> Composed:
        """Record the answer (and the exchange in memory) under the lease, before anything is sent; the job's
        notices go under any text (an answer, a refusal, a limit's notice), never alone into a silence."""
        memory = self.memory
        if text and job.notices:
            text = "\n\n".join([text, *job.notices])
        committed = await job.record.commit(
            text,
            f"{time.time():.3f}",
            self.keys.memory(job.scope.lane),
            exchange,
            memory.ttl_s,
            memory.max_items,
            clear_memory=clear_memory,
        )
        return Composed(committed)

    def knowledge(self) -> Retriever:
        if self.retriever is None:
            self.retriever = Retriever(self.settings.knowledge, self.http)
        return self.retriever
