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
        self._misnamed: set[tuple[str, tuple[str, ...]]] = set()  # said once each

    async def offer(self, tools: BotTools, person: str, group: str | None) -> Offer:
        """The bot's tools this person may call; a server that is down is left out and named. Servers are asked
        together, and one that failed is not asked again for DOWN_S: a hung server must not add its timeout to
        every message of the bot."""
        listed = await asyncio.gather(*(self._listed(server) for server in tools.use))
        listed = [self._unless_misnamed(tools, server, specs) for server, specs in zip(tools.use, listed, strict=True)]
        offered: dict[str, ToolSpec] = {}
        for specs in listed:
            for spec in specs or ():
                if may_call(tools, spec.qualified, person, group):
                    offered[spec.exposed] = spec
        return Offer(offered, tuple(server for server, specs in zip(tools.use, listed, strict=True) if specs is None))

    def _unless_misnamed(self, tools: BotTools, server: str, specs: list[ToolSpec] | None) -> list[ToolSpec] | None:
        """A server's tools, or None (not offered) when the bot's `confirm` or `access` names a tool of it that the
        server does not list: a typo there (hr.delete_employe) would leave the real tool without its confirmation or
        its access rule, open to everyone (found by a review). Said once per server and set of names."""
        if specs is None:
            return None
        served = {spec.qualified for spec in specs}
        unknown = sorted({name for name in [*tools.confirm, *tools.access]
                          if name.partition(".")[0] == server and name not in served})  # fmt: skip
        if not unknown:
            return specs
        if (server, tuple(unknown)) not in self._misnamed:
            self._misnamed.add((server, tuple(unknown)))
            log.error("a bot's tools.confirm or tools.access names tools its server does not list; none of the "
                      "server's tools are offered until they are fixed",
                      extra={"server": server, "unknown": unknown, "listed": sorted(served)})  # fmt: skip
        return None

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
