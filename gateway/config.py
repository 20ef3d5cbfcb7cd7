"""Configuration: one YAML file, `BOTGW_*` environment variables over it (pydantic-settings).

Secrets can stay out of the file: any string value may be written `${ENV_VAR}` and is
filled from the environment at load time; an unset variable is a clear error.
Nested keys come from the environment with `__`, e.g. `BOTGW_ENGINE__BASE_URL`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from difflib import get_close_matches
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bots.registry import PLATFORMS
from engine.asr import AsrSettings
from engine.settings import EngineSettings
from gateway.console.settings import ConsoleSettings
from gateway.state import redis_client
from gateway.state.identities import IdentityError, qualify, tenants_by_family
from gateway.state.limits import LimitSettings
from gateway.state.memory import GroupMemory
from knowledge.config import KnowledgeSettings, KnowledgeUse
from tools.config import ToolsSettings

T = TypeVar("T")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ENV_PREFIX = "BOTGW_"
# BOTGW_* variables that are not settings: botgw's own commands, install scripts and tests read them.
TOOL_VARIABLES = {"CONFIG", "DEBUG", "GATEWAY_URL", "SIMULATOR_URL", "WEB_BOT", "ENGINE_PYTHON", "ENGINE_VENV",
                  "VLLM_PACKAGE", "INSTALL_BROWSER", "OPS_VENV", "TINY_MODEL_DIR", "IMAGE", "PROCS", "VARS", "SIDE",
                  "AUDIT_TIMEOUT_S", "FUZZ_EXAMPLES"}  # fmt: skip
MIN_ADMIN_TOKEN_CHARS = 24
MIN_SIGNING_SECRET_CHARS = 32


class ConfigError(Exception):
    """The configuration cannot be used; the message says which key and why."""


class MemorySettings(BaseModel):
    """Per-session conversation memory kept in Redis."""

    model_config = ConfigDict(extra="forbid")

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

    model_config = ConfigDict(extra="forbid")

    token: SecretStr | None = None
    host: str = Field(default="127.0.0.1", description="the admin listener's address (keep it off the internet)")
    port: int | None = Field(default=8081, ge=0, le=65535, description="the admin listener's port; null: none")


class WorkerSettings(BaseModel):
    """The worker pool: parallelism, redelivery of a dead worker's messages, retries."""

    model_config = ConfigDict(extra="forbid")

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


