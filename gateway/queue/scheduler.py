"""The durable work queue: per-conversation lanes, a fair ready set, and leases.

Every message is appended to its lane (a Redis list, one per unit of memory: a user's
session, or a whole group with `memory.group: shared`). A lane that holds work is in
exactly one place at a time, and every move between them is one Lua script:

    ready (a sorted set by virtual time) → leased (owner + epoch) → ready again / idle
                                         ↘ deferred (its user is at max_concurrent_per_user)
                                         ↘ delayed (paced, or backing off after a failure)

So a worker only ever takes work that can run now: one conversation's messages are
answered in order because only the lane's head can be leased, never because a worker
waits for a turn. A lane that has been served goes to the back of the round (its next
score is the virtual clock plus 1/weight), so a user with 30 queued messages gets one
turn per round while others get theirs.

Leases: a taken lane carries (owner, epoch); every side effect of the worker checks the
epoch inside Redis, so a worker that stalled past `claim_idle_ms` and lost its lease can
do nothing more. Expired leases are swept by any live worker and the lane is handed on,
with a new epoch. Workers block on a wake-up list instead of polling.

Epochs come from one namespace-wide counter and are never reused, so the fences may compare for
equality and no lane needs a key of its own once it is idle: a lane that holds no work leaves no
key behind, however many conversations the namespace has seen.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from gateway import metrics
from gateway.queue.entry import QueueEntry
from gateway.state.keys import Keys
from gateway.state.redis_text import as_text
from gateway.state.reply_record import RecordMarks

# Shared Lua: the current time in ms (Redis's clock, the same for every worker), and
# putting a lane back into the ready set with a wake-up for one blocked worker.
_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function make_ready(ns, lane, bump)
  -- Equal turns are served first come, first served: a small arrival tie-break is added. The clock is
  -- reset whenever the ready set runs empty, so scores stay small and the tie-break stays exact.
  local v = tonumber(redis.call('GET', ns .. ':sched:vclock') or '0')
  local arrival = redis.call('INCR', ns .. ':sched:arrivals') % 1000000
  redis.call('ZADD', ns .. ':sched:ready', v + bump + arrival * 1e-9, lane)
  redis.call('LPUSH', ns .. ':sched:wake', '1')
  redis.call('LTRIM', ns .. ':sched:wake', 0, 63)
end
local function next_epoch(ns, lane)
  -- Above the last epoch handed out and at least the time in ms: never reused, even if the counter is lost, and
  -- above the per-lane counters (from 1) of earlier releases, whose keys then expire instead of staying for ever.
  local counter = ns .. ':sched:epoch'
  local epoch = string.format('%d', math.max(tonumber(redis.call('GET', counter) or '0') + 1, now_ms()))
  redis.call('SET', counter, epoch)
  redis.call('EXPIRE', counter .. ':' .. lane, 86400)
  return epoch
end
local function field(item, name)
  -- An entry no worker can read (not JSON, a field missing) gives nil here, never a script error halfway
  -- through a script (Redis keeps what a failed script wrote before its error: a lane could be left nowhere).
  local ok, decoded = pcall(cjson.decode, item)
  if ok and type(decoded) == 'table' then return decoded[name] end
  return nil
end
local function head_time(lane_key)
  local head = redis.call('LINDEX', lane_key, 0)
  if not head then return nil end
  return tonumber(field(head, 't')) or now_ms()
end
local function resume_deferred(ns, user)
  local waiting = redis.call('LPOP', ns .. ':sched:deferred:' .. user)
  if waiting then make_ready(ns, waiting, 0) end
end
local function end_lease(ns, lane)
  local user = redis.call('HGET', ns .. ':sched:lease:' .. lane, 'u')
  redis.call('DEL', ns .. ':sched:lease:' .. lane)
  redis.call('ZREM', ns .. ':sched:leases', lane)
  if user then
    redis.call('SREM', ns .. ':sched:active:' .. user, lane)
    resume_deferred(ns, user)
  end
end
local function suspect_counts(ns, lane, head)
  -- How often the lane's head was taken from a worker that died or stalled holding it, and how often of those it
  -- was running alone there (gateway/worker/loop.py): only those deaths are its own, not a companion's. Kept per
  -- head (its id): counts of the lane's earlier head are none of this one's.
  local kept = redis.call('HMGET', ns .. ':sched:suspect:' .. lane, 'id', 't', 'd')
  if kept[1] ~= tostring(field(head, 'id') or '') then return 0, 0 end
  return tonumber(kept[2]) or 0, tonumber(kept[3]) or 0
end
local function note_takeover(ns, lane, head, alone)
  local takeovers, deaths = suspect_counts(ns, lane, head)
  if alone then deaths = deaths + 1 end
  local key = ns .. ':sched:suspect:' .. lane
  redis.call('HSET', key, 'id', tostring(field(head, 'id') or ''), 't', takeovers + 1, 'd', deaths)
  redis.call('EXPIRE', key, 604800)
end
local function sweep_due(ns, now)
  -- Expired leases are ended (their lane goes to the front of the round; the lease hash is gone, so the stalled
  -- owner is fenced, and the next take hands out a new epoch) and delayed lanes that are due become ready.
  -- Returns the expired lanes.
  local expired = redis.call('ZRANGEBYSCORE', ns .. ':sched:leases', '-inf', now, 'LIMIT', 0, 64)
  for _, lane in ipairs(expired) do
    local alone = redis.call('HGET', ns .. ':sched:lease:' .. lane, 'alone') == '1'
    end_lease(ns, lane)
    redis.call('HINCRBY', ns .. ':sched:stats', 'takeovers', 1)
    if alone then redis.call('HINCRBY', ns .. ':sched:stats', 'deaths_alone', 1) end
    local head = redis.call('LINDEX', ns .. ':sched:lane:' .. lane, 0)
    if head then
      note_takeover(ns, lane, head, alone)
      make_ready(ns, lane, 0)
    end
  end
  local due = redis.call('ZRANGEBYSCORE', ns .. ':sched:delayed', '-inf', now, 'LIMIT', 0, 256)
  for _, lane in ipairs(due) do
    redis.call('ZREM', ns .. ':sched:delayed', lane)
    make_ready(ns, lane, 0)
  end
  return expired
end
"""

