"""What every botgw process has been doing, for the console's overview of the whole deployment.

Any number of gateways, workers and Stream processes share one Redis; the overview must show all of them. So each
process counts in memory (`PULSE`: a dict increment where a callback is taken or an answer sent, never a Redis round
trip on a message's path) and a background task (`Pulse.run`) flushes what it counted every FLUSH_S seconds in one
pipeline, all under one hash tag (`Keys.pulse`, one Cluster slot):

- `<p>:min:<minute>`: a hash per minute, `<kind>|<bot>` → how many (callback, rejected, answer, failed), kept
  MINUTES_KEPT minutes;
- `<p>:last`: a sorted set `<kind>|<bot>` → when it last happened (ZADD GT: the latest wins across processes);
- `<p>:token`, `<p>:reject`: per bot, its last token refresh error (code, the platform's words truncated, when) and
  its last refused callback (why, when);
- `<p>:procs` (id → last report) and `<p>:proc:<id>` (role, host, pid, its DingTalk Stream connections, its engines'
  readiness and load as it sees them): a process that stops reporting drops out after PROCESS_STALE_S, and one that
  stops cleanly takes itself out at once.

`read_pulse` reads it all back in two trips, for the console (gateway/console/pages/overview.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.state.keys import Keys
from gateway.state.redis_text import as_text

log = logging.getLogger(__name__)

FLUSH_S = 5.0
MINUTES_KEPT = 120  # per-minute counts kept this long (the overview reads the last 15 minutes)
PROCESS_STALE_S = 30.0  # a process that has not reported for this long is taken as gone
PROCESS_FORGET_S = 3600.0  # ... and its name dropped from the list after this long
MESSAGE_MAX = 500  # a platform's error text is kept truncated (its own words: no token, no secret in them)
LEAVE_S = 2.0  # the last flush of a process that stops, at most this long
KINDS = ("callback", "rejected", "answer", "failed")


class EngineView(Protocol):
    """What a process knows of one engine (engine/pool.py Endpoint)."""

    @property
    def name(self) -> str:  # its URL without credentials
        ...

    status: str
    in_flight: int


def _minute(at: float) -> int:
    return int(at // 60)


@dataclass
class _Pending:
    """What a process counted since its last flush."""

    counts: Counter[tuple[str, str, int]] = field(default_factory=Counter)  # (kind, bot, minute) → n
    last: dict[str, float] = field(default_factory=dict)  # "<kind>|<bot>" → when
    token_errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    rejections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def merge(self, older: _Pending) -> None:
        """Put back what a failed flush took (this process's newer facts win)."""
        self.counts.update(older.counts)
        for name, at in older.last.items():
            self.last[name] = max(at, self.last.get(name, 0.0))
        for mine, theirs in ((self.token_errors, older.token_errors), (self.rejections, older.rejections)):
            for bot, fact in theirs.items():
                mine.setdefault(bot, fact)


class Pulse:
    """One process's counters (`PULSE` is the process's own); every method on a message's path is in memory."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.role = "process"
        self.process_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.started = clock()
        self._pending = _Pending()
        self._connections: dict[str, Callable[[], bool]] = {}
        self._connection_state: dict[str, tuple[bool, float]] = {}  # bot → (connected, since when)
        self._engines: Callable[[], Iterable[EngineView]] | None = None

    # -- counted on the message's path (memory only) ------------------------------------------------

    def _count(self, kind: str, bot_id: str) -> float:
        now = self._clock()
        self._pending.counts[(kind, bot_id, _minute(now))] += 1
        return now

    def callback(self, bot_id: str) -> None:
        """A callback (or a Stream push) of `bot_id` was taken."""
        self._pending.last[f"callback|{bot_id}"] = self._count("callback", bot_id)

    def rejected(self, bot_id: str, reason: str) -> None:
        """A callback of `bot_id` was refused (bad signature, too large, …): `reason` is the refusal's short name."""
        now = self._count("rejected", bot_id)
        self._pending.rejections[bot_id] = {"reason": reason[:100], "at": now}

    def answered(self, bot_id: str) -> None:
        """An answer of `bot_id` went out."""
        self._pending.last[f"answer|{bot_id}"] = self._count("answer", bot_id)

    def failed(self, bot_id: str) -> None:
        """A message of `bot_id` could not be answered (it became a dead letter)."""
        self._count("failed", bot_id)

    def token_error(self, bot_id: str, code: int | str, message: str) -> None:
        """`bot_id`'s platform refused to give an access token: its code and its words (truncated)."""
        self._pending.token_errors[bot_id] = {"code": str(code), "message": message[:MESSAGE_MAX], "at": self._clock()}

    # -- read at each flush ---------------------------------------------------------------------

    def watch_connection(self, bot_id: str, connected: Callable[[], bool]) -> None:
        """A connection this process holds for `bot_id` (DingTalk Stream): `connected()` is read at each flush."""
        self._connections[bot_id] = connected

    def watch_engines(self, engines: Callable[[], Iterable[EngineView]]) -> None:
        """The engines as this process sees them (ready or not, how many requests it has open on each)."""
        self._engines = engines

    def _streams(self, now: float) -> dict[str, dict[str, Any]]:
        streams = {}
        for bot_id, connected in self._connections.items():
            try:
                up = bool(connected())
            except Exception:  # a connection object that cannot tell is not connected
                up = False
            was, since = self._connection_state.get(bot_id, (None, now))
            if was is not up:
                since = now
            self._connection_state[bot_id] = (up, since)
            streams[bot_id] = {"connected": up, "since": since}
        return streams

    def _engine_views(self) -> dict[str, dict[str, Any]]:
        if self._engines is None:
            return {}
        return {e.name: {"status": e.status, "in_flight": e.in_flight} for e in self._engines()}

    # -- the flush ------------------------------------------------------------------------------

    async def flush(self, redis: Redis, keys: Keys, *, leaving: bool = False) -> None:
        """Write what was counted since the last flush, and this process's report, in one trip. A flush that
        fails keeps what it took for the next one. `leaving`: the process stops, its report is taken out."""
        taken, self._pending = self._pending, _Pending()
        now = self._clock()
        prefix = keys.pulse
        pipe = redis.pipeline(transaction=False)
        buckets: set[int] = set()
        for (kind, bot_id, minute), count in taken.counts.items():
            if minute > _minute(now) - MINUTES_KEPT:
                pipe.hincrby(f"{prefix}:min:{minute}", f"{kind}|{bot_id}", count)
                buckets.add(minute)
        for minute in buckets:
            pipe.expire(f"{prefix}:min:{minute}", MINUTES_KEPT * 60)
        if taken.last:
            pipe.zadd(f"{prefix}:last", taken.last, gt=True)
        for name, facts in (("token", taken.token_errors), ("reject", taken.rejections)):
            if facts:
                pipe.hset(f"{prefix}:{name}", mapping={bot: json.dumps(fact) for bot, fact in facts.items()})
        proc = f"{prefix}:proc:{self.process_id}"
        if leaving:
            pipe.zrem(f"{prefix}:procs", self.process_id)
            pipe.delete(proc)
        else:
            report = {"role": self.role, "host": socket.gethostname(), "pid": os.getpid(), "started": self.started,
                      "at": now, "streams": self._streams(now), "engines": self._engine_views()}  # fmt: skip
            pipe.hset(proc, mapping={name: json.dumps(value) for name, value in report.items()})
            pipe.expire(proc, int(PROCESS_STALE_S * 2))
            pipe.zadd(f"{prefix}:procs", {self.process_id: now})
            pipe.zremrangebyscore(f"{prefix}:procs", "-inf", now - PROCESS_FORGET_S)
        try:
            await pipe.execute()
        except BaseException:
            self._pending.merge(taken)
            raise

    async def run(self, redis: Redis, keys: Keys, role: str) -> None:
        """Flush now and every FLUSH_S until cancelled; then a last flush that takes this process out."""
        self.role = role
        try:
            while True:
                try:
                    await self.flush(redis, keys)
                except (RedisError, OSError) as exc:  # Redis away for a while: the counts wait in memory
                    log.warning("could not write the activity counters", extra={"error": str(exc)})
                await asyncio.sleep(FLUSH_S)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(redis, keys, leaving=True), LEAVE_S)


