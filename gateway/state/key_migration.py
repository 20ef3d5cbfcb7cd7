"""Moving a namespace's keys from the names before hash tags (`botgw:sched:…`) to today's (`{botgw}:sched:…`).

Releases before Redis Cluster support named every key `<ns>:…`. The queue, the reply records, memory and
streams now live under `{<ns>}:…`, and token budgets under `{<ns>:budget}:…` (gateway/state/keys.py). Without a
move, an upgrade would start with an empty queue and forget every conversation. `botgw migrate-keys`
renames them, with every botgw process stopped (an old process still running would write the old names).
Only a single server (or Sentinel's primary) can hold the old names: they never ran on a cluster.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.state.keys import Keys

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


def _bare_counter(keys: Keys, name: str) -> tuple[str, str, str, str] | None:
    """(kind: tok|win, who: user|group, bare id, bucket) of a limit counter named by a bare id, else None.

    Before identities were qualified, `{<ns>:budget}:tok:user:zhangsan:d20261201` counted every platform's
    zhangsan; today's names carry `<family>:<tenant>:` before the id (two more ':')."""
    rest = name[len(keys.budget) + 1 :]
    parts = rest.split(":")
    if len(parts) != 4 or parts[0] not in ("tok", "win") or parts[1] not in ("user", "group"):
        return None
    kind, who, bare, bucket = parts
    return kind, who, bare, bucket


async def qualify_counters(
    redis: Redis, keys: Keys, tenants: dict[str, list[str]], dry_run: bool = False
) -> dict[str, int]:
    """Carry the limit counters of bare ids over to qualified identities (gateway/state/identities.py).

    A bare counter was shared by every platform's user of that id, so which person it was is not known: it is
    copied to the identity of every configured family and tenant (each keeps what was used, so nobody gains
    a fresh budget by the upgrade; a day's budget and a message window end within a day anyway), then
    removed. A qualified counter that exists already is left as it is. Both names are in the budgets' slot:
    COPY works on a cluster too."""
    counts = {"counters_qualified": 0, "counters_kept_existing": 0}
    targets = [(family, tenant) for family, names in tenants.items() for tenant in names]
    for kind in ("tok", "win"):
        async for raw in redis.scan_iter(match=f"{keys.budget}:{kind}:*", count=1000):
            old = raw.decode() if isinstance(raw, bytes) else raw
            parsed = _bare_counter(keys, old)
            if parsed is None:
                continue
            _, who, bare, bucket = parsed
            for family, tenant in targets:
                new = f"{keys.budget}:{kind}:{who}:{family}:{tenant}:{bare}:{bucket}"
                if dry_run:
                    exists = await redis.exists(new)
                elif await redis.copy(old, new):
                    exists = False
                else:
                    exists = True
                counts["counters_kept_existing" if exists else "counters_qualified"] += 1
            if not dry_run:
                await redis.delete(old)
    return counts
