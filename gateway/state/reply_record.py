"""The reply record: one message's answer and how far its delivery got, in one Redis hash.

It is what makes delivery exactly-once out of at-least-once pieces: the answer and the
conversation memory are committed together before anything is sent, so a worker that
takes over resends the same answer instead of asking the engine again, and the pieces
sent are counted, so a takeover resumes instead of repeating.

Every write is fenced by the writer's lease (scheduler): a worker that lost its lane
cannot change the record, and `LeaseLost` tells it to stop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Literal, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.state.keys import Keys
from gateway.state.memory import Turn, turns_of
from gateway.state.redis_text import as_text
from gateway.state.riders import Rider

State = Literal["new", "committed", "done", "failed"]
T = TypeVar("T")
MARK_RETRY_S = 10.0

_FENCE = """
local function fenced()
  return ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1]
end
"""

# KEYS: lease (the record itself when unfenced), record.
# ARGV: epoch ('' = unfenced), ttl, mode ('set' | 'setnx'), field, value, ...
# Returns -1 if fenced, else the number of fields written.
_WRITE = (
    _FENCE
    + """
if fenced() then return -1 end
local written = 0
for i = 4, #ARGV, 2 do
  if ARGV[3] == 'set' then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    written = written + 1
  else
    written = written + redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return written
"""
)

# KEYS: lease (the record when unfenced), record, then memory if the exchange is kept.
# ARGV: epoch ('' = unfenced), ttl, text, created, state, memory ttl,
# max memory items (0 = unbounded), clear memory first ('1' | ''), then memory items.
# Returns {status, text}: status -1 fenced, 0 another worker committed first (its text is returned), 1 committed.
_COMMIT = (
    _FENCE
    + """
if fenced() then return {-1, ''} end
local existing = redis.call('HGET', KEYS[2], 'text')
if existing then return {0, existing} end
redis.call('HSET', KEYS[2], 'text', ARGV[3], 'created', ARGV[4], 'state', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[2])
if KEYS[3] and ARGV[8] == '1' then redis.call('DEL', KEYS[3]) end
if KEYS[3] and #ARGV > 8 then
  for i = 9, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
  if tonumber(ARGV[7]) > 0 then redis.call('LTRIM', KEYS[3], -tonumber(ARGV[7]), -1) end
  redis.call('EXPIRE', KEYS[3], ARGV[6])
end
return {1, ARGV[3]}
"""
)


# A piece's send begins, in one round trip where every key may go into one script (a single Redis; in a Cluster the
# pacing windows and the repeat counter stand outside the record's slot, and the steps go one by one):
# KEYS: lease (the record when unfenced), record, repeat counter (the record when none), then one list per window,
# then the memory if a commit carries an exchange or clears it.
# ARGV: epoch ('' = unfenced), ttl, now, windows n, repeat counter ttl (0 = none), variant field ('' = none),
# repeats modulus, a commit left to ride on this send ('' = none; JSON: text, created, items, clear, max, ttl), then
# per window its limit and seconds, then field, value, ...
# The commit comes first and stays whatever follows (a full window does not undo it): the answer is recorded before
# its first send, as `_COMMIT` would have recorded it (a record that has its text already keeps it).
# A window is the `limits` library's moving window (LINDEX limit-1 within its seconds: full; else LPUSH now, LTRIM,
# EXPIRE), so the library and this script keep one count. Every window has room, or nothing is counted at all.
# Returns {-1, '0'} fenced, {0, seconds to wait} when a window is full, {1, repeat count} when begun.
_BEGIN_SEND = (
    _FENCE
    + """
if fenced() then return {-1, '0'} end
local now, n = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[8] ~= '' and redis.call('HEXISTS', KEYS[2], 'text') == 0 then
  local c = cjson.decode(ARGV[8])
  redis.call('HSET', KEYS[2], 'text', c['text'], 'created', c['created'], 'state', 'committed')
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  local memory = KEYS[4 + n]
  if memory and c['clear'] then redis.call('DEL', memory) end
  if memory and #c['items'] > 0 then
    for _, item in ipairs(c['items']) do redis.call('RPUSH', memory, item) end
    if c['max'] > 0 then redis.call('LTRIM', memory, -c['max'], -1) end
    redis.call('EXPIRE', memory, c['ttl'])
  end
