"""Per-session conversation memory in Redis: turns with their token counts, trimmed to a budget.

Each turn is stored with its size in the engine's own tokens (counted once, when it is
stored: the user's text by vLLM's /tokenize, the answer by the engine's usage), so that
trimming to the budget needs no tokenizer at read time and never counts characters.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from gateway.keys import Keys


@dataclass(frozen=True)
class Turn:
    """One message of the conversation as the engine saw it."""

    role: str
    content: str
    tokens: int


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


class ConversationMemory:
    """Reads a session's turns; appends an exchange inside the caller's transaction."""

    def __init__(self, redis: Redis, keys: Keys, ttl_s: int, max_turns: int) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s
        self._max_items = max_turns * 2

    async def load(self, session_key: str) -> list[Turn]:
        raw = await self._redis.lrange(self._keys.memory(session_key), 0, -1)
        return [Turn(**json.loads(item)) for item in raw]

    async def clear(self, session_key: str) -> None:
        await self._redis.delete(self._keys.memory(session_key))

    def append_exchange(self, pipe: Pipeline, session_key: str, user: Turn, assistant: Turn) -> None:
        """Queue the append on `pipe`, so it commits atomically with the reply record."""
        key = self._keys.memory(session_key)
        pipe.rpush(key, json.dumps(asdict(user), ensure_ascii=False), json.dumps(asdict(assistant), ensure_ascii=False))
        if self._max_items:
            pipe.ltrim(key, -self._max_items, -1)
        pipe.expire(key, self._ttl_s)
