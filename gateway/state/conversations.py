"""Conversations on platforms with human agents (微信客服): who holds one, the reply quota, handoff.

The holder is cached in Redis per conversation (every worker sees one answer) and refreshed from the
platform when the cache is empty; events and our own moves update it. The quota counts messages sent
since the person last wrote; it is renewed when the pull finds a new message of theirs, and one slot is
always left for the handoff notice.

WeCom counts the 5 from the moment the person wrote, not from when botgw handles their message: whatever we
sent after they wrote (an answer to their previous message still being written, a welcome) counts in the new
window. So every slot is stamped with when it was taken, and a renewal keeps the slots taken since the person
wrote (less QUOTA_GRACE_S: a send taken just before may land after), instead of starting again at 0.

Every write here is fenced by the writing worker's lease (a stale worker changes nothing), and each
once-only step of a handoff is marked in the reply record after it happened: a retry after a failure
repeats only what did not happen yet.
"""

from __future__ import annotations

import logging
import time
from typing import cast

from redis.asyncio import Redis

from bots.base import InboundMessage, Owner, ReplyQuota, Sessions
from gateway import metrics
from gateway.state.handoffs import Handoffs
from gateway.state.keys import Keys
from gateway.state.memory import GroupMemory, Scope
from gateway.state.redis_text import as_text
from gateway.state.reply_record import FENCE_LUA, Fence, FencedValues, LeaseLost, ReplyRecord, fence_args

log = logging.getLogger(__name__)
OWNER_CACHE_S = 600  # a holder learnt from the platform is asked again after this; events update it sooner
# A renewal also counts the slots taken this long before the person wrote: a send begun then may reach WeCom after
# their message (the platform's send_time is whole seconds; a request in flight). Longer over-counts a quick reply
# (seed 219 at 20 s withheld an answer WeCom allowed); a resend begun before they wrote that lands much later is
# not covered.
QUOTA_GRACE_S = 2.0

_FENCED = FENCE_LUA + "\nif fenced() then return -1 end\n"

# KEYS: lease (the record when unfenced), quota hash {used, since, at}, reply record. ARGV: epoch ('' = unfenced),
# limit, slots kept back, record ttl, no window is fine ('1': a welcome before the person wrote), now, the window
# (s), then field/value pairs to mark in the record with the slot. Returns 1 when a slot was taken (and the marks
# written, in the same step: a crash can neither send without a slot counted nor count a slot for a send that is
# not recorded as begun), 2 when there is no window and that is fine (marks written), 0 when none is left (or the
# window since the person last wrote has passed: the hash is gone), -1 when the lease is lost. Every send (1 or 2)
# is stamped in `at` (the last `limit` stamps): a renewal counts those taken since the person wrote.
_TAKE_SLOT = (
    _FENCED
    + """
local function mark()
  if #ARGV > 7 then
    for i = 8, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
    redis.call('EXPIRE', KEYS[3], ARGV[4])
  end
end
local function stamp()
  local at = {}
  for t in string.gmatch(redis.call('HGET', KEYS[2], 'at') or '', '%S+') do at[#at + 1] = t end
  at[#at + 1] = ARGV[6]
  local limit = tonumber(ARGV[2])
  while #at > limit do table.remove(at, 1) end
  redis.call('HSET', KEYS[2], 'at', table.concat(at, ' '))
  if redis.call('TTL', KEYS[2]) < 0 then redis.call('EXPIRE', KEYS[2], ARGV[7]) end
end
local used = redis.call('HGET', KEYS[2], 'used')
if not used then
  if ARGV[5] == '1' then stamp() mark() return 2 end
  return 0
end
if tonumber(used) + 1 > tonumber(ARGV[2]) - tonumber(ARGV[3]) then return 0 end
redis.call('HINCRBY', KEYS[2], 'used', 1)
stamp()
mark()
return 1
"""
)

