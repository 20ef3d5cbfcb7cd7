"""Dead letters: messages that could not be answered, kept with why, for an operator to look at and replay.

A replay puts the message back into its conversation's lane with its original dedup key, so
its reply record decides what happens: an answer that was delivered after all is not sent
again; a failed one is composed afresh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError
from redis.asyncio import Redis

from bots.base import InboundMessage
from gateway.config import Settings
from gateway.queue.entry import QueueEntry
from gateway.queue.scheduler import Scheduler
from gateway.state.keys import Keys
from gateway.state.memory import Scope
from gateway.state.redis_text import as_text
from gateway.state.reply_record import ReplyState

PREVIEW_CHARS = 40


class NoSuchDeadLetter(LookupError):
    """The id names no dead letter (replayed or purged already, or mistyped)."""


@dataclass(frozen=True)
class DeadLetter:
    letter_id: str
    reason: str
    entry: QueueEntry | None  # None: the queue held something no worker could read (`raw` is what it was)
    raw: str = ""

    @property
    def message(self) -> InboundMessage:
        if self.entry is None:
            raise UnreadableLetter(self.letter_id)
        return self.entry.message

    def shown(self) -> dict:
        """The letter as `dlq show` prints it."""
        entry = self.entry.wire() if self.entry is not None else {"raw": self.raw}
        return {"id": self.letter_id, "reason": self.reason, "entry": entry}

    def summary(self) -> dict:
        if self.entry is None:
            return {"id": self.letter_id, "at": self.at, "reason": self.reason, "raw": self.raw[:PREVIEW_CHARS]}
        message = self.message
        text = message.text if len(message.text) <= PREVIEW_CHARS else message.text[:PREVIEW_CHARS] + "…"
        return {
            "id": self.letter_id,
            "at": self.at,
            "bot": message.bot_id,
            "user": message.sender_id,
            "person": message.person,  # qualified, as `botgw limits show` takes it
            "text": text,
            "reason": self.reason,
        }


    @property
    def at(self) -> float:
        return int(self.letter_id.split("-")[0]) / 1000


class UnreadableLetter(ValueError):
    """A dead letter of an entry that could not be read: it cannot be replayed, only shown and purged."""

    def __str__(self) -> str:
        return f"{self.args[0]} holds an unreadable queue entry; it cannot be replayed (`botgw dlq purge` it)"


class DeadLetters:
    def __init__(self, redis: Redis, keys: Keys, scheduler: Scheduler, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._scheduler = scheduler
        self._settings = settings

    @staticmethod
    def _letter(letter_id: bytes | str, fields: dict) -> DeadLetter:
        body = json.loads(as_text(fields[b"entry"]))
        reason = str(body.get("reason", ""))
        try:
            # A letter of a platform's later delivery failure, as the release before the entry model wrote it, has
            # no owner: the replay works it out again from the message, as it does for every letter.
            entry = {"u": "", **body["entry"]} if isinstance(body.get("entry"), dict) else body["entry"]
            return DeadLetter(as_text(letter_id), reason, QueueEntry.model_validate(entry))
        except (KeyError, ValidationError):
            return DeadLetter(as_text(letter_id), reason, None, str(body.get("raw") or json.dumps(body.get("entry"))))

    async def list(self, count: int = 100, before: str = "") -> list[DeadLetter]:
        """The newest first; `before`: only those older than this id (where the previous page ended)."""
        upper = f"({before}" if before else "+"
        items = await self._redis.xrevrange(self._keys.dead_letters, max=upper, min="-", count=count)
        return [self._letter(letter_id, fields) for letter_id, fields in items]

    async def get(self, letter_id: str) -> DeadLetter:
        items = await self._redis.xrange(self._keys.dead_letters, min=letter_id, max=letter_id)
        if not items:
            raise NoSuchDeadLetter(letter_id)
        return self._letter(*items[0])

    async def reply_state(self, letter: DeadLetter) -> ReplyState:
        """The reply record of the letter's message: how far its answer got (state "new" when there is none)."""
        return ReplyState.from_hash(await self._redis.hgetall(self._keys.reply(letter.message.dedup_key)))

    async def replay(self, letter_id: str) -> str:
        """Queue the message again (same dedup key), then drop the dead letter; what the reply record says it needs.

        Queued first, dropped after: a replay cut off between the two (a killed process) leaves the letter to be
        replayed again, never lost. Queueing twice (that, or two operators at the same moment) is harmless: the
        entries share the message's dedup key and its reply record, in one lane, so the second finds the answer
        delivered and sends nothing. A letter already replayed is NoSuchDeadLetter."""
        letter = await self.get(letter_id)
        message = letter.message
        record_key = self._keys.reply(message.dedup_key)
        state = ReplyState.from_hash(await self._redis.hgetall(record_key))
        if state.state == "failed":
            await self._redis.delete(record_key)  # composed afresh; a delivered answer ("done") is kept
        scope = Scope.of(message, self._settings.memory.group)
        assert letter.entry is not None  # `message` said so
        entry = QueueEntry(owner=scope.owner, kind=letter.entry.kind, message=message, notice=letter.entry.notice,
                           request_id=letter.entry.request_id, servicer=letter.entry.servicer,
                           event=letter.entry.event)  # fmt: skip
        await self._scheduler.enqueue(scope.lane, entry, self._settings.worker.weight(message.bot_id))
        await self._redis.xdel(self._keys.dead_letters, letter_id)
        return "already delivered: will not be sent again" if state.state == "done" else "queued"

    async def purge(self, letter_ids: list[str]) -> int:
        """Drop these dead letters (all of them when the list is empty)."""
        if letter_ids:
            return int(await self._redis.xdel(self._keys.dead_letters, *letter_ids))
        count = int(await self._redis.xlen(self._keys.dead_letters))
        await self._redis.delete(self._keys.dead_letters)
        return count
