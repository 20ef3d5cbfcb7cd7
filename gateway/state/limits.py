"""Per-user and per-group limits: message windows and token budgets, on Redis.

Message windows are moving windows shared by every replica, kept as sorted sets of the messages
admitted (member: the message's dedup key), so admitting a message is idempotent: a retry, a
takeover or a failure between the count and its record can never count one message twice, and a
refusal by any window counts it in none (one script checks the sender's and the group's windows
together). The `limits` library's moving window counts hits, not messages, so it cannot do that; it
still paces sends. Token budgets are counted per
minute and per calendar day (in `limits.timezone`) from vLLM's `usage`: before the engine
call the largest possible cost (prompt + max_tokens) is reserved, atomically for every
window that applies, and only if it fits; afterwards the reservation is settled to what
was really used. So parallel requests can never together spend more than the budget.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from zoneinfo import ZoneInfo

from limits import RateLimitItem, parse, parse_many
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string
from pydantic import BaseModel, ConfigDict, Field, field_validator
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from gateway.state.keys import Keys
from gateway.state.redis_client import limits_storage

LimitKind = Literal["messages", "tokens_per_minute", "tokens_per_day", "prompt"]

# KEYS: counters; ARGV: amount, then (limit, ttl) per key. Returns 0 when reserved, else the 1-based
# index of the first counter that has no room (nothing is reserved then).
_RESERVE = """
local amount = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local used = tonumber(redis.call('GET', key) or '0')
  if used + amount > tonumber(ARGV[2 * i]) then return i end
end
for i, key in ipairs(KEYS) do
  redis.call('INCRBY', key, amount)
  redis.call('EXPIRE', key, ARGV[2 * i + 1])
end
return 0
"""

# KEYS: message windows (sorted sets of admitted messages by time, ms), then optionally the message's reply record.
# ARGV: now (ms), the message, then (limit, window ms) per window. Returns {0} when the message is admitted (or was
# already, or its record has an answer: nothing changes), else {index of the first full window (1-based), ms until
# its oldest message leaves it}. The record is given where the question is asked before the record is read (a
# rider of its load, a single Redis): a retry of an answered message, refused the first time, is not counted now.
_ADMIT = """
local now, member = tonumber(ARGV[1]), ARGV[2]
local n = (#ARGV - 2) / 2
if #KEYS > n and redis.call('HEXISTS', KEYS[n + 1], 'text') == 1 then return {0, 0} end
for i = 1, n do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - tonumber(ARGV[2 + 2 * i])) end
-- Admitted before if it is still in any window: a retry after the minute is still in the day's, and was counted
-- as new in the minute's (or refused there, once full) when each window was asked on its own (found by a review).
for i = 1, n do
  if redis.call('ZSCORE', KEYS[i], member) then return {0, 0} end
end
for i = 1, n do
  local key, limit, span = KEYS[i], tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  if redis.call('ZCARD', key) >= limit then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return {i, math.max(1, tonumber(oldest[2]) + span - now)}
  end
end
for i = 1, n do
  redis.call('ZADD', KEYS[i], 'NX', now, member)
  redis.call('PEXPIRE', KEYS[i], ARGV[2 + 2 * i])
end
return {0, 0}
"""

# KEYS: counters; ARGV: delta. Settles a reservation to what was used (never below zero).
_SETTLE = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    if redis.call('INCRBY', key, ARGV[1]) < 0 then redis.call('SET', key, 0, 'KEEPTTL') end
  end
end
return 1
"""


def _check_windows(value: str | None) -> str | None:
    if value:
        try:
            parse_many(value)
        except ValueError as exc:
            raise ValueError(f"not a limit like '20/minute' or '20/minute;300/day': {value!r}") from exc
    return value


class Budget(BaseModel):
    """Limits for one user or group. Unset fields fall back to the defaults."""

    model_config = ConfigDict(extra="forbid")

    messages: str | None = Field(default=None, description="moving windows, e.g. '20/minute;300/day'")
    tokens_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_day: int | None = Field(default=None, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=16)

    @field_validator("messages")
    @classmethod
    def _windows_parse(cls, value: str | None) -> str | None:
        return _check_windows(value)

    def over(self, base: Budget) -> Budget:
        """This budget's values where set, `base`'s elsewhere."""
        return Budget(**{**base.model_dump(), **self.model_dump(exclude_none=True)})


