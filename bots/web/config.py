"""Configuration of the web chat page: who may sign in, and the key the page uses to call the gateway."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from knowledge.config import KnowledgeUse

PRESETS = {"code and documents": 0.1, "creative writing": 0.7, "logic and maths": 0.0}


SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # about 50 ms and 16 MiB per check: slow for a guesser, fine here


def hash_password(password: str) -> str:
    """A salted, slow hash for `password_hash` (hashlib's scrypt): `scrypt$N$r$p$salt$hash`, base64 parts."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    encode = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"


def _check_hash(password: str, stored: str) -> bool:
    _, n, r, p, salt, digest = stored.split("$")
    expected = base64.b64decode(digest)
    given = hashlib.scrypt(
        password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
    )
    return hmac.compare_digest(given, expected)


class WebUser(BaseModel):
    """A person allowed to sign in: the password as a salted scrypt hash (`botgw web-password`), or as plain
    text from the environment (`password: ${ENV}`)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    password_hash: str = ""
    password: SecretStr | None = None
    password_sha256: str = Field(default="", description="refused: unsalted; kept only to say so clearly")

    @field_validator("password_sha256")
    @classmethod
    def _unsalted_refused(cls, value: str) -> str:
        if value:
            raise ValueError(
                "password_sha256 (unsalted SHA-256) is no longer accepted: "
                "make a password_hash with `botgw web-password` and use that instead"
            )
        return value

    @field_validator("password_hash")
    @classmethod
    def _hash_form(cls, value: str) -> str:
        parts = value.split("$")
        if value and (len(parts) != 6 or parts[0] != "scrypt" or not all(part.isdigit() for part in parts[1:4])):
            raise ValueError("password_hash must be the scrypt$N$r$p$salt$hash form `botgw web-password` prints")
        return value

    def check(self, password: str) -> bool:
        if self.password is not None:
            return hmac.compare_digest(password.encode(), self.password.get_secret_value().encode())
        return bool(self.password_hash) and _check_hash(password, self.password_hash)


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
    knowledge: KnowledgeUse | None = Field(default=None, description="the knowledge bases it answers from")

    def user(self, name: str, password: str) -> WebUser | None:
        for user in self.users:
            if user.name == name and user.check(password):
                return user
        return None
