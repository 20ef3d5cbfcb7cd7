"""`botgw dingtalk-stream`: hold the connection of every bot whose platform pushes into one (today DingTalk's
Stream mode: `adapter.connection`, bots/channels.py).

Messages go into the same ingest path as HTTP callbacks (dedup by message id, then the queue), so several
replicas of this process may run at once: the platform pushes each message once, to one of them (a repeated
push would still be recognised as a duplicate). A frame is acknowledged only after its message is queued; on
SIGTERM the connection stops reading and the frames in hand are queued and acknowledged (up to 5 s) before it
closes.
"""

from __future__ import annotations

import asyncio
import logging

from bots.base import InboundMessage
from bots.registry import holds_connection
from gateway import metrics
from gateway.config import ConfigError, Settings
from gateway.edge.batching import RedisBatcher
from gateway.edge.ingest import Ingest
from gateway.runtime import open_runtime
from gateway.state.pulse import PULSE, start_pulse, stop_pulse

log = logging.getLogger(__name__)


async def run_stream_mode(settings: Settings, stop: asyncio.Event) -> None:
    if not any(holds_connection(bot) for bot in settings.bots):
        raise ConfigError("no DingTalk bot with mode: stream in the configuration")
    async with open_runtime(settings) as runtime:
        await runtime.scheduler.load_scripts()
        batcher = RedisBatcher(runtime.redis)
        batcher.start()
        ingest = Ingest(batcher, runtime.keys, runtime.scheduler, settings)

        async def sink(message: InboundMessage) -> None:
            outcome = await ingest.accept(message)
            metrics.CALLBACKS.labels(message.platform, outcome).inc()
            PULSE.callback(message.bot_id)
            log.info("stream message", extra={"outcome": outcome, "bot_id": message.bot_id})

        connections = [c for adapter in runtime.adapters.values() if (c := adapter.connection(sink)) is not None]
        for connection in connections:  # read at every scrape: an alert can tell a lost link from a dead process
            metrics.STREAM_CONNECTED.labels(connection.bot_id).set_function(
                lambda connection=connection: 1.0 if connection.connected else 0.0
            )
            PULSE.watch_connection(connection.bot_id, lambda connection=connection: connection.connected)
        pulse = start_pulse(runtime.redis, runtime.keys, "stream")
        try:
            await asyncio.gather(*(connection.run(stop) for connection in connections))
        finally:
            await stop_pulse(pulse)
            await batcher.aclose()
