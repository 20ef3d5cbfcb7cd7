"""One leased entry by its kind: a message (or a ready notice) is answered through the adapter's pipeline and
delivered; a pulled channel's other kinds are the pull itself, a human agent's turn, a platform event, an
operator's handoff."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from bots.base import ConversationTaken
from bots.channels import PulledChannel
from gateway import metrics
from gateway.pipeline.job import Job, Services
from gateway.pipeline.stage import Next
from gateway.queue.entry import EntryKind
from gateway.state.pulse import PULSE
from gateway.worker.failures import pull_succeeded
from gateway.worker.pulled import PulledWork

log = logging.getLogger(__name__)

Handler = Callable[[Job, Services, PulledWork], Awaitable[str]]


async def _pull(job: Job, services: Services, pulled: PulledWork) -> str:
    if not isinstance(job.adapter, PulledChannel):  # the bot's platform changed since the pull was queued
        log.warning("a pull queued for a bot that has no log to pull is dropped", extra={"bot_id": job.adapter.bot_id})
        return "nothing_to_pull"
    outcome = await pulled.pull(job.adapter, job.message, job.entry.enqueued_at, job.record.fence)
    await pull_succeeded(services, job.message)
    return outcome


async def _agent_turn(job: Job, services: Services, pulled: PulledWork) -> str:
    return await pulled.agent_turn(job.message, job.record, services.keys.memory(job.scope.lane))


async def _event(job: Job, services: Services, pulled: PulledWork) -> str:
    return await pulled.event(job.adapter, job.message, job.entry.event_fields(), job.record)


async def _handoff(job: Job, services: Services, pulled: PulledWork) -> str:
    sessions = job.adapter.sessions
    if sessions is None:  # queued for a bot whose platform has no human agents (its settings refuse to build one)
        raise TypeError(f"bot {job.adapter.bot_id!r} has no human agents to hand over to")
    servicer = job.entry.servicer or None
    conversations = services.conversations
    code = await conversations.hand_off(sessions, job.adapter.reply_quota, job.message, job.record, servicer)
    return f"handed off (code {'yes' if code else 'none'})"


ANSWERED = (EntryKind.CHAT, EntryKind.NOTICE)  # through the adapter's answer pipeline
OTHER_KINDS: dict[EntryKind, Handler] = {
    EntryKind.PULL: _pull,
    EntryKind.AGENT: _agent_turn,
    EntryKind.EVENT: _event,
    EntryKind.HANDOFF: _handoff,
}


async def run_entry(job: Job, services: Services, pulled: PulledWork, pipeline: Next) -> str:
    kind = job.entry.kind
    if kind in ANSWERED:
        return await answer(job, services, pipeline)
    return await OTHER_KINDS[kind](job, services, pulled)


async def answer(job: Job, services: Services, pipeline: Next) -> str:
    """Compose the answer once (the pipeline commits it to the reply record), then deliver what is recorded:
    a retry or a takeover resends the committed answer, never asks the engine again."""
    state = job.state = await job.record.load()
    if state.done:
        return "already_sent"
    text = state.text
    if text is None:
        composed = await pipeline(job)
        if composed.ended:
            return composed.ended
        text = composed.text
        state.text, state.state = text, "committed"
    if not text:
        await job.record.mark(state="done")
        return "nothing_to_send"
    platform = job.message.platform
    sessions = job.adapter.sessions
    if (job.no_answer or state.no_answer) and sessions is not None:
        # Nothing in the documents: say so, then hand over; done only once the handoff happened, so that a
        # retry after a failed move still makes it. A customer whose allowance is used up (the answers to earlier
        # questions took it) cannot be told, but is handed over all the same: the move takes no message.
        told = True
        try:
            await job.presenter.deliver(text, state)
        except ConversationTaken as taken:
            told = False
            if taken.by_human:  # a person has the conversation already: nothing to hand over
                raise
            # botgw's count of the allowance ("quota"), or WeCom's own refusal of the send (95001...)
            log.warning("the customer could not be told there is no answer (%s); handing over", taken.code,
                        extra={"bot_id": job.message.bot_id})  # fmt: skip
        await services.conversations.hand_off(sessions, job.adapter.reply_quota, job.message, job.record)
        await job.record.mark(state="done")
        if not told:
            return "handed off (no answer; the customer could not be told)"
        metrics.REPLIES.labels(platform, "sent").inc()
        PULSE.answered(job.message.bot_id)
        return "sent; handed off (no answer)"
    await job.presenter.finish(text, state)
    metrics.REPLIES.labels(platform, "sent").inc()
    PULSE.answered(job.message.bot_id)
    return "sent"
