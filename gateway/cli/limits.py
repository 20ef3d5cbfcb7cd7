"""`botgw limits show|reset`: a person's or group's usage against its limits."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gateway.cli.common import redis_for
from gateway.config import load_settings


def register(sub: argparse._SubParsersAction) -> None:
    limits = sub.add_parser("limits", help="a user's or group's usage against its limits")
    limits_sub = limits.add_subparsers(dest="limits_command", required=True)
    for name, help_text in (("show", "usage, limits and reset times"), ("reset", "clear the windows and budgets")):
        cmd = limits_sub.add_parser(name, help=help_text)
        cmd.add_argument("--config", required=True)
        cmd.add_argument(
            "who",
            help="a person or group, qualified: <family>:<tenant>:<id> (wecom:<corp_id>:zhangsan; "
            "the tenant may be left out when the family has one)",
        )
        cmd.set_defaults(run=_limits)


def _limits(args: argparse.Namespace) -> int:
    """`botgw limits show|reset ID`: a user's or group's usage against its limits, or a fresh start."""
    import json

    from gateway.state.identities import IdentityError, qualify, tenants_by_family
    from gateway.state.keys import Keys
    from gateway.state.limits import Budgets

    settings = load_settings(args.config)
    try:
        who = qualify(args.who, tenants_by_family(settings.bots))
    except IdentityError as exc:
        print(f"botgw limits: {exc}", file=sys.stderr)
        return 2

    async def main() -> dict:
        async with redis_for(settings) as redis:
            budgets = Budgets(redis, settings.redis_url, Keys(settings.namespace), settings.limits)
            if args.limits_command == "reset":
                return {"reset": who, "cleared": await budgets.reset(who)}
            return await budgets.show(who)

    print(json.dumps(asyncio.run(main()), ensure_ascii=False, indent=2))
    return 0