class Notices(BaseModel):
    """What an over-limit user is told, once per window. {limit} and {reset} are filled in."""

    model_config = ConfigDict(extra="forbid")

    messages: str = (
        "消息太频繁了（上限 {limit}），请在 {reset}后再试。"
        "You are over your message limit ({limit}); try again in {reset}."
    )
    tokens_per_minute: str = (
        "这一分钟的用量已达上限（{limit} tokens），请在 {reset}后再试。"
        "Token limit reached ({limit} a minute); try again in {reset}."
    )
    tokens_per_day: str = (
        "今天的用量已达上限（{limit} tokens），将在 {reset}后恢复。"
        "Daily token limit reached ({limit}); it resets in {reset}."
    )
    prompt: str = (
        "这条消息太长了（约 {size} tokens，上限 {limit}），请缩短后再发。"
        "Your message is too long ({size} tokens, limit {limit}); please shorten it."
    )


class LimitSettings(BaseModel):
    """Per-user and per-group limits and the HTTP flood guard (gateway/edge/flood_guard.py)."""

    model_config = ConfigDict(extra="forbid")

    per_user: str = Field(default="20/minute", description="a user's message windows, e.g. '20/minute;300/day'")
    user: Budget = Field(default_factory=Budget, description="default token budgets of every user")
    group: Budget = Field(default_factory=Budget, description="default budgets of every group conversation")
    users: dict[str, Budget] = Field(default_factory=dict, description="overrides by user id")
    groups: dict[str, Budget] = Field(default_factory=dict, description="overrides by group (conversation) id")
    max_concurrent_per_user: int = Field(default=1, ge=0, description="engine requests per user at a time; 0 = any")
    timezone: str = Field(default="Asia/Shanghai", description="where a day's token budget starts at midnight")
    notices: Notices = Field(default_factory=Notices)
    http_per_source: str = "2000/second"
    http_storage: str = "memory://"

    @field_validator("per_user")
    @classmethod
    def _per_user_parses(cls, value: str) -> str:
        _check_windows(value)
        return value

    @field_validator("timezone")
    @classmethod
    def _zone_exists(cls, value: str) -> str:
        ZoneInfo(value)
        return value

    def budget_of_user(self, user_id: str) -> Budget:
        base = self.user.over(Budget(messages=self.per_user))
        override = self.users.get(user_id)
        return override.over(base) if override else base

    def budget_of_group(self, group_id: str) -> Budget:
        override = self.groups.get(group_id)
        return override.over(self.group) if override else self.group


@dataclass(frozen=True)
class Refusal:
    """Why a message may not go to the engine now, and when it could."""

    kind: LimitKind
    who: str  # "user:ID" or "group:ID"
    limit: str
    retry_after_s: int
    size: int = 0

    def notice(self, notices: Notices) -> str:
        template = getattr(notices, self.kind)
        return template.format(limit=self.limit, reset=describe_wait(self.retry_after_s), size=self.size)


def describe_wait(seconds: int) -> str:
    """A short "in how long" in Chinese: 45 秒, 3 分钟, 5 小时."""
    if seconds < 120:
        return f"{max(1, seconds)} 秒"
    if seconds < 2 * 3600:
        return f"{math.ceil(seconds / 60)} 分钟"
    return f"{math.ceil(seconds / 3600)} 小时"


@dataclass(frozen=True)
class LimitDecision:
    """Whether a hit was allowed, and if not, in how many seconds it could be."""

    allowed: bool
    retry_after_s: int = 0


class MovingWindowLimiter:
    """Hits per key in moving windows shared by all replicas (a user's messages, a robot's sends)."""

    def __init__(self, redis_url: str, key_prefix: str, **redis_options: float) -> None:
        self._prefix = key_prefix
        uri, options = limits_storage(redis_url)
        self._storage = storage_from_string(
            uri, implementation="redispy", key_prefix=key_prefix, **options, **redis_options
        )
        self._limiter = MovingWindowRateLimiter(self._storage)

    def window_key(self, key: str, limit: RateLimitItem) -> str:
        """The Redis list the library keeps `limit`'s moving window of `key` in (its storage puts the prefix and a
        colon before its own name), for a script that counts in the same window (ReplyRecord.begin_send)."""
        return f"{self._prefix}:{limit.key_for(key)}"

    async def hit(self, key: str, limits: list[RateLimitItem]) -> LimitDecision:
        """Count one hit in every window; refused by the first that is full (the rest are not counted)."""
        for limit in limits:
            if not await self._limiter.hit(limit, key):
                return await self._refused(key, limit)
        return LimitDecision(True)

    async def _refused(self, key: str, limit: RateLimitItem) -> LimitDecision:
        stats = await self._limiter.get_window_stats(limit, key)
        return LimitDecision(False, max(1, math.ceil(stats.reset_time - time.time())))

    async def usage(self, key: str, limit: RateLimitItem) -> tuple[int, int]:
        """(hits in the window now, seconds until one frees up)."""
        stats = await self._limiter.get_window_stats(limit, key)
        return limit.amount - stats.remaining, max(0, math.ceil(stats.reset_time - time.time()))

    async def clear(self, key: str, limit: RateLimitItem) -> None:
        await self._limiter.clear(limit, key)


