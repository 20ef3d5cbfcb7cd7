"""How an answer is shown, one class per reply style (bots.base.ReplyStyle), never per adapter class.

- pieces (WeCom app, group robot, DingTalk text): split to the byte cap, paced to the platform's
  allowances (shared in Redis), sent piece by piece with progress in the reply record, so that
  a takeover resumes instead of repeating; a piece whose outcome is unknown is resent with the
  platform's duplicate check on. A send that must wait for its allowance raises `Paced`, and the
  worker hands the message back with that delay instead of holding a slot.
- stream (WeCom AI bot): the text grows in the stream store, which WeCom's refresh callbacks
  read; finished with the first 20480 bytes, the rest posted once through response_url.
- page (web): the text grows in the stream store, which the gateway's SSE endpoint reads.
- card (DingTalk AI card): created once (recorded), updated with the full text so far, finished
  or marked failed.

Every write is fenced by the worker's lease: a stream update or record write from a worker that
lost the message raises LeaseLost, and a send is preceded by a lease check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from bots.base import ConversationTaken, InboundMessage, SendError, Throttled
from bots.dingtalk.client import FLOW_FAILED, FLOW_FINISHED, FLOW_INPUTTING
from bots.text import split_utf8, utf8_len, utf8_prefix
from gateway import texts
from gateway.config import WorkerSettings
from gateway.retry import retry
from gateway.state.conversations import Conversations
from gateway.state.keys import Keys
from gateway.state.limits import MovingWindowLimiter, window
from gateway.state.reply_record import Fence, LeaseLost, ReplyRecord, ReplyState
from gateway.state.streams import StreamStore

log = logging.getLogger(__name__)
SENT_PIECE_TTL_S = 72 * 3600  # a report that an accepted message was not delivered comes within its 48 h window
CARD_STREAM_LIMIT = 1000  # cards are not limited per user; the store's limit is for WeCom's rule
# Invisible characters (zero-width space, non-joiner, word joiner, joiner) whose sequences number the repeats
# of one piece, so that its content differs each time; five of them (15 bytes) count 1,364 repeats.
UNIQUE_MARKS = "\u200b\u200c\u2060\u200d"
MAX_MARKS_LEN = 5
MARKS_ROOM_BYTES = 3 * MAX_MARKS_LEN
MAX_REPEATS = sum(len(UNIQUE_MARKS) ** n for n in range(1, MAX_MARKS_LEN + 1))


def repeat_marks(repeat: int) -> str:
    """The invisible suffix of a piece's `repeat`-th repeat ('' for the first send): bijective base 4."""
    marks = ""
    while repeat > 0:
        repeat, digit = divmod(repeat - 1, len(UNIQUE_MARKS))
        marks = UNIQUE_MARKS[digit] + marks
    return marks


