"""What a worker needs for tools, opened once per process: the servers, the audit trail and the waiting
confirmations; and which tools one asker is offered."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from gateway.state.keys import Keys
from tools.access import may_call
from tools.audit import ToolAudit
from tools.config import BotTools, ToolsSettings
from tools.confirmations import Confirmations
from tools.servers import ServerUnavailable, ToolServers, ToolSpec

log = logging.getLogger(__name__)
DOWN_S = 30.0


@dataclass(frozen=True)
class Offer:
    """The tools an asker may call now, by their exposed (OpenAI) name, and the servers that could not be asked."""

    tools: dict[str, ToolSpec] = field(default_factory=dict)
    unavailable: tuple[str, ...] = ()


class ToolKit:
    def __init__(self, settings: ToolsSettings, redis: Redis, keys: Keys) -> None:
        self.servers = ToolServers(settings)
        self.audit = ToolAudit(redis, keys, settings)
        self.confirmations = Confirmations(redis)
        self._down_until: dict[str, float] = {}  # servers that failed to list, left alone until then

    async def offer(self, tools: BotTools, person: str, group: str | None) -> Offer:
        """The bot's tools this person may call; a server that is down is left out and named. Servers are asked
        together, and one that failed is not asked again for DOWN_S: a hung server must not add its timeout to
        every message of the bot."""
        listed = await asyncio.gather(*(self._listed(server) for server in tools.use))
        offered: dict[str, ToolSpec] = {}
        for specs in listed:
            for spec in specs or ():
                if may_call(tools, spec.qualified, person, group):
                    offered[spec.exposed] = spec
        return Offer(offered, tuple(server for server, specs in zip(tools.use, listed, strict=True) if specs is None))

    async def _listed(self, server: str) -> list[ToolSpec] | None:
        if time.monotonic() < self._down_until.get(server, 0.0):
            return None
        try:
            return await self.servers.tools(server)
        except ServerUnavailable as exc:
            log.warning("tool server unavailable; its tools are not offered", extra={"error": str(exc)})
            self._down_until[server] = time.monotonic() + DOWN_S
            return None

    async def aclose(self) -> None:
        await self.servers.aclose()
