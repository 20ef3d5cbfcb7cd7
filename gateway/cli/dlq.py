"""`botgw dlq list|show|replay|purge`: the messages that could not be answered."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gateway.cli.common import UsageError, letter_id, positive_int, redis_for
from gateway.config import load_settings


def register(sub: argparse._SubParsersAction) -> None:
    dlq = sub.add_parser("dlq", help="messages that could not be answered: list, show, replay, purge")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_sub.add_parser("list", help="the newest dead letters, one line each")
    dlq_list.add_argument("--count", type=positive_int, default=100)
    dlq_list.add_argument("--before", type=letter_id, default=None, help="only letters older than this id (next page)")
    dlq_show = dlq_sub.add_parser("show", help="one dead letter in full (reply URLs hidden)")
    dlq_show.add_argument("id", type=letter_id)
    dlq_show.add_argument("--with-urls", action="store_true",
                          help="show the reply target's URLs too (a sessionWebhook posts into the conversation)")
    dlq_replay = dlq_sub.add_parser("replay", help="queue again with the original dedup key (never answered twice)")
    dlq_replay.add_argument("ids", nargs="+", type=letter_id)
    dlq_purge = dlq_sub.add_parser("purge", help="drop dead letters")
    dlq_purge.add_argument("ids", nargs="*", type=letter_id)
    dlq_purge.add_argument("--all", action="store_true")
    for cmd in (dlq_list, dlq_show, dlq_replay, dlq_purge):
        cmd.add_argument("--config", required=True)
        cmd.set_defaults(run=_dlq)


def _dlq(args: argparse.Namespace) -> int:
    """`botgw dlq list|show|replay|purge`: the messages that could not be answered."""
    import json

    from gateway.queue.dead_letters import DeadLetters, NoSuchDeadLetter, ReportedUndelivered, UnreadableLetter
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys

    settings = load_settings(args.config)
    if args.dlq_command == "purge" and bool(args.ids) == bool(args.all):
        raise UsageError("purge takes dead-letter ids, or --all (not both)")
    failed = False  # some id named no letter, or one that cannot be replayed: exit 1, after every id was tried

    async def main() -> object:
        nonlocal failed
        keys = Keys(settings.namespace)
        async with redis_for(settings) as redis:
            letters = DeadLetters(redis, keys, Scheduler(redis, keys), settings)
            if args.dlq_command == "list":
                return [letter.summary() for letter in await letters.list(args.count, args.before or "")]
            if args.dlq_command == "show":
                return (await letters.get(args.id)).shown(with_urls=args.with_urls)
            if args.dlq_command == "purge" and args.all:
                return {"purged": await letters.purge([])}
            results = {}
            for letter in args.ids:  # each on its own: one bad id stopped the rest, and hid what was done before it
                try:
                    if args.dlq_command == "replay":
                        results[letter] = await letters.replay(letter)
                    elif await letters.purge([letter]):
                        results[letter] = "purged"
                    else:
                        raise NoSuchDeadLetter(letter)
                except (NoSuchDeadLetter, UnreadableLetter, ReportedUndelivered) as exc:
                    results[letter] = "no such dead letter" if isinstance(exc, NoSuchDeadLetter) else str(exc)
                    failed = True
            return results

    try:
        print(json.dumps(asyncio.run(main()), ensure_ascii=False, indent=2))
    except NoSuchDeadLetter as exc:
        print(f"botgw dlq {args.dlq_command}: no dead letter {exc} (`botgw dlq list` shows them)", file=sys.stderr)
        return 1
    if failed:
        print(f"botgw dlq {args.dlq_command}: not every id named a letter it could act on (`botgw dlq list`)",
              file=sys.stderr)
        return 1
    return 0
