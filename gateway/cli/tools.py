"""`botgw tools audit`: who asked which tool to do what, when, and how it went (the trail of tools/audit.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import datetime
from typing import TYPE_CHECKING

from gateway.cli.common import UsageError, positive_int, redis_for
from gateway.config import load_settings

if TYPE_CHECKING:
    from tools.audit import AuditRecord

ARGUMENTS_SHOWN = 60  # characters of a record's arguments in the table (--json has them whole)


def register(sub: argparse._SubParsersAction) -> None:
    tools = sub.add_parser("tools", help="the assistant's tools: the audit trail of confirmations and calls")
    tools_sub = tools.add_subparsers(dest="tools_command", required=True)
    audit = tools_sub.add_parser("audit", help="confirmations asked, given, cancelled and calls made; newest last")
    audit.add_argument("--config", required=True)
    audit.add_argument("--user", help="only this person: wecom:<corp_id>:zhangsan, or wecom:zhangsan when the "
                       "family has one tenant")
    audit.add_argument("--since", help="only this recent: 90s, 30m, 12h, 7d (or bare seconds)")
    audit.add_argument("--limit", type=positive_int, default=1000, help="at most this many, the most recent "
                       "(default 1000, at most 10000)")
    audit.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    audit.set_defaults(run=_audit)


def _audit(args: argparse.Namespace) -> int:
    """Read the trail with the filters given and print it, oldest first (the newest at the bottom)."""
    from gateway.state.identities import IdentityError, qualify, tenants_by_family
    from gateway.state.keys import Keys
    from tools.audit import MAX_READ, ToolAudit, parse_duration

    settings = load_settings(args.config)
    try:
        user = qualify(args.user, tenants_by_family(settings.bots)) if args.user is not None else None
        since_s = parse_duration(args.since) if args.since is not None else None
    except (IdentityError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if args.limit > MAX_READ:
        raise UsageError(f"--limit {args.limit}: at most {MAX_READ}")

    async def main() -> list[AuditRecord]:
        async with redis_for(settings) as redis:
            audit = ToolAudit(redis, Keys(settings.namespace), settings.tools)
            return await audit.read(user=user, since_s=since_s, limit=args.limit)

    records = asyncio.run(main())
    if args.json:
        for record in records:
            print(json.dumps(record.to_json(), ensure_ascii=False))
    elif not records:
        print("no tool audit records" + (f" for {user}" if user else "") + (f" since {args.since}" if since_s else ""))
    else:
        print(_table(records))
    return 0


def _table(records: list[AuditRecord]) -> str:
    """Aligned columns: local time, user, tool, kind, outcome, duration, and the arguments cut short."""
    rows = [("time", "user", "tool", "kind", "outcome", "duration", "arguments")]
    for record in records:
        shown = json.dumps(record.arguments, ensure_ascii=False)
        if len(shown) > ARGUMENTS_SHOWN:
            shown = shown[: ARGUMENTS_SHOWN - 1] + "…"
        at = datetime.fromtimestamp(record.ts).astimezone().isoformat(timespec="seconds")
        outcome = record.outcome or "-"
        rows.append((at, record.user, record.tool, record.kind, outcome, f"{record.duration_ms} ms", shown))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
                     for row in rows)
