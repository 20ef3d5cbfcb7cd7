"""The `tools:` section (MCP servers, configured once) and a bot's `tools:` (which servers it uses, who may call
what, which calls wait for the asker's confirmation)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from bots.urls import url_in_message

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")  # shown to the model as <server>__<tool>: no dots, no "__"
CONFIRM_WORDS = ("确认", "confirm", "yes", "是")
CANCEL_WORDS = ("取消", "cancel", "no", "否")


class ToolServerSettings(BaseModel):
    """One MCP server: Streamable HTTP (`url`, `headers`) or stdio (`command`, `env`)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, description="Streamable HTTP endpoint, e.g. http://rooms-mcp:8000/mcp")
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="sent with every HTTP request (secrets)")
    command: list[str] | None = Field(default=None, description="stdio: the program and its arguments")
    env: dict[str, SecretStr] = Field(default_factory=dict, description="stdio: the program's environment")
    timeout_s: float = Field(default=15.0, gt=0, le=600, description="a call not answered by then is a timeout")

    @model_validator(mode="after")
    def _one_transport(self) -> ToolServerSettings:
        if (self.url is None) == (self.command is None):
            raise ValueError("a tool server has either `url` (Streamable HTTP) or `command` (stdio), exactly one")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"url must be http(s)://host[:port]/path, not {url_in_message(self.url)}")
        if self.command is not None and not self.command:
            raise ValueError("command must name a program")
        return self


class ToolsSettings(BaseModel):
    """The MCP servers bots may use, and how long the audit trail is kept."""

    model_config = ConfigDict(extra="forbid")

    servers: dict[str, ToolServerSettings] = Field(default_factory=dict)
    audit_retention_days: float = Field(default=90.0, gt=0, description="audit records older than this are dropped")
    audit_max_records: int = Field(default=1_000_000, ge=1000, description="and at most this many are kept")
    list_ttl_s: float = Field(default=300.0, gt=0, description="a server's tool list is asked again after this")

    @field_validator("servers")
    @classmethod
    def _names(cls, servers: dict[str, ToolServerSettings]) -> dict[str, ToolServerSettings]:
        for name in servers:
            if not SERVER_NAME.match(name) or "__" in name:
                raise ValueError(f"tool server name {name!r}: letters, digits, '-' and single '_', up to 32")
        return servers


class ToolAccess(BaseModel):
    """Who may call one tool; a list left out does not restrict, and with none given nobody may."""

    model_config = ConfigDict(extra="forbid")

    users: list[str] | None = Field(default=None, description="qualified identities, e.g. wecom:zhangsan")
    groups: list[str] | None = Field(default=None, description="qualified group ids: asked from within them")
    departments: list[int | str] | None = Field(default=None, description="from the platform's directory")


class BotTools(BaseModel):
    """A bot's tools: `use` names servers of `tools.servers`; `confirm` and `access` name tools as server.tool."""

    model_config = ConfigDict(extra="forbid")

    use: list[str] = Field(default_factory=list)
    confirm: list[str] = Field(default_factory=list, description="server.tool: run only after the asker confirms")
    max_calls: int = Field(default=4, ge=1, le=32, description="tool calls one answer may make")
    access: dict[str, ToolAccess] = Field(default_factory=dict)
    confirm_ttl_s: float = Field(default=300.0, ge=10, le=86400, description="a confirmation unanswered expires")

    @model_validator(mode="after")
    def _names_are_server_dot_tool(self) -> BotTools:
        for field, names in (("confirm", self.confirm), ("access", list(self.access))):
            for name in names:
                server, dot, tool = name.partition(".")
                if not dot or not tool:
                    raise ValueError(f"tools.{field}: {name!r} is not <server>.<tool>")
                if server not in self.use:
                    raise ValueError(f"tools.{field}: {name!r} names server {server!r}, which `use` does not list")
        return self

    def confirms(self, server: str, tool: str) -> bool:
        return f"{server}.{tool}" in self.confirm
