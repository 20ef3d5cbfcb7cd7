"""The page style (web): the answer grows in the stream store, which the gateway's /web endpoint streams to the
browser; a question's buttons (a tool call's 确认/取消) go with the stream, and the page shows them under the
answer."""

from __future__ import annotations

import logging

from bots.buttons import Question
from gateway.delivery.stream import StoredStreamPresenter
from gateway.state.reply_record import LeaseLost, ReplyState

log = logging.getLogger(__name__)


class PagePresenter(StoredStreamPresenter):
    """The web page: the gateway's /web endpoint streams it to the browser."""

    interval_s = 0.05
    _question_stored = False  # this answer's stream carries its question's buttons

    async def finish(self, text: str, state: ReplyState) -> None:
        """The question's buttons are stored with the stream before it is finished: the page reads the stream
        until it is finished, and then takes the buttons from it with the final text (after, it reads no more)."""
        question = Question.from_json(state.question)
        if question is not None and not state.buttons_sent:
            stored = await self.delivery.streams.ask(self.stream_id, question.to_json(), fence=self.fence)
            if stored is None:
                raise LeaseLost(self.stream_id)
            if not stored:  # finished before without them (cannot happen through finish): the text says to reply
                log.warning("the stream was finished without the question's buttons; it is answered by a reply")
            self._question_stored = stored
        await super().finish(text, state)

    async def ask(self, question: Question, state: ReplyState) -> None:
        """Shown with the stream (stored by `finish`); recorded now that the page can read them."""
        if not self._question_stored:
            return
        await self.record.mark(buttons_sent="1")
        state.buttons_sent = "1"