# What gateway/state/redis_client.py opens: one server, a Redis Cluster, a Sentinel-watched primary.
REDIS_SCHEMES = redis_client.SCHEMES
PLACEHOLDER = "change-me"  # what botgw.env.example and the other example files hold where a secret goes


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
    asr: AsrSettings | None = Field(
        default=None,
        description="an OpenAI-compatible /v1/audio/transcriptions endpoint for voice messages the platform did not "
        "recognise (vLLM serving Whisper: engine profile asr-whisper-*); null: such voice gets a reply asking to type",
    )
    tools: ToolsSettings = Field(default_factory=ToolsSettings, description="MCP servers bots may call (issue 24)")
    console: ConsoleSettings = Field(default_factory=ConsoleSettings, description="the operator console (/console/)")
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
        if PLACEHOLDER in value.lower():  # REDIS_PASSWORD=change-me of the example files (no SecretStr to check)
            raise ValueError(f"redis_url's password is still the example's placeholder ({PLACEHOLDER}…)")
        if scheme.lower() in ("redis", "rediss"):  # one host: its port must read (the others list several)
            try:
                _ = urlsplit(value).port
            except ValueError:  # redis-py failed on it later, an "unexpected" error whose --debug showed the password
                raise ValueError(
                    "redis_url's host:port cannot be read: a password holding '/', '?', '#' or '@' must be "
                    "percent-encoded (%2F, %3F, %23, %40)"
                ) from None
        return value

    @model_validator(mode="after")
    def _bots_agree(self) -> Settings:
        """What one bot's settings say of another's (a 微信客服 bot's app, a page's logins, an AI bot's corporation):
        each platform checks its own bots against the others (`check_peers`, in bots/<platform>/config.py)."""
        for bot in self.bots:
            bot.check_peers(self.bots)
        return self

    @model_validator(mode="after")
    def _alert_bot_is_a_group_robot(self) -> Settings:
        """Operators' alerts go out through a WeCom group robot; anything else would fail at the first alert."""
        if self.alert_bot is None:
            return self
        named = next((bot for bot in self.bots if bot.id == self.alert_bot), None)
        if named is None or named.platform != "wecom-webhook":
            found = f"a {named.platform!r} bot" if named else "no such bot"
            robots = ", ".join(bot.id for bot in self.bots if bot.platform == "wecom-webhook") or "none configured"
            raise ValueError(f"alert_bot must name a 'wecom-webhook' group robot (found {found} {self.alert_bot!r}; "
                             f"group robots: {robots})")
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
    def _console_resolves(self) -> Settings:
        """`console.roles` names people as limits do (qualified); `console.login` names bots that can sign in."""
        tenants = tenants_by_family(self.bots)
        full = {}
        for key, role in self.console.roles.items():
            try:
                full[qualify(key, tenants)] = role
            except IdentityError as exc:
                raise ValueError(f"console.roles: {exc}") from None
        self.console.roles = full
        self.console.login.check("console.login", self.bots)
        return self

    @model_validator(mode="after")
    def _tools_resolve(self) -> Settings:
        """A bot's `tools.use` names configured servers; its `access` names people and groups as limits do."""
        tenants = tenants_by_family(self.bots)
        for bot in self.bots:
            if bot.tools is None:
                continue
            unknown = [name for name in bot.tools.use if name not in self.tools.servers]
            if unknown:
                known = ", ".join(self.tools.servers) or "none configured"
                raise ValueError(f"bots.{bot.id}.tools.use: {', '.join(unknown)} not in tools.servers ({known})")
            for tool, access in bot.tools.access.items():
                for field in ("users", "groups"):
                    written = getattr(access, field)
                    if written is None:
                        continue
                    try:
                        setattr(access, field, [qualify(name, tenants) for name in written])
                    except IdentityError as exc:
                        raise ValueError(f"bots.{bot.id}.tools.access.{tool}.{field}: {exc}") from None
        return self

    @model_validator(mode="after")
    def _no_empty_secrets(self) -> Settings:
        """An empty credential is no credential: `Bearer ` must never open the admin API. Named, never shown."""
        check_secrets(self, self.bots)
        token = self.admin.token
        if token is not None and len(token.get_secret_value().strip()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(f"admin.token is shorter than {MIN_ADMIN_TOKEN_CHARS} characters: make one with "
                             "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        return self

    def shown(self) -> dict:
        """The effective configuration as it may be shown (`botgw config check`, the console): every secret
        masked (SecretStr dumps as '**********'), credentials inside URLs too, and password hashes (they can be
        attacked offline)."""
        return _masked(self.model_dump(mode="json"))  # type: ignore[return-value]

    def redis_options(self) -> dict[str, float]:
        """Timeouts for every Redis client: a blackholed Redis fails a call instead of hanging it (WeCom waits
        5 s for an ack). A worker's blocking read waits less than this (worker.block_ms)."""
        return {"socket_timeout": self.redis_timeout_s, "socket_connect_timeout": self.redis_connect_timeout_s}

    def bot(self, bot_id: str) -> BotConfig:
        for bot in self.bots:
            if bot.id == bot_id:
                return bot
        known = ", ".join(bot.id for bot in self.bots) or "none"
        raise ConfigError(f"no bot with id {bot_id!r} in the configuration (its bots: {known})")

    def bases_in_use(self) -> dict[str, list[str]]:
        """Each knowledge base some bot answers from, with the keys that name it (`bots.kefu.knowledge`)."""
        uses: dict[str, list[str]] = {}
        for bot in self.bots:
            for where, use in _knowledge_uses(bot, f"bots.{bot.id}."):
                for base in use.bases:
                    uses.setdefault(base, []).append(where)
        return uses

    def effective_dedup_ttl_s(self) -> int:
        """Dedup must outlive every replay window, so that no replay is processed twice."""
        windows = [getattr(bot, "replay_window_s", 0) for bot in self.bots]
        return max([self.dedup_ttl_s, *[w * 2 for w in windows]])


def _masked(value: object, key: str = "") -> object:
    if isinstance(value, str):
        if "hash" in key or "sha256" in key:
            return "**********"
        from bots.urls import redact_url

        return redact_url(value) if "://" in value else value
    if isinstance(value, dict):
        return {name: _masked(item, str(name)) for name, item in value.items()}
    if isinstance(value, list):
        return [_masked(item, key) for item in value]
    return value


def _found_in(model: BaseModel, kind: type[T], where: str = "") -> Iterator[tuple[str, T]]:
    """Every value of `kind` the settings hold, with its dotted key: through nested models, lists (an item by
    its id or name, else its index) and dicts (an item by its key)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{where}{name}"
        if isinstance(value, kind):
            yield key, value
            continue
        if isinstance(value, BaseModel):
            yield from _found_in(value, kind, f"{key}.")
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for index, item in items:
            if isinstance(item, BaseModel):
                label = getattr(item, "id", None) or getattr(item, "name", None) or index
                yield from _found_in(item, kind, f"{key}.{label}.")


def check_secrets(model: BaseModel, bots: Sequence[BaseModel]) -> None:
    """No empty credential anywhere in `model`, and no page's session-signing secret too short to keep its
    sessions (company members' identities among them) from being forged. The gateway's settings and the page's
    own (webchat/bot_settings.py) both run it."""
    for where, secret in _secrets(model):
        if not secret.get_secret_value().strip():
            raise ValueError(f"{where} is empty: set it, or remove the key to turn its feature off")
        if PLACEHOLDER in secret.get_secret_value().lower():  # the example env files' values (found by a review:
            # a 29-character admin token anyone who read the repository knew opened /admin/* on the public port)
            raise ValueError(f"{where} is still the example's placeholder ({PLACEHOLDER}…): set a real value")
    for bot in bots:
        signing = getattr(bot, "auth_secret", None)
        if signing is not None and len(signing.get_secret_value().strip()) < MIN_SIGNING_SECRET_CHARS:
            raise ValueError(f"bots.{getattr(bot, 'id', '?')}.auth_secret is shorter than {MIN_SIGNING_SECRET_CHARS} "
                             "characters (or leave it out: `botgw web` then makes one per start)")


def _secrets(model: BaseModel) -> Iterator[tuple[str, SecretStr]]:
    """Every secret in the settings with its dotted key (a bot by its id, a list item by its index)."""
    return _found_in(model, SecretStr)


def _knowledge_uses(model: BaseModel, where: str) -> Iterator[tuple[str, KnowledgeUse]]:
    """Every `knowledge:` a bot's settings hold (its own, and per account where a platform has them)."""
    return _found_in(model, KnowledgeUse, where)


def expand_env(value: Any) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"configuration refers to ${{{name}}}, which is not set in the environment")
            return os.environ[name]

        return _ENV_REF.sub(substitute, value)
    if isinstance(value, dict):
        return {key: expand_env(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_env(item) for item in value]
    return value


_UNQUOTED_FLOW_REF = re.compile(r"[{\[,]\s*[\w.-]+:\s*\$\{|[\[,]\s*\$\{")


def read_config_file(file: Path) -> dict[str, Any]:
    """The YAML file as written (no `${VAR}` expanded): a mapping, or ConfigError saying what is wrong with it."""
    if not file.is_file():
        raise ConfigError(f"configuration file {file} does not exist")
    text = file.read_text(encoding="utf-8")
    try:
        loaded = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        hint = ""
        if _UNQUOTED_FLOW_REF.search(text):  # `{key: ${KEY}}`: YAML reads the `{` of `${` as a mapping's start
            hint = ' (a ${VAR} inside {...} or [...] must be quoted: key: "${VAR}")'
        raise ConfigError(f"{file} is not valid YAML: {exc}{hint}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{file} must hold a mapping at the top level")
    return loaded


def load_settings(path: str | Path | None) -> Settings:
    """Read the YAML file (if any), expand `${VAR}`, apply `BOTGW_*` over it, validate."""
    data: dict[str, Any] = {}
    if path:
        file = Path(path)
        data = expand_env(read_config_file(file))
    odd = [key for key in data if not isinstance(key, str)]
    if odd:
        raise ConfigError(f"top-level keys are names: {str(odd[0])[:40]!r} is not one (a key without quotes that "
                          "YAML reads as a number, true or null?)")
    bots = data.get("bots")
    ids = [bot.get("id") if isinstance(bot, dict) else None for bot in bots] if isinstance(bots, list) else []
    named = [bot_id for bot_id in ids if isinstance(bot_id, str)]
    if len(named) != len(set(named)):
        twice = sorted({bot_id for bot_id in named if named.count(bot_id) > 1})
        raise ConfigError(f"bot ids must be unique: {', '.join(twice)} more than once")
    mistyped = _mistyped_environment(set(_ENV_REF.findall(file.read_text(encoding="utf-8"))) if path else set())
    if mistyped:
        raise ConfigError(_problems(mistyped))
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, ids)) from None  # `from None`: pydantic's own text shows the values
    if settings.worker.block_ms / 1000 >= settings.redis_timeout_s:
        raise ConfigError("worker.block_ms must be shorter than redis_timeout_s: a blocking read would time out")
    return settings


def _mistyped_environment(referenced: set[str]) -> list[str]:
    """BOTGW_* variables meant as settings whose section is misspelt: pydantic-settings reads only the names it
    knows and would ignore them. Meant as a setting: a nested name (`__`), or a name close to a section's. Not
    judged: botgw's tools' own variables, and those the YAML file refers to as `${VAR}` (they are values)."""
    sections = list(Settings.model_fields)
    found = []
    for name in sorted(os.environ):
        if not name.startswith(ENV_PREFIX) or name in referenced:
            continue
        rest = name[len(ENV_PREFIX) :]
        section = rest.split("__", 1)[0].lower()
        if section in sections or rest in TOOL_VARIABLES or rest.startswith("TEST_"):
            continue
        near = get_close_matches(section, sections, n=1, cutoff=0.6 if "__" in rest else 0.8)
        if "__" in rest or near:
            hint = f"; did you mean {ENV_PREFIX}{near[0].upper()}{rest[len(section):]}?" if near else ""
            found.append(f"environment variable {name}: not a setting{hint}")
    return found


def describe_errors(exc: ValidationError, bot_ids: Sequence[Any] = ()) -> str:
    """Which keys are wrong and why, never the values given: a mistyped key may hold a secret. An unknown key
    gets the nearest valid name; a bot is named by its id."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = error["loc"]
        text = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            text = _unknown_key(loc)
        where = _key_path(loc, bot_ids)
        lines.append(f"{where}: {text}" if where else text)  # a whole-settings check names its key itself
    return _problems(lines)


def _problems(lines: list[str]) -> str:
    """One problem on one line; several, a line each under a count."""
    if len(lines) == 1:
        return f"invalid configuration: {lines[0]}"
    return f"invalid configuration ({len(lines)} problems):\n  " + "\n  ".join(lines)


def _key_path(loc: tuple[Any, ...], bot_ids: Sequence[Any]) -> str:
    """`bots.demo.secrett` rather than pydantic's `bots.0.wecom.secrett`: the bot by its id, no union tag."""
    parts = [str(part) for part in loc]
    if len(loc) >= 2 and loc[0] == "bots" and isinstance(loc[1], int):
        named = loc[1] < len(bot_ids) and isinstance(bot_ids[loc[1]], str) and bot_ids[loc[1]]
        label = bot_ids[loc[1]] if named else loc[1]
        rest = parts[3:] if len(loc) > 2 and str(loc[2]) in PLATFORMS else parts[2:]
        parts = ["bots", str(label), *rest]
    return ".".join(parts)


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """"unknown key; did you mean max_tokens?": the valid names where the unknown one was written."""
    valid = _keys_at(loc[:-1])
    near = get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
    if near:
        return f"unknown key; did you mean {near[0]}?"
    return "unknown key; the keys here are " + ", ".join(valid) if valid else "unknown key"


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys the model at `loc` takes: followed from Settings through nested models, lists, dicts and the
    bots' platform union (whose tag pydantic puts in the path)."""
    models: list[type[BaseModel]] = [Settings]
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the same models
        inner = [m for model in models if part in model.model_fields
                 for m in _models_in(model.model_fields[part].annotation)]
        tagged = [m for m in models if "platform" in m.model_fields and m.model_fields["platform"].default == part]
        models = inner or tagged or models  # otherwise a dict's key: the same models
    return sorted({name for model in models for name in model.model_fields})


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every model an annotation can hold, through Optional, list, dict, Annotated and Union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]
