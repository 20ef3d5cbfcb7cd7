"""Per-session conversation memory in Redis: turns with their token counts, trimmed to a budget.

Each turn is stored with its size in the engine's own tokens (counted once, when it is
stored: the user's text by vLLM's /tokenize, the answer by the engine's usage), so that
trimming to the budget needs no tokenizer at read time and never counts characters.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from bots.base import InboundMessage
from gateway.state.keys import Keys
from gateway.state.riders import Rider

GroupMemory = Literal["per_user", "shared"]
ADOPTED_MEMO_SIZE = 100_000  # sessions remembered as adopted; past that the memo starts over (Redis still knows)

# KEYS: the adopted mark, the old name, the name now; ARGV: the mark's TTL (s). The old memory moves only the
# first time, and only if there is one and the name now holds none. Returns 1 when it moved, else 0.
_ADOPT_ONCE = """
if redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[1]) then
  if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('RENAME', KEYS[2], KEYS[3])
    return 1
  end
end
return 0
"""


@dataclass(frozen=True)
class Turn:
    """One message of the conversation as the engine saw it."""

    role: str
    content: str
    tokens: int

    def to_json(self) -> str:
        """The turn as kept in a memory list (read back by turns_of): 3.7 µs, where dataclasses.asdict (a deep copy
        field by field) and json.dumps took 8.7."""
        return json.dumps({"role": self.role, "content": self.content, "tokens": self.tokens}, ensure_ascii=False)


def turns_of(raw: list) -> list[Turn]:
    """The turns of a memory list as Redis returns it (LRANGE)."""
    return [Turn(**json.loads(item)) for item in raw]


def fit_to_budget(turns: list[Turn], budget_tokens: int) -> list[Turn]:
    """The newest turns whose tokens fit the budget, starting at a user turn (never a lone answer)."""
    kept: list[Turn] = []
    used = 0
    for turn in reversed(turns):
        if used + turn.tokens > budget_tokens:
            break
        kept.append(turn)
        used += turn.tokens
    kept.reverse()
    while kept and kept[0].role != "user":
        kept.pop(0)
    return kept


@dataclass(frozen=True)
class Scope:
    """The unit of memory, which is also the unit of ordering (the scheduler's lane), and whose turn it is.

    With `per_user` every member of a group has a conversation of their own, so members are answered in
    parallel; with `shared` the group is one conversation, answered in order. `owner` is who is given
    fair turns and the per-user concurrency cap: the sender (the qualified person, whichever bot they write
    to), or the group when it is shared.
    """

    lane: str
    owner: str

    @classmethod
    def of(cls, message: InboundMessage, group: GroupMemory) -> Scope:
        if group == "shared":
            return cls(message.conversation_key, message.conversation_key)
        return cls(message.session_key, message.person)


@dataclass
class _Adoption:
    """ConversationMemory.adopt, sent with the reply record's first load."""

    memory: ConversationMemory
    session_key: str
    keys: list[str]

    def queue(self, pipe: Pipeline) -> None:
        script = self.memory._adopt_once
        pipe.execute_command("EVALSHA", script.sha, len(self.keys), *self.keys, self.memory.ttl_s)

    def answer(self, result: object) -> None:
        if not isinstance(result, Exception):
            self.memory._adopted_now(self.session_key)


class ConversationMemory:
    """Reads and clears a session's turns; the reply record appends an exchange atomically with the answer."""

    def __init__(self, redis: Redis, keys: Keys, ttl_s: int, max_turns: int) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s
        self._max_items = max_turns * 2
        self._adopt_once = redis.register_script(_ADOPT_ONCE)
        self._adopted: dict[str, float] = {}  # session -> monotonic time its adopted mark expires (this process)

    async def load_scripts(self) -> None:
        """Load the adoption script, which a rider calls by its SHA (evalsha in a pipeline does not load)."""
        await self._redis.script_load(_ADOPT_ONCE)

    async def adopt(self, session_key: str, old_name: str) -> bool:
        """Move a session's memory kept under an older name (one-to-one memory kept per bot, before it followed
        the person) under its name now: the first time the person writes after the upgrade, and only then.

        Once: a later /reset leaves the person's memory empty, and an old name adopted then would bring back
        what they cleared (the old memory of another bot they wrote to is not adopted at all: it expires within
        `ttl_s`, as the mark does, so no old name outlives the mark). All three keys are in the core slot.
        Asked once per session and process (a memo as long-lived as the mark): it ran on every message before.
        True when the old memory moved (what was read under the name now is out of date)."""
        if not self._may_adopt(session_key, old_name):
            return False
        moved = int(await self._adopt_once(keys=self._adopt_keys(session_key, old_name), args=[self._ttl_s]))
        self._adopted_now(session_key)
        return bool(moved)

    def adoption(self, session_key: str, old_name: str) -> Rider | None:
        """`adopt` as a rider of the reply record's first load (the memory read there follows the move); None
        when there is nothing to ask. If it fails, `adopt` asks again."""
        if not self._may_adopt(session_key, old_name):
            return None
        return _Adoption(self, session_key, self._adopt_keys(session_key, old_name))

    def _may_adopt(self, session_key: str, old_name: str) -> bool:
        """False when there is no older name, or this process set or saw the mark (as long-lived as the memo)."""
        if not old_name or old_name == session_key:
            return False
        return self._adopted.get(session_key, 0.0) <= time.monotonic()

    def _adopt_keys(self, session_key: str, old_name: str) -> list[str]:
        return [self._keys.memory_adopted(session_key), self._keys.memory(old_name), self._keys.memory(session_key)]

    def _adopted_now(self, session_key: str) -> None:
        if len(self._adopted) >= ADOPTED_MEMO_SIZE:
            self._adopted.clear()
        self._adopted[session_key] = time.monotonic() + self._ttl_s

    async def load(self, session_key: str) -> list[Turn]:
        return turns_of(await self._redis.lrange(self._keys.memory(session_key), 0, -1))

    async def clear(self, session_key: str) -> None:
        await self._redis.delete(self._keys.memory(session_key))

    @property
    def max_items(self) -> int:
        """How many turns a session keeps (two per exchange); 0 keeps all."""
        return self._max_items

    @property
    def ttl_s(self) -> int:
        return self._ttl_s