# KEYS: lease (the quota hash when unfenced), quota hash. ARGV: epoch, when the person wrote, the window (s),
# now, the grace (s). A message newer than the last one that renewed the allowance starts it again, with the
# slots stamped since the person wrote (less the grace) still counted: WeCom counts what reached it after their
# message, and botgw may have sent that (the answer to their previous message, a welcome) before it handled this
# one. Handling the same message twice (a takeover) does not renew.
_RENEW = (
    _FENCED
    + """
local since = tonumber(redis.call('HGET', KEYS[2], 'since') or '-1')
if tonumber(ARGV[2]) <= since then return 0 end
local left = math.floor(tonumber(ARGV[2]) + tonumber(ARGV[3]) - tonumber(ARGV[4]))
if left <= 0 then return 0 end
local from, used = tonumber(ARGV[2]) - tonumber(ARGV[5]), 0
for t in string.gmatch(redis.call('HGET', KEYS[2], 'at') or '', '%S+') do
  if tonumber(t) >= from then used = used + 1 end
end
redis.call('HSET', KEYS[2], 'used', used, 'since', ARGV[2])
redis.call('EXPIRE', KEYS[2], left)
return 1
"""
)

# KEYS: quota hash. ARGV: slots to give back (negative: take), the limit. Bounded to [0, limit]; 0 if the hash
# is gone (the window passed).
_ADJUST = """
local used = redis.call('HGET', KEYS[1], 'used')
if not used then return 0 end
local now = math.max(0, math.min(tonumber(ARGV[2]), tonumber(used) - tonumber(ARGV[1])))
redis.call('HSET', KEYS[1], 'used', now)
return 1
"""

# KEYS: quota hash. ARGV: the stamp of the slot to give back, the grace (s). A send refused outright took a slot
# for nothing: its stamp goes (a renewal would count it again), and `used` loses it where the current window
# counted it (taken in the window, or stamped since the person wrote, less the grace). 0 when the stamp is not
# there (the hash is gone, or the slot was given back already).
_RETURN = """
local kept, found = {}, false
for t in string.gmatch(redis.call('HGET', KEYS[1], 'at') or '', '%S+') do
  if not found and t == ARGV[1] then found = true else kept[#kept + 1] = t end
end
if not found then return 0 end
redis.call('HSET', KEYS[1], 'at', table.concat(kept, ' '))
local used, since = redis.call('HGET', KEYS[1], 'used'), redis.call('HGET', KEYS[1], 'since')
if used and since and tonumber(used) > 0 and tonumber(ARGV[1]) >= tonumber(since) - tonumber(ARGV[2]) then
  redis.call('HINCRBY', KEYS[1], 'used', -1)
end
return 1
"""