class Paced(Exception):
    """The platform's send allowance is used up for now: try again in `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"paced for {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


@dataclass
class Delivery:
    """What every presenter shares: Redis, the stream store, pacing windows and retry settings."""

    redis: Redis
    keys: Keys
    streams: StreamStore
    pacer: MovingWindowLimiter
    settings: WorkerSettings
    conversations: Conversations | None = None  # reply quotas, for platforms that have them

    async def retry_send(self, call) -> None:  # type: ignore[no-untyped-def]
        try:
            await retry(
                call,
                attempts=self.settings.max_send_attempts,
                base_s=self.settings.backoff_base_s,
                cap_s=self.settings.backoff_max_s,
                retryable=lambda exc: isinstance(exc, SendError) and exc.retryable and not isinstance(exc, Throttled),
                hint=lambda exc: getattr(exc, "retry_after", 0.0),
                what="send",
            )
        except Throttled as throttled:  # a throttle of minutes: hand the message back, count no failure
            raise Paced(throttled.retry_after) from throttled


class Presenter:
    """One answer on its platform. Subclasses say whether it is shown while written (`streams`)."""

    streams = False  # the engine's text is shown as it is written
    always_answers = False  # the user is looking at an open stream, card or page: it must end with a text
    interval_s = 0.15  # least time between two updates while writing

    def __init__(
        self, delivery: Delivery, adapter, message: InboundMessage, record: ReplyRecord, fence: Fence | None
    ) -> None:  # type: ignore[no-untyped-def]
        self.delivery = delivery
        self.adapter = adapter
        self.message = message
        self.record = record
        self.fence = fence

    @property
    def stream_id(self) -> str:
        """The answer's entry in the stream store, for styles that keep what was shown there ('' for none)."""
        return ""

    async def open(self, state: ReplyState) -> None:
        """Prepare where the answer will appear (a card is created here)."""

    async def shown(self) -> str:
        """What the user already sees of this answer (continued, never replaced, after a takeover)."""
        if not self.stream_id:
            return ""
        state = await self.delivery.streams.get(self.stream_id)
        return state.content if state else ""

    async def _update(self, text: str, *, finish: bool = False) -> bool:
        """Grow (or finish) the stored text under this worker's lease; LeaseLost when the lease has passed on."""
        applied = await self.delivery.streams.update(self.stream_id, text, finish=finish, fence=self.fence)
        if applied is None:
            raise LeaseLost(self.stream_id)
        return applied

    async def _finish_stored(self, text: str) -> str:
        """Finish the stored stream with `text` and return what it ends up showing: when `text` does not
        extend what the user already sees (an engine that failed after a partial answer, a notice), it is
        shown after that text, never dropped."""
        if await self._update(text, finish=True):
            return text
        state = await self.delivery.streams.get(self.stream_id)
        if state is None or state.finished:
            return state.content if state else text
        combined = f"{state.content}\n\n{text}" if state.content else text
        await self._update(combined, finish=True)
        return combined

    async def show(self, text: str) -> None:
        """Show the text written so far."""

    async def deliver(self, text: str, state: ReplyState) -> None:
        """Show the final answer; done when this returns."""
        raise NotImplementedError

    async def finish(self, text: str, state: ReplyState) -> None:
        """Deliver the answer and record it as done."""
        await self.deliver(text, state)
        await self.record.mark(state="done")

    async def fail(self, text: str, state: ReplyState) -> None:
        """End the answer in a failed state, telling the user `text`."""
        await self.deliver(text, state)

    async def notice(self, text: str, once: str) -> bool:
        """A one-off notice outside the answer (the engine is starting), sent at most once per answer (the
        record's field `once` says it was); best effort. True when it was sent. Styles that show the answer
        as it is written have nothing to add: the user sees it coming."""
        return False


