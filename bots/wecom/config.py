"""Configuration of WeCom bots: self-built apps, AI bots (智能机器人) and group robots (群机器人)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from bots.base import BotSettings, Identity
from bots.wecom.crypto import decode_aes_key
from knowledge.config import KnowledgeUse

WECOM_API_BASE = "https://qyapi.weixin.qq.com"
# 企业微信Web登录 (developer.work.weixin.qq.com/document/path/98171): login.work.weixin.qq.com/wwlogin/sso/login
WECOM_LOGIN_BASE = "https://login.work.weixin.qq.com"
# Where an AI bot's pictures and files are fetched from: the one origin of doc 100719's examples (接收消息, 图片/文件
# 结构体), which other implementations observe in real callbacks too. No other host of a message's URL is fetched.
AIBOT_MEDIA_HOSTS = ("ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com",)
BOT_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
FAMILY = "wecom"  # the members of a corporation: `wecom:<corp_id>:<userid>`
CORP_PLATFORMS = ("wecom", "wecom-kf")  # bots configured with their corporation's id


class _CallbackSecrets(BotSettings):
    """What every WeCom callback receiver shares: the token and AES key, and the replay window."""

    id: str = Field(pattern=BOT_ID_PATTERN)
    token: SecretStr
    encoding_aes_key: SecretStr
    replay_window_s: int = Field(default=3600, description="how far a callback's timestamp may be from now")

    @field_validator("replay_window_s")
    @classmethod
    def _window_on(cls, value: int) -> int:
        """A window that is off (0) let a callback captured once be answered again once its deduplication
        (dedup_ttl_s) had passed, and a timestamp days old pass (found by a review): at least 1 s, judged on the
        number read (0.0, false and "+0" are 0 too)."""
        if value < 1:
            raise ValueError(
                "must be at least 1: without the window a callback captured once would be answered again "
                "once its deduplication (dedup_ttl_s) has passed"
            )
        return value

    @field_validator("encoding_aes_key")
    @classmethod
    def _aes_key_decodes(cls, value: SecretStr) -> SecretStr:
        decode_aes_key(value.get_secret_value())
        return value


def _strip_slash(value: str) -> str:
    return value.rstrip("/")


class WeComAppConfig(_CallbackSecrets):
    """A WeCom app: its callback crypto, its send credentials and where its API lives."""

    platform: Literal["wecom"] = "wecom"
    corp_id: str
    agent_id: int
    secret: SecretStr
    api_base: str = WECOM_API_BASE
    login_base: str = Field(default=WECOM_LOGIN_BASE, description="WeCom's web login page (web_login)")
    duplicate_check_interval_s: int = Field(
        default=1800, ge=60, le=14400, description="WeCom drops a repeated send within this window (max 4 h)"
    )
    knowledge: KnowledgeUse | None = Field(default=None, description="the knowledge bases it answers from")

    _api_base = field_validator("api_base", "login_base")(_strip_slash)

    @property
    def identity(self) -> Identity:
        """Members of the corporation: one person whichever of its apps, AI bots or pages they write to."""
        return Identity(FAMILY, self.corp_id, memory_by_person=True)


class WeComAIBotConfig(_CallbackSecrets):
    """A WeCom 智能机器人 (AI bot): JSON callbacks, answers streamed through WeCom's refresh polling."""

    platform: Literal["wecom-ai"] = "wecom-ai"
    welcome_text: str = "你好，我是智能助手，有什么可以帮你？ Hello, how can I help?"
    api_base: str = Field(default=WECOM_API_BASE, description="WeCom's API origin: a response_url must point there")
    stream_limit_s: float = Field(default=330.0, gt=0, le=360, description="WeCom stops polling after 6 minutes")
    knowledge: KnowledgeUse | None = Field(default=None, description="the knowledge bases it answers from")
    corp_id: str = Field(
        default="",
        description="the corporation the AI bot belongs to (its members' identities); the one configured if omitted",
    )
    aibot_id: str = Field(
        default="",
        description="the bot's aibotid (WeCom's console): a callback naming another is refused (empty: not checked)",
    )
    media_hosts: list[str] = Field(
        default_factory=lambda: list(AIBOT_MEDIA_HOSTS),
        description="the hosts a picture's or file's URL in a callback may name (besides api_base)",
    )

    _api_base = field_validator("api_base")(_strip_slash)

    @property
    def identity(self) -> Identity:
        """The corporation's members, as in its apps (the bot's own id stands in while no corp id is known)."""
        return Identity(FAMILY, self.corp_id or self.id, memory_by_person=True)

    def check_peers(self, bots: Sequence[BotSettings]) -> None:
        """An AI bot's members are its corporation's: without a corp_id it takes the one WeCom corporation
        configured (so that the app, the AI bot and the page name a member alike); with several, say which."""
        if self.corp_id:
            return
        corps = sorted({str(getattr(bot, "corp_id", "")) for bot in bots if bot.platform in CORP_PLATFORMS})
        if len(corps) > 1:
            raise ValueError(f"bots.{self.id}.corp_id: several WeCom corporations are configured "
                             f"({', '.join(corps)}): say which the AI bot belongs to")
        self.corp_id = corps[0] if corps else ""


class WeComWebhookConfig(BotSettings):
    """A WeCom group robot (群机器人) used to push notifications and operators' alerts (send only)."""

    id: str = Field(pattern=BOT_ID_PATTERN)
    platform: Literal["wecom-webhook"] = "wecom-webhook"
    key: SecretStr
    api_base: str = WECOM_API_BASE
    per_minute: int = Field(default=20, ge=1, le=20, description="WeCom allows 20 messages a minute per robot")

    _api_base = field_validator("api_base")(_strip_slash)
