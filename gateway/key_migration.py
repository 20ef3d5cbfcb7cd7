"""Moving a namespace's keys from the names before hash tags (`botgw:sched:…`) to today's (`{botgw}:sched:…`).

Releases before Redis Cluster support named every key `<ns>:…`. The queue, the reply records, memory and
streams now live under `{<ns>}:…`, and token budgets under `{<ns>:budget}:…` (gateway/keys.py). Without a
move, an upgrade would start with an empty queue and forget every conversation. `botgw migrate-keys`
renames them, with every botgw process stopped (an old process still running would write the old names).
Only a single server (or Sentinel's primary) can hold the old names: they never ran on a cluster.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.keys import Keys

# Old prefix (after `<ns>:`) -> which new prefix it moves under.
_MOVES = {
    "sched:": "core",
    "dedup:": "core",
    "sigbind:": "core",
    "reply:": "core",
    "mem:": "core",
    "stream:": "core",
    "streams:": "core",
    "pull:": "core",
    "owner:": "core",
    "quota:": "core",
    "tok:": "budget",
}
_SINGLE_KEYS = ("dead",)  # keys moved by their whole name


def _new_name(keys: Keys, old: str) -> str | None:
    rest = old[len(keys.namespace) + 1 :]
    if rest in _SINGLE_KEYS:
        return f"{keys.core}:{rest}"
    for prefix, target in _MOVES.items():
        if rest.startswith(prefix):
            return f"{getattr(keys, target)}:{rest}"
    return None


async def old_keys_present(redis: Redis, keys: Keys) -> bool:
    """Cheap check at start: the old scheduler's counters exist (every namespace that ever ran has them) and
    the new ones do not (once this release has run, old names left over are what `migrate-keys` reported as
    kept, not a reason to stay down). False when Redis does not answer: the check is for an upgrade."""
    try:
        old = await redis.exists(f"{keys.namespace}:sched:stats")
        return bool(old) and not await redis.exists(keys.scheduler_stats)
    except RedisError:
        return False


async def migrate_keys(redis: Redis, keys: Keys, dry_run: bool = False) -> dict[str, int]:
    """Rename every old-named key of the namespace; a key whose new name already exists is left (and counted).

    A stream's hash names its user's set of open streams by key: that field is rewritten too."""
    counts = {"moved": 0, "kept_existing": 0}
    patterns = [f"{keys.namespace}:{prefix}*" for prefix in _MOVES] + [f"{keys.namespace}:{k}" for k in _SINGLE_KEYS]
    for pattern in patterns:
        async for raw in redis.scan_iter(match=pattern, count=1000):
            old = raw.decode() if isinstance(raw, bytes) else raw
            new = _new_name(keys, old)
            if new is None:
                continue
            if dry_run:
                counts["kept_existing" if await redis.exists(new) else "moved"] += 1
                continue
            if not await redis.renamenx(old, new):
                counts["kept_existing"] += 1
                continue
            counts["moved"] += 1
            if old.startswith(f"{keys.namespace}:stream:"):
                active = await redis.hget(new, "active")
                if active:
                    moved = _new_name(keys, active.decode())
                    if moved:
                        await redis.hset(new, "active", moved)
    return counts