class Conversations:
    """The holder cache, the reply quota and the handoff, for adapters that have `sessions`."""

    def __init__(self, redis: Redis, keys: Keys, group: GroupMemory) -> None:
        self._redis = redis
        self._keys = keys
        self._group = group
        self._values = FencedValues(redis)
        self._take_slot = redis.register_script(_TAKE_SLOT)
        self._renew = redis.register_script(_RENEW)
        self._adjust = redis.register_script(_ADJUST)
        self._return = redis.register_script(_RETURN)
        self.handoffs = Handoffs(redis, keys)  # the console's register of customers handed to a human

    def _lane(self, message: InboundMessage) -> str:
        return Scope.of(message, self._group).lane

    async def owner(self, sessions: Sessions, message: InboundMessage, fence: Fence | None = None) -> Owner:
        """Who holds the conversation: the cache, else the platform (then cached)."""
        key = self._keys.conversation_owner(self._lane(message))
        cached = await self._redis.get(key)
        if cached is not None:
            return cast(Owner, as_text(cached))  # written only by set_owner
        owner = await sessions.owner(message.reply_to)
        await self.set_owner(message, owner, fence)
        return owner

    async def set_owner(self, message: InboundMessage, owner: Owner, fence: Fence | None = None) -> None:
        await self._values.set(fence, self._keys.conversation_owner(self._lane(message)), owner, OWNER_CACHE_S)

    async def take(self, sessions: Sessions, message: InboundMessage, fence: Fence | None = None) -> None:
        """The bot takes a conversation nobody holds, before answering it."""
        await sessions.take(message.reply_to)
        # The holder cached and the customer out of the handoff register, in the one round trip the cache took.
        await self.handoffs.taken(message, self._keys.conversation_owner(self._lane(message)), OWNER_CACHE_S, fence)

    async def renew_quota(self, message: InboundMessage, quota: ReplyQuota, fence: Fence | None = None) -> None:
        """The person wrote (at `message.received_at`): their allowance starts again, for the platform's window,
        less what botgw sent since they wrote (WeCom counts from their message, not from our handling of it)."""
        key = self._keys.reply_quota(self._lane(message))
        lease_key, epoch = fence_args(fence, key)
        args = [epoch, f"{message.received_at:.3f}", quota.window_s, f"{time.time():.3f}", QUOTA_GRACE_S]
        if int(await self._renew(keys=[lease_key, key], args=args)) < 0:
            raise LeaseLost(key)

    async def quota_left(self, message: InboundMessage, quota: ReplyQuota) -> int:
        """Answer messages that may still be sent (the handoff's slot not counted)."""
        used = await self._redis.hget(self._keys.reply_quota(self._lane(message)), "used")
        return 0 if used is None else max(0, quota.limit - quota.reserve - int(used))

    async def take_slot(
        self,
        message: InboundMessage,
        quota: ReplyQuota,
        record: ReplyRecord,
        marks: dict[str, str | int],
        *,
        for_handoff: bool = False,
        outside_window_ok: bool = False,
        at: float | None = None,
    ) -> bool:
        """Count one message against the quota and mark `marks` in the reply record, together and under the
        record's lease; False when it may not be sent. `outside_window_ok`: a message bound to an event code
        (a welcome, the handoff notice) may go when botgw knows of no window (the person has not written yet, or
        their message is not handled yet); it is counted when they have (and, stamped, by the renewal of a
        message they wrote before it went). `at`: the slot's stamp (now), for `return_slot`."""
        keep = 0 if for_handoff else quota.reserve
        key = self._keys.reply_quota(self._lane(message))
        lease_key, epoch = fence_args(record.fence, record.key)
        stamp = time.time() if at is None else at
        argv: list[str | int] = [epoch, quota.limit, keep, record.ttl_s, "1" if outside_window_ok else "",
                                f"{stamp:.3f}", quota.window_s]
        for name, value in marks.items():
            argv += [name, value]
        taken = int(await self._take_slot(keys=[lease_key, key, record.key], args=argv))
        if taken < 0:
            raise LeaseLost(record.key)
        return bool(taken)

    async def give_back(self, message: InboundMessage, quota: ReplyQuota, slots: int) -> None:
        """The platform says messages we counted did not count (or counted more: `slots` < 0)."""
        await self._adjust(keys=[self._keys.reply_quota(self._lane(message))], args=[slots, quota.limit])

    async def return_slot(self, message: InboundMessage, at: float) -> None:
        """The platform refused outright a send that took the slot stamped `at` (take_slot): nothing reached the
        person, so neither the slot nor its stamp counts against them (a renewal recounts the stamps)."""
        await self._return(keys=[self._keys.reply_quota(self._lane(message))], args=[f"{at:.3f}", QUOTA_GRACE_S])

    async def hand_off(
        self,
        sessions: Sessions,
        quota: ReplyQuota | None,
        message: InboundMessage,
        record: ReplyRecord,
        servicer: str | None = None,
    ) -> str:
        """Give the conversation to a human, then send the notice with the code the move returned (in the slot
        kept for it). Returns the code ('' when the platform gave none: no notice can be sent then).

        Resumable: the move is marked (with its code) after it happened, the notice after it was sent, so a
        retry after a failure anywhere repeats only the step that did not happen."""
        state = await record.load()
        if state.handoff_code:
            code = "" if state.handoff_code == "-" else state.handoff_code
        else:
            code = await sessions.hand_off(message.reply_to, servicer)
            await record.mark(handoff_code=code or "-")
            metrics.HANDOFFS.labels(message.platform, "agent" if servicer else "pool").inc()
            log.info("conversation handed to a human", extra={"bot_id": message.bot_id, "to": servicer or "pool"})
        # After the move, and again on a retry that found it marked (a worker that died between the mark and this
        # line left the customer out of the console's list): the register keeps the first `since`.
        await self.handoffs.handed(message, servicer, record.fence)
        await self.set_owner(message, "human", record.fence)
        if not code or state.handoff_notice_sent:
            return code
        resend = bool(state.handoff_notice_started)
        if not resend:
            marks: dict[str, str | int] = {"handoff_notice_started": "1"}
            if quota is None:
                await record.mark(**marks)
            # Bound to the move's msg_code, like a welcome to its welcome_code: it goes when botgw knows of no window
            # yet (an operator's handoff can overtake the pull of the customer's messages: model seed 219).
            elif not await self.take_slot(message, quota, record, marks, for_handoff=True, outside_window_ok=True):
                log.warning("no message left in the customer's allowance for the handoff notice")
                return code
        await sessions.send_notice(
            message.reply_to, code, sessions.handoff_text(), f"handoff:{message.dedup_key}", resend=resend
        )
        await record.mark(handoff_notice_sent="1")
        return code