PULSE = Pulse()  # this process's


def start_pulse(redis: Redis, keys: Keys, role: str, engines: Callable[[], Iterable[EngineView]] | None = None,
                ) -> asyncio.Task[None]:  # fmt: skip
    """The process's flusher, as a task: cancel it (and await it) when the process stops."""
    if engines is not None:
        PULSE.watch_engines(engines)
    return asyncio.create_task(PULSE.run(redis, keys, role), name="pulse")


async def stop_pulse(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# -- reading it back (the console) ---------------------------------------------------------------------


@dataclass
class Activity:
    """The deployment's activity over the last `len(minutes)` minutes (the current one, partial, last)."""

    now: float
    minutes: list[int]
    counts: dict[str, dict[str, list[int]]]  # kind → bot → per minute, oldest first
    last: dict[str, dict[str, float]]  # kind → bot → when
    token_errors: dict[str, dict[str, Any]]
    rejections: dict[str, dict[str, Any]]
    processes: list[dict[str, Any]]

    def series(self, kind: str, bot_id: str | None = None) -> list[int]:
        """Per minute, oldest first: of one bot, or of every bot (None)."""
        by_bot = self.counts.get(kind, {})
        rows = [by_bot.get(bot_id, [])] if bot_id is not None else list(by_bot.values())
        total = [0] * len(self.minutes)
        for row in rows:
            for i, count in enumerate(row):
                total[i] += count
        return total

    def total(self, kind: str, bot_id: str | None = None, minutes: int | None = None) -> int:
        """How many in the last `minutes` minutes (the current one counted; all of the window by default)."""
        series = self.series(kind, bot_id)
        return sum(series[-minutes:] if minutes else series)

    def last_at(self, kind: str, bot_id: str) -> float | None:
        return self.last.get(kind, {}).get(bot_id)


def _json(raw: object) -> Any:
    try:
        return json.loads(as_text(raw))
    except (TypeError, ValueError):
        return None


async def read_pulse(redis: Redis, keys: Keys, minutes: int = 15, now: float | None = None) -> Activity:
    """Every process's reports and counts of the last `minutes` minutes, in two trips."""
    now = time.time() if now is None else now
    prefix = keys.pulse
    window = list(range(_minute(now) - minutes + 1, _minute(now) + 1))
    pipe = redis.pipeline(transaction=False)
    for minute in window:
        pipe.hgetall(f"{prefix}:min:{minute}")
    pipe.zrange(f"{prefix}:last", 0, -1, withscores=True)
    pipe.hgetall(f"{prefix}:token")
    pipe.hgetall(f"{prefix}:reject")
    pipe.zrangebyscore(f"{prefix}:procs", now - PROCESS_STALE_S, "+inf")
    *buckets, last, tokens, rejects, alive = await pipe.execute()
    counts: dict[str, dict[str, list[int]]] = {}
    for i, bucket in enumerate(buckets):
        for name, value in bucket.items():
            kind, _, bot_id = as_text(name).partition("|")
            counts.setdefault(kind, {}).setdefault(bot_id, [0] * len(window))[i] = int(value)
    latest: dict[str, dict[str, float]] = {}
    for name, at in last:
        kind, _, bot_id = as_text(name).partition("|")
        latest.setdefault(kind, {})[bot_id] = float(at)
    processes = []
    if alive:
        pipe = redis.pipeline(transaction=False)
        for process_id in alive:
            pipe.hgetall(f"{prefix}:proc:{as_text(process_id)}")
        for process_id, report in zip(alive, await pipe.execute(), strict=True):
            if report:
                processes.append({"id": as_text(process_id), **{as_text(k): _json(v) for k, v in report.items()}})
    processes.sort(key=lambda p: (str(p.get("role")), str(p.get("host")), str(p["id"])))
    return Activity(
        now=now,
        minutes=window,
        counts=counts,
        last=latest,
        token_errors={as_text(bot): fact for bot, raw in tokens.items() if isinstance(fact := _json(raw), dict)},
        rejections={as_text(bot): fact for bot, raw in rejects.items() if isinstance(fact := _json(raw), dict)},
        processes=processes,
    )