class PiecesPresenter(Presenter):
    """Where the platform has a duplicate check (WeCom), every piece is sent with it from the first attempt:
    whether WeCom matches a flagged resend against an unflagged original is UNCONFIRMED, so none is
    unflagged. The check matches on content, so a new piece that repeats one sent to the same person within
    the window ("好的" twice) gets invisible marks that make it unique; which repeat it is gets recorded before
    the send, so a resend of that piece is byte for byte the first and is the one dropped."""

    async def finish(self, text: str, state: ReplyState) -> None:
        await self.deliver(text, state, done_with_last=True)

    async def deliver(self, text: str, state: ReplyState, done_with_last: bool = False) -> None:
        target = self.message.reply_to
        checked = self.adapter.duplicate_check_window_s > 0
        cap = self.adapter.max_bytes_for(target) - (MARKS_ROOM_BYTES if checked else 0)
        pieces = await self._within_quota(split_utf8(text, cap), cap, state)
        if done_with_last and state.sent >= len(pieces):
            await self.record.mark(state="done")
        for index in range(state.sent, len(pieces)):
            outcome_unknown = index < state.started
            await self._pace()
            piece, progress = pieces[index], {"started": index + 1}
            if checked:
                repeat = state.variants.get(index, 0) if outcome_unknown else await self._repeat_of(piece)
                piece, progress[f"v{index}"] = piece + repeat_marks(repeat), repeat
            piece_key = f"{self.message.dedup_key}:{index}"
            await self._begin(progress, resend=outcome_unknown)  # fenced: a worker that lost the message stops here
            await self._remember_sent(piece_key, index)
            await self.delivery.retry_send(
                lambda attempt, piece=piece, unknown=outcome_unknown, key=piece_key: self.adapter.send_piece(
                    target, piece, duplicate_check=checked or unknown or attempt > 0, piece_key=key
                )
            )
            last = index + 1 == len(pieces)
            await self.record.mark(sent=index + 1, **({"state": "done"} if last and done_with_last else {}))

    async def _within_quota(self, pieces: list[str], cap: int, state: ReplyState) -> list[str]:
        """Where the platform allows a person only so many messages (微信客服: 5 per 48 h), the answer takes
        at most what is left; how many pieces that is gets recorded once, so a takeover splits alike, and
        a cut answer says so."""
        quota, conversations = self.adapter.reply_quota, self.delivery.conversations
        if quota is None or conversations is None:
            return pieces
        if not state.quota_pieces:
            left = await conversations.quota_left(self.message, quota)
            await self.record.claim("quota_pieces", str(min(len(pieces), left)))
            state.quota_pieces = (await self.record.load()).quota_pieces
        allowed = int(state.quota_pieces)
        if allowed >= len(pieces):
            return pieces
        if allowed == 0:
            raise ConversationTaken("the person's reply allowance is used up", code="quota")
        cut = utf8_prefix(pieces[allowed - 1], cap - utf8_len(texts.ANSWER_CUT_TEXT)) + texts.ANSWER_CUT_TEXT
        return [*pieces[: allowed - 1], cut]

    async def _begin(self, progress: dict[str, str | int], *, resend: bool) -> None:
        """Mark a piece's send as begun; where the person has an allowance, a new piece takes its slot in the
        same step (a resend took its slot the first time), so a crash between the two can neither waste a
        slot nor send one uncounted."""
        quota, conversations = self.adapter.reply_quota, self.delivery.conversations
        if quota is None or conversations is None or resend:
            await self.record.mark(**progress)
            return
        if not await conversations.take_slot(self.message, quota, self.record, progress):
            raise ConversationTaken("the person's reply allowance is used up", code="quota")

    async def _remember_sent(self, piece_key: str, index: int) -> None:
        """Where the platform can report later that an accepted message was not delivered, keep which reply the
        platform's id of this piece belongs to (as long as such a report can come)."""
        message_id = self.adapter.platform_message_id(piece_key)
        if not message_id:
            return
        sent = {"dedup_key": self.message.dedup_key, "piece": index, "message": self.message.model_dump(mode="json")}
        key = self.delivery.keys.sent_piece(self.message.bot_id, message_id)
        await self.delivery.redis.set(key, json.dumps(sent, ensure_ascii=False), ex=SENT_PIECE_TTL_S)

    async def _repeat_of(self, piece: str) -> int:
        """How often `piece` went to this recipient within the platform's duplicate-check window before now
        (a counter in Redis, so every worker knows; it lives as long as the window after the last send)."""
        recipient = self.message.reply_to.user_id or self.message.reply_to.chat_id
        digest = hashlib.sha256(f"{recipient}\0{piece}".encode()).hexdigest()[:32]
        key = self.delivery.keys.recent_send(self.message.bot_id, digest)
        async with self.delivery.redis.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, int(self.adapter.duplicate_check_window_s))
            count, _ = await pipe.execute()
        if count > MAX_REPEATS:
            log.warning("a piece repeats too often within the duplicate-check window; the platform may drop it")
        return (int(count) - 1) % (MAX_REPEATS + 1)

    async def _pace(self) -> None:
        """Take one send from every allowance (a robot's, a member's, a conversation's), or raise Paced."""
        allowances = self.adapter.pacing(self.message.reply_to)
        if not allowances:
            return
        for key, spec in allowances:
            # Shortest window first: when a longer one refuses, a slot of a shorter one is spent unused, which
            # errs on the side of sending less than the platform allows, never more.
            decision = await self.delivery.pacer.hit(key, [window(spec)])
            if not decision.allowed:
                raise Paced(decision.retry_after_s)

    async def notice(self, text: str, once: str) -> bool:
        """Like every send: within the pacing and, where the person has an allowance, in a slot of it (taken
        with the once-mark, so the notice can never push the answer or the handoff notice out)."""
        if getattr(await self.record.load(), once, ""):
            return False
        try:
            await self._pace()
        except Paced:
            return False  # a notice is not worth waiting for: the answer is what the user waits for
        quota, conversations = self.adapter.reply_quota, self.delivery.conversations
        if quota is not None and conversations is not None:
            if not await conversations.take_slot(self.message, quota, self.record, {once: "1"}):
                return False
        elif not await self.record.claim(once):
            return False
        try:
            if self.adapter.duplicate_check_window_s > 0:  # counted, so that an answer repeating it is unique
                text += repeat_marks(await self._repeat_of(text))
            await self.adapter.send_piece(self.message.reply_to, text, duplicate_check=False)
        except SendError as exc:
            log.warning("could not send a notice", extra={"error": str(exc)})
            return False
        return True


