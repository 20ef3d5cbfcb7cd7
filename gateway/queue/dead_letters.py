"""Dead letters: messages that could not be answered, kept with why, for an operator to look at and replay.

A replay puts the message back into its conversation's lane with its original dedup key, so
its reply record decides what happens: an answer that was delivered after all is not sent
again; a failed one resumes from its first piece not delivered (the answer and its progress
are kept), or is composed afresh when it failed before it was composed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pydantic import ValidationError
from redis.asyncio import Redis

from bots.base import InboundMessage
from gateway.config import Settings
from gateway.queue.entry import QueueEntry
from gateway.queue.scheduler import QUEUE_LUA, Scheduler
from gateway.state.keys import Keys
from gateway.state.memory import Scope
from gateway.state.redis_text import as_text, older_than
from gateway.state.reply_record import ReplyState

PREVIEW_CHARS = 40
PURGE_BATCH = 500
# Where a reply goes (a DingTalk sessionWebhook posts into the conversation, a response_url answers it): never shown.
REPLY_URL_FIELDS = ("webhook_url", "response_url")
URL = re.compile(r"https?://\S+", re.IGNORECASE)

# A failed card was finished showing the failure and cannot carry the answer any more: a replay opens a new one.
_FAILED_CARD_FIELDS = ("card_track", "card_created", "card_deliver_started", "card_sent", "card_delivered")

# One step, so that two replays (of one letter, or of two letters of one message) cannot both act, and a record a
# worker resumes meanwhile is never reset or deleted under it. Every key is in the namespace's core slot.
# KEYS: the dead letters, the message's reply record, the ready set (the scheduler's slot).
# ARGV: core prefix, letter id, lane, entry json, weight, then the fields a reset drops.
# The record is reset only while it says failed: with an answer, to `committed` (the answer, `sent`, `started`, the
# pieces' marks and every once-only step kept, so the worker resumes where delivery stopped: a piece sent again
# would be doubled, or on 微信客服 refused for its used msgid), without one deleted (composed afresh). The entry is
# queued as the scheduler's enqueue script does (no dedup: the dedup key stays taken) and the letter dropped.
# Returns {-1, ''} when the letter is gone (nothing changed), else {1 if the record was reset or deleted else 0,
# the record's state before ('' when there was none)}.
_REPLAY = (
    QUEUE_LUA
    + """
local ns, lane = ARGV[1], ARGV[3]
if #redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2]) == 0 then return {-1, ''} end
local state = redis.call('HGET', KEYS[2], 'state') or ''
local reset = 0
if state == 'failed' then
  reset = 1
  if redis.call('HEXISTS', KEYS[2], 'text') == 1 then
    redis.call('HDEL', KEYS[2], 'reason', unpack(ARGV, 6))
    redis.call('HSET', KEYS[2], 'state', 'committed')
  else
    redis.call('DEL', KEYS[2])
  end
