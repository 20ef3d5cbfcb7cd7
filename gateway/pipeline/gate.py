"""On a platform with human agents (微信客服), before answering: who may speak in this conversation.

Renew the person's reply allowance, stay quiet when a human holds the conversation, hand it over when the
person asks for one, and take it when nobody holds it. A handoff asked for is finished before the message is
remembered and done (and resumed first on a retry, whoever holds the conversation by then): a move or notice
that failed is tried again.
"""

from __future__ import annotations

import contextlib
import logging

from redis.exceptions import RedisError

from bots.base import SendError
from bots.channels import HumanSessions
from bots.text import utf8_len
from gateway import metrics
from gateway.pipeline.job import Composed, Job, Services
from gateway.pipeline.stage import Next
from gateway.queue.entry import EntryKind
from gateway.state.memory import Turn
from gateway.state.reply_record import LeaseLost

log = logging.getLogger(__name__)


class HumanGate:
    def __init__(self, services: Services, sessions: HumanSessions) -> None:
        self._services = services
        self._sessions = sessions

    async def __call__(self, job: Job, next: Next) -> Composed:
        if job.entry.kind != EntryKind.CHAT:
            return await next(job)
        adapter, message, state, fence = job.adapter, job.message, job.state, job.record.fence
        conversations = self._services.conversations
        if adapter.reply_quota is not None:
            await conversations.renew_quota(message, adapter.reply_quota, fence)
        owner = "bot" if state.handoff_code else await conversations.owner(self._sessions, message, fence)
        if owner == "human":
            await self._remember(job)
            await withheld(self._services, job, "human")
            return Composed("", ended="withheld")
        if state.handoff_code or self._sessions.wants_human(message.text):
            await conversations.hand_off(self._sessions, adapter.reply_quota, message, job.record)
            await self._remember(job)
            await job.record.mark(state="done")
            return Composed("", ended="handed_off")
        if owner == "free":
            await conversations.take(self._sessions, message, fence)
        return await next(job)

    async def _remember(self, job: Job) -> None:
        """The person wrote while a human holds the conversation: keep it for when the bot speaks again."""
        text = job.message.text
        await self._services.commit(job, "", (Turn("user", text, utf8_len(text)),))


async def withheld(services: Services, job: Job, reason: str, *, by_human: bool = False) -> None:
    """The platform will not let the bot speak (a human holds the conversation, the quota is used up): the
    message is done, without a retry, a dead letter or an alert. `by_human`: the platform said a human took
    the conversation, so who holds it now is asked and remembered."""
    metrics.WITHHELD.labels(job.message.platform, reason).inc()
    log.info("answer withheld by the platform's rules", extra={"lane": job.lease.lane, "reason": reason})
    sessions = job.adapter.sessions
    if by_human and sessions is not None:
        with contextlib.suppress(RedisError, SendError):
            owner = await sessions.owner(job.message.reply_to)
            holder = owner if owner != "bot" else "human"
            await services.conversations.set_owner(job.message, holder, job.record.fence)
    with contextlib.suppress(RedisError, LeaseLost):
        await job.record.mark(state="done", reason=f"withheld: {reason}")
