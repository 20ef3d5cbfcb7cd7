"""Styles whose text grows in the stream store (Redis), read from there by whoever shows it: the WeCom AI bot's
stream (WeCom's refresh callbacks, any replica), finished with the first 20480 bytes and the rest posted once
through response_url. The web page reads the same store (gateway/delivery/page.py)."""

from __future__ import annotations

import logging
import time

from bots.base import SendError
from bots.channels import StreamChannel
from bots.text import utf8_len, utf8_prefix
from gateway import texts
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
    """The WeCom AI bot's stream: WeCom's refresh callbacks read it from Redis (any replica)."""

    adapter: StreamChannel

    async def show(self, text: str) -> None:
        # Room for the cut note is kept while writing: a final text that ends with the note must extend what
        # was shown (a stream only grows), or the note would land past the cap and be cut off itself.
        await self._update(utf8_prefix(text, self.adapter.max_stream_bytes - utf8_len(texts.ANSWER_CUT_TEXT)))

    async def deliver(self, text: str, state: ReplyState) -> None:
        """The stream takes the first 20,480 bytes; the rest goes once through response_url, posted before the
        stream is finished, so that when the post cannot be made (no usable URL, expired, refused) the stream
        still ends with a note that says the answer was cut, never silently."""
        cap = self.adapter.max_stream_bytes
        visible = utf8_prefix(text, cap)
        rest = text[len(visible) :]
        if rest and not state.overflow_sent and not await self._post_overflow(rest):
            visible = utf8_prefix(text, cap - utf8_len(texts.ANSWER_CUT_TEXT)) + texts.ANSWER_CUT_TEXT
        await self._finish_stored(visible)

    async def _post_overflow(self, rest: str) -> bool:
        """Post what did not fit the stream through response_url; False when it could not be posted."""
        target = self.message.reply_to
        if not self.adapter.overflow_allowed(target):
            return False
        overflow_cap = self.adapter.max_overflow_bytes
        if utf8_len(rest) > overflow_cap:  # longer than the stream and the one post together: say where it ends
            rest = utf8_prefix(rest, overflow_cap - utf8_len(texts.ANSWER_CUT_TEXT)) + texts.ANSWER_CUT_TEXT
        # response_url takes one message: never post twice, even if this worker dies right after posting.
        if not await self.record.claim("overflow_started", f"{time.time():.3f}"):
            log.warning("overflow post of an earlier attempt has an unknown outcome; not posting again")
            return True
        try:
            await self.delivery.retry_send(lambda attempt: self.adapter.send_overflow(target, rest))
        except SendError as exc:
            log.warning("the rest of a long answer could not be posted; the stream says it was cut",
                        extra={"error": str(exc)})  # fmt: skip
            return False
        await self.record.mark(overflow_sent="1")
        return True
