"""The register of 微信客服 customers handed to a human, for the console's 微信客服 page.

WeCom has no call that lists the sessions waiting in its pool (service_state/get answers for one customer named),
so botgw keeps its own list: a customer enters it when a handoff's move (service_state/trans) has happened
(Conversations.hand_off marks it after the move), a session_status_change event updates it (1 an agent took the
customer from the pool, 2 transferred, 4 an ended session taken up again: an agent holds it; 3 ended: out), and the
customer leaves it when the bot takes the conversation (Conversations.take) or the console finds the session over.
Handoffs made in WeCom's own app enter it once their events arrive.

Per bot, a sorted set of customers by when they were handed over, and a hash per customer; each write refreshes the
entry's life to a session's (48 h from the customer's last message), and the set keeps at most MAX_ENTRIES. Only
handoffs, those events and the bot's take write here: the ordinary answer path never touches it (the take's write
rides in the one round trip that caches the holder). Writes are fenced by the writer's lease, as the holder cache is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis

from bots.base import InboundMessage
from gateway.state.keys import Keys
from gateway.state.redis_text import as_text
from gateway.state.reply_record import FENCE_LUA, Fence, LeaseLost, fence_args

ENTRY_TTL_S = 48 * 3600  # a 微信客服 session lasts 48 h from the customer's last message (wecom-kf.md §6)
MAX_ENTRIES = 10_000  # per bot: the oldest go first
STATE_POOL, STATE_AGENT = 2, 3  # service_state: waiting in the pool, held by an agent (servicer)
STATUS_CHANGE = "session_status_change"
CHANGE_ENDED = 3  # change_type: 1 taken from the pool, 2 transferred, 3 ended, 4 an ended session taken up again

_FENCED = FENCE_LUA + "\nif fenced() then return -1 end\n"

# KEYS: lease (the entry when unfenced), index, entry. ARGV: epoch, member, now, state, servicer, ttl, max entries,
# open_kfid, external_userid, via. The entry keeps the time it was first handed over (`since`, the index's score).
_UPSERT = (
    _FENCED
    + """
local since = redis.call('HGET', KEYS[3], 'since') or ARGV[3]
redis.call('HSET', KEYS[3], 'open_kfid', ARGV[8], 'external_userid', ARGV[9], 'state', ARGV[4],
           'servicer', ARGV[5], 'since', since, 'changed', ARGV[3], 'via', ARGV[10])
redis.call('EXPIRE', KEYS[3], ARGV[6])
redis.call('ZADD', KEYS[2], since, ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[3]) - 2 * tonumber(ARGV[6])))
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[7])
if over > 0 then
  local oldest = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #oldest, 2 do redis.call('DEL', KEYS[2] .. ':' .. oldest[i]) end
end
return 1
"""
)

# KEYS: lease (the entry when unfenced), index, entry. ARGV: epoch, member, the `since` it must still have ('' any).
_FORGET = (
    _FENCED
    + """
