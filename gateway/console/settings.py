"""The `console:` section of the configuration: who may do what on the operator console (gateway/console)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bots.web.config import WebLogin

Role = Literal["viewer", "editor", "admin"]
ROLE_RANK: dict[str, int] = {"viewer": 1, "editor": 2, "admin": 3}


class ConsoleSettings(BaseModel):
    """The operator console at /console/ on the admin listener.

    People sign in with the admin token (role admin) or with the company's WeCom or DingTalk identity (`login`,
    the same flows as the page's `web_login`); such a person has the role `roles` gives their qualified identity
    (`wecom:<corp_id>:<userid>`, `dingtalk:<corp_id>:<staffId>`; a bare `wecom:zhangsan` is qualified when one
    corporation is configured), and no role means no console."""

    model_config = ConfigDict(extra="forbid")

    roles: dict[str, Role] = Field(
        default_factory=dict, description="qualified identity → viewer | editor | admin"
    )
    login: WebLogin = Field(default_factory=WebLogin, description="company sign-in: {wecom: {bot: <app id>}, …}")
    session_hours: float = Field(default=12.0, gt=0, le=24 * 30, description="a sign-in lasts this long")
    public_url: str | None = Field(
        default=None,
        description="the console's address as browsers reach it (behind a proxy), for the platforms' redirect back",
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        """`https://ops.example.com/` or `https://ops.example.com`: the scheme and host the platforms send people
        back to; the console's own path is added (`/console/login/<login>/callback`)."""
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError("console.public_url is the console's address as browsers reach it, like "
                             "https://ops.example.com (no query, no fragment)")
        path = parts.path.rstrip("/")
        if path.endswith("/console"):  # the console's own address pasted: the console adds that part itself
            path = path[: -len("/console")]
        return f"{parts.scheme}://{parts.netloc}{path}"

    def role_of(self, identity: str) -> Role | None:
        return self.roles.get(identity)