# KEYS: dedup key (or any key of the slot when ARGV[2] == '0'), then the signature binding key if there is one.
# ARGV: core prefix, dedup ttl, lane, entry json, weight, message id, binding ttl.
# Returns -1 when the signature was first seen with another message (a replay: nothing is changed),
# 0 for a duplicate delivery, else the lane's length after the append.
# A signature that covers less than the body (DingTalk HTTP signs the timestamp alone) is bound to the messages it
# came with: a hash of their ids (as 'm:<id>': an id is the unsigned body's, and may be anything, '@' too), and '@'
# the first one's arrival (Redis's clock, the same for every gateway).
# Another message may join for SHARE_SIGNATURE_MS after the first, up to SHARE_SIGNATURE_MAX in all: DingTalk's
# pushes in the same millisecond carry the same pair (a busy bot's second one was refused as a replay); a captured
# pair reused later carries nothing. A string key is a binding of an earlier release: its one message.
SHARE_SIGNATURE_MS = 2000
SHARE_SIGNATURE_MAX = 8
_BIND_LUA = f"""
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function bind(key, message_id, ttl)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'string' then return redis.call('GET', key) == message_id end
  local field = 'm:' .. message_id
  if kind == 'none' then
    redis.call('HSET', key, '@', now_ms(), field, 1)
    redis.call('EXPIRE', key, ttl)
    return true
  end
  if redis.call('HEXISTS', key, field) == 1 then return true end
  local first = tonumber(redis.call('HGET', key, '@')) or 0
  if now_ms() - first > {SHARE_SIGNATURE_MS} or redis.call('HLEN', key) - 1 >= {SHARE_SIGNATURE_MAX} then
    return false
  end
  redis.call('HSET', key, field, 1)
  return true
end
"""

