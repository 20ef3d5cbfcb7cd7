"""WeCom group robot (群机器人) push: send-only text and markdown to a group, for notifications and alerts.

WeCom allows 20 messages a minute per robot and drops the rest; pacing is the worker's
job (shared across replicas in Redis), splitting to the byte caps is done here.
"""

from __future__ import annotations

import httpx

from bots.base import ChannelDefaults, Pacing, ReplyStyle, ReplyTarget, per_window
from bots.http import request_json
from bots.wecom.config import WeComWebhookConfig
from bots.wecom.exceptions import error_for

TEXT_MAX_BYTES = 2048
MARKDOWN_MAX_BYTES = 4096


class WeComWebhookAdapter(ChannelDefaults):
    """One group robot. A push names its format in `target.chat_id` ("markdown" or "text", as `botgw push` and
    the alerts queue it); anything else is sent as the bot's reply_format says, markdown by default (a group
    renders it, up to 4096 bytes)."""

    platform = "wecom-webhook"
    reply_style: ReplyStyle = "pieces"
    default_reply_format = "markdown"

    def __init__(self, config: WeComWebhookConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.bot_id = config.id
        self._http = http

    def pacing(self, target: ReplyTarget) -> Pacing:
        """WeCom drops what a robot sends beyond 20 a minute: pace every worker's sends together."""
        return [(self.bot_id, per_window(self.config.per_minute, 60))]

    def msgtype_for(self, target: ReplyTarget) -> str:
        return target.chat_id if target.chat_id in ("markdown", "text") else self.reply_format

    def max_bytes_for(self, target: ReplyTarget) -> int:
        return MARKDOWN_MAX_BYTES if self.msgtype_for(target) == "markdown" else TEXT_MAX_BYTES

    async def send_piece(
        self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = ""
    ) -> None:
        msgtype = self.msgtype_for(target)
        body = {"msgtype": msgtype, msgtype: {"content": text}}
        url = f"{self.config.api_base}/cgi-bin/webhook/send"
        key = self.config.key.get_secret_value()
        data = await request_json(self._http, "POST", url, "group robot", params={"key": key}, json=body)
        errcode = int(data.get("errcode", 0))
        if errcode:
            raise error_for(errcode, str(data.get("errmsg", "")))