end
append(ns, lane, ARGV[4], ARGV[5])
redis.call('XDEL', KEYS[1], ARGV[2])
return {reset, state}
"""
)


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

    def shown(self, with_urls: bool = False) -> dict:
        """The letter as `dlq show` prints it: without the reply target's URLs (anyone who reads them can post into
        the conversation), as the console shows it, unless `with_urls`."""
        raw = self.raw if with_urls else URL.sub("[URL]", self.raw)  # an unreadable letter's text may name them too
        entry = self.entry.wire() if self.entry is not None else {"raw": raw}
        if not with_urls and isinstance(entry.get("msg"), dict) and isinstance(entry["msg"].get("reply_to"), dict):
            reply_to = entry["msg"]["reply_to"]
            entry["msg"]["reply_to"] = {
                key: "(hidden)" if key in REPLY_URL_FIELDS and value else value for key, value in reply_to.items()
            }
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


class ReportedUndelivered(ValueError):
    """A dead letter of an answer the platform accepted and later reported undelivered (微信客服 msg_send_fail): not
    replayed (its pieces' msgids are used; the customer refused, or the session ended), only purged."""

    def __str__(self) -> str:
        letter_id, piece, fail_type = self.args
        return (f"{letter_id}: the platform reported piece {piece} undelivered (fail_type {fail_type}); not replayed: "
                "reach the customer another way, then purge the letter")


class DeadLetters:
    def __init__(self, redis: Redis, keys: Keys, scheduler: Scheduler, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._scheduler = scheduler
        self._settings = settings
        self._replay = redis.register_script(_REPLAY)

    @staticmethod
    def _letter(letter_id: bytes | str, fields: dict) -> DeadLetter:
        """A stream item as a letter; one that is not what botgw writes (no `entry`, not JSON, not an object: by hand,
        or a broken client) is an unreadable letter, never an error that hides the whole list (found by a review)."""
        try:
            body = json.loads(as_text(fields[b"entry"]))
        except (KeyError, ValueError):
            raw = json.dumps({as_text(key): as_text(value) for key, value in fields.items()}, ensure_ascii=False)
            return DeadLetter(as_text(letter_id), "not a letter botgw wrote", None, raw)
        if not isinstance(body, dict):
            raw = json.dumps(body, ensure_ascii=False)
            return DeadLetter(as_text(letter_id), "not a letter botgw wrote", None, raw)
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
        upper = older_than(before)
        if upper is None:
            return []
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
        """Queue the message again (same dedup key) and drop the dead letter, in one step with the reset of its
        reply record (`_REPLAY`): a failed answer resumes from its first piece not delivered, never from piece 0.

        One step: a replay cut off (a killed process) did all or nothing, and of two replays of one letter at once
        (two operators) only one acts; the other finds the letter gone (NoSuchDeadLetter). A record that no longer
        says failed (delivered, or being resumed by a worker after another letter of the message was replayed) is
        left as it is, and the entry queued behind finds the answer done and sends nothing."""
        letter = await self.get(letter_id)
        message = letter.message
        state = await self.reply_state(letter)
        if state.send_failed and state.state == "done":
            # 微信客服's msg_send_fail: sent, then reported undelivered (the session expired or closed, the customer
            # refused). A replay queued an entry that sent nothing and said "already delivered" (found by a review):
            # the letter stays, for an operator to deal with and purge.
            fail_type, _, piece = state.send_failed.partition(":")
            raise ReportedUndelivered(letter_id, piece, fail_type)
        scope = Scope.of(message, self._settings.memory.group)
        assert letter.entry is not None  # `message` said so
        entry = QueueEntry(owner=scope.owner, kind=letter.entry.kind, message=message, notice=letter.entry.notice,
                           request_id=letter.entry.request_id, servicer=letter.entry.servicer,
                           event=letter.entry.event, merged=letter.entry.merged)  # fmt: skip
        keys = [self._keys.dead_letters, self._keys.reply(message.dedup_key), self._keys.scheduler_ready]
        args = [self._keys.core, letter_id, scope.lane, entry.to_json(), self._settings.worker.weight(message.bot_id)]
        acted, state = await self._replay(keys=keys, args=[*args, *_FAILED_CARD_FIELDS])
        if int(acted) < 0:
            raise NoSuchDeadLetter(letter_id)
        return "already delivered: will not be sent again" if as_text(state) == "done" else "queued"

    async def purge(self, letter_ids: list[str]) -> int:
        """Drop these dead letters (all of them when the list is empty, counted: XLEN then DEL dropped one that
        arrived between the two uncounted)."""
        if letter_ids:
            return int(await self._redis.xdel(self._keys.dead_letters, *letter_ids))
        purged, start = 0, "-"
        while items := await self._redis.xrange(self._keys.dead_letters, min=start, max="+", count=PURGE_BATCH):
            purged += int(await self._redis.xdel(self._keys.dead_letters, *(letter for letter, _ in items)))
            if len(items) < PURGE_BATCH:
                break
            start = "(" + as_text(items[-1][0])
        return purged
