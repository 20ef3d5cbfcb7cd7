"""Styles whose text grows in the stream store (Redis), read from there by whoever shows it: the WeCom AI bot's
stream (WeCom's refresh callbacks, any replica), finished with the first 20480 bytes and the rest posted once
through response_url (or, when that post is free, a question's buttons; a tap's whole answer, as a tap has no
stream; the whole answer when the stream was closed at its time limit before the answer came). The web page
reads the same store (gateway/delivery/page.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

from bots.base import PermanentSendError, SendError
from bots.buttons import Question
from bots.channels import StreamChannel
from bots.text import utf8_len, utf8_prefix
from gateway import metrics, texts
from gateway.delivery.base import Presenter
from gateway.state.reply_record import ReplyState
from gateway.state.streams import StreamState

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
    A message without a stream (a tap on a button) is answered by that one post alone, and so is an answer that
    comes after a refresh closed its stream at the platform's time limit (workers or engine too slow)."""

    adapter: StreamChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.streams = bool(self.stream_id)  # a tap's answer is posted whole: nothing is shown while written

    @staticmethod
    def _ended_early(stream: StreamState | None) -> bool:
        """Whether the stream ended without this answer: closed by a refresh callback at the platform's time limit
        (gateway/edge/callbacks.py, unfenced, marked `timed_out`) or gone from the store (its hour
        passed). Nothing written into it from now on is seen; only response_url can still carry the answer."""
        if stream is None:
            return True
        before = texts.STREAM_TIMEOUT_TEXTS_BEFORE  # closed by a gateway older than the mark (a rolling upgrade)
        return stream.finished and (stream.timed_out or stream.content.endswith(before))

    async def _closed_early(self) -> bool:
        return self._ended_early(await self.delivery.streams.get(self.stream_id))

    async def open(self, state: ReplyState) -> None:
        """Before the engine is asked: when the stream was closed early and the response_url cannot take a post
        (expired, unusable or used), no answer can reach the person, so the engine is not asked at all and the
        message ends as failed (PermanentSendError: a dead letter, counted failed, not sent)."""
        if not self.streams or not await self._closed_early():
            return
        if state.overflow_started or not self.adapter.overflow_allowed(self.message.reply_to):
            log.warning("the stream was closed at the time limit and response_url cannot be used; not asking the "
                        "engine", extra={"stream_id": self.stream_id})  # fmt: skip
            raise PermanentSendError("stream closed at the time limit, response_url unusable", code="stream_closed")

    async def shown(self) -> str:
        """What the engine continues: nothing once the stream was closed early, as its text is then (or ends
        with) the time-limit apology, which is no part of the answer; the whole answer goes to response_url."""
        if not self.streams:
            return ""
        stream = await self.delivery.streams.get(self.stream_id)
        return "" if stream is None or self._ended_early(stream) else stream.content

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
        if rest and await self._closed_early():  # checked first: the one post must carry the whole answer then
            await self._post_late(text, state)
            return
        rest_posted = bool(rest) and bool(state.overflow_sent or await self._post_once(rest))
        if rest and not rest_posted:
            visible = utf8_prefix(text, cap - utf8_len(texts.ANSWER_CUT_TEXT)) + texts.ANSWER_CUT_TEXT
        if await self._finish_stored(visible) != visible and await self._closed_early():
            # closed at the time limit before the finish: the answer is not in the stream (a finish that applied
            # costs no extra read). Had the rest taken the post while it was being posted, nothing more can be
            # sent: the start of the answer was never shown, so the message fails rather than counts as sent.
            if rest_posted:
                raise PermanentSendError("the stream closed at the time limit while the rest of the answer was "
                                         "posted: its start was not shown", code="stream_closed")  # fmt: skip
            await self._post_late(text, state)

    async def _post_late(self, text: str, state: ReplyState) -> None:
        """The answer to a stream closed early (the person saw only the time-limit apology, maybe after part of
        the answer): posted whole through response_url, which nothing used yet. At most once by design, as
        `_post_once` claims `overflow_started` before posting (the URL takes one post: a post whose outcome is
        unknown is never repeated) and marks `overflow_sent` after it. When it cannot be posted, the message
        fails (raised) rather than being counted as sent."""
        state = await self.record.load()  # as it is now: a post of the rest may have taken the URL since `state`
        if state.overflow_sent:  # an earlier attempt posted the answer
            return
        if state.overflow_started:  # the one post was taken, by this answer's rest or an attempt that died
            log.warning("response_url was taken by a post that did not complete; not posting again",
                        extra={"stream_id": self.stream_id})  # fmt: skip
            raise PermanentSendError("stream closed at the time limit, response_url taken", code="stream_closed")
        if await self._post_once(text):
            log.info("an answer finished after its stream was closed at the time limit went through response_url",
                     extra={"stream_id": self.stream_id})  # fmt: skip
            return
        log.warning("an answer finished after its stream was closed at the time limit could not be delivered",
                    extra={"stream_id": self.stream_id})  # fmt: skip
        raise PermanentSendError("stream closed at the time limit, response_url unusable", code="stream_closed")

    async def fail(self, text: str, state: ReplyState) -> None:
        """On a stream closed early the apology promised a separate message: the failure notice is that message,
        through response_url when nothing took it (the stream itself can show nothing more)."""
        if self.streams and await self._closed_early():
            if not state.overflow_started:
                await self._post_once(text)
            return
        await super().fail(text, state)

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
