"""Chat commands a user can type instead of a question (/help, /reset), and what comes before them."""

from __future__ import annotations

from gateway import texts
from gateway.pipeline.job import Composed, Job, Services
from gateway.pipeline.stage import Next
from gateway.state.reply_record import FencedValues


def parse_command(text: str) -> str | None:
    """'/reset' → 'reset'; a question → None. Unknown slash words are questions, not errors."""
    word = text.strip().split(maxsplit=1)[0].lower() if text.strip() else ""
    if word in ("/reset", "/help"):
        return word[1:]
    return None


class AdoptMemory:
    """A person's one-to-one memory kept per bot by an earlier release becomes their memory, before anything
    reads or clears it (a /reset must clear it too). Once per session: the memory module remembers."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._values: FencedValues | None = None  # made at the first /reset: the pipeline is built without Redis

    async def __call__(self, job: Job, next: Next) -> Composed:
        message = job.message
        own_lane = job.scope.lane == message.session_key
        if own_lane and await self._services.memory.adopt(message.session_key, message.bot_session_key):
            job.record.forget_memory()  # what the record read of the memory is stale now
        return await next(job)


class Commands:
    """/help and /reset; the clear is part of the fenced commit, so a stale worker wipes nothing."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._values: FencedValues | None = None  # made at the first /reset: the pipeline is built without Redis

    async def __call__(self, job: Job, next: Next) -> Composed:
        message = job.message
        command = parse_command(message.text)
        if command == "help":
            return await self._services.commit(job, texts.HELP_TEXT)
        if command == "reset":
            # the files too, under the lease: a stale worker's /reset wiped files sent after the real one (a review)
            self._values = self._values or FencedValues(self._services.redis)
            await self._values.set(job.record.fence, self._services.keys.attachments(job.scope.lane), "")
            return await self._services.commit(job, texts.RESET_TEXT, clear_memory=True)
        return await next(job)
