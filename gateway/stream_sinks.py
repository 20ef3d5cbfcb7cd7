"""Where a streamed answer is shown while the engine writes it: a WeCom AI-bot stream, a DingTalk AI card.

Both keep what the user has seen in the StreamStore (Redis), which only accepts text that
extends what was shown; a worker taking over a message reads it back and continues it.
"""

from __future__ import annotations

import logging

from bots.base import InboundMessage, SendError
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.dingtalk.client import FLOW_FAILED, FLOW_FINISHED, FLOW_INPUTTING
from bots.text import utf8_prefix
from bots.wecom.aibot import WeComAIBotAdapter
from gateway.streams import StreamStore

log = logging.getLogger(__name__)
CARD_STREAM_LIMIT = 1000  # cards are not limited per user; the store's limit is for WeCom's rule


class StreamSink:
    """Shows the text so far; `interval_s` is the least time between two updates."""

    interval_s: float = 0.15

    def __init__(self, streams: StreamStore, stream_id: str) -> None:
        self._streams = streams
        self.stream_id = stream_id

    async def shown(self) -> str:
        state = await self._streams.get(self.stream_id)
        return state.content if state else ""

    async def show(self, text: str) -> bool:
        return await self._streams.update(self.stream_id, text)


class WeComStreamSink(StreamSink):
    """The AI bot's stream: WeCom's refresh callbacks read it from Redis (any replica)."""

    def __init__(self, streams: StreamStore, adapter: WeComAIBotAdapter, message: InboundMessage) -> None:
        super().__init__(streams, message.reply_to.stream_id)
        self._max_bytes = adapter.max_stream_bytes

    async def show(self, text: str) -> bool:
        return await super().show(utf8_prefix(text, self._max_bytes))


class WebStreamSink(StreamSink):
    """The web page's answer: the gateway's /web endpoint streams it to the browser from Redis."""

    interval_s = 0.05


class DingTalkCardSink(StreamSink):
    """A DingTalk AI card, created on first use, updated with the full text so far (≤ updates_per_second)."""

    def __init__(self, streams: StreamStore, adapter: DingTalkRobotAdapter, track_id: str) -> None:
        super().__init__(streams, track_id)
        self._api = adapter.api
        self.interval_s = 1.0 / adapter.config.ai_card.updates_per_second
        self._inputting = False

    async def open(self, adapter: DingTalkRobotAdapter, message: InboundMessage, *, create: bool) -> None:
        await self._streams.open(
            adapter.bot_id, message.sender_id, self.stream_id, limit=CARD_STREAM_LIMIT, max_age_s=3600
        )
        if create:
            target = message.reply_to
            await self._api.create_card(self.stream_id, group_id=target.chat_id, user_id=target.user_id)

    async def show(self, text: str) -> bool:
        if not await super().show(text):
            return False
        if not self._inputting:
            await self._api.set_card_status(self.stream_id, FLOW_INPUTTING)
            self._inputting = True
        await self._api.stream_card(self.stream_id, text)
        return True

    async def finish(self, text: str) -> None:
        await self._streams.update(self.stream_id, text, finish=True)
        await self._api.stream_card(self.stream_id, text, final=True)
        await self._api.set_card_status(self.stream_id, FLOW_FINISHED, text)

    async def fail(self, reason: str) -> None:
        try:
            await self._api.set_card_status(self.stream_id, FLOW_FAILED, reason)
        except SendError as exc:
            log.warning("could not mark the card failed", extra={"error": str(exc)})