# Append an entry to its lane: the lane joins the lanes (and the ready set) when it was empty. Returns its length.
_APPEND_LUA = """
local function append(ns, lane, entry_json, weight)
  local n = redis.call('RPUSH', ns .. ':sched:lane:' .. lane, entry_json)
  redis.call('HINCRBY', ns .. ':sched:stats', 'enqueued', 1)
  if n == 1 then
    redis.call('ZADD', ns .. ':sched:lanes', cjson.decode(entry_json)['t'], lane)
    make_ready(ns, lane, 1 / tonumber(weight))
  end
  return n
end
"""
QUEUE_LUA = _COMMON + _APPEND_LUA  # for other modules' scripts that queue an entry (gateway/queue/dead_letters.py)

_ENQUEUE = (
    QUEUE_LUA
    + _BIND_LUA
    + """
local ns, lane = ARGV[1], ARGV[3]
if KEYS[2] and not bind(KEYS[2], ARGV[6], ARGV[7]) then return -1 end
if ARGV[2] ~= '0' and not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then return 0 end
return append(ns, lane, ARGV[4], ARGV[5])
"""
)

# KEYS: the signature binding key. ARGV: message id, binding ttl. Returns -1 when the signature was first seen with
# another message, else 1 (bound now or before to this one): for a message that is not queued (Ingest: ignored).
_BIND = _BIND_LUA + "if bind(KEYS[1], ARGV[1], ARGV[2]) then return 1 end\nreturn -1\n"

# KEYS: the ready set (so that a cluster routes the script to the queue's slot).
# ARGV: core prefix, owner, lease ms, max concurrent per user (0 = no cap).
# Sweeps first (sweep_due): a busy worker's takes keep the leases and delays swept without trips of their own.
# Returns {lane, epoch, head entry, 1 if more lanes are ready else 0, the head's takeovers, its deaths while alone,
# expired lanes...}, or {'', '', '', 0, 0, 0, expired lanes...} when nothing can run now.
# Whenever the ready set is left empty the wake-ups are dropped with it, so a worker told "no more" blocks on
# the wake list at once instead of asking again to learn that nothing is ready (one round trip per message).
_TAKE = (
    _COMMON
    + """
local ns, owner, lease_ms, cap = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local expired = sweep_due(ns, now_ms())
local function ran_empty()
  redis.call('DEL', ns .. ':sched:wake', ns .. ':sched:vclock', ns .. ':sched:arrivals')
end
local function answer(lane, epoch, head, more, takeovers, deaths)
  local result = {lane, epoch, head, more, takeovers, deaths}
  for _, gone in ipairs(expired) do result[#result + 1] = gone end
  return result
end
for _ = 1, 16 do
  local popped = redis.call('ZPOPMIN', ns .. ':sched:ready')
  if #popped == 0 then
    ran_empty()
    return answer('', '', '', 0, 0, 0)
  end
  local lane = popped[1]
  redis.call('SET', ns .. ':sched:vclock', popped[2])
  local head = redis.call('LINDEX', ns .. ':sched:lane:' .. lane, 0)
  if head then
    local user = tostring(field(head, 'u') or '')  -- '': leased all the same, for the worker to dead-letter
    local active = ns .. ':sched:active:' .. user
    if cap > 0 and redis.call('SCARD', active) >= cap then
      redis.call('RPUSH', ns .. ':sched:deferred:' .. user, lane)
    else
      local epoch = next_epoch(ns, lane)
      redis.call('HSET', ns .. ':sched:lease:' .. lane, 'owner', owner, 'epoch', epoch, 'u', user)
      redis.call('ZADD', ns .. ':sched:leases', now_ms() + lease_ms, lane)
      redis.call('SADD', active, lane)
      local more = redis.call('ZCARD', ns .. ':sched:ready')
      if more == 0 then ran_empty() end
      local takeovers, deaths = suspect_counts(ns, lane, head)
      return answer(lane, epoch, head, math.min(more, 1), takeovers, deaths)
    end
  end
end
return answer('', '', '', 0, 0, 0)
"""
)

