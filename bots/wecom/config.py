"""Configuration of one WeCom self-built app bot (企业微信自建应用)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from bots.wecom.crypto import decode_aes_key

WECOM_API_BASE = "https://qyapi.weixin.qq.com"


class WeComAppConfig(BaseModel):
    """A WeCom app: its callback crypto, its send credentials and where its API lives."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    platform: Literal["wecom"] = "wecom"
    corp_id: str
    agent_id: int
    secret: SecretStr
    token: SecretStr
    encoding_aes_key: SecretStr
    api_base: str = WECOM_API_BASE
    replay_window_s: int = Field(default=3600, ge=0)

    @field_validator("encoding_aes_key")
    @classmethod
    def _aes_key_decodes(cls, value: SecretStr) -> SecretStr:
        decode_aes_key(value.get_secret_value())
        return value

    @field_validator("api_base")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")
