"""`botgw kf handoff`: operators' actions on 微信客服 sessions."""

from __future__ import annotations

import argparse
import asyncio
import sys

import httpx

from gateway.cli.common import redis_for
from gateway.config import ConfigError, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    kf = sub.add_parser("kf", help="微信客服: operators' actions")
    kf_sub = kf.add_subparsers(dest="kf_command", required=True)
    handoff = kf_sub.add_parser("handoff", help="hand a customer to a human agent (or the queue for one)")
    handoff.add_argument("--config", required=True)
    handoff.add_argument("--bot", required=True, help="the wecom-kf bot's id")
    handoff.add_argument("--customer", required=True, help="the customer's external_userid")
    handoff.add_argument("--servicer", default=None, help="an agent's userid (state 3); default: the queue")
    handoff.add_argument("--open-kfid", default=None, help="the account (needed when the bot serves several)")
    handoff.set_defaults(run=_kf_handoff)


def _kf_handoff(args: argparse.Namespace) -> int:
    """`botgw kf handoff`: hand a 微信客服 customer to a human (a named agent, else the queue).

    The platform is asked for the customer's session first (its adapter, with the token cache the workers share):
    a customer with no session cannot be handed to anyone, and queueing the move anyway only had the worker
    dead-letter it later while this command said "queued". The session can still end between this check and the
    worker's move; the worker then dead-letters it."""
    from bots.base import SendError
    from bots.registry import build_adapter
    from gateway.queue.push import enqueue_handoff
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys
    from gateway.state.tokens import RedisTokenStore

    settings = load_settings(args.config)
    try:
        bot = settings.bot(args.bot)
        message = bot.handoff_request(args.open_kfid, args.customer, args.servicer)
    except (ValueError, ConfigError) as exc:
        print(f"botgw kf handoff: {exc}", file=sys.stderr)
        return 2
    account = message.reply_to.chat_id

    async def main() -> int | None:
        """The place in the conversation's lane, or None when the customer has no session."""
        keys = Keys(settings.namespace)
        async with redis_for(settings) as redis:
            async with httpx.AsyncClient(timeout=10) as http:
                sessions = build_adapter(bot, http, RedisTokenStore(redis, keys)).sessions
                if sessions is None or not await sessions.is_open(message.reply_to):
                    return None
            scheduler = Scheduler(redis, keys)
            await scheduler.load_scripts()
            return await enqueue_handoff(scheduler, message, settings.memory.group, args.servicer or "")

    try:
        place = asyncio.run(main())
    except SendError as exc:  # the platform refused or was unreachable: its words (no token, no secret in them)
        print(f"botgw kf handoff: cannot ask the platform for {args.customer}'s session at {account}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 3
    if place is None:
        print(
            f"botgw kf handoff: {args.customer} has no open session with {account} (ended, or never started): "
            "nothing to hand off until they write again",
            file=sys.stderr,
        )
        return 1
    print(f"handoff of {args.customer} queued (place {place} in the conversation)")
    return 0
