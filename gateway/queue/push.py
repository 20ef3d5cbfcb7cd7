"""Pushing a message through a send-only group robot: notifications and operators' alerts.

A push is queued like any answer (durable, retried, delivered once) and paced by the
worker to the robot's per-minute allowance.
"""

from __future__ import annotations

import secrets
import time

from bots.base import InboundMessage, ReplyTarget
from gateway.queue.entry import EntryKind, QueueEntry
from gateway.queue.scheduler import Scheduler
from gateway.state.memory import GroupMemory, Scope

PUSH_PLATFORM = "wecom-webhook"


async def enqueue_push(scheduler: Scheduler, bot_id: str, text: str, *, markdown: bool = False) -> int:
    """Queue `text` for the group robot `bot_id`; returns its place in the robot's send order."""
    message = InboundMessage(
        platform=PUSH_PLATFORM,
        bot_id=bot_id,
        msg_id=f"push-{time.time_ns()}-{secrets.token_hex(4)}",
        conversation_id="push",
        sender_id="botgw",
        text="",
        reply_to=ReplyTarget(chat_id="markdown" if markdown else "text"),
    )
    return await enqueue_notice(scheduler, message, text)


async def enqueue_notice(scheduler: Scheduler, message: InboundMessage, text: str, rid: str = "") -> int:
    """Queue a ready-made answer `text` for `message` (no engine): delivered like any answer, in the
    order of the message's conversation. Returns its place in that conversation's lane."""
    entry = QueueEntry(
        owner=message.conversation_key, kind=EntryKind.NOTICE, message=message, notice=text, request_id=rid or None
    )
    return await scheduler.enqueue(message.session_key, entry)


async def enqueue_handoff(scheduler: Scheduler, message: InboundMessage, group: GroupMemory, servicer: str = "") -> int:
    """Queue an operator's handoff of the conversation `message` names (to `servicer`, else the queue for a
    human) in that conversation's lane, so it happens in order with the answers already queued there."""
    scope = Scope.of(message, group)
    entry = QueueEntry(owner=scope.owner, kind=EntryKind.HANDOFF, message=message, servicer=servicer)
    return await scheduler.enqueue(scope.lane, entry)
