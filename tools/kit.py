"""What a worker needs for tools, opened once per process: the servers, the audit trail and the waiting
confirmations; and which tools one asker is offered."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from redis.asyncio import Redis

from gateway.state.keys import Keys
from tools.access import may_call
from tools.audit import ToolAudit
from tools.config import BotTools, ToolsSettings
from tools.confirmations import Confirmations
from tools.servers import ServerUnavailable, ToolServers, ToolSpec

log = logging.getLogger(__name__)


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

    async def offer(self, tools: BotTools, person: str, group: str | None) -> Offer:
        """The bot's tools this person may call; a server that is down is left out and named."""
        offered: dict[str, ToolSpec] = {}
        unavailable: list[str] = []
        for server in tools.use:
            try:
                specs = await self.servers.tools(server)
            except ServerUnavailable as exc:
                log.warning("tool server unavailable; its tools are not offered", extra={"error": str(exc)})
                unavailable.append(server)
                continue
            for spec in specs:
                if may_call(tools, spec.qualified, person, group):
                    offered[spec.exposed] = spec
        return Offer(offered, tuple(unavailable))

    async def aclose(self) -> None:
        await self.servers.aclose()