end
local wait = 0
for i = 1, n do
  local limit, seconds = tonumber(ARGV[7 + 2 * i]), tonumber(ARGV[8 + 2 * i])
  local entry = redis.call('LINDEX', KEYS[3 + i], limit - 1)
  if entry and tonumber(entry) >= now - seconds then wait = math.max(wait, tonumber(entry) + seconds - now) end
end
if wait > 0 then return {0, tostring(wait)} end
for i = 1, n do
  local limit, seconds = tonumber(ARGV[7 + 2 * i]), tonumber(ARGV[8 + 2 * i])
  redis.call('LPUSH', KEYS[3 + i], ARGV[3])
  redis.call('LTRIM', KEYS[3 + i], 0, limit - 1)
  redis.call('EXPIRE', KEYS[3 + i], seconds)
end
local count = 0
if tonumber(ARGV[5]) > 0 then
  count = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], ARGV[5])
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[2], ARGV[6], (count - 1) % tonumber(ARGV[7])) end
end
for i = 9 + 2 * n, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {1, tostring(count)}
"""
)

# KEYS: lease (the value's own key when unfenced), the key. ARGV: epoch ('' = unfenced), ttl (0 = none), value
# ('' deletes). Returns -1 if fenced, else 1.
_SET_VALUE = (
    _FENCE
    + """
if fenced() then return -1 end
if ARGV[3] == '' then redis.call('DEL', KEYS[2])
elseif tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[2])
else redis.call('SET', KEYS[2], ARGV[3]) end
return 1
"""
)


@dataclass(frozen=True)
class _Commit:
    """An answer's commit kept to ride on its first send's begin (ReplyRecord.commit)."""

    text: str
    created: str
    memory_key: str  # '' when the commit leaves the memory alone
    items: list[str]
    memory_ttl_s: int
    max_memory_items: int
    clear_memory: bool

    def as_json(self) -> str:
        return json.dumps({"text": self.text, "created": self.created, "items": self.items, "clear": self.clear_memory,
                           "max": self.max_memory_items, "ttl": self.memory_ttl_s}, ensure_ascii=False)  # fmt: skip


@dataclass(frozen=True)
class RecordMarks:
    """Fields of a reply record to set with the release of its lease (gateway/queue/scheduler.py): an answer's
    last step, written under the same fence in the same round trip."""

    key: str
    ttl_s: int
    marks: dict[str, str | int]


class LeaseLost(Exception):
    """This worker's lease on the message ended (it stalled, another worker took over): stop, change nothing."""


