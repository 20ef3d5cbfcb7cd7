"""Every platform botgw speaks, in one table: its configuration model and how to build its adapter.

Adding a platform means adding its package under bots/ and one row here; the gateway and
the worker find everything else on the adapter (reply_style, callback_kind, pacing, …).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from bots.base import ErrorHint, TokenStore
from bots.channels import Channel, HostsPulled, JoinsBots, PulledThroughApp, check_channel
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.dingtalk.config import DingTalkBotConfig
from bots.web.adapter import WebAdapter
from bots.web.config import WebBotConfig
from bots.wecom.adapter import WeComAppAdapter
from bots.wecom.aibot import WeComAIBotAdapter
from bots.wecom.config import WeComAIBotConfig, WeComAppConfig, WeComWebhookConfig
from bots.wecom.exceptions import TOKEN_HINTS as WECOM_TOKEN_HINTS
from bots.wecom.webhook import WeComWebhookAdapter
from bots.wecom_kf.adapter import WeComKfAdapter
from bots.wecom_kf.config import WeComKfConfig

AdapterFactory = Callable[[Any, httpx.AsyncClient, TokenStore], Channel]


@dataclass(frozen=True)
class Platform:
    config: type
    build: AdapterFactory
    title: tuple[str, str]  # (中文, English): how the operator's console names the platform
    holds_connection: Callable[[Any], bool] = lambda config: False  # its messages come by a connection botgw holds
    token_hints: Mapping[str, ErrorHint] = field(default_factory=dict)  # token error codes the console explains


PLATFORMS: dict[str, Platform] = {
    "wecom": Platform(WeComAppConfig, WeComAppAdapter, ("企业微信应用", "WeCom app"), token_hints=WECOM_TOKEN_HINTS),
    "wecom-ai": Platform(WeComAIBotConfig, lambda config, http, tokens: WeComAIBotAdapter(config, http),
                         ("企业微信智能机器人", "WeCom AI bot")),
    "wecom-kf": Platform(WeComKfConfig, WeComKfAdapter, ("微信客服", "WeChat Kefu"), token_hints=WECOM_TOKEN_HINTS),
    "wecom-webhook": Platform(WeComWebhookConfig, lambda config, http, tokens: WeComWebhookAdapter(config, http),
                              ("企业微信群机器人", "WeCom group robot")),
    "dingtalk": Platform(DingTalkBotConfig, DingTalkRobotAdapter, ("钉钉", "DingTalk"),
                         holds_connection=lambda config: config.mode == "stream"),
    "web": Platform(WebBotConfig, lambda config, http, tokens: WebAdapter(config), ("网页", "Web page")),
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
        if isinstance(adapter, PulledThroughApp) and adapter.app_id is not None:
            host = adapters[adapter.app_id]
            if not isinstance(host, HostsPulled):  # the configuration's check names the mistake first
                raise ValueError(f"bot {adapter.app_id!r} cannot receive another bot's callbacks")
            host.attach_pulled(adapter)
        if isinstance(adapter, JoinsBots):
            adapter.join_bots({config.id: config for config in configs})
    return adapters
