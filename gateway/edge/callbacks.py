"""What the gateway answers a platform's callback, after its adapter has verified and read it, chosen by the
adapter's `callback_style` (bots/channels.py), never by its platform.

- queue: the work is queued (deduplicated) and the callback acknowledged at once with the adapter's fixed
  body; the answer goes out later by the platform's send API.
- polled-stream: a message opens the answer's stream and is queued; the platform's refresh callbacks get the
  text so far from the stream store, so any replica can answer them. A message that names no stream (a tap on
  a button, which the platform sends once and answers no stream for) is only queued, and the callback answered
  with an empty body at once; its answer goes out by the platform's send path (the adapter's reply_to).
"""

from __future__ import annotations

import logging
import secrets

from bots.base import CallbackRejected, InboundMessage
from bots.channels import (
    CallbackRequest,
    Channel,
    PolledStreamCallbacks,
    QueueingCallbacks,
    StreamPoll,
    UnsupportedMessage,
    WelcomeEvent,
)
from gateway import metrics, texts
from gateway.edge.ingest import Ingest
from gateway.queue.entry import EntryKind
from gateway.state.streams import StreamStore

log = logging.getLogger(__name__)

MAX_OPEN_STREAMS_PER_USER = 3  # WeCom AI bot: at most 3 messages of one user in progress with one bot
STREAM_STORE_SLACK_S = 30  # a stream outlives the platform's polling a little, for its last refresh


class CallbackReply:
    def __init__(self, status: int, body: str, media_type: str = "text/plain") -> None:
        self.status, self.body, self.media_type = status, body, media_type


class QueueingHandler:
    """Verify, queue (once per delivery: a platform's retry is a duplicate), acknowledge."""

    def __init__(self, adapter: QueueingCallbacks, ingest: Ingest, streams: StreamStore) -> None:
        self.adapter = adapter
        self._ingest = ingest

    async def handle(self, request: CallbackRequest) -> CallbackReply:
        queued = self.adapter.receive(request)
        if queued is None:
            outcome = "ignored"
        else:
            kind = EntryKind.PULL if queued.pull else EntryKind.CHAT
            outcome = await self._ingest.accept(queued.message, signature=queued.signature, kind=kind)
            if outcome == "replayed":
                raise CallbackRejected("replayed_signature", 403, "this timestamp and sign came with another message")
        metrics.CALLBACKS.labels(self.adapter.platform, outcome).inc()
        body, media_type = self.adapter.ack
        return CallbackReply(200, body, media_type)


class PolledStreamHandler:
    """Open a stream and queue on a message; answer refreshes from the stream store."""

    def __init__(self, adapter: PolledStreamCallbacks, ingest: Ingest, streams: StreamStore) -> None:
        self.adapter = adapter
        self._ingest = ingest
        self._streams = streams

    async def handle(self, request: CallbackRequest) -> CallbackReply:
        query, now = request.query, request.now
        event = self.adapter.parse(query, request.body, now)
        if isinstance(event, InboundMessage) and event.tap is not None:  # a button: acknowledged empty, no stream
            outcome = await self._ingest.accept(event)
            metrics.CALLBACKS.labels(self.adapter.platform, outcome).inc()
            return CallbackReply(200, "")
        if isinstance(event, InboundMessage):
            payload, outcome = await self._first_callback(event)
        elif isinstance(event, StreamPoll):
            payload, outcome = await self._refresh(event, now)
        elif isinstance(event, WelcomeEvent):
            payload, outcome = self.adapter.text_payload(self.adapter.welcome_text), "welcome"
        elif isinstance(event, UnsupportedMessage):
            payload = self.adapter.stream_payload(secrets.token_hex(16), texts.UNSUPPORTED_TEXT, True)
            outcome = "unsupported"
        else:
            metrics.CALLBACKS.labels(self.adapter.platform, "ignored").inc()
            return CallbackReply(200, "")
        metrics.CALLBACKS.labels(self.adapter.platform, outcome).inc()
        envelope = self.adapter.envelope(payload, query.get("nonce", ""), int(now))
        return CallbackReply(200, envelope, "application/json")

    async def _first_callback(self, message: InboundMessage) -> tuple[dict, str]:
        stream_id = message.reply_to.stream_id
        if self._ingest.admit(message) is None:  # not one the bot answers: its stream closes empty
            return self.adapter.stream_payload(stream_id, "", True), "ignored"
        opened = await self._streams.open(
            self.adapter.bot_id,
            message.sender_id,
            stream_id,
            limit=MAX_OPEN_STREAMS_PER_USER,
            max_age_s=self.adapter.stream_limit_s + STREAM_STORE_SLACK_S,
        )
        if not opened:
            return self.adapter.stream_payload(secrets.token_hex(16), texts.TOO_MANY_STREAMS_TEXT, True), "busy"
        outcome = await self._ingest.accept(message)
        state = await self._streams.get(stream_id)
        content, finished = (state.content, state.finished) if state else ("", False)
        return self.adapter.stream_payload(stream_id, content, finished), outcome

    async def _refresh(self, poll: StreamPoll, now: float) -> tuple[dict, str]:
        """The stream's state for a refresh, only of the bot's own streams: stream ids are derived from message ids,
        and any bot's stream was shown (and, past the time limit, ended) to whoever could sign a refresh for any
        other bot (found by a review). Who asks is not compared: whether a group's refresh names the asker is
        UNCONFIRMED, and a refresh refused by mistake ends the asker's answer."""
        stream_id = poll.stream_id
        state = await self._streams.get(stream_id)
        if state is None:
            return self.adapter.stream_payload(stream_id, "", True), "refresh"
        if not self._streams.belongs(state, self.adapter.bot_id):
            log.warning("a refresh asked for another bot's stream", extra={"bot_id": self.adapter.bot_id})
            return self.adapter.stream_payload(stream_id, "", True), "foreign_refresh"
        if not state.finished and now - state.created > self.adapter.stream_limit_s:
            apology = texts.STREAM_TIMEOUT_TEXT
            closing = f"{state.content}\n\n{apology}" if state.content else apology
            if await self._streams.close_late(stream_id, closing):
                log.warning("stream closed unfinished at the platform's time limit", extra={"stream_id": stream_id})
            state = await self._streams.get(stream_id) or state
        return self.adapter.stream_payload(stream_id, state.content, state.finished), "refresh"


CallbackHandler = QueueingHandler | PolledStreamHandler


def callback_handlers(adapters: dict[str, Channel], ingest: Ingest, streams: StreamStore) -> dict[str, CallbackHandler]:
    """One handler per bot that receives callbacks (checked to offer its style's methods: bots.channels)."""
    handlers: dict[str, CallbackHandler] = {}
    for bot_id, adapter in adapters.items():
        if isinstance(adapter, PolledStreamCallbacks) and adapter.callback_style == "polled-stream":
            handlers[bot_id] = PolledStreamHandler(adapter, ingest, streams)
        elif isinstance(adapter, QueueingCallbacks) and adapter.callback_style == "queue":
            handlers[bot_id] = QueueingHandler(adapter, ingest, streams)
    return handlers