@dataclass
class ReplyState:
    """The record's fields, typed. Empty strings and zeros mean "not yet"."""

    text: str | None = None
    state: State = "new"
    created: str = ""
    started: int = 0  # pieces whose send began (a piece in started but not in sent has an unknown outcome)
    sent: int = 0  # pieces known delivered
    wait_notice: str = ""  # the "engine is starting" notice was sent
    card_track: str = ""  # the DingTalk card of this answer
    card_created: str = ""
    card_deliver_started: str = ""  # the card's delivery into the conversation began
    card_sent: str = ""  # the created card was delivered into the conversation
    card_delivered: str = ""
    overflow_started: str = ""  # the one response_url post began
    overflow_sent: str = ""
    experts: str = ""
    reason: str = ""  # why the answer failed, when state is failed
    failed_by: str = ""  # the lease epoch whose release wrote `failed` (with its dead letter)
    no_answer: str = ""  # the knowledge bases had nothing above the threshold (微信客服 hands over)
    knowledge: str = ""  # which chunks the answer used (JSON), for an operator asking why it said that
    quota_pieces: str = ""  # how many pieces the person's reply allowance let this answer have
    handoff_code: str = ""  # the conversation was moved to a human: the code that move returned ('-': none)
    handoff_notice_started: str = ""  # the handoff notice took its slot and its send began
    handoff_notice_sent: str = ""
    welcome_started: str = ""  # the welcome's send began (a retry resends it, with the same msgid)
    welcome_sent: str = ""
    question: str = ""  # the answer asks the person something with buttons (bots.buttons.Question as JSON)
    question_id: str = ""  # the tool call this message asked its asker to confirm (its PendingCall id)
    buttons_sent: str = ""  # the question's buttons were shown
    send_failed: str = ""  # the platform reported after accepting a piece that it was not delivered (why)
    quota_refunded: str = ""  # (a msg_send_fail event's record) the slot it gives back was given back
    letter_kept: str = ""  # (a msg_send_fail event's record) its dead letter was kept
    # a send that began and failed with every attempt certainly not acted on (rate limits): the next run's first
    # attempt is no resend ("<piece index>" or "card"; "" once an attempt may have arrived)
    not_arrived: str = ""
    variants: dict[int, int] = field(default_factory=dict)  # piece index -> marks that made it unique (v<index>)

    @classmethod
    def from_hash(cls, raw: dict) -> ReplyState:
        names = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for key, value in raw.items():
            name = as_text(key)
            if name.startswith("v") and name[1:].isdigit():
                values.setdefault("variants", {})[int(name[1:])] = int(as_text(value))
                continue
            if name not in names:
                continue
            text = as_text(value)
            values[name] = int(text) if name in ("started", "sent") else text
        return cls(**values)

    @property
    def done(self) -> bool:
        return self.state in ("done", "failed")


@dataclass(frozen=True)
class Fence:
    """The lease a writer must still hold: its Redis key and epoch."""

    lease_key: str
    epoch: str


FENCE_LUA = _FENCE  # for other modules' fenced scripts: defines fenced() over KEYS[1] (lease) and ARGV[1] (epoch)


async def while_redis_returns(call: Callable[[], Awaitable[T]]) -> T:
    """`call`, tried again while Redis is away (a restart), for up to MARK_RETRY_S."""
    delay, deadline = 0.05, time.monotonic() + MARK_RETRY_S
    while True:
        try:
            return await call()
        except (RedisConnectionError, RedisTimeoutError):
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


def fence_args(fence: Fence | None, own_key: str) -> tuple[str, str]:
    """(lease key, epoch) for a fenced script; unfenced, the written key itself stands in (every key given to a
    script must be of its one cluster slot) and the empty epoch says there is no lease to check."""
    return (fence.lease_key, fence.epoch) if fence else (own_key, "")


class FencedValues:
    """Plain values (a cursor, a cached holder) written only while the writer still holds its lease, so that a
    worker that stalled and lost its message cannot overwrite what its successor wrote."""

    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(_SET_VALUE)

    async def set(self, fence: Fence | None, key: str, value: str, ttl_s: int = 0) -> None:
        """Set (or, with value '', delete) `key`; LeaseLost when the fence no longer holds."""
        lease_key, epoch = fence_args(fence, key)
        if int(await self._script(keys=[lease_key, key], args=[epoch, ttl_s, value])) < 0:
            raise LeaseLost(key)