@functools.lru_cache(maxsize=256)
def _parsed_windows(spec: str) -> tuple[RateLimitItem, ...]:
    return tuple(parse_many(spec))


def windows(spec: str | None) -> list[RateLimitItem]:
    """The windows of a spec such as '20/minute;300/day', parsed once per process (it is asked per message)."""
    return list(_parsed_windows(spec)) if spec else []


@functools.lru_cache(maxsize=256)
def window(spec: str) -> RateLimitItem:
    return parse(spec)


@dataclass(frozen=True)
class TokenCounter:
    """One token budget window: its Redis counter, limit and when it resets."""

    key: str
    limit: int
    reset_s: int
    kind: LimitKind
    who: str


@dataclass
class Admission:
    """One message's admission into its windows (the _ADMIT script), asked alone or as a rider of the reply
    record's first load (gateway/state/riders.py). `answered` once the script's answer came."""

    sha: str
    keys: list[str]
    args: list[str | int]
    judge: Callable[[list], Refusal | None]
    answered: bool = False
    refusal: Refusal | None = None

    def queue(self, pipe: Pipeline) -> None:
        pipe.execute_command("EVALSHA", self.sha, len(self.keys), *self.keys, *self.args)

    def answer(self, result: object) -> None:
        if isinstance(result, list):
            self.refusal, self.answered = self.judge(result), True


@dataclass(frozen=True)
class Reservation:
    """Tokens reserved for one engine call, on these counters."""

    keys: tuple[str, ...]
    amount: int


