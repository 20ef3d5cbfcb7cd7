"""Knowledge grounding: look the question up in the bot's knowledge bases before the engine is asked.

The passages go into the system prompt; or the reply needs no engine at all (nothing found: the bot's
`no_answer_text`, flagged so a platform with human agents hands over; a Q&A row that matches closely).
"""

from __future__ import annotations

import json
import logging

from bots.text import utf8_len
from gateway.delivery.presenters import Paced
from gateway.pipeline.job import Composed, Grounding, Job, Services
from gateway.pipeline.stage import Next
from gateway.state.memory import Turn
from knowledge.errors import StoreLocked

log = logging.getLogger(__name__)


class KnowledgeGrounding:
    def __init__(self, services: Services) -> None:
        self._services = services

    async def __call__(self, job: Job, next: Next) -> Composed:
        use = job.adapter.knowledge_for(job.message)
        if use is None or job.tool_resume is not None:  # a 确认 continues a question grounded when it was asked
            return await next(job)
        message = job.message
        try:
            retrieval = await self._services.knowledge().retrieve(use, message.text, message.bot_id)
        except StoreLocked as exc:  # a `botgw kb` command holds the embedded store: try again shortly
            log.info("knowledge store busy; the message waits", extra={"error": str(exc)})
            raise Paced(2.0) from exc
        job.no_answer = retrieval.no_answer
        used = json.dumps(retrieval.record(), ensure_ascii=False)
        await job.record.mark(knowledge=used, **({"no_answer": "1"} if job.no_answer else {}))
        job.grounding = Grounding(retrieval.system_prompt(), retrieval.with_sources)
        ready = retrieval.reply()
        if ready is None:
            return await next(job)
        user = Turn("user", message.text, utf8_len(message.text))
        return await self._services.commit(job, ready, (user, Turn("assistant", ready, utf8_len(ready))))
