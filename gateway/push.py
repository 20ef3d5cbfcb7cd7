"""Pushing a message through a send-only group robot: notifications and operators' alerts.

A push is queued like any answer (durable, retried, delivered once) and paced by the
worker to the robot's per-minute allowance.
"""

from __future__ import annotations

import secrets
import time

from bots.base import InboundMessage, ReplyTarget
from gateway.queue import WorkQueue

PUSH_PLATFORM = "wecom-webhook"


async def enqueue_push(queue: WorkQueue, bot_id: str, text: str, *, markdown: bool = False) -> int:
    """Queue `text` for the group robot `bot_id`; returns its turn number in the robot's send order."""
    message = InboundMessage(
        platform=PUSH_PLATFORM,
        bot_id=bot_id,
        msg_id=f"push-{time.time_ns()}-{secrets.token_hex(4)}",
        conversation_id="push",
        sender_id="botgw",
        text="",
        reply_to=ReplyTarget(chat_id="markdown" if markdown else "text"),
    )
    fields = {"msg": message.model_dump_json(), "kind": "notice", "notice": text, "rid": ""}
    return await queue.enqueue(message.conversation_key, fields)
