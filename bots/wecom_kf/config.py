"""Configuration of a 微信客服 bot: the Kefu secret, its callback crypto, which accounts it serves, handoff."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from bots.base import BotSettings, Identity, InboundMessage
from bots.wecom.config import WECOM_API_BASE, WeComAppConfig, _CallbackSecrets, _strip_slash
from knowledge.config import KnowledgeUse

DEFAULT_HANDOFF_KEYWORDS = ["人工", "转人工", "人工客服"]
# A member's UserID: "长度为1~64个字节。只能由数字、字母和“_-@.”四种字符组成，且第一个字符必须是数字或字母"
# (WeCom's user/create documentation, as quoted by the wecom-rs crate's ParamsCreateUser).
USERID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


class KfAccountSettings(BaseModel):
    """What one customer-service account (open_kfid) may do differently from the bot's defaults."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str | None = None
    welcome_text: str | None = None
    knowledge: KnowledgeUse | None = Field(default=None, description="instead of the bot's knowledge bases")


class HandoffSettings(BaseModel):
    """When and how a customer goes to a human agent."""

    model_config = ConfigDict(extra="forbid")

    keywords: list[str] = Field(default_factory=lambda: list(DEFAULT_HANDOFF_KEYWORDS))
    notice_text: str = "正在为您转接人工客服，请稍候。"
    servicer: str | None = Field(
        default=None, pattern=USERID_PATTERN, description="an agent's userid (state 3); none: the pool (state 2)"
    )


class WeComKfConfig(_CallbackSecrets):
    """A WeCom 微信客服 bot: callbacks say "pull", messages come from kf/sync_msg, replies go by kf/send_msg."""

    platform: Literal["wecom-kf"] = "wecom-kf"
    corp_id: str
    secret: SecretStr = Field(
        description="the secret of the self-built app set under 微信客服 → 可调用接口的应用 (since 2023-12-01 the "
        "微信客服 system app's own secret no longer works for companies that did not use it before)"
    )
    app: str | None = Field(
        default=None,
        description="the `wecom` bot of that same app, when it also serves employees: its one callback URL receives "
        "the kf_msg_or_event callbacks too, and hands them to this bot (token and encoding_aes_key are that app's)",
    )
    api_base: str = WECOM_API_BASE
    open_kfids: list[str] | None = Field(default=None, description="accounts to serve; none: all (kf/account/list)")
    accounts: dict[str, KfAccountSettings] = Field(default_factory=dict, description="per open_kfid overrides")
    welcome_text: str | None = "您好，我是智能客服，请问有什么可以帮您？"
    merge_window_s: float = Field(default=2.0, ge=0, le=30, description="a customer's burst answered together")
    skip_history: bool = Field(default=True, description="on a first start, skip messages sent before it")
    handoff: HandoffSettings = Field(default_factory=HandoffSettings)
    knowledge: KnowledgeUse | None = Field(default=None, description="the knowledge bases it answers from")

    _api_base = field_validator("api_base")(_strip_slash)

    @model_validator(mode="after")
    def _accounts_are_served(self) -> WeComKfConfig:
        """An override for an account the bot does not serve would never apply: say so at start."""
        for open_kfid in [*(self.open_kfids or []), *self.accounts]:
            if not open_kfid or any(char.isspace() for char in open_kfid):
                raise ValueError("open_kfids and accounts: an open_kfid is one word without spaces")
        unserved = sorted(set(self.accounts) - set(self.open_kfids)) if self.open_kfids is not None else []
        if unserved:
            raise ValueError(f"accounts names {', '.join(unserved)}, which open_kfids does not serve")
        if self.reply_format == "markdown":
            # kf/send_msg has no Markdown message type (wecom-kf.md §4: text, image, voice, video, file, link,
            # miniprogram, msgmenu, location): a customer would read the raw ** and #.
            raise ValueError("reply_format: 微信客服 sends text only (kf/send_msg has no markdown type); use text")
        return self

    @property
    def identity(self) -> Identity:
        """WeChat customers of the corporation (`wecom-kf:<corp_id>:<external_userid>`), never its members; each
        account's conversation keeps its own memory (the platform's session and quota are per account)."""
        return Identity("wecom-kf", self.corp_id)

    def handoff_request(self, account: object, person: object, servicer: object = None) -> InboundMessage:
        from bots.wecom_kf.models import handoff_for  # models needs this module's USERID_PATTERN

        return handoff_for(self, account, person, servicer)

    def check_peers(self, bots: Sequence[BotSettings]) -> None:
        """`app` names the `wecom` bot whose callback URL receives this bot's callbacks: that app verifies and
        decrypts them and its secret calls the Kefu API, so they are one app's credentials; one Kefu bot an app."""
        if self.app is None:
            return
        app = next((bot for bot in bots if bot.id == self.app), None)
        if not isinstance(app, WeComAppConfig):
            found = f"a {app.platform!r} bot" if app is not None else "no such bot"
            raise ValueError(f"bots.{self.id}.app must name a bot of platform 'wecom' (found {found} {self.app!r})")
        first = next(bot for bot in bots if isinstance(bot, WeComKfConfig) and bot.app == self.app)
        if first is not self:
            raise ValueError(f"bots.{self.id}.app: {self.app!r} already serves bots.{first.id} (one Kefu bot an app)")
        for key in ("corp_id", "secret", "token", "encoding_aes_key"):
            if _plain(getattr(self, key)) != _plain(getattr(app, key)):
                raise ValueError(f"bots.{self.id}.{key} must be the app's own (bots.{app.id}.{key}): one app for both")


def _plain(value: object) -> object:
    return value.get_secret_value() if isinstance(value, SecretStr) else value
