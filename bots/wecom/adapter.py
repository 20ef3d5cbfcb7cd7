"""WeCom self-built app adapter: URL verification, callback → InboundMessage, replies.

The order in `parse` is the security order: query present → timestamp in window →
signature (constant time) → decrypt → receiver id → inner XML. Nothing is decrypted
before the signature checks out, and nothing is trusted before the receiver id does.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from bots.base import (
    CallbackRejected,
    ChannelDefaults,
    InboundMessage,
    Pacing,
    ReplyStyle,
    ReplyTarget,
    TokenStore,
    per_window,
)
from bots.buttons import ButtonTap, Question
from bots.channels import CallbackRequest, PulledThroughApp, Queued
from bots.parts import Downloaded, Media, MediaError
from bots.wecom.cards import APP_CARD, button_card
from bots.wecom.client import WeComApiClient
from bots.wecom.config import WeComAppConfig
from bots.wecom.crypto import WeComCrypto
from bots.wecom.models import parse_app_message
from bots.xml import parse_flat_xml

# message/send (doc 90236, platform-protocols.md §C): text.content and markdown.content are both at most 2048 bytes
# for an app (the 4096 of markdown is the group robot's).
TEXT_MAX_BYTES = 2048
MARKDOWN_MAX_BYTES = 2048
# WeCom: an app may send one member at most 30 messages a minute and 1000 an hour; the excess is dropped.
MEMBER_PACING = (per_window(30, 60), per_window(1000, 3600))


def check_timestamp(timestamp: str, now: float, window_s: int) -> None:
    """Reject a timestamp outside ±window_s of now (the settings keep it at least 1 s).

    Compared as integers: a timestamp of thousands of digits is merely far off, not too large for a float."""
    try:
        sent_at = int(timestamp)
    except ValueError as exc:
        raise CallbackRejected("bad_timestamp", 400, "timestamp is not an integer") from exc
    if abs(int(now) - sent_at) > window_s:
        raise CallbackRejected("stale_timestamp", 403, "timestamp outside the replay window")


def required_params(query: Mapping[str, str], *names: str) -> list[str]:
    values = [query.get(name, "") for name in names]
    if not all(values):
        raise CallbackRejected("missing_params", 400, f"query must carry {', '.join(names)}")
    return values


def verified_echo(crypto: WeComCrypto, query: Mapping[str, str], now: float, window_s: int) -> str:
    """GET URL verification of a WeCom callback URL (apps, 微信客服): the decrypted echostr."""
    signature, timestamp, nonce, echostr = required_params(query, "msg_signature", "timestamp", "nonce", "echostr")
    check_timestamp(timestamp, now, window_s)
    return crypto.verify_and_decrypt(signature, timestamp, nonce, echostr)


def verified_plaintext(crypto: WeComCrypto, query: Mapping[str, str], body: bytes, now: float, window_s: int) -> str:
    """A WeCom XML callback's decrypted inner XML, in the security order: query, timestamp, signature, then
    decryption (apps and 微信客服 share it)."""
    signature, timestamp, nonce = required_params(query, "msg_signature", "timestamp", "nonce")
    check_timestamp(timestamp, now, window_s)
    encrypted = parse_flat_xml(body).get("Encrypt", "")
    if not encrypted:
        raise CallbackRejected("missing_encrypt", 400, "envelope has no Encrypt element")
    return crypto.verify_and_decrypt(signature, timestamp, nonce, encrypted)


class AppCardButtons:
    """A question's buttons as the app's template card (message/send, msgtype template_card); a tap comes back as
    a template_card_event callback (bots/wecom/models.py)."""

    def __init__(self, api: WeComApiClient) -> None:
        self._api = api

    async def ask(self, target: ReplyTarget, question: Question) -> None:
        await self._api.send_card(target.user_id, button_card(question, APP_CARD))

    async def answered(self, target: ReplyTarget, tap: ButtonTap, label: str) -> None:
        """The tap's ResponseCode lets the app update the card once within 72 h (doc 94888 更新模版卡片消息,
        更新按钮为不可点击状态): its buttons become one that cannot be tapped, named `label`."""
        if tap.card_ref:
            await self._api.update_card_button(target.user_id, tap.card_ref, label)


class WeComAppAdapter(ChannelDefaults):
    """One WeCom app: verifies and parses its callbacks, sends its replies."""

    platform = "wecom"
    reply_style: ReplyStyle = "pieces"
    callback_style = "queue"
    ack = ("", "text/plain")  # WeCom app callbacks are acknowledged with 200 and an empty body
    # `markdown` messages show only in the WeCom client (WeChat users of the app see "unsupported"): plain text
    # unless the bot asks for markdown.
    default_reply_format = "text"

    def __init__(self, config: WeComAppConfig, http: httpx.AsyncClient, tokens: TokenStore) -> None:
        self.config = config
        self.bot_id = config.id
        self.crypto = WeComCrypto(
            config.token.get_secret_value(), config.encoding_aes_key.get_secret_value(), config.corp_id
        )
        self._api = WeComApiClient(config, http, tokens)
        self.buttons = AppCardButtons(self._api)
        self.pulled: PulledThroughApp | None = None

    def handshake(self, query: Mapping[str, str], now: float) -> str:
        """GET URL verification: the decrypted echostr, to be answered bare."""
        return verified_echo(self.crypto, query, now, self.config.replay_window_s)

    def parse(self, query: Mapping[str, str], body: bytes, now: float) -> InboundMessage | None:
        """POST callback → InboundMessage (None for events that need no answer). When the same app also serves
        微信客服, its kf_msg_or_event callbacks arrive here and become the Kefu bot's pull requests."""
        plaintext = verified_plaintext(self.crypto, query, body, now, self.config.replay_window_s)
        if self.pulled is not None and (pull := self.pulled.pull_for(plaintext, now)) is not None:
            return pull
        message = parse_app_message(self.bot_id, plaintext, now, self.config.agent_id)
        return self.config.identity.stamp(message) if message is not None else None

    def receive(self, request: CallbackRequest) -> Queued | None:
        message = self.parse(request.query, request.body, request.now)
        if message is None:
            return None
        return Queued(message, pull=message.msg_type == "pull")  # a 微信客服 callback to the app's URL: a pull

    def attach_pulled(self, channel: PulledThroughApp) -> None:
        """The 微信客服 bot whose callbacks come to this app's URL (`app: <this bot>` in its config)."""
        self.pulled = channel

    @property
    def duplicate_check_window_s(self) -> float:
        return float(self.config.duplicate_check_interval_s)

    def max_bytes_for(self, target: ReplyTarget) -> int:
        return MARKDOWN_MAX_BYTES if self.reply_format == "markdown" else TEXT_MAX_BYTES

    def pacing(self, target: ReplyTarget) -> Pacing:
        return [(f"{self.bot_id}:{target.user_id}", window) for window in MEMBER_PACING]

    async def send_piece(
        self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = ""
    ) -> None:
        """Deliver one piece (already within max_bytes_for) to the user, as the bot's reply_format says."""
        await self._api.send(target.user_id, self.reply_format, text, duplicate_check=duplicate_check)

    async def download(self, media: Media) -> Downloaded:
        """A message's picture or recording, by its MediaId, through media/get on the bot's API host."""
        if not media.ref:
            raise MediaError("unavailable", "the message names no MediaId")
        return await self._api.download_media(media.ref, self.max_media_bytes)
