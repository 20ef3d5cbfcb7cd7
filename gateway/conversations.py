"""Conversations on platforms with human agents (微信客服): who holds one, the reply quota, handoff.

The holder is cached in Redis per conversation (every worker sees one answer) and refreshed from the
platform when the cache is empty; events and our own moves update it. The quota counts messages sent
since the person last wrote; it is renewed when the pull finds a new message of theirs, and one slot is
always left for the handoff notice.
"""

from __future__ import annotations

import logging
import time

from redis.asyncio import Redis

from bots.base import InboundMessage, Owner, ReplyQuota
from gateway import metrics
from gateway.keys import Keys
from gateway.memory import GroupMemory, Scope
from gateway.redis_text import as_text

log = logging.getLogger(__name__)
OWNER_CACHE_S = 600  # a holder learnt from the platform is asked again after this; events update it sooner

# KEYS: quota hash {used, since}. ARGV: limit, slots kept back. Returns 1 when a slot was taken, 0 when none
# is left (or the window since the person last wrote has passed: the hash is gone).
_TAKE_SLOT = """
local used = redis.call('HGET', KEYS[1], 'used')
if not used then return 0 end
if tonumber(used) + 1 > tonumber(ARGV[1]) - tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'used', 1)
return 1
"""

# KEYS: quota hash. ARGV: when the person wrote, the window (s), now. A message newer than the last one that
# renewed the allowance starts it again; handling the same message twice (a takeover) does not.
_RENEW = """
local since = tonumber(redis.call('HGET', KEYS[1], 'since') or '-1')
if tonumber(ARGV[1]) <= since then return 0 end
local left = math.floor(tonumber(ARGV[1]) + tonumber(ARGV[2]) - tonumber(ARGV[3]))
if left <= 0 then return 0 end
redis.call('HSET', KEYS[1], 'used', 0, 'since', ARGV[1])
redis.call('EXPIRE', KEYS[1], left)
return 1
"""


class Conversations:
    """The holder cache, the reply quota and the handoff, for adapters that have `sessions`."""

    def __init__(self, redis: Redis, keys: Keys, group: GroupMemory) -> None:
        self._redis = redis
        self._keys = keys
        self._group = group
        self._take_slot = redis.register_script(_TAKE_SLOT)
        self._renew = redis.register_script(_RENEW)

    def _lane(self, message: InboundMessage) -> str:
        return Scope.of(message, self._group).lane

    async def owner(self, adapter, message: InboundMessage) -> Owner:  # type: ignore[no-untyped-def]
        """Who holds the conversation: the cache, else the platform (then cached)."""
        key = self._keys.conversation_owner(self._lane(message))
        cached = await self._redis.get(key)
        if cached is not None:
            return as_text(cached)  # type: ignore[return-value]
        owner = await adapter.sessions.owner(message.reply_to)
        await self._redis.set(key, owner, ex=OWNER_CACHE_S)
        return owner

    async def set_owner(self, message: InboundMessage, owner: Owner) -> None:
        await self._redis.set(self._keys.conversation_owner(self._lane(message)), owner, ex=OWNER_CACHE_S)

    async def take(self, adapter, message: InboundMessage) -> None:  # type: ignore[no-untyped-def]
        """The bot takes a conversation nobody holds, before answering it."""
        await adapter.sessions.take(message.reply_to)
        await self.set_owner(message, "bot")

    async def renew_quota(self, message: InboundMessage, quota: ReplyQuota) -> None:
        """The person wrote (at `message.received_at`): their allowance starts again, for the platform's window."""
        args = [f"{message.received_at:.3f}", quota.window_s, f"{time.time():.3f}"]
        await self._renew(keys=[self._keys.reply_quota(self._lane(message))], args=args)

    async def quota_left(self, message: InboundMessage, quota: ReplyQuota) -> int:
        """Answer messages that may still be sent (the handoff's slot not counted)."""
        used = await self._redis.hget(self._keys.reply_quota(self._lane(message)), "used")
        return 0 if used is None else max(0, quota.limit - quota.reserve - int(used))

    async def take_slot(self, message: InboundMessage, quota: ReplyQuota, *, for_handoff: bool = False) -> bool:
        """Count one message against the quota; False when it may not be sent."""
        keep = 0 if for_handoff else quota.reserve
        key = self._keys.reply_quota(self._lane(message))
        return bool(await self._take_slot(keys=[key], args=[quota.limit, keep]))

    async def hand_off(self, adapter, message: InboundMessage, servicer: str | None = None) -> str:  # type: ignore[no-untyped-def]
        """Give the conversation to a human, then send the notice with the code the move returned (in the slot
        kept for it). Returns the code ('' when the platform gave none: no notice can be sent then)."""
        sessions = adapter.sessions
        code = await sessions.hand_off(message.reply_to, servicer)
        await self.set_owner(message, "human")
        metrics.HANDOFFS.labels(message.platform, "agent" if servicer else "pool").inc()
        log.info("conversation handed to a human", extra={"bot_id": message.bot_id, "to": servicer or "pool"})
        quota = adapter.reply_quota
        if code and (quota is None or await self.take_slot(message, quota, for_handoff=True)):
            await sessions.send_notice(message.reply_to, code, sessions.handoff_text(), f"handoff:{message.dedup_key}")
        return code
