"""The card style (DingTalk AI card): created and delivered once each, each step recorded after it happened,
updated with the full text so far (at most `cards.updates_per_second`), finished or marked failed."""

from __future__ import annotations

import logging
from typing import Any

from bots.base import SendError
from bots.channels import CardChannel
from gateway.delivery.base import Presenter
from gateway.state.reply_record import ReplyState

log = logging.getLogger(__name__)
CARD_STREAM_LIMIT = 1000  # cards are not limited per user; the store's limit is for WeCom's rule


class CardPresenter(Presenter):
    """A DingTalk AI card, created and delivered once each, updated with the full text so far (≤ updates_per_second)."""

    streams = True
    always_answers = True
    adapter: CardChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.interval_s = 1.0 / self.adapter.cards.updates_per_second
        self._inputting = False
        self.track_id = ""

    async def open(self, state: ReplyState) -> None:
        """One card per answer, created and then delivered, each step recorded once it happened: a retry or a
        takeover continues the recorded card (a failed delivery is delivered again, never created again)."""
        message = self.message
        if not state.card_created:
            await self._create(state)
        self.track_id = state.card_track
        await self.delivery.streams.open(
            message.bot_id, message.sender_id, self.track_id, limit=CARD_STREAM_LIMIT, max_age_s=3600
        )
        if not state.card_sent:
            await self._deliver_card(state)

    async def _create(self, state: ReplyState) -> None:
        """Create the card, each try under a track id of its own, recorded before the try: DingTalk's answer to
        a second create of one outTrackId is UNCONFIRMED, and a try whose outcome is unknown (a 5xx, a timeout,
        a crash) may have made its card. Such a card was never delivered, so nobody sees it."""
        message, cards = self.message, self.adapter.cards

        async def attempt(_: int) -> None:
            state.card_track = cards.new_track_id(message.bot_id, message.conversation_id, message.msg_id)
            await self.record.mark(card_track=state.card_track)
            await cards.create(state.card_track, group_id=message.reply_to.chat_id)

        await self.delivery.retry_send(attempt)
        await self.record.mark(card_created="1")
        state.card_created = "1"

    async def _deliver_card(self, state: ReplyState) -> None:
        """Deliver the card into the conversation. A repeat after a try whose outcome is unknown may be refused
        because the first one arrived (DingTalk's answer is UNCONFIRMED): a refusal then counts as delivered,
        as the same request was not refused the first time."""
        target, cards = self.message.reply_to, self.adapter.cards
        earlier = bool(state.card_deliver_started)
        await self.record.mark(card_deliver_started="1")

        async def attempt(resend: bool) -> None:
            try:
                await cards.deliver(self.track_id, group_id=target.chat_id, user_id=target.user_id)
            except SendError as exc:
                if exc.retryable or not resend:
                    raise
                log.warning("a repeated card delivery was refused; taking the earlier one to have arrived",
                            extra={"error": str(exc)})  # fmt: skip

        await self.delivery.send_with_resends(self.record, state, "card", attempt, started_before=earlier)
        await self.record.mark(card_sent="1")
        state.card_sent = "1"

    @property
    def stream_id(self) -> str:
        return self.track_id

    async def show(self, text: str) -> None:
        """An update on the way: one the platform refuses for now (its calls a second used up, a 5xx) is skipped,
        as the next carries the full text and the finish is retried. Raised, it failed the whole answer, which
        was then generated again (DingTalk's API limit is per app: a few people's streamed cards reach it)."""
        if not await self._update(text):
            return
        try:
            if not self._inputting:
                await self.adapter.cards.writing(self.track_id)
                self._inputting = True
            await self.adapter.cards.show(self.track_id, text)
        except SendError as exc:
            if not exc.retryable:
                raise
            log.info("skipped a card update the platform refused for now", extra={"code": str(exc.code)})

    async def deliver(self, text: str, state: ReplyState) -> None:
        if not self.track_id:
            await self.open(state)
        if state.card_delivered:  # the card was finished before a takeover; only the record was missing
            return
        # The card shows the full text with every update: finish with what the store settled on, so that a
        # final text that does not extend what was shown is added after it, not swapped in for it.
        final = await self._finish_stored(text)
        await self.delivery.retry_send(lambda attempt: self._finalize(final))
        await self.record.mark(card_delivered="1")
        state.card_delivered = "1"

    async def _finalize(self, final: str) -> None:
        """The full text, finalized, and the finished state: both idempotent, so a retry repeats them whole."""
        await self.adapter.cards.show(self.track_id, final, final=True)
        await self.adapter.cards.finished(self.track_id, final)

    async def fail(self, text: str, state: ReplyState) -> None:
        if not self.track_id:
            await self.open(state)
        final = await self._finish_stored(text)
        try:
            await self.adapter.cards.failed(self.track_id, final)
        except SendError as exc:
            log.warning("could not mark the card failed", extra={"error": str(exc)})
