"""What the gateway answers each kind of platform callback, after the adapter has verified it.

Apps get an empty 200 at once (their answer goes by message/send). AI bots get an encrypted
stream reply: a new stream on a message's first callback, the text so far on a refresh,
read from Redis so that any replica can answer.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from bots.base import CallbackKind, CallbackRejected, InboundMessage
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.wecom.adapter import WeComAppAdapter
from bots.wecom.aibot import StreamPoll, UnsupportedMessage, WeComAIBotAdapter, WelcomeEvent
from gateway import metrics, texts
from gateway.edge.ingest import Ingest
from gateway.state.streams import StreamStore

log = logging.getLogger(__name__)

MAX_OPEN_STREAMS_PER_USER = 3  # WeCom: at most 3 messages of one user in progress with one bot


@dataclass(frozen=True)
class CallbackRequest:
    """What a handler gets of the HTTP request: the platforms sign different parts of it."""

    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    now: float


@dataclass(frozen=True)
class CallbackReply:
    status: int
    body: str
    media_type: str = "text/plain"


class AppCallbacks:
    """WeCom app: enqueue the message, answer 200 with an empty body."""

    def __init__(self, adapter: WeComAppAdapter, ingest: Ingest, streams: StreamStore) -> None:
        self.adapter = adapter
        self._ingest = ingest

    async def handle(self, request: CallbackRequest) -> CallbackReply:
        message = self.adapter.parse(request.query, request.body, request.now)
        if message is None:
            outcome = "ignored"
        else:  # a pull: a 微信客服 callback to the app's URL (one self-built app serving both)
            outcome = await self._ingest.accept(message, kind="pull" if message.msg_type == "pull" else "chat")
        metrics.CALLBACKS.labels(self.adapter.platform, outcome).inc()
        return CallbackReply(200, "")


class KfCallbacks(AppCallbacks):
    """WeCom 微信客服: the callback only says "pull"; the pull is queued (once per callback Token), never
    done here, and the answer is an empty 200 at once."""

    async def handle(self, request: CallbackRequest) -> CallbackReply:
        pull = self.adapter.parse(request.query, request.body, request.now)
        outcome = "ignored" if pull is None else await self._ingest.accept(pull, kind="pull")
        metrics.CALLBACKS.labels(self.adapter.platform, outcome).inc()
        return CallbackReply(200, "")


class DingTalkCallbacks:
    """DingTalk robot in HTTP mode: verify the signed headers, enqueue, answer 200 at once."""

    def __init__(self, adapter: DingTalkRobotAdapter, ingest: Ingest, streams: StreamStore) -> None:
        self.adapter = adapter
        self._ingest = ingest

    async def handle(self, request: CallbackRequest) -> CallbackReply:
        message = self.adapter.parse(request.headers, request.body, request.now)
        # The sign covers only the timestamp: one captured pair would carry any body for an hour.
        signature = f"{request.headers.get('timestamp', '')}:{request.headers.get('sign', '')}"
        outcome = await self._ingest.accept(message, signature=signature)
        if outcome == "replayed":
            raise CallbackRejected("replayed_signature", 403, "this timestamp and sign came with another message")
        metrics.CALLBACKS.labels(self.adapter.platform, outcome).inc()
        return CallbackReply(200, "{}", "application/json")


class AIBotCallbacks:
    """WeCom AI bot: open a stream and enqueue on a message; answer refreshes from the stream store."""

    def __init__(self, adapter: WeComAIBotAdapter, ingest: Ingest, streams: StreamStore) -> None:
        self.adapter = adapter
        self._ingest = ingest
        self._streams = streams

    async def handle(self, request: CallbackRequest) -> CallbackReply:
        query, now = request.query, request.now
        event = self.adapter.parse(query, request.body, now)
        if isinstance(event, InboundMessage):
            payload, outcome = await self._first_callback(event)
        elif isinstance(event, StreamPoll):
            payload, outcome = await self._refresh(event.stream_id, now), "refresh"
        elif isinstance(event, WelcomeEvent):
            payload, outcome = self.adapter.text_payload(self.adapter.config.welcome_text), "welcome"
        elif isinstance(event, UnsupportedMessage):
            payload = self.adapter.stream_payload(secrets.token_hex(16), texts.TEXT_ONLY_TEXT, finish=True)
            outcome = "unsupported"
        else:
            metrics.CALLBACKS.labels(self.adapter.platform, "ignored").inc()
            return CallbackReply(200, "")
        metrics.CALLBACKS.labels(self.adapter.platform, outcome).inc()
        envelope = self.adapter.envelope(payload, query.get("nonce", ""), int(now))
        return CallbackReply(200, envelope, "application/json")

    async def _first_callback(self, message: InboundMessage) -> tuple[dict, str]:
        stream_id = message.reply_to.stream_id
        opened = await self._streams.open(
            self.adapter.bot_id,
            message.sender_id,
            stream_id,
            limit=MAX_OPEN_STREAMS_PER_USER,
            max_age_s=self.adapter.config.stream_limit_s + 30,
        )
        if not opened:
            return self.adapter.stream_payload(secrets.token_hex(16), texts.TOO_MANY_STREAMS_TEXT, True), "busy"
        outcome = await self._ingest.accept(message)
        state = await self._streams.get(stream_id)
        content, finished = (state.content, state.finished) if state else ("", False)
        return self.adapter.stream_payload(stream_id, content, finished), outcome

    async def _refresh(self, stream_id: str, now: float) -> dict:
        state = await self._streams.get(stream_id)
        if state is None:
            return self.adapter.stream_payload(stream_id, "", finish=True)
        if not state.finished and now - state.created > self.adapter.config.stream_limit_s:
            apology = texts.STREAM_TIMEOUT_TEXT
            closing = f"{state.content}\n\n{apology}" if state.content else apology
            if await self._streams.update(stream_id, closing, finish=True):
                log.warning("stream closed unfinished at WeCom's time limit", extra={"stream_id": stream_id})
            state = await self._streams.get(stream_id) or state
        return self.adapter.stream_payload(stream_id, state.content, state.finished)


CallbackHandler = AppCallbacks | AIBotCallbacks | DingTalkCallbacks
HANDLERS: dict[CallbackKind, type[CallbackHandler]] = {
    "wecom-app": AppCallbacks,
    "wecom-kf": KfCallbacks,
    "wecom-aibot": AIBotCallbacks,
    "dingtalk-http": DingTalkCallbacks,
}


def callback_handlers(adapters: dict[str, object], ingest: Ingest, streams: StreamStore) -> dict[str, CallbackHandler]:
    """One handler per bot that receives HTTP callbacks, chosen by its adapter's `callback_kind`."""
    handlers: dict[str, CallbackHandler] = {}
    for bot_id, adapter in adapters.items():
        kind = getattr(adapter, "callback_kind", None)
        if kind is not None:
            handlers[bot_id] = HANDLERS[kind](adapter, ingest, streams)  # type: ignore[arg-type]
    return handlers