class ReplyRecords:
    """Opens reply records; the scripts are registered once per process, not per message."""

    def __init__(self, redis: Redis, keys: Keys, ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s
        self._scripts = {
            "write": redis.register_script(_WRITE),
            "commit": redis.register_script(_COMMIT),
            "begin_send": redis.register_script(_BEGIN_SEND),
        }

    def open(
        self,
        dedup_key: str,
        fence: Fence | None = None,
        memory_key: str = "",
        files_key: str = "",
        riders: list[Rider] | None = None,
    ) -> ReplyRecord:
        """`memory_key`: the conversation memory the answer will be planned on, and `files_key` the files it was
        sent (gateway/pipeline/parts.py), read with the record's first load, and `riders` sent with it (one
        round trip for all; riders need a `memory_key`)."""
        key = self._keys.reply(dedup_key)
        return ReplyRecord(
            self._redis, key, self._ttl_s, fence, self._scripts, memory_key, files_key=files_key, riders=riders or []
        )

@dataclass
class ReplyRecord:
    """One message's reply record, written under one worker's lease."""

    redis: Redis
    key: str
    ttl_s: int
    fence: Fence | None = None
    _scripts: dict = field(default_factory=dict, repr=False)
    memory_key: str = ""
    memory: list[Turn] | None = field(default=None, repr=False)  # as read with the record; None: not read
    files_key: str = ""
    files: dict[bytes, bytes] | None = field(default=None, repr=False)  # as read with the record; None: not read
    riders: list[Rider] = field(default_factory=list, repr=False)  # sent with the first load (memory_key set)
    at_release: dict[str, str | int] = field(default_factory=dict, repr=False)  # see mark_at_release
    commit_rides_on_send: bool = False  # see commit; set by the worker where the presenter's first write is a begin
    _pending_commit: _Commit | None = field(default=None, repr=False)

    def _fence_args(self) -> tuple[str, str]:
        return fence_args(self.fence, self.key)

    async def exists(self) -> bool:
        """Whether anything was recorded for this message yet (an answer, a step of one)."""
        return bool(await self.redis.exists(self.key))

    async def load(self) -> ReplyState:
        """The record; the first time, with the conversation memory (`memory`) in the same round trip. Only the
        lease holder writes that memory, so it stays as read unless this job changes it (`forget_memory`)."""
        await self._flush_commit()  # what is read includes the answer kept for the send's begin
        if not self.memory_key or self.memory is not None:
            return ReplyState.from_hash(await self.redis.hgetall(self.key))
        riders, self.riders = self.riders, []
        async with self.redis.pipeline(transaction=False) as pipe:
            for rider in riders:
                rider.queue(pipe)
            pipe.hgetall(self.key)
            pipe.lrange(self.memory_key, 0, -1)
            if self.files_key:
                pipe.hgetall(self.files_key)
            results = await pipe.execute(raise_on_error=False)
        for rider, result in zip(riders, results, strict=False):
            rider.answer(result)
        raw, turns, *files = reads = results[len(riders) :]
        for read in reads:
            if isinstance(read, Exception):
                raise read
        self.memory = turns_of(turns)
        self.files = files[0] if files else None
        return ReplyState.from_hash(raw)

    def forget_memory(self) -> None:
        """The memory read with the record may have changed (an old one was adopted): read it again."""
        self.memory = None

    def mark_at_release(self, **values: str | int) -> None:
        """Fields to set with the release of the lease, in its round trip and under the same fence (the
        scheduler's release script): for an answer's last step, the mark after its last send. Whoever holds the
        record hands them to the release (`release_marks`); any write before that carries them first."""
        self.at_release.update(values)

    def release_marks(self) -> RecordMarks | None:
        """What `mark_at_release` left for the release (taken: a second call has nothing)."""
        if not self.at_release:
            return None
        marks, self.at_release = self.at_release, {}
        return RecordMarks(self.key, self.ttl_s, marks)

    async def flush(self) -> None:
        """Write now what was kept for a later step: a commit kept for the send's begin, marks left for the release
        (a path that ends without them)."""
        await self._flush_commit()
        if self.at_release:
            await self.mark()

    async def _write(self, mode: str, values: dict[str, str | int]) -> int:
        await self._flush_commit()
        marks = self.at_release  # written first: the release may never come, or come after this write
        lease_key, epoch = self._fence_args()
        argv: list[str | int] = [epoch, self.ttl_s, mode]
        for name, value in {**marks, **values}.items():
            argv += [name, value]
        written = int(await self._scripts["write"](keys=[lease_key, self.key], args=argv))
        if written < 0:
            raise LeaseLost(self.key)
        if marks:  # only once written: a write retried after a blip carries them again
            self.at_release = {}
        return written

    async def mark(self, **values: str | int) -> None:
        """Set fields (progress, state); raises LeaseLost when this worker no longer holds the message.

        Progress written after a send must not be lost to a Redis restart (the piece would be sent again,
        and DingTalk has no duplicate check): the write is idempotent, so it is retried while Redis is away,
        for up to MARK_RETRY_S (a takeover only happens after the lease runs out, which it cannot do sooner)."""
        await while_redis_returns(lambda: self._write("set", values))

    async def begin_send(
        self, windows: list[tuple[str, int, int]], repeats: tuple[str, int, str, int] | None,
        values: dict[str, str | int],
    ) -> tuple[float, int]:
        """A piece's send begins in one round trip (single Redis only: see _BEGIN_SEND): one send counted in every
        window (key, limit, seconds), the piece's repeats counted (counter key, its ttl, the record's field for
        the repeat number, the modulus) and `values` marked. (seconds to wait, 0) when a window is full: nothing
        was counted or marked; else (0, the repeat count). LeaseLost when fenced. Retried while Redis is away,
        like `mark`: a repeat may count a send twice (less is sent, never more) and number the piece anew."""
        if self.at_release:
            await self.flush()
        commit, self._pending_commit = self._pending_commit, None  # rides on this begin, in front of it
        lease_key, epoch = self._fence_args()
        counter, counter_ttl, variant, modulus = repeats or (self.key, 0, "", 1)
        argv: list[str | int] = [epoch, self.ttl_s, f"{time.time():.6f}", len(windows), counter_ttl, variant, modulus]
        argv.append(commit.as_json() if commit else "")
        for _, limit, seconds in windows:
            argv += [limit, seconds]
        for name, value in values.items():
            argv += [name, value]
        keys = [lease_key, self.key, counter, *(key for key, _, _ in windows)]
        if commit and commit.memory_key:
            keys.append(commit.memory_key)

        async def once() -> list:
            return await self._scripts["begin_send"](keys=keys, args=argv)

        try:
            status, number = await while_redis_returns(once)
        except BaseException:
            if commit is not None:  # it may not have run: kept for the next write (it is applied once only)
                self._pending_commit = commit
            raise
        if int(status) < 0:
            raise LeaseLost(self.key)
        return (float(number), 0) if int(status) == 0 else (0.0, int(number))

    async def claim(self, name: str, value: str = "1") -> bool:
        """Set a field only if unset (a once-only step such as the overflow post); True if this call set it."""
        return await self._write("setnx", {name: value}) == 1

    async def commit(
        self,
        text: str,
        created: str,
        memory_key: str = "",
        exchange: tuple[Turn, ...] | None = None,
        memory_ttl_s: int = 0,
        max_memory_items: int = 0,
        *,
        clear_memory: bool = False,
    ) -> str:
        """Store the answer (and the exchange in memory) once; if another worker got there first, its answer.
        `clear_memory` (/reset) empties the conversation's memory in the same fenced step.

        With `commit_rides_on_send` (a fenced record whose first write after the commit is a send's begin) the
        commit is kept and goes with that begin, in its script and before it (`begin_send`); any other write or
        read first writes it alone. Under the lease nobody else can have committed meanwhile (this worker read
        the record without a text after taking the lease), so the answer is `text`."""
        items = [turn.to_json() for turn in exchange] if exchange else []
        pending = _Commit(text, created, memory_key if exchange or clear_memory else "", items, memory_ttl_s,
                          max_memory_items, clear_memory)  # fmt: skip
        await self.flush()
        if self.commit_rides_on_send and self.fence is not None:
            self._pending_commit = pending
            return text
        return await self._commit_now(pending)

    async def _commit_now(self, pending: _Commit) -> str:
        lease_key, epoch = self._fence_args()
        flag = "1" if pending.clear_memory else ""
        argv = [epoch, self.ttl_s, pending.text, pending.created, "committed", pending.memory_ttl_s,
                pending.max_memory_items, flag, *pending.items]  # fmt: skip
        keys = [lease_key, self.key, *([pending.memory_key] if pending.memory_key else [])]
        status, stored = await self._scripts["commit"](keys=keys, args=argv)
        if int(status) < 0:
            raise LeaseLost(self.key)
        return as_text(stored)

    async def _flush_commit(self) -> None:
        """Write a commit kept for the next send's begin now (another write or read comes first)."""
        if self._pending_commit is not None:
            await self._commit_now(self._pending_commit)
            self._pending_commit = None  # only once written: a write retried after a blip commits first again
