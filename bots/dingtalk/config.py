"""Configuration of a DingTalk (钉钉) enterprise robot, in HTTP or Stream mode."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from bots.base import BotSettings, Identity
from knowledge.config import KnowledgeUse

DINGTALK_API_BASE = "https://api.dingtalk.com"
DINGTALK_OAPI_BASE = "https://oapi.dingtalk.com"
# 钉钉登录 (open-dingtalk/developerpedia get_user_app_token_browser.md): login.dingtalk.com/oauth2/auth
DINGTALK_LOGIN_BASE = "https://login.dingtalk.com"
AI_CARD_TEMPLATE = "382e4302-551d-4880-bf29-a30acfab2e71.schema"


class AICardSettings(BaseModel):
    """Answers shown as an AI card that fills in as the engine writes (OpenAPI only)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    template_id: str = AI_CARD_TEMPLATE
    updates_per_second: float = Field(default=3.0, gt=0, le=10)


class DingTalkBotConfig(BotSettings):
    """An enterprise robot: HTTP mode (DingTalk posts to us) or Stream mode (we hold a WebSocket)."""

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    platform: Literal["dingtalk"] = "dingtalk"
    mode: Literal["http", "stream"] = "stream"
    app_key: str
    app_secret: SecretStr
    robot_code: str = ""
    corp_id: str = Field(default="", description="the organisation's corpId: callbacks of another are refused")
    api_base: str = DINGTALK_API_BASE
    oapi_base: str = DINGTALK_OAPI_BASE
    login_base: str = Field(default=DINGTALK_LOGIN_BASE, description="DingTalk's OAuth login page (web_login)")
    replay_window_s: int = Field(
        default=3600, ge=1, description="HTTP mode: how far a callback's timestamp may be from now (DingTalk: 1 h)"
    )
    per_minute: int = Field(
        default=20, ge=1, le=20,
        description="sends per conversation per minute (DingTalk throttles a robot past 20 a minute for 10 minutes)",
    )  # fmt: skip
    ai_card: AICardSettings = Field(default_factory=AICardSettings)
    knowledge: KnowledgeUse | None = Field(default=None, description="the knowledge bases it answers from")
    # a silently dead connection (open, passing nothing) is noticed within interval + timeout: 10 s
    stream_ping_interval_s: float = Field(default=5.0, gt=0)
    stream_ping_timeout_s: float = Field(default=5.0, gt=0)

    @field_validator("replay_window_s", mode="before")
    @classmethod
    def _window_on(cls, value: object) -> object:
        """At least 1, as WeCom's (bots/wecom/config.py); the more so as DingTalk's sign covers only the timestamp."""
        if value in (0, "0"):
            raise ValueError(
                "must be at least 1: DingTalk signs only the timestamp, so without the window one captured "
                "callback's timestamp and sign would carry any message for ever"
            )
        return value

    @field_validator("api_base", "oapi_base", "login_base")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @property
    def identity(self) -> Identity:
        """The organisation's staff, `dingtalk:<corpId>:<staffId>` (the robot's id stands in without a corp_id:
        a staffId is unique only within its organisation)."""
        return Identity("dingtalk", self.corp_id or self.id, memory_by_person=True)

    @property
    def robot(self) -> str:
        """robotCode: the app key unless configured otherwise (DingTalk's default for enterprise robots)."""
        return self.robot_code or self.app_key
