"""Configuration: one YAML file, `BOTGW_*` environment variables over it (pydantic-settings).

Secrets can stay out of the file: any string value may be written `${ENV_VAR}` and is
filled from the environment at load time; an unset variable is a clear error.
Nested keys come from the environment with `__`, e.g. `BOTGW_ENGINE__BASE_URL`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bots.registry import PLATFORMS
from engine.settings import EngineSettings
from gateway import redis_client
from gateway.identities import IdentityError, qualify, tenants_by_family
from gateway.limits import LimitSettings
from gateway.memory import GroupMemory
from knowledge.config import KnowledgeSettings

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MIN_ADMIN_TOKEN_CHARS = 24
MIN_SIGNING_SECRET_CHARS = 32


class ConfigError(Exception):
    """The configuration cannot be used; the message says which key and why."""


class MemorySettings(BaseModel):
    """Per-session conversation memory kept in Redis."""

    ttl_s: int = Field(default=7 * 86400, ge=60)
    token_budget: int = Field(default=2048, ge=0)
    max_turns: int = Field(default=40, ge=0)
    group: GroupMemory = Field(
        default="per_user", description="per_user: each member of a group has their own conversation; shared: one"
    )


class AdminSettings(BaseModel):
    """What operators reach and the public never does: /metrics, /readyz and /admin/… on a second listener
    (loopback by default), and on the public port only with `Authorization: Bearer TOKEN` (/admin/… is off
    unless a token is set)."""

    token: SecretStr | None = None
    host: str = Field(default="127.0.0.1", description="the admin listener's address (keep it off the internet)")
    port: int | None = Field(default=8081, ge=0, le=65535, description="the admin listener's port; null: none")


class WorkerSettings(BaseModel):
    """The worker pool: parallelism, redelivery of a dead worker's messages, retries."""

    concurrency: int = Field(default=8, ge=1)
    claim_idle_ms: int = Field(default=30_000, ge=100)
    block_ms: int = Field(default=1000, ge=10)
    max_send_attempts: int = Field(default=6, ge=1)
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    drain_s: float = Field(default=30.0, ge=0, description="on SIGTERM: finish what is held, then hand it back")
    bot_weights: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="turns a bot's users get per round relative to others (default 1)"
    )
    metrics_port: int | None = None

    def weight(self, bot_id: str) -> float:
        return self.bot_weights.get(bot_id, 1.0)


BotConfig = Annotated[Union[tuple(p.config for p in PLATFORMS.values())], Field(discriminator="platform")]  # noqa: UP007


# What gateway/redis_client.py opens: one server, a Redis Cluster, a Sentinel-watched primary.
REDIS_SCHEMES = redis_client.SCHEMES


