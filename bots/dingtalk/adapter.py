"""DingTalk enterprise robot adapter: HTTP-mode callbacks in, replies out (sessionWebhook, then OpenAPI).

A reply goes through the message's sessionWebhook while it is valid (about 90 minutes,
no token needed), @-mentioning the asker in groups; after that, or if DingTalk refuses
the webhook, through the OpenAPI with the robot's access token: at once when DingTalk ended
the session early (300001), after SESSION_TRIES tries when the webhook keeps failing (5xx,
unreachable). The sessionWebhook comes in the body, which HTTP mode's signature does not
cover: it is used only when it points at DingTalk's own origin (`oapi_base`), else the reply
goes through the OpenAPI.

A Stream-mode robot asks a tool call's question with an interactive card's buttons (buttons.py); the tap comes back
over the Stream connection (stream.py) and its answer, having no sessionWebhook, goes through the OpenAPI.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping

import httpx

from bots.base import (
    CallbackRejected,
    ChannelDefaults,
    InboundMessage,
    Pacing,
    PermanentSendError,
    ReplyStyle,
    ReplyTarget,
    RetryableSendError,
    Throttled,
    TokenStore,
    per_window,
)
from bots.channels import CallbackRequest, MessageSink, Queued
from bots.dingtalk.buttons import DingTalkButtons
from bots.dingtalk.cards import DingTalkCards
from bots.dingtalk.client import DingTalkApiClient
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.crypto import verify_headers
from bots.dingtalk.exceptions import SessionWebhookExpired, error_for
from bots.dingtalk.models import parse_robot_message
from bots.dingtalk.stream import DingTalkStreamConnection
from bots.http import download_bounded, request_json
from bots.markdown import to_text
from bots.parts import Downloaded, Media, MediaError
from bots.safe_json import parse_json_object
from bots.urls import trusted

log = logging.getLogger(__name__)
TEXT_MAX_BYTES = 4000  # UNCONFIRMED cap; DingTalk documents none for robot text, this stays well inside
MARKDOWN_MAX_BYTES = 4000  # UNCONFIRMED likewise for markdown / sampleMarkdown `text`: the same margin
# A markdown message's `title` is what the conversation list and the notification show, not the message
# ("会话展示内容", the custom robot's doc through S14's copies); no length is documented (UNCONFIRMED): kept short.
TITLE_MAX_CHARS = 32
WEBHOOK_MARGIN_S = 60.0
# A sessionWebhook that fails this often (5xx, unreachable) is given up for the OpenAPI, as one that answers
# 300001: an expired webhook may well answer a gateway error instead (UNCONFIRMED; the harsher reading), and
# retrying it alone would dead-letter an answer the OpenAPI still delivers. Counted per process (bounded).
SESSION_TRIES = 3
FAILED_WEBHOOKS_KEPT = 1024


class DingTalkRobotAdapter(ChannelDefaults):
    """One enterprise robot, whichever mode its messages arrive in."""

    platform = "dingtalk"
    ack = ("{}", "application/json")
    default_reply_format = "markdown"  # DingTalk renders markdown / sampleMarkdown in every client

    def __init__(self, config: DingTalkBotConfig, http: httpx.AsyncClient, tokens: TokenStore) -> None:
        self.config = config
        self.bot_id = config.id
        self._http = http
        self.api = DingTalkApiClient(config, http, tokens)
        self.cards = DingTalkCards(self.api, config.ai_card.updates_per_second)
        # A card's button calls back over the Stream connection (callbackType STREAM); an HTTP-mode robot would
        # need a registered callbackRouteKey, UNCONFIRMED here: its questions are answered by a reply of 确认/取消.
        self.buttons = DingTalkButtons(self.api, config) if config.mode == "stream" else None
        self.callback_style = "queue" if config.mode == "http" else None  # Stream mode: botgw dingtalk-stream
        self._webhook_failures: OrderedDict[str, int] = OrderedDict()

    duplicate_check_window_s = 0.0  # DingTalk's send APIs have no duplicate check (UNCONFIRMED: none documented)
    max_answer_bytes = None  # text goes in pieces; a card takes the whole text (no documented cap)

    @property
    def reply_style(self) -> ReplyStyle:
        return "card" if self.config.ai_card.enabled else "pieces"

    def handshake(self, query: Mapping[str, str], now: float) -> str:
        raise CallbackRejected("no_handshake", 405, "DingTalk robots have no URL verification")

    def parse(self, headers: Mapping[str, str], body: bytes, now: float) -> InboundMessage:
        """HTTP mode: check timestamp and sign headers, then parse the JSON body."""
        verify_headers(headers, self.config.app_secret.get_secret_value(), now, self.config.replay_window_s)
        payload = parse_json_object(body, "body")
        self._check_addressee(payload)
        return self.config.identity.stamp(parse_robot_message(self.bot_id, payload, now))

    def receive(self, request: CallbackRequest) -> Queued:
        message = self.parse(request.headers, request.body, request.now)
        # The sign covers only the timestamp: one captured pair would carry any body for an hour.
        signature = f"{request.headers.get('timestamp', '')}:{request.headers.get('sign', '')}"
        return Queued(message, signature=signature)

    def connection(self, sink: MessageSink) -> DingTalkStreamConnection | None:
        """Stream mode: the connection `botgw dingtalk-stream` holds (HTTP mode: None, messages are callbacks)."""
        return DingTalkStreamConnection(self.config, self._http, sink) if self.config.mode == "stream" else None

    def _check_addressee(self, payload: dict) -> None:
        """A message for another robot or organisation is refused, whatever its signature says."""
        robot = payload.get("robotCode")
        if robot is not None and str(robot) != self.config.robot:
            raise CallbackRejected("wrong_robot", 403, "robotCode is not this robot's")
        corp = payload.get("chatbotCorpId")
        if self.config.corp_id and corp is not None and str(corp) != self.config.corp_id:
            raise CallbackRejected("wrong_corp", 403, "chatbotCorpId is not this organisation's")

    def max_bytes_for(self, target: ReplyTarget) -> int:
        return MARKDOWN_MAX_BYTES if self.reply_format == "markdown" else TEXT_MAX_BYTES

    async def download(self, media: Media) -> Downloaded:
        """A message's picture, voice or file: its downloadCode exchanged for the temporary downloadUrl through the
        OpenAPI (with the token), then that URL fetched, bounded and without following redirects. The URL is
        fetched because DingTalk's own authenticated answer gave it, never because a message named it."""
        if not media.ref:
            raise MediaError("unavailable", "the message named no downloadCode")
        url = await self.api.download_url(media.ref)
        data, headers = await download_bounded(self._http, url, "DingTalk download", self.max_media_bytes)
        return Downloaded(data=data, mime=headers.get("content-type", "").split(";")[0].strip(), name=media.name)

    def pacing(self, target: ReplyTarget) -> Pacing:
        """At most `per_minute` sends per conversation, shared by every worker."""
        return [(f"{self.bot_id}:{target.chat_id or target.user_id}", per_window(self.config.per_minute, 60))]

    async def send_piece(
        self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = ""
    ) -> None:
        if self._session_usable(target):
            try:
                await self._send_by_session(target, text)
                return
            except SessionWebhookExpired:
                pass  # DingTalk ended the session early: the OpenAPI still reaches the conversation
            except Throttled:
                raise  # the conversation is throttled, whichever way the answer goes
            except RetryableSendError:
                if self._webhook_failed(target.webhook_url) < SESSION_TRIES:
                    raise  # tried again with the presenter's backoff
            except PermanentSendError as exc:  # a refusal nothing documents (only 300001 is seen in public): it
                # sent nothing, and the OpenAPI may still reach the conversation (found by a review)
                log.warning("the sessionWebhook refused a piece; sending through the OpenAPI",
                            extra={"bot_id": self.bot_id, "code": str(exc.code)})  # fmt: skip
                self._webhook_failed(target.webhook_url, SESSION_TRIES)  # not used again for this message
        if self.reply_format == "markdown":
            await self.api.send_markdown(group_id=target.chat_id, user_id=target.user_id, title=title_of(text),
                                         text=text)  # fmt: skip
        else:
            await self.api.send_text(group_id=target.chat_id, user_id=target.user_id, text=text)

    def _session_usable(self, target: ReplyTarget) -> bool:
        """The message's sessionWebhook is on DingTalk's origin, not about to expire, and has not failed too often."""
        return bool(
            target.webhook_url
            and time.time() < target.webhook_expires_at - WEBHOOK_MARGIN_S
            and self._webhook_failures.get(target.webhook_url, 0) < SESSION_TRIES
            and trusted(target.webhook_url, self.config.oapi_base, self.platform, "sessionWebhook")
        )

    def _webhook_failed(self, url: str, count: int = 1) -> int:
        """Count `count` failed posts to `url`; how often it has failed. Only the most recent webhooks are kept."""
        failures = self._webhook_failures.pop(url, 0) + count
        self._webhook_failures[url] = failures
        while len(self._webhook_failures) > FAILED_WEBHOOKS_KEPT:
            self._webhook_failures.popitem(last=False)
        return failures

    async def _send_by_session(self, target: ReplyTarget, text: str) -> None:
        """The sessionWebhook bodies of S13's reply_text / reply_markdown (platform-protocols.md §F)."""
        body: dict = (
            {"msgtype": "markdown", "markdown": {"title": title_of(text), "text": text}}
            if self.reply_format == "markdown"
            else {"msgtype": "text", "text": {"content": text}}
        )
        if target.chat_id:
            body["at"] = {"atUserIds": [target.user_id], "isAtAll": False}
        data = await request_json(self._http, "POST", target.webhook_url, "sessionWebhook", json=body)
        if int(data.get("errcode", 0) or 0):
            raise error_for(int(data["errcode"]), str(data.get("errmsg", "")))


def title_of(markdown: str) -> str:
    """A markdown message's title: the first line of the answer as plain text, at most TITLE_MAX_CHARS."""
    line = next((line.strip() for line in to_text(markdown).splitlines() if line.strip()), "")
    if len(line) > TITLE_MAX_CHARS:
        line = line[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return line or "…"
