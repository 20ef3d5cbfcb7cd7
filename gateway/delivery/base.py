"""What every reply style shares: `Delivery` (Redis, the stream store, pacing, send retries), `Presenter` (one
answer on its platform), `Paced` (a send must wait for its allowance), and the registry of styles.

One class per reply style (bots.channels), never per adapter class, each in its own module:

- pieces (WeCom app, group robot, DingTalk text, 微信客服): gateway/delivery/pieces.py
- stream (WeCom AI bot): gateway/delivery/stream.py
- page (web): gateway/delivery/page.py (the page reads the same stored stream)
- card (DingTalk AI card): gateway/delivery/card.py

Every write is fenced by the worker's lease: a stream update or record write from a worker that lost the message
raises LeaseLost, and a send is preceded by a lease check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis

from bots.base import InboundMessage, SendError, Throttled
from bots.buttons import Question
from bots.channels import Channel
from gateway.config import WorkerSettings
from gateway.retry import retry
from gateway.state.conversations import Conversations
from gateway.state.keys import Keys
from gateway.state.limits import MovingWindowLimiter
from gateway.state.reply_record import Fence, LeaseLost, ReplyRecord, ReplyState
from gateway.state.streams import StreamStore

log = logging.getLogger(__name__)


class Paced(Exception):
    """The platform's send allowance is used up for now: try again in `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"paced for {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class HandedBack(Paced):
    """The worker is stopping: the message goes back to the queue before its next piece, with the marks so far."""

    def __init__(self) -> None:
        super().__init__(0.0)


class Resends:
    """One send's attempts for `Delivery.retry_send`, each told whether an earlier one may have arrived: `unknown`
    at first (a try in an earlier run of the message whose outcome is not known), then after any failed attempt
    the platform may have acted on (a timeout, a 5xx, a busy errcode). A refusal on a resend may be the platform
    refusing a repeat and is taken as delivered; after a rate limit (which certainly sent nothing) it is a refusal
    like any other. `may_have_arrived` is what the next run of the message must know (ReplyState.not_arrived)."""

    def __init__(self, send: Callable[[bool], Awaitable[None]], unknown: bool) -> None:
        self._send = send
        self.may_have_arrived = unknown

    async def __call__(self, number: int) -> None:
        try:
            await self._send(self.may_have_arrived)
        except SendError as exc:
            self.may_have_arrived = self.may_have_arrived or not exc.not_sent
            raise


@dataclass
class Delivery:
    """What every presenter shares: Redis, the stream store, pacing windows and retry settings."""

    redis: Redis
    keys: Keys
    streams: StreamStore
    pacer: MovingWindowLimiter
    settings: WorkerSettings
    conversations: Conversations | None = None  # reply quotas, for platforms that have them
    single_slot: bool = False  # a single Redis (not a Cluster): a send's pacing, repeat count and mark go together
    # Set when the worker hands its messages back (SIGTERM, past drain_s): no new piece is begun, and a piece
    # whose send is on the way is let finish rather than cancelled mid-send (then sent again by the next owner,
    # twice on DingTalk, which has no duplicate check: found by a review).
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    async def retry_send(self, call: Callable[[int], Awaitable[None]]) -> None:
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

    async def send_with_resends(
        self, record: ReplyRecord, state: ReplyState, name: str, send: Callable[[bool], Awaitable[None]],
        started_before: bool,
    ) -> None:
        """`send` (told whether it is a resend) through `retry_send`, as `Resends` says. `started_before`: an earlier
        run of the message began this send (`name`: "<piece index>" or "card"); unless the record says that run's
        attempts certainly did not arrive, its outcome is unknown. When every attempt fails, the record says
        whether they may have arrived, for the next run (a rate limit that outlasted them is no resend then)."""
        attempts = Resends(send, started_before and state.not_arrived != name)
        try:
            await self.retry_send(attempts)
        except (SendError, Paced):
            value = "" if attempts.may_have_arrived else name
            if state.not_arrived != value:
                await record.mark(not_arrived=value)
                state.not_arrived = value
            raise


class Presenter:
    """One answer on its platform. Subclasses say whether it is shown while written (`streams`)."""

    streams = False  # the engine's text is shown as it is written
    always_answers = False  # the user is looking at an open stream, card or page: it must end with a text
    interval_s = 0.15  # least time between two updates while writing

    adapter: Channel

    def __init__(
        self, delivery: Delivery, adapter: Channel, message: InboundMessage, record: ReplyRecord, fence: Fence | None
    ) -> None:
        self.delivery = delivery
        self.adapter = adapter
        self.message = message
        self.record = record
        self.fence = fence

    @property
    def begins_with_the_commit(self) -> bool:
        """Whether the first write after the answer's commit is the begin of its first send, so that the commit can
        ride on it (ReplyRecord.commit_rides_on_send): one round trip fewer."""
        return False

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
        """Deliver the answer (and the buttons of a question it asks) and record it as done; a style may leave
        that last mark to the release of the lease, which follows at once (ReplyRecord.mark_at_release)."""
        await self.deliver(text, state)
        question = Question.from_json(state.question)
        if question is not None and not state.buttons_sent:
            await self.ask(question, state)
        await self.record.mark(state="done")

    async def ask(self, question: Question, state: ReplyState) -> None:
        """Show the buttons of the question the answer (already delivered) asks, where the platform has them;
        recorded after they were shown. The answer says to reply 确认 or 取消, so a platform without buttons, or
        buttons that could not be sent, leave the person a way to answer."""
        buttons = self.adapter.buttons
        if buttons is None:
            return
        try:
            await self.delivery.retry_send(lambda attempt: buttons.ask(self.message.reply_to, question))
        except SendError as exc:
            log.warning("the question's buttons could not be shown; it is answered by a reply",
                        extra={"error": str(exc)})  # fmt: skip
            return
        await self.record.mark(buttons_sent="1")
        state.buttons_sent = "1"

    async def fail(self, text: str, state: ReplyState) -> None:
        """End the answer in a failed state, telling the user `text`."""
        await self.deliver(text, state)

    async def notice(self, text: str, once: str) -> bool:
        """A one-off notice outside the answer (the engine is starting), sent at most once per answer (the
        record's field `once` says it was); best effort. True when it was sent. Styles that show the answer
        as it is written have nothing to add: the user sees it coming."""
        return False
