"""Styles whose text grows in the stream store (Redis), read from there by whoever shows it: the WeCom AI bot's
stream (WeCom's refresh callbacks, any replica), finished with the first 20480 bytes and the rest posted once
through response_url (or, when that post is free, a question's buttons; a tap's whole answer, as a tap has no
stream). The web page reads the same store (gateway/delivery/page.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

from bots.base import SendError
from bots.buttons import Question
from bots.channels import StreamChannel
from bots.text import utf8_len, utf8_prefix
from gateway import metrics, texts
from gateway.delivery.base import Presenter
from gateway.state.reply_record import ReplyState

log = logging.getLogger(__name__)


class StoredStreamPresenter(Presenter):
    """A stream kept in the stream store (Redis): the platform or the page reads it from there."""

    streams = True
    always_answers = True

    @property
    def stream_id(self) -> str:
        return self.message.reply_to.stream_id

    async def show(self, text: str) -> None:
        await self._update(text)

    async def deliver(self, text: str, state: ReplyState) -> None:
        await self._finish_stored(text)


class StreamPresenter(StoredStreamPresenter):
    """The WeCom AI bot's stream: WeCom's refresh callbacks read it from Redis (any replica).

    The message's response_url takes one post, recorded as `overflow_started` before it is made (never twice,
    even if this worker dies right after): the rest of a long answer, else the question's buttons, else nothing.
    A message without a stream (a tap on a button) is answered by that one post alone."""

    adapter: StreamChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.streams = bool(self.stream_id)  # a tap's answer is posted whole: nothing is shown while written

    async def show(self, text: str) -> None:
        if not self.streams:
            return
        # Room for the cut note is kept while writing: a final text that ends with the note must extend what
        # was shown (a stream only grows), or the note would land past the cap and be cut off itself.
        await self._update(utf8_prefix(text, self.adapter.max_stream_bytes - utf8_len(texts.ANSWER_CUT_TEXT)))

    async def deliver(self, text: str, state: ReplyState) -> None:
        """The stream takes the first 20,480 bytes; the rest goes once through response_url, posted before the
        stream is finished, so that when the post cannot be made (no usable URL, expired, refused) the stream
        still ends with a note that says the answer was cut, never silently. Without a stream, the whole
        answer is that post."""
        if not self.streams:
            if not state.overflow_sent and not await self._post_once(text):
                log.warning("the answer to a message without a stream could not be posted through its response_url")
                await self.record.mark(send_failed="response_url")  # said in the record, counted
                metrics.REPLIES.labels(self.message.platform, "undeliverable").inc()
            return
        cap = self.adapter.max_stream_bytes
        visible = utf8_prefix(text, cap)
        rest = text[len(visible) :]
        if rest and not state.overflow_sent and not await self._post_once(rest):
            visible = utf8_prefix(text, cap - utf8_len(texts.ANSWER_CUT_TEXT)) + texts.ANSWER_CUT_TEXT
        await self._finish_stored(visible)

    async def ask(self, question: Question, state: ReplyState) -> None:
        """The question's buttons take the response_url when nothing else took it (the rest of a long answer
        did, or the answer itself for a tap): else the question is answered by a reply, as its text says."""
        target = self.message.reply_to
        if self.adapter.buttons is None or state.overflow_started or not self.adapter.overflow_allowed(target):
            return
        if not await self.record.claim("overflow_started", f"{time.time():.3f}"):
            return
        await super().ask(question, state)

    async def _post_once(self, text: str) -> bool:
        """Post `text` through response_url (cut, with a note, to what one post takes); False when it could not
        be posted."""
        target = self.message.reply_to
        if not self.adapter.overflow_allowed(target):
            return False
        overflow_cap = self.adapter.max_overflow_bytes
        if utf8_len(text) > overflow_cap:  # longer than the one post: say where it ends
            text = utf8_prefix(text, overflow_cap - utf8_len(texts.ANSWER_CUT_TEXT)) + texts.ANSWER_CUT_TEXT
        # response_url takes one message: never post twice, even if this worker dies right after posting.
        if not await self.record.claim("overflow_started", f"{time.time():.3f}"):
            log.warning("a response_url post of an earlier attempt has an unknown outcome; not posting again")
            return True
        try:
            await self.delivery.retry_send(lambda attempt: self.adapter.send_overflow(target, text))
        except SendError as exc:
            log.warning("an answer could not be posted through response_url", extra={"error": str(exc)})
            return False
        await self.record.mark(overflow_sent="1")
        return True
