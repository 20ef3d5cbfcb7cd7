"""Every platform botgw speaks, in one table: its configuration model and how to build its adapter.

Adding a platform means adding its package under bots/ and one row here; the gateway and
the worker find everything else on the adapter (reply_style, callback_kind, pacing, …).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bots.base import TokenStore
from bots.channels import Channel, check_channel
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.dingtalk.config import DingTalkBotConfig
from bots.web.adapter import WebAdapter
from bots.web.config import WebBotConfig
from bots.wecom.adapter import WeComAppAdapter
from bots.wecom.aibot import WeComAIBotAdapter
from bots.wecom.config import WeComAIBotConfig, WeComAppConfig, WeComWebhookConfig
from bots.wecom.webhook import WeComWebhookAdapter
from bots.wecom_kf.adapter import WeComKfAdapter
from bots.wecom_kf.config import WeComKfConfig

AdapterFactory = Callable[[Any, httpx.AsyncClient, TokenStore], Channel]


@dataclass(frozen=True)
class Platform:
    config: type
    build: AdapterFactory
    holds_connection: Callable[[Any], bool] = lambda config: False  # its messages come by a connection botgw holds


PLATFORMS: dict[str, Platform] = {
    "wecom": Platform(WeComAppConfig, WeComAppAdapter),
    "wecom-ai": Platform(WeComAIBotConfig, lambda config, http, tokens: WeComAIBotAdapter(config, http)),
    "wecom-kf": Platform(WeComKfConfig, WeComKfAdapter),
    "wecom-webhook": Platform(WeComWebhookConfig, lambda config, http, tokens: WeComWebhookAdapter(config, http)),
    "dingtalk": Platform(DingTalkBotConfig, DingTalkRobotAdapter, lambda config: config.mode == "stream"),
    "web": Platform(WebBotConfig, lambda config, http, tokens: WebAdapter(config)),
}


def holds_connection(config: Any) -> bool:
    """Whether the bot's messages come by a connection botgw holds open (`botgw dingtalk-stream` runs them)."""
    return PLATFORMS[config.platform].holds_connection(config)


def build_adapter(config: Any, http: httpx.AsyncClient, tokens: TokenStore) -> Channel:
    """The adapter for one configured bot, checked to offer what its reply style needs (bots/channels.py)."""
    adapter = PLATFORMS[config.platform].build(config, http, tokens)
    check_channel(adapter)
    return adapter


def build_adapters(configs: list[Any], http: httpx.AsyncClient, tokens: TokenStore) -> dict[str, Channel]:
    """Every configured bot's adapter, with a pulled channel joined to the app whose callback URL it shares."""
    adapters = {config.id: build_adapter(config, http, tokens) for config in configs}
    for adapter in adapters.values():
        app = getattr(adapter, "app_id", None)
        if app is not None:
            adapters[app].attach_pulled(adapter)
        join = getattr(adapter, "join_bots", None)
        if join is not None:
            join({config.id: config for config in configs})
    return adapters