# KEYS: the ready set, then the entry's reply record if the release marks it.
# ARGV: core prefix, lane, epoch, entry id ('*': whatever is the head, for one that cannot be read), outcome
# ('done' | 'retry'), delay ms, weight, dead-letter json ('' = none), then if marked: the record's ttl, field,
# value, ... (the answer's last progress, written under the same fence as the release).
# Returns 1, or 0 when the lease is no longer held at this epoch (nothing is changed then).
_RELEASE = (
    _COMMON
    + """
local ns, lane = ARGV[1], ARGV[2]
local lease_key = ns .. ':sched:lease:' .. lane
if redis.call('HGET', lease_key, 'epoch') ~= ARGV[3] then return 0 end
if KEYS[2] then
  for i = 10, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
  redis.call('EXPIRE', KEYS[2], ARGV[9])
end
local lane_key = ns .. ':sched:lane:' .. lane
if ARGV[5] == 'done' then
  local head = redis.call('LINDEX', lane_key, 0)
  if head and (ARGV[4] == '*' or field(head, 'id') == ARGV[4]) then
    redis.call('LPOP', lane_key)
    redis.call('HINCRBY', ns .. ':sched:stats', 'handled', 1)
    redis.call('DEL', ns .. ':sched:suspect:' .. lane)
  end
  if ARGV[8] ~= '' then
    redis.call('XADD', ns .. ':dead', 'MAXLEN', '~', '10000', '*', 'entry', ARGV[8])
  end
end
end_lease(ns, lane)
local t = head_time(lane_key)
if t then
  redis.call('ZADD', ns .. ':sched:lanes', t, lane)
  local delay = tonumber(ARGV[6])
  if delay > 0 then
    redis.call('ZADD', ns .. ':sched:delayed', now_ms() + delay, lane)
  else
    make_ready(ns, lane, 1 / tonumber(ARGV[7]))
  end
else
  redis.call('ZREM', ns .. ':sched:lanes', lane)
end
return 1
"""
)

# KEYS: the ready set. ARGV: core prefix, lane, epoch. Marks the lease as running alone (a death now counts against
# its head: note_takeover). Returns 1, or 0 when the lease is no longer held at this epoch.
_ALONE = """
local lease_key = ARGV[1] .. ':sched:lease:' .. ARGV[2]
if redis.call('HGET', lease_key, 'epoch') ~= ARGV[3] then return 0 end
redis.call('HSET', lease_key, 'alone', '1')
return 1
"""

# KEYS: the ready set. ARGV: core prefix, lease ms, then lane, epoch pairs.
# Returns the lanes whose lease is no longer held.
_RENEW = (
    _COMMON
    + """
local ns, lease_ms = ARGV[1], tonumber(ARGV[2])
local lost = {}
local deadline = now_ms() + lease_ms
for i = 3, #ARGV, 2 do
  local lane = ARGV[i]
  if redis.call('HGET', ns .. ':sched:lease:' .. lane, 'epoch') == ARGV[i + 1] then
    redis.call('ZADD', ns .. ':sched:leases', 'XX', deadline, lane)
  else
    lost[#lost + 1] = lane
  end
end
return lost
"""
)

# KEYS: the ready set. ARGV: core prefix.
# sweep_due (expired leases handed on, due delays made ready), for when no take has done it lately.
# Returns {expired lanes..., '|', ms until the next lease or delay falls due (-1 = none)}.
_SWEEP = (
    _COMMON
    + """
local ns = ARGV[1]
local now = now_ms()
local expired = sweep_due(ns, now)
local next_due = -1
for _, key in ipairs({ns .. ':sched:leases', ns .. ':sched:delayed'}) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #first > 0 then
    local wait = math.max(0, tonumber(first[2]) - now)
    if next_due < 0 or wait < next_due then next_due = wait end
  end
end
expired[#expired + 1] = '|'
expired[#expired + 1] = tostring(next_due)
return expired
"""
)


# KEYS: the ready set.
# ARGV: core prefix, lane, epoch, merged head entry json, then the ids of the head and of the entries after it
# that it absorbs, in lane order. Returns 1, or 0 when the lease is not held at this epoch or the lane
# no longer starts with those entries (nothing is changed then).
_ABSORB = (
    _COMMON
    + """
local ns, lane = ARGV[1], ARGV[2]
if redis.call('HGET', ns .. ':sched:lease:' .. lane, 'epoch') ~= ARGV[3] then return 0 end
local lane_key = ns .. ':sched:lane:' .. lane
local count = #ARGV - 4
local present = redis.call('LRANGE', lane_key, 0, count - 1)
if #present ~= count then return 0 end
for i = 1, count do
  if field(present[i], 'id') ~= ARGV[4 + i] then return 0 end
end
redis.call('LTRIM', lane_key, count, -1)
redis.call('LPUSH', lane_key, ARGV[4])
redis.call('HINCRBY', ns .. ':sched:stats', 'handled', count - 1)
return 1
"""
)