class Settings(BaseSettings):
    """Everything a gateway or worker process needs."""

    model_config = SettingsConfigDict(env_prefix="BOTGW_", env_nested_delimiter="__", extra="forbid")

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout_s: float = Field(default=5.0, gt=0, description="socket timeout of every Redis call")
    redis_connect_timeout_s: float = Field(default=2.0, gt=0)
    namespace: str = Field(default="botgw", pattern=r"^[A-Za-z0-9_.-]+$")
    system_prompt: str = "You are a helpful assistant."
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    dedup_ttl_s: int = Field(default=86400, ge=600)
    log_level: str = "INFO"
    engine: EngineSettings = Field(default_factory=EngineSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    knowledge: KnowledgeSettings = Field(default_factory=KnowledgeSettings)
    bots: list[BotConfig] = Field(default_factory=list)
    alert_bot: str | None = Field(default=None, description="a wecom-webhook bot that receives operators' alerts")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first, so that BOTGW_* overrides what the YAML file (passed as init) says.
        return env_settings, init_settings

    @field_validator("redis_url")
    @classmethod
    def _known_redis_url(cls, value: str) -> str:
        scheme, separator, _ = value.partition("://")
        if scheme.lower() not in REDIS_SCHEMES:
            # Only a scheme is named: without "://" the whole value (its password among it) would be echoed.
            given = f"not {scheme.lower()!r}" if separator and len(scheme) <= 20 else "it has no scheme"
            raise ValueError(
                "redis_url must start with one of " + ", ".join(f"{s}://" for s in REDIS_SCHEMES) + f", {given}"
            )
        return value

    @model_validator(mode="after")
    def _kefu_apps_exist(self) -> Settings:
        """A 微信客服 bot's `app` names the `wecom` bot whose callback URL receives its callbacks."""
        by_id = {bot.id: bot for bot in self.bots}
        served: dict[str, str] = {}
        for bot in self.bots:
            app = getattr(bot, "app", None)
            if app is None:
                continue
            if getattr(by_id.get(app), "platform", None) != "wecom":
                found = f"a {by_id[app].platform!r} bot" if app in by_id else "no such bot"
                raise ValueError(f"bots.{bot.id}.app must name a bot of platform 'wecom' (found {found} {app!r})")
            if app in served:
                raise ValueError(f"bots.{bot.id}.app: {app!r} already serves bots.{served[app]} (one Kefu bot an app)")
            served[app] = bot.id
            # The app's URL verifies and decrypts the Kefu callbacks, and its secret calls the Kefu API.
            for key in ("corp_id", "secret", "token", "encoding_aes_key"):
                if _plain(getattr(bot, key)) != _plain(getattr(by_id[app], key)):
                    raise ValueError(f"bots.{bot.id}.{key} must be the app's own (bots.{app}.{key}): one app for both")
        return self

    @model_validator(mode="after")
    def _ai_bots_know_their_corp(self) -> Settings:
        """An AI bot's members are its corporation's: without a corp_id it takes the one WeCom corporation
        configured (so that the app, the AI bot and the page name a member alike); with several, say which."""
        corps = sorted({bot.corp_id for bot in self.bots if bot.platform in ("wecom", "wecom-kf")})
        for bot in self.bots:
            if bot.platform == "wecom-ai" and not bot.corp_id:
                if len(corps) > 1:
                    raise ValueError(f"bots.{bot.id}.corp_id: several WeCom corporations are configured "
                                     f"({', '.join(corps)}): say which the AI bot belongs to")
                bot.corp_id = corps[0] if corps else ""
        return self

    @model_validator(mode="after")
    def _limits_name_qualified_identities(self) -> Settings:
        """`limits.users` and `limits.groups` keys name a person as every limit counts them: qualified."""
        tenants = tenants_by_family(self.bots)
        for field in ("users", "groups"):
            written: dict = getattr(self.limits, field)
            full = {}
            for key, budget in written.items():
                try:
                    full[qualify(key, tenants)] = budget
                except IdentityError as exc:
                    raise ValueError(f"limits.{field}: {exc}") from None
            setattr(self.limits, field, full)
        return self

    @model_validator(mode="after")
    def _web_logins_exist(self) -> Settings:
        """A page's `web_login` names a bot whose credentials sign people in: a WeCom app (an AI bot has no
        secret to call auth/getuserinfo with), or a DingTalk bot with its corp_id (a staffId is the corp's)."""
        by_id = {bot.id: bot for bot in self.bots}
        for bot in self.bots:
            login = getattr(bot, "web_login", None)
            for via, platform in (("wecom", "wecom"), ("dingtalk", "dingtalk")):
                through = getattr(login, via, None)
                if through is None:
                    continue
                named = by_id.get(through.bot)
                if named is None or named.platform != platform:
                    found = f"a {named.platform!r} bot" if named else "no such bot"
                    raise ValueError(f"bots.{bot.id}.web_login.{via}.bot must name a {platform!r} bot "
                                     f"(found {found} {through.bot!r})")
                if via == "dingtalk" and not named.corp_id:
                    raise ValueError(f"bots.{bot.id}.web_login.dingtalk: bots.{named.id}.corp_id must be set "
                                     "(a staffId names a person only within its organisation)")
        return self

    @model_validator(mode="after")
    def _no_empty_secrets(self) -> Settings:
        """An empty credential is no credential: `Bearer ` must never open the admin API. Named, never shown."""
        for where, secret in _secrets(self):
            if not secret.get_secret_value().strip():
                raise ValueError(f"{where} is empty: set it, or remove the key to turn its feature off")
        for bot in self.bots:  # it signs the page's sessions, company members' identities among them
            signing = getattr(bot, "auth_secret", None)
            if signing is not None and len(signing.get_secret_value().strip()) < MIN_SIGNING_SECRET_CHARS:
                raise ValueError(f"bots.{bot.id}.auth_secret is shorter than {MIN_SIGNING_SECRET_CHARS} characters "
                                 "(or leave it out: `botgw web` then makes one per start)")
        token = self.admin.token
        if token is not None and len(token.get_secret_value().strip()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(f"admin.token is shorter than {MIN_ADMIN_TOKEN_CHARS} characters: make one with "
                             "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        return self

    def redis_options(self) -> dict[str, float]:
        """Timeouts for every Redis client: a blackholed Redis fails a call instead of hanging it (WeCom waits
        5 s for an ack). A worker's blocking read waits less than this (worker.block_ms)."""
        return {"socket_timeout": self.redis_timeout_s, "socket_connect_timeout": self.redis_connect_timeout_s}

    def bot(self, bot_id: str) -> BotConfig:
        for bot in self.bots:
            if bot.id == bot_id:
                return bot
        raise ConfigError(f"no bot with id {bot_id!r} in the configuration")

    def effective_dedup_ttl_s(self) -> int:
        """Dedup must outlive every replay window, so that no replay is processed twice."""
        windows = [getattr(bot, "replay_window_s", 0) for bot in self.bots]
        return max([self.dedup_ttl_s, *[w * 2 for w in windows]])


def _secrets(model: BaseModel, where: str = "") -> Iterator[tuple[str, SecretStr]]:
    """Every secret in the settings with its dotted key (a bot by its id, a list item by its index)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{where}{name}"
        if isinstance(value, SecretStr):
            yield key, value
        elif isinstance(value, BaseModel):
            yield from _secrets(value, f"{key}.")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    label = getattr(item, "id", None) or getattr(item, "name", None) or index
                    yield from _secrets(item, f"{key}.{label}.")


def _plain(value: Any) -> Any:
    """A setting's value, a secret's revealed for comparing (never for printing)."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def _expand_env(value: Any) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"configuration refers to ${{{name}}}, which is not set in the environment")
            return os.environ[name]

        return _ENV_REF.sub(substitute, value)
    if isinstance(value, dict):
        return {key: _expand_env(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item) for item in value]
    return value


def load_settings(path: str | Path | None) -> Settings:
    """Read the YAML file (if any), expand `${VAR}`, apply `BOTGW_*` over it, validate."""
    data: dict[str, Any] = {}
    if path:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"configuration file {file} does not exist")
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{file} must hold a mapping at the top level")
        data = _expand_env(loaded)
    ids = [bot.get("id") for bot in data.get("bots", []) if isinstance(bot, dict)]
    if len(ids) != len(set(ids)):
        raise ConfigError("bot ids must be unique")
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc)) from None  # `from None`: pydantic's own text shows the values
    if settings.worker.block_ms / 1000 >= settings.redis_timeout_s:
        raise ConfigError("worker.block_ms must be shorter than redis_timeout_s: a blocking read would time out")
    return settings


def describe_errors(exc: ValidationError) -> str:
    """Which keys are wrong and why, never the values given: a mistyped key may hold a secret."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        text = error["msg"].removeprefix("Value error, ")
        where = ".".join(str(part) for part in error["loc"])
        lines.append(f"{where}: {text}" if where else text)  # a whole-settings check names its key itself
    return "invalid configuration:\n  " + "\n  ".join(lines)