if ARGV[3] ~= '' and redis.call('HGET', KEYS[3], 'since') ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
"""
)

# KEYS: lease (the holder key when unfenced), holder key, index, entry. ARGV: epoch, ttl, holder, member.
_TAKEN = (
    _FENCED
    + """
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[2])
redis.call('DEL', KEYS[4])
redis.call('ZREM', KEYS[3], ARGV[4])
return 1
"""
)


@dataclass(frozen=True)
class Handoff:
    """One customer in the register: what botgw last knew of their session."""

    bot_id: str
    open_kfid: str
    external_userid: str
    state: int  # 2 pool, 3 an agent
    servicer: str  # the agent's userid (state 3), '' in the pool
    since: float  # when handed to a human (the wait starts here)
    changed: float  # the last move or event
    via: str  # 'handoff' (botgw moved them) or 'event:<change_type>' (the platform told)
    raw_since: str = ""  # `since` as stored: forget() removes only the entry it read

    @property
    def member(self) -> str:
        return member_of(self.open_kfid, self.external_userid)


def member_of(open_kfid: str, external_userid: str) -> str:
    return f"{open_kfid}/{external_userid}"


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


class Handoffs:
    """Writes and reads of the register (the scripts are registered once per process)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._upsert = redis.register_script(_UPSERT)
        self._forget = redis.register_script(_FORGET)
        self._taken = redis.register_script(_TAKEN)

    def _where(self, message: InboundMessage) -> tuple[str, str, str]:
        """(index, entry, member) of the customer a message names (reply_to: the account and the customer)."""
        index = self._keys.kf_handoffs(message.bot_id)
        member = member_of(message.reply_to.chat_id or "", message.reply_to.user_id or "")
        return index, f"{index}:{member}", member

    async def _write(self, message: InboundMessage, state: int, servicer: str, via: str, fence: Fence | None,
                     now: float | None) -> None:  # fmt: skip
        now = time.time() if now is None else now
        index, entry, member = self._where(message)
        lease_key, epoch = fence_args(fence, entry)
        argv = [epoch, member, f"{now:.3f}", state, servicer, ENTRY_TTL_S, MAX_ENTRIES,
                message.reply_to.chat_id or "", message.reply_to.user_id or "", via]  # fmt: skip
        if int(await self._upsert(keys=[lease_key, index, entry], args=argv)) < 0:
            raise LeaseLost(entry)

    async def handed(self, message: InboundMessage, servicer: str | None, fence: Fence | None,
                     now: float | None = None) -> None:  # fmt: skip
        """The move to a human happened: to `servicer` (state 3), else the pool (2), as asked; a later event (or the
        console asking the platform) corrects it where the platform chose otherwise (an agent off duty: the pool)."""
        await self._write(message, STATE_AGENT if servicer else STATE_POOL, servicer or "", "handoff", fence, now)

    async def changed(self, message: InboundMessage, event: dict, fence: Fence | None,
                      now: float | None = None) -> None:  # fmt: skip
        """A 微信客服 event: session_status_change moves the customer to an agent, or out when the session ended;
        any other event changes nothing (and costs no round trip)."""
        if str(event.get("event_type", "")) != STATUS_CHANGE:
            return
        change = int(_number(event.get("change_type")))
        if change == CHANGE_ENDED:
            await self.forget(message, fence)
        elif change in (1, 2, 4):
            servicer = str(event.get("new_servicer_userid") or "")
            await self._write(message, STATE_AGENT, servicer, f"event:{change}", fence, now)

    async def forget(self, message: InboundMessage, fence: Fence | None = None, since: str = "") -> bool:
        """The customer leaves the register (only the entry first handed over at `since`, when given: one handed
        over again meanwhile stays). False when it was not there (or was newer)."""
        index, entry, member = self._where(message)
        lease_key, epoch = fence_args(fence, entry)
        done = int(await self._forget(keys=[lease_key, index, entry], args=[epoch, member, since]))
        if done < 0:
            raise LeaseLost(entry)
        return bool(done)

    async def taken(self, message: InboundMessage, holder_key: str, ttl_s: int, fence: Fence | None) -> None:
        """The bot took the conversation: the holder cached as 'bot' and the customer out of the register, in one
        round trip (as the cache's write alone was)."""
        index, entry, member = self._where(message)
        lease_key, epoch = fence_args(fence, holder_key)
        if int(await self._taken(keys=[lease_key, holder_key, index, entry], args=[epoch, ttl_s, "bot", member])) < 0:
            raise LeaseLost(holder_key)

    async def page(self, bot_id: str, offset: int, limit: int) -> tuple[list[Handoff], int]:
        """Customers `offset`.. `offset + limit` of one bot, the longest waiting first, and how many there are.
        Members whose entry has expired are dropped from the index on the way."""
        index = self._keys.kf_handoffs(bot_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrange(index, offset, offset + max(0, limit - 1))
        pipe.zcard(index)
        members, total = await pipe.execute()
        if not members or limit <= 0:
            return [], int(total)
        names = [as_text(member) for member in members]
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(f"{index}:{name}")
        found: list[Handoff] = []
        gone: list[str] = []
        for name, fields in zip(names, await pipe.execute(), strict=True):
            if not fields:
                gone.append(name)
                continue
            values = {as_text(key): as_text(value) for key, value in fields.items()}
            found.append(Handoff(
                bot_id=bot_id, open_kfid=values.get("open_kfid", ""), external_userid=values.get("external_userid", ""),
                state=int(_number(values.get("state"))), servicer=values.get("servicer", ""),
                since=_number(values.get("since")), changed=_number(values.get("changed")), via=values.get("via", ""),
                raw_since=values.get("since", ""),
            ))  # fmt: skip
        if gone:
            await self._redis.zrem(index, *gone)
        return found, max(0, int(total) - len(gone))