@dataclass(frozen=True)
class Binding:
    """A signature that covers less than the body, and the message it comes with: the messages it first came with
    within SHARE_SIGNATURE_MS (at most SHARE_SIGNATURE_MAX) may carry it, kept `ttl_s`; any other is a replay."""

    key: str
    message_id: str
    ttl_s: int


@dataclass(frozen=True)
class QueueGauges:
    depth: int  # entries waiting or in progress
    oldest_age_s: float  # age of the oldest one
    dead_letters: int  # entries in the dead-letter stream
    deaths_alone: int  # takeovers of a message that ran alone (a poison message), since the namespace was created


@dataclass(frozen=True)
class Lease:
    """A lane held by this worker: its head entry may be worked on while `epoch` is current."""

    lane: str
    epoch: str
    entry: QueueEntry
    takeovers: int = 0  # times its head was taken from a worker that died or stalled holding it
    deaths: int = 0  # ... of those, while it ran alone there (`mark_alone`)

    @property
    def entry_id(self) -> str:
        return self.entry.entry_id


Outcome = Literal["done", "retry"]
log = logging.getLogger(__name__)


class Scheduler:
    """Enqueue on the gateway side; take, renew, release and sweep on the worker side."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._ns = keys.core  # the scripts build every name from the hash-tagged prefix (one cluster slot)
        self._routing = [keys.scheduler_ready]
        self.swept_at = 0.0  # monotonic time of the last sweep, by `sweep` or by a take (which sweeps first)
        self._scripts = {
            name: redis.register_script(source)
            for name, source in {
                "enqueue": _ENQUEUE,
                "take": _TAKE,
                "release": _RELEASE,
                "renew": _RENEW,
                "sweep": _SWEEP,
                "absorb": _ABSORB,
                "bind": _BIND,
                "alone": _ALONE,
            }.items()
        }

    async def load_scripts(self) -> None:
        """Load the scripts that pipelines call by their SHA (evalsha in a pipeline does not load)."""
        await self._redis.script_load(_ENQUEUE)
        await self._redis.script_load(_BIND)
        await self._redis.script_load(_TAKE)

    # -- gateway side ------------------------------------------------------------------------

    def _enqueue_args(
        self,
        lane: str,
        entry: QueueEntry,
        dedup_key: str,
        dedup_ttl_s: int,
        weight: float,
        binding: Binding | None = None,
    ) -> list:
        keys = [dedup_key or self._keys.scheduler_stats, *([binding.key] if binding else [])]
        argv = [self._ns, dedup_ttl_s if dedup_key else 0, lane, entry.to_json(), weight]
        argv += [binding.message_id, binding.ttl_s] if binding else ["", 0]
        return [len(keys), *keys, *argv]

    def queue_enqueue(
        self,
        pipe: Pipeline,
        lane: str,
        entry: QueueEntry,
        dedup_key: str = "",
        dedup_ttl_s: int = 0,
        weight: float = 1.0,
        binding: Binding | None = None,
    ) -> None:
        """Add the enqueue script to `pipe`: signature binding, dedup (SET NX) and append to the lane, atomically.

        The pipeline's result is -1 for a replayed signature, 0 for a duplicate delivery, else the lane's length.
        """
        args = self._enqueue_args(lane, entry, dedup_key, dedup_ttl_s, weight, binding)
        pipe.execute_command("EVALSHA", self._scripts["enqueue"].sha, *args)  # a cluster pipeline blocks .evalsha()

    def queue_bind(self, pipe: Pipeline, binding: Binding) -> None:
        """Add the binding alone to `pipe` (a message that is not queued): its result is -1 for a signature first
        seen with another message, else 1."""
        pipe.execute_command("EVALSHA", self._scripts["bind"].sha, 1, binding.key, binding.message_id, binding.ttl_s)

    async def enqueue(self, lane: str, entry: QueueEntry, weight: float = 1.0) -> int:
        """Append an entry to its lane (no dedup); returns the lane's length."""
        args = self._enqueue_args(lane, entry, "", 0, weight)
        return int(await self._scripts["enqueue"](keys=args[1 : 1 + args[0]], args=args[1 + args[0] :]))

    # -- worker side -------------------------------------------------------------------------

    async def take(self, owner: str, lease_ms: int, max_per_user: int) -> Lease | None:
        """Lease the next ready lane's head (fair across users), or None when nothing can run now."""
        return (await self.take_next(owner, lease_ms, max_per_user))[0]

    async def take_next(self, owner: str, lease_ms: int, max_per_user: int) -> tuple[Lease | None, bool]:
        """`take`, and whether another lane may be ready (False: nothing is there to take; `wait_and_take`)."""
        result = await self._scripts["take"](keys=self._routing, args=[self._ns, owner, lease_ms, max_per_user])
        return await self._leased(result)

    async def wait_and_take(
        self, owner: str, lease_ms: int, max_per_user: int, timeout_s: float
    ) -> tuple[Lease | None, bool]:
        """Block until a lane becomes ready somewhere (or `timeout_s` passes), then `take_next`, in one round trip:
        Redis runs a connection's pipelined commands in order, and one held up by a blocking pop runs as soon as
        the pop returns, so the take follows the wake-up without a second trip."""
        take_args = [self._ns, owner, lease_ms, max_per_user]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.blpop([self._keys.scheduler_wake], timeout=max(0.01, timeout_s))
            pipe.execute_command("EVALSHA", self._scripts["take"].sha, len(self._routing), *self._routing, *take_args)
            _, result = await pipe.execute(raise_on_error=False)
        if isinstance(result, NoScriptError):  # Redis restarted and lost its scripts: the take was not run
            await self.load_scripts()
            return await self.take_next(owner, lease_ms, max_per_user)
        if isinstance(result, Exception):
            raise result
        return await self._leased(result)

    async def _leased(self, result: list) -> tuple[Lease | None, bool]:
        """The take script's answer as (lease, whether another lane may be ready); the leases it found expired
        are reported."""
        self.swept_at = time.monotonic()
        self._report(as_text(lane) for lane in result[6:])
        lane, epoch, head = (as_text(item) for item in result[:3])
        more = bool(int(result[3]))
        if not lane:
            return None, more
        try:
            return Lease(lane, epoch, QueueEntry.from_json(head), int(result[4]), int(result[5])), more
        except ValidationError as exc:  # written by hand or by a broken client: kept for an operator, not retried
            await self._release_unreadable(lane, epoch, head, exc)
            return None, True

    async def _release_unreadable(self, lane: str, epoch: str, head: str, exc: ValidationError) -> None:
        """An entry no worker can read leaves its lane as a dead letter (`botgw dlq show` has it whole)."""
        reason = f"unreadable queue entry: {exc.error_count()} problem(s), first: {exc.errors()[0]['msg']}"
        dead = json.dumps({"reason": reason, "raw": head[:10_000]}, ensure_ascii=False)
        args = [self._ns, lane, epoch, "*", "done", 0, 1.0, dead]
        await self._scripts["release"](keys=self._routing, args=args)

    async def release(
        self,
        lease: Lease,
        outcome: Outcome,
        *,
        delay_s: float = 0.0,
        weight: float = 1.0,
        dead_letter: dict | None = None,
        record: RecordMarks | None = None,
    ) -> bool:
        """End the lease: 'done' drops the entry (optionally into the dead letters), 'retry' keeps it at the
        head, to run again after `delay_s`; `record` sets fields of the entry's reply record in the same step.
        False when the lease was lost meanwhile (nothing changed). Idempotent: a release that is sent again after
        it ran finds the lease gone and changes nothing."""
        dead = json.dumps({**dead_letter, "entry": lease.entry.wire()}, ensure_ascii=False) if dead_letter else ""
        args: list[str | int | float] = [self._ns, lease.lane, lease.epoch, lease.entry_id, outcome]
        args += [int(delay_s * 1000), weight, dead]
        keys = self._routing
        if record is not None and record.marks:
            keys = [*keys, record.key]
            args.append(record.ttl_s)
            for name, value in record.marks.items():
                args += [name, value]
        return bool(await self._scripts["release"](keys=keys, args=args))

    async def following(self, lease: Lease, count: int) -> list[QueueEntry]:
        """Up to `count` entries queued behind the leased head (to be absorbed into it, for a merge); the first
        one that cannot be read ends the list (it is not absorbed, and dead-lettered when it is a head)."""
        behind = []
        for item in await self._redis.lrange(self._keys.lane(lease.lane), 1, count):
            try:
                behind.append(QueueEntry.from_json(item))
            except ValidationError:
                break
        return behind

    async def absorb(self, lease: Lease, merged: QueueEntry, absorbed: list[QueueEntry]) -> bool:
        """Replace the head and the `absorbed` entries behind it by one `merged` entry (the head's id), in one
        script, so that a worker dying after it leaves the merged message queued, not the parts lost."""
        ids = [lease.entry_id, *(entry.entry_id for entry in absorbed)]
        args = [self._ns, lease.lane, lease.epoch, merged.to_json(), *ids]
        return bool(await self._scripts["absorb"](keys=self._routing, args=args))

    async def mark_alone(self, lease: Lease) -> bool:
        """Say that the lease's head now runs alone in its worker: if the lease expires from here on, the death
        is counted against the head. False when the lease was lost meanwhile."""
        return bool(await self._scripts["alone"](keys=self._routing, args=[self._ns, lease.lane, lease.epoch]))

    async def renew(self, leases: list[Lease], lease_ms: int) -> set[str]:
        """Extend every lease still held; returns the lanes whose lease was lost."""
        if not leases:
            return set()
        args: list[str | int] = [self._ns, lease_ms]
        for lease in leases:
            args += [lease.lane, lease.epoch]
        return {as_text(lane) for lane in await self._scripts["renew"](keys=self._routing, args=args)}

    async def sweep(self) -> tuple[list[str], float]:
        """Hand on expired leases and wake delayed lanes that are due; (expired lanes, seconds to next due).
        Every take sweeps too (`swept_at`)."""
        result = [as_text(item) for item in await self._scripts["sweep"](keys=self._routing, args=[self._ns])]
        self.swept_at = time.monotonic()
        next_ms = int(result[-1])
        self._report(result[:-2])
        return result[:-2], (next_ms / 1000 if next_ms >= 0 else -1.0)

    @staticmethod
    def _report(expired: Iterable[str]) -> None:
        for lane in expired:
            metrics.LEASE_TAKEOVERS.inc()
            log.warning("took over a stalled message", extra={"lane": lane})

    # -- operators ---------------------------------------------------------------------------

    async def stats(self) -> tuple[int, float]:
        """(entries waiting or in progress, age in seconds of the oldest one)."""
        gauges = await self.gauges()
        return gauges.depth, gauges.oldest_age_s

    async def gauges(self) -> QueueGauges:
        """What a gateway exports of the queue at each scrape, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hmget(self._keys.scheduler_stats, "enqueued", "handled", "deaths_alone")
        pipe.zrange(self._keys.scheduler_lanes, 0, 0, withscores=True)
        pipe.xlen(self._keys.dead_letters)
        (enqueued, handled, deaths_alone), oldest, dead_letters = await pipe.execute()
        depth = int(enqueued or 0) - int(handled or 0)
        age = max(0.0, time.time() - oldest[0][1] / 1000) if oldest else 0.0
        return QueueGauges(max(0, depth), age, int(dead_letters), int(deaths_alone or 0))

    async def counters(self) -> dict[str, int]:
        """enqueued, handled, takeovers and deaths_alone (takeovers of a message that ran alone) since the
        namespace was created."""
        raw = await self._redis.hgetall(self._keys.scheduler_stats)
        return {as_text(k): int(v) for k, v in raw.items()}
