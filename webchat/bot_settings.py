"""The page's own settings: its web bot and the bots its `web_login` signs people in through, nothing else.

The page process is the one most exposed to the internet. It used to load the whole configuration, every bot's
secrets with it, and failed to start when another bot's `${VAR}` was unset where only the gateway and workers have
it. Here the YAML file is read, the page's entries are picked, `${VAR}` is expanded inside them only, and they are
validated as the gateway validates them (the same one-line errors, `bots.<id>.<key>`). No `BOTGW_*` is applied:
the page has no settings of its own beyond its bots."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from bots.web.config import WebBotConfig
from gateway.config import BotConfig, ConfigError, check_secrets, describe_errors, expand_env, read_config_file


class _PageBots(BaseModel):
    """The page's bots, validated under `bots` so that an error names them as the whole configuration would."""

    model_config = ConfigDict(extra="forbid")

    bots: list[BotConfig]

    @model_validator(mode="after")
    def _checked_as_the_gateway_checks(self) -> _PageBots:
        """The checks of the whole configuration that concern these bots: no empty credential, a signing secret
        long enough, the logins naming bots that can sign people in (the web bot is first)."""
        check_secrets(self, self.bots)
        self.bots[0].check_peers(self.bots)
        return self


@dataclass(frozen=True)
class PageSettings:
    """What a `botgw web` page process knows: its web bot, and the bots `web_login` names (for their OAuth)."""

    web: WebBotConfig
    sign_in_bots: tuple[Any, ...]

    @property
    def bots(self) -> list[Any]:
        return [self.web, *self.sign_in_bots]


def _entries(path: str | Path) -> list[dict]:
    bots = read_config_file(Path(path)).get("bots")
    return [bot for bot in bots if isinstance(bot, dict)] if isinstance(bots, list) else []


def load_page_settings(path: str | Path, bot_id: str) -> PageSettings:
    """The web bot `bot_id` of the configuration file and the bots its `web_login` names; ConfigError saying what
    is wrong (no such bot, not a web bot, an unset `${VAR}` inside these entries, an invalid key)."""
    by_id = {entry.get("id"): entry for entry in _entries(path)}
    if bot_id not in by_id:
        known = ", ".join(str(key) for key in by_id) or "none"
        raise ConfigError(f"no bot with id {bot_id!r} in the configuration (its bots: {known})")
    entry = by_id[bot_id]
    if entry.get("platform") != "web":
        raise ConfigError(f"bot {bot_id!r} is not a web bot")
    logins = entry.get("web_login") if isinstance(entry.get("web_login"), dict) else {}
    named = [login.get("bot") for login in logins.values() if isinstance(login, dict)]
    picked = [entry, *(by_id[name] for name in dict.fromkeys(named) if name in by_id and name != bot_id)]
    expanded = expand_env(picked)
    try:
        bots = _PageBots(bots=expanded).bots
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, [bot.get("id") for bot in expanded])) from None
    web = bots[0]
    assert isinstance(web, WebBotConfig)
    return PageSettings(web, tuple(bots[1:]))


@functools.cache
def page_settings() -> PageSettings:
    """The page process's settings, from BOTGW_CONFIG and BOTGW_WEB_BOT (what `botgw web` sets): read once."""
    return load_page_settings(os.environ["BOTGW_CONFIG"], os.environ.get("BOTGW_WEB_BOT", "web"))
