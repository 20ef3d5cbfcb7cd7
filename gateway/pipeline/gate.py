"""On a platform with human agents (微信客服), before answering: who may speak in this conversation.

Renew the person's reply allowance, stay quiet when a human holds the conversation, hand it over when the
person asks for one, and take it when nobody holds it. A handoff asked for is finished before the message is
remembered and done (and resumed first on a retry, whoever holds the conversation by then): a move or notice
that failed is tried again.
"""

from __future__ import annotations

from bots.channels import HumanSessions
from gateway.pipeline.job import Composed, Job, Services
from gateway.pipeline.stage import Next
from gateway.queue.entry import EntryKind
from gateway.worker.failures import withheld


class HumanGate:
    def __init__(self, services: Services, sessions: HumanSessions) -> None:
        self._services = services
        self._sessions = sessions

    async def __call__(self, job: Job, next: Next) -> Composed:
        if job.entry.kind != EntryKind.CHAT:
            return await next(job)
        adapter, message, state, fence = job.adapter, job.message, job.state, job.record.fence
        pulled = self._services.pulled
        conversations = pulled.conversations
        memory_key = self._services.keys.memory(job.scope.lane)
        if adapter.reply_quota is not None:
            await conversations.renew_quota(message, adapter.reply_quota, fence)
        owner = "bot" if state.handoff_code else await conversations.owner(adapter, message, fence)
        if owner == "human":
            await pulled.remember_withheld(message, job.record, memory_key)
            await withheld(self._services, job, "human")
            return Composed("", ended="withheld")
        if state.handoff_code or self._sessions.wants_human(message.text):
            await conversations.hand_off(adapter, message, job.record)
            await pulled.remember_withheld(message, job.record, memory_key)
            await job.record.mark(state="done")
            return Composed("", ended="handed_off")
        if owner == "free":
            await conversations.take(adapter, message, fence)
        return await next(job)