class _StoredStreamPresenter(Presenter):
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


class PagePresenter(_StoredStreamPresenter):
    """The web page: the gateway's /web endpoint streams it to the browser."""

    interval_s = 0.05


class StreamPresenter(_StoredStreamPresenter):
    """The WeCom AI bot's stream: WeCom's refresh callbacks read it from Redis (any replica)."""

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


class CardPresenter(Presenter):
    """A DingTalk AI card, created and delivered once each, updated with the full text so far (≤ updates_per_second)."""

    streams = True
    always_answers = True

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.interval_s = 1.0 / self.adapter.config.ai_card.updates_per_second
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
        message, api = self.message, self.adapter.api

        async def attempt(_: int) -> None:
            state.card_track = api.new_track_id(message.bot_id, message.conversation_id, message.msg_id)
            await self.record.mark(card_track=state.card_track)
            await api.create_card(state.card_track, group_id=message.reply_to.chat_id)

        await self.delivery.retry_send(attempt)
        await self.record.mark(card_created="1")
        state.card_created = "1"

    async def _deliver_card(self, state: ReplyState) -> None:
        """Deliver the card into the conversation. A repeat after a try whose outcome is unknown may be refused
        because the first one arrived (DingTalk's answer is UNCONFIRMED): a refusal then counts as delivered,
        as the same request was not refused the first time."""
        target, api = self.message.reply_to, self.adapter.api
        earlier = bool(state.card_deliver_started)
        await self.record.mark(card_deliver_started="1")

        async def attempt(number: int) -> None:
            try:
                await api.deliver_card(self.track_id, group_id=target.chat_id, user_id=target.user_id)
            except SendError as exc:
                if exc.retryable or not (earlier or number > 0):
                    raise
                log.warning("a repeated card delivery was refused; taking the earlier one to have arrived",
                            extra={"error": str(exc)})  # fmt: skip

        await self.delivery.retry_send(attempt)
        await self.record.mark(card_sent="1")
        state.card_sent = "1"

    @property
    def stream_id(self) -> str:
        return self.track_id

    async def show(self, text: str) -> None:
        if not await self._update(text):
            return
        if not self._inputting:
            await self.adapter.api.set_card_status(self.track_id, FLOW_INPUTTING)
            self._inputting = True
        await self.adapter.api.stream_card(self.track_id, text)

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
        await self.adapter.api.stream_card(self.track_id, final, final=True)
        await self.adapter.api.set_card_status(self.track_id, FLOW_FINISHED, final)

    async def fail(self, text: str, state: ReplyState) -> None:
        if not self.track_id:
            await self.open(state)
        final = await self._finish_stored(text)
        try:
            await self.adapter.api.set_card_status(self.track_id, FLOW_FAILED, final)
        except SendError as exc:
            log.warning("could not mark the card failed", extra={"error": str(exc)})


PRESENTERS: dict[str, type[Presenter]] = {
    "pieces": PiecesPresenter,
    "stream": StreamPresenter,
    "page": PagePresenter,
    "card": CardPresenter,
}


def presenter_for(
    delivery: Delivery, adapter, message: InboundMessage, record: ReplyRecord, fence: Fence | None
) -> Presenter:  # type: ignore[no-untyped-def]
    return PRESENTERS[adapter.reply_style](delivery, adapter, message, record, fence)
