"""One queue entry: the only shape work has between the edge, the queue and the workers.

Entries are JSON in Redis lists; the scheduler's Lua scripts read three fields of them (`id`, `t`, `u`), so the
wire names stay short and stable: entries queued by the release before this model are read by it, and the other
way round during a rolling upgrade. An entry a worker cannot read (not JSON, a field missing, a kind this release
does not know) becomes a dead letter kept raw (`botgw dlq show`), and its conversation goes on. Everything in
Python goes through `QueueEntry`: written with `to_json`, read with `QueueEntry.from_json`, never spliced or picked
apart by hand.
"""

from __future__ import annotations

import json
import secrets
import time
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from bots.base import InboundMessage


class EntryKind(StrEnum):
    """What a worker does with an entry (gateway/worker/dispatch.py)."""

    CHAT = "chat"  # a person's message: answered
    NOTICE = "notice"  # a text to send as it is (a group robot's push, an operator's alert)
    PULL = "pull"  # a pulled channel's "there is something new" (微信客服): fetch it
    AGENT = "agent"  # what a human agent wrote in a pulled channel: remembered, not answered
    EVENT = "event"  # a pulled channel's platform event (session moved, welcome, delivery failed)
    HANDOFF = "handoff"  # an operator's handoff of a conversation to a human


def _new_id() -> str:
    return f"{time.time_ns():x}-{secrets.token_hex(4)}"


def _now_ms() -> int:
    return int(time.time() * 1000)


class QueueEntry(BaseModel):
    """A unit of work in a lane. Optional fields are left out of the JSON when unset."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    entry_id: str = Field(default_factory=_new_id, alias="id")
    enqueued_ms: int = Field(default_factory=_now_ms, alias="t")
    owner: str = Field(alias="u", description="whose turn it is in the fair order (a person, or a group)")
    kind: EntryKind = EntryKind.CHAT
    request_id: str | None = Field(default=None, alias="rid", description="follows the message into every log")
    notice: str | None = None  # kind notice: the text
    servicer: str | None = None  # kind handoff: the agent asked for ('' or None = the queue)
    event: str | None = None  # kind event: the platform's event as JSON, as the adapter pulled it
    merged: list[str] | None = None  # the ids of messages absorbed into this one (a burst answered together)
    message: InboundMessage = Field(alias="msg")

    @property
    def enqueued_at(self) -> float:
        return self.enqueued_ms / 1000

    def event_fields(self) -> dict:
        return json.loads(self.event) if self.event else {}

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)

    def wire(self) -> dict:
        """The entry as the JSON object it is in Redis (for a dead letter, which embeds it)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> QueueEntry:
        return cls.model_validate_json(raw)
