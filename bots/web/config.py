"""Configuration of the web chat page: who may sign in, and the key the page uses to call the gateway."""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

PRESETS = {"code and documents": 0.1, "creative writing": 0.7, "logic and maths": 0.0}


class WebUser(BaseModel):
    """A person allowed to sign in; the password is kept as its SHA-256 (hex), or as ${ENV} plain text."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    password_sha256: str = ""
    password: SecretStr | None = None

    def check(self, password: str) -> bool:
        if self.password is not None:
            return hmac.compare_digest(password.encode(), self.password.get_secret_value().encode())
        digest = hashlib.sha256(password.encode()).hexdigest()
        return bool(self.password_sha256) and hmac.compare_digest(digest, self.password_sha256.lower())


class WebBotConfig(BaseModel):
    """The chat page (Chainlit), talking to the gateway's /web endpoints with `api_key`."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    platform: Literal["web"] = "web"
    api_key: SecretStr
    users: list[WebUser] = Field(default_factory=list)
    trusted_header: str | None = Field(default=None, description="behind an SSO proxy: the header naming the user")
    gateway_url: str = "http://127.0.0.1:8080"
    auth_secret: SecretStr | None = Field(default=None, description="Chainlit's session signing secret")
    answer_timeout_s: float = Field(default=300.0, gt=0)

    def user(self, name: str, password: str) -> WebUser | None:
        for user in self.users:
            if user.name == name and user.check(password):
                return user
        return None
