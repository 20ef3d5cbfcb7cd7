"""Delivering a committed answer, exactly once, in the shape each platform takes it.

- Message APIs (WeCom app, group robot): split to the byte cap, send piece by piece, and
  record progress in the reply record, so that a takeover resumes instead of repeating;
  a piece whose outcome is unknown is resent with the platform's duplicate check on.
- Group robots are paced to their per-minute allowance, shared by all workers in Redis.
- AI-bot streams: the stream is finished with the answer's first 20480 bytes; the rest
  goes once through the message's response_url.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.asyncio import Redis

from bots.base import InboundMessage, ReplyChannel, SendError
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.text import split_utf8, utf8_prefix
from bots.web.adapter import WebAdapter
from bots.wecom.aibot import WeComAIBotAdapter
from gateway.config import WorkerSettings
from gateway.keys import Keys
from gateway.limits import MovingWindowLimiter
from gateway.retry import retry
from gateway.stream_sinks import DingTalkCardSink
from gateway.streams import StreamStore

log = logging.getLogger(__name__)


class Delivery:
    """Sends answers for the worker; knows each platform's shape of "sent"."""

    def __init__(
        self, redis: Redis, keys: Keys, streams: StreamStore, settings: WorkerSettings, redis_url: str
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._streams = streams
        self._cfg = settings
        self._redis_url = redis_url
        self._pacers: dict[int, MovingWindowLimiter] = {}

    async def deliver(
        self, adapter: object, message: InboundMessage, record_key: str, text: str, record: dict[str, str]
    ) -> None:
        if isinstance(adapter, WeComAIBotAdapter):
            await self._finish_stream(adapter, message, record_key, text, record)
        elif isinstance(adapter, WebAdapter):
            await self._streams.update(message.reply_to.stream_id, text, finish=True)
        elif isinstance(adapter, DingTalkRobotAdapter) and (track := await self._redis.hget(record_key, "card_track")):
            await DingTalkCardSink(self._streams, adapter, track.decode()).finish(text)
        else:
            await self._send_pieces(adapter, message, record_key, text, record)  # type: ignore[arg-type]
        await self._redis.hset(record_key, "done", "1")

    async def notify(self, adapter: object, message: InboundMessage, text: str) -> None:
        """A one-off notice outside the answer (e.g. the engine is starting); best effort."""
        if not hasattr(adapter, "send_piece"):
            return  # a stream shows WeCom's own "thinking" state meanwhile
        try:
            await adapter.send_piece(message.reply_to, text, duplicate_check=False)  # type: ignore[attr-defined]
        except SendError as exc:
            log.warning("could not send a notice", extra={"error": str(exc)})

    async def _send_pieces(
        self, adapter: ReplyChannel, message: InboundMessage, record_key: str, text: str, record: dict[str, str]
    ) -> None:
        pieces = split_utf8(text, adapter.max_bytes_for(message.reply_to))
        sent = int(record.get("sent", 0))
        started = int(record.get("started", 0))
        for index in range(sent, len(pieces)):
            outcome_unknown = index < started
            if hasattr(adapter, "pacing"):
                await self._pace(*adapter.pacing(message.reply_to))
            await self._redis.hset(record_key, "started", index + 1)
            piece = pieces[index]
            await self._retry_send(
                lambda attempt, piece=piece, unknown=outcome_unknown: adapter.send_piece(
                    message.reply_to, piece, duplicate_check=unknown or attempt > 0
                )
            )
            await self._redis.hset(record_key, "sent", index + 1)

    async def _retry_send(self, call) -> None:
        await retry(
            call,
            attempts=self._cfg.max_send_attempts,
            base_s=self._cfg.backoff_base_s,
            cap_s=self._cfg.backoff_max_s,
            retryable=lambda exc: isinstance(exc, SendError) and exc.retryable,
            hint=lambda exc: getattr(exc, "retry_after", 0.0),
            what="send",
        )

    async def _pace(self, key: str, per_minute: int) -> None:
        """Wait for a slot in a per-minute allowance (a robot's, a conversation's), shared by every worker."""
        pacer = self._pacers.get(per_minute)
        if pacer is None:
            pacer = MovingWindowLimiter(self._redis_url, f"{per_minute}/minute", self._keys.send_pace_prefix)
            self._pacers[per_minute] = pacer
        while True:
            decision = await pacer.hit(key)
            if decision.allowed:
                return
            await asyncio.sleep(min(decision.retry_after_s, 5))

    async def _finish_stream(
        self, adapter: WeComAIBotAdapter, message: InboundMessage, record_key: str, text: str, record: dict[str, str]
    ) -> None:
        visible = utf8_prefix(text, adapter.max_stream_bytes)
        await self._streams.update(message.reply_to.stream_id, visible, finish=True)
        rest = text[len(visible) :]
        if not rest or record.get("overflow_sent"):
            return
        # response_url takes one message: never post twice, even if this worker dies right after posting.
        if not await self._redis.hsetnx(record_key, "overflow_started", f"{time.time():.3f}"):
            log.warning("overflow post of an earlier attempt has an unknown outcome; not posting again")
            return
        await self._retry_send(lambda attempt: adapter.send_overflow(message.reply_to, rest))
        await self._redis.hset(record_key, "overflow_sent", "1")
