"""An operator's handoff of a 微信客服 customer to a human, as `POST /admin/kf/{bot}/handoff` and the console's
微信客服 page both make it (`botgw kf handoff` makes the same checks from a shell): the platform is asked first whether
the customer has a session a move can take, then the move is queued in the customer's lane; the worker does it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bots.base import SendError
from gateway.queue.push import enqueue_handoff

if TYPE_CHECKING:
    from gateway.runtime import Runtime


class HandoffRefused(Exception):
    """Why a handoff was not queued, with the HTTP status that says it (404 no bot, 400 a bad request, 409 no
    open session, 502 the platform did not say)."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


async def queue_handoff(runtime: Runtime, bot_id: str, open_kfid: object, customer: object, servicer: object) -> int:
    """Queue the handoff of `customer` (in account `open_kfid`, where the bot serves several) to `servicer`, else
    the queue for a human; returns its place in the customer's lane. HandoffRefused says why not.
    Any bot whose platform has human agents (`adapter.sessions`) takes it."""
    adapter = runtime.adapters.get(bot_id)
    if adapter is None:
        raise HandoffRefused(404, f"no bot {bot_id!r}")
    if adapter.sessions is None:
        raise HandoffRefused(400, f"bot {bot_id!r} has no human agents to hand over to")
    try:
        message = runtime.settings.bot(bot_id).handoff_request(open_kfid, customer, servicer)
    except ValueError as exc:
        raise HandoffRefused(400, str(exc)) from exc
    # Asked first, as `botgw kf handoff` does: a person without an open conversation cannot be handed to anyone,
    # and queueing the move anyway only had the worker dead-letter it after this said "queued".
    account, person = message.reply_to.chat_id, message.sender_id
    try:
        if not await adapter.sessions.is_open(message.reply_to):
            raise HandoffRefused(409, f"{person} has no open session with {account} (ended, or never started): "
                                      "nothing to hand off until they write again")  # fmt: skip
    except SendError as exc:  # the platform refused or did not answer: its words (no token, no secret in them)
        raise HandoffRefused(502, f"cannot ask the platform for the conversation: {exc}") from exc
    return await enqueue_handoff(runtime.scheduler, message, runtime.settings.memory.group, str(servicer or ""))