class Budgets:
    """Applies LimitSettings to one message's sender and group."""

    def __init__(
        self, redis: Redis, redis_url: str, keys: Keys, settings: LimitSettings, **redis_options: float
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._settings = settings
        self._zone = ZoneInfo(settings.timezone)
        self._admit = redis.register_script(_ADMIT)
        # a sender's effective budget is asked several times per message; the settings do not change
        self._user_budget = functools.lru_cache(maxsize=4096)(settings.budget_of_user)
        self._group_budget = functools.lru_cache(maxsize=4096)(settings.budget_of_group)
        self._reserve = redis.register_script(_RESERVE)
        self._settle = redis.register_script(_SETTLE)

    async def load_scripts(self) -> None:
        """Load the admission script, which a rider calls by its SHA (evalsha in a pipeline does not load)."""
        await self._redis.script_load(_ADMIT)

    def _parties(self, user_id: str, group_id: str | None) -> list[tuple[str, Budget]]:
        parties = [(f"user:{user_id}", self._user_budget(user_id))]
        if group_id:
            parties.append((f"group:{group_id}", self._group_budget(group_id)))
        return parties

    def _message_windows(self, user_id: str, group_id: str | None) -> list[tuple[str, str, RateLimitItem]]:
        """(key, who, window) of every message window that applies to this sender and group."""
        return [
            (self._keys.message_window(who, f"{limit.amount}-{limit.get_expiry()}"), who, limit)
            for who, budget in self._parties(user_id, group_id)
            for limit in windows(budget.messages)
        ]

    async def admit_message(self, user_id: str, group_id: str | None, message_key: str) -> Refusal | None:
        """Count message `message_key` in its sender's (and group's) windows, once however often it is asked;
        a Refusal when one is full, and then no window counts it."""
        admission = self.admission(user_id, group_id, message_key)
        if admission is None:
            return None
        return admission.judge(await self._admit(keys=admission.keys, args=admission.args))

    def admission(
        self, user_id: str, group_id: str | None, message_key: str, record_key: str = ""
    ) -> Admission | None:
        """`admit_message` as a rider of the reply record's first load (`record_key`: nothing is counted when the
        record has an answer already); None when no window applies."""
        applying = self._message_windows(user_id, group_id)
        if not applying:
            return None
        argv: list[str | int] = [int(time.time() * 1000), message_key]
        for _, _, limit in applying:
            argv += [limit.amount, limit.get_expiry() * 1000]
        keys = [key for key, _, _ in applying] + ([record_key] if record_key else [])
        return Admission(self._admit.sha, keys, argv, functools.partial(self._refusal, user_id, group_id, applying))

    def _refusal(
        self, user_id: str, group_id: str | None, applying: list[tuple[str, str, RateLimitItem]], result: list
    ) -> Refusal | None:
        """The admission script's answer as a Refusal (None: admitted)."""
        full, wait_ms = result
        if not int(full):
            return None
        _, who, _ = applying[int(full) - 1]
        spec = next(str(b.messages) for w, b in self._parties(user_id, group_id) if w == who)
        return Refusal("messages", who, spec, max(1, math.ceil(int(wait_ms) / 1000)))

    async def _window_usage(self, key: str, limit: RateLimitItem) -> tuple[int, int]:
        """(messages in the window now, seconds until one leaves it)."""
        now_ms = int(time.time() * 1000)
        span = limit.get_expiry() * 1000
        await self._redis.zremrangebyscore(key, "-inf", now_ms - span)
        oldest = await self._redis.zrange(key, 0, 0, withscores=True)
        reset = math.ceil((oldest[0][1] + span - now_ms) / 1000) if oldest else 0
        return int(await self._redis.zcard(key)), max(0, reset)

    def max_prompt_tokens(self, user_id: str, group_id: str | None) -> int | None:
        sizes = [b.max_prompt_tokens for _, b in self._parties(user_id, group_id) if b.max_prompt_tokens]
        return min(sizes) if sizes else None

    def _token_counters(self, user_id: str, group_id: str | None, now: float) -> list[TokenCounter]:
        """Every token budget that applies to this sender and group now."""
        local = dt.datetime.fromtimestamp(now, self._zone)
        minute_left = 60 - local.second
        midnight = (local + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        day_left = max(1, int((midnight - local).total_seconds()))
        counters = []
        for who, budget in self._parties(user_id, group_id):
            if budget.tokens_per_minute:
                key = self._keys.token_budget(who, local.strftime("m%Y%m%d%H%M"))
                counters.append(TokenCounter(key, budget.tokens_per_minute, minute_left, "tokens_per_minute", who))
            if budget.tokens_per_day:
                key = self._keys.token_budget(who, local.strftime("d%Y%m%d"))
                counters.append(TokenCounter(key, budget.tokens_per_day, day_left, "tokens_per_day", who))
        return counters

    async def reserve(self, user_id: str, group_id: str | None, amount: int) -> Reservation | Refusal:
        """Reserve `amount` tokens on every budget that applies, or none if one has no room."""
        counters = self._token_counters(user_id, group_id, time.time())
        if not counters:
            return Reservation((), 0)
        argv: list[int] = [amount]
        for counter in counters:
            argv += [counter.limit, counter.reset_s + 5]
        failed = int(await self._reserve(keys=[c.key for c in counters], args=argv))
        if failed:
            full = counters[failed - 1]
            return Refusal(full.kind, full.who, str(full.limit), full.reset_s, size=amount)
        return Reservation(tuple(c.key for c in counters), amount)

    async def settle(self, reservation: Reservation, used: int) -> None:
        """Turn a reservation into what the engine really used (vLLM's usage)."""
        if reservation.keys and used != reservation.amount:
            await self._settle(keys=list(reservation.keys), args=[used - reservation.amount])

    # -- operators ---------------------------------------------------------------------------

    async def show(self, who_id: str) -> dict:
        """Usage and limits of a user and of a group with this id (whichever exist)."""
        report: dict = {}
        now = time.time()
        for who, budget in self._parties(who_id, who_id):
            entry: dict = {"budget": budget.model_dump(exclude_none=True), "messages": []}
            for key, who_, limit in self._message_windows(who_id, who_id):
                if who_ != who:
                    continue
                used, reset = await self._window_usage(key, limit)
                entry["messages"].append({"window": str(limit), "used": used, "limit": limit.amount, "reset_s": reset})
            for counter in self._token_counters(who_id, who_id, now):
                if counter.who == who:
                    used = int(await self._redis.get(counter.key) or 0)
                    entry[counter.kind] = {"used": used, "limit": counter.limit, "reset_s": counter.reset_s}
            entry["notice_pending"] = bool(await self._redis.exists(self._keys.limit_notice(who)))
            report[who] = entry
        return report

    async def reset(self, who_id: str) -> int:
        """Clear the windows, token counters and notice marks of a user and a group with this id."""
        cleared = 0
        for key, _, _ in self._message_windows(who_id, who_id):
            cleared += int(await self._redis.delete(key))  # what was there: an empty identity cleared "1"
        for who, _ in self._parties(who_id, who_id):
            # the id taken literally, and only its own buckets (d20261201, m202612011200): an id that is the start
            # of another's (`dingtalk:c1:$` of `dingtalk:c1:$:LWCP…`) clears nothing of that other
            literal = re.sub(r"([*?\[\]\\])", r"\\\1", who)
            async for key in self._redis.scan_iter(match=self._keys.token_budget(literal, "[dm][0-9]*")):
                cleared += int(await self._redis.delete(key))
            cleared += int(await self._redis.delete(self._keys.limit_notice(who)))
        return cleared
