"""`botgw migrate-keys`: an upgrade from the key names before hash tags."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gateway.cli.common import redis_for
from gateway.config import load_settings


def register(sub: argparse._SubParsersAction) -> None:
    migrate = sub.add_parser(
        "migrate-keys", help="rename Redis keys of a release before hash tags (stop every botgw process first)"
    )
    migrate.add_argument("--config", required=True)
    migrate.add_argument("--dry-run", action="store_true", help="count what would move, change nothing")
    migrate.set_defaults(run=_migrate_keys)


def _migrate_keys(args: argparse.Namespace) -> int:
    """`botgw migrate-keys`: move a namespace's keys to the hash-tagged names, and limit counters of bare ids to
    qualified identities (gateway/state/key_migration.py)."""
    import json

    from gateway.state.identities import tenants_by_family
    from gateway.state.key_migration import migrate_keys, qualify_counters
    from gateway.state.keys import Keys
    from gateway.state.redis_client import is_cluster_url

    settings = load_settings(args.config)
    cluster = is_cluster_url(settings.redis_url)
    if cluster:
        print(
            "botgw migrate-keys: a Redis Cluster never held the old names; only limit counters are qualified",
            file=sys.stderr,
        )

    async def main() -> dict[str, int]:
        keys = Keys(settings.namespace)
        async with redis_for(settings) as redis:
            moved = {} if cluster else await migrate_keys(redis, keys, dry_run=args.dry_run)
            tenants = tenants_by_family(settings.bots)
            return {**moved, **await qualify_counters(redis, keys, tenants, dry_run=args.dry_run)}

    print(json.dumps({"namespace": settings.namespace, "dry_run": args.dry_run, **asyncio.run(main())}))
    return 0
