"""`botgw push`: a message for a WeCom group robot, queued for the workers (paced to 20 a minute)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gateway.cli.common import UsageError, redis_for
from gateway.config import ConfigError, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    push = sub.add_parser("push", help="queue a message for a WeCom group robot (paced to 20 a minute)")
    push.add_argument("--config", required=True)
    push.add_argument("--bot", required=True)
    push.add_argument("--markdown", action="store_true")
    push.add_argument("text")
    push.set_defaults(run=_push)


def _push(args: argparse.Namespace) -> int:
    from gateway.queue.push import enqueue_push
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys

    if not args.text.strip():  # it was queued, then refused by WeCom: a dead letter and an alert for nothing
        raise UsageError("the text is empty")
    settings = load_settings(args.config)
    if settings.bot(args.bot).platform != "wecom-webhook":
        robots = ", ".join(bot.id for bot in settings.bots if bot.platform == "wecom-webhook") or "none configured"
        raise ConfigError(f"bot {args.bot!r} is not a wecom-webhook group robot (group robots: {robots})")

    async def main() -> int:
        async with redis_for(settings) as redis:
            return await enqueue_push(
                Scheduler(redis, Keys(settings.namespace)), args.bot, args.text, markdown=args.markdown
            )

    turn = asyncio.run(main())
    print(f"queued as push #{turn} for {args.bot}; a worker delivers it within the robot's rate", file=sys.stderr)
    return 0
