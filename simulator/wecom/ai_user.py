"""WeCom's side of an AI bot (智能机器人): encrypted JSON callbacks, then refresh polling of the stream.

It plays what WeCom does for a user: send the message, then poll "refresh" callbacks at an
interval, spreading them over any number of gateway addresses (as WeCom's load balancer
would), verifying and decrypting every reply, and assembling what the user sees.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bots.wecom.config import WeComAIBotConfig
from bots.wecom.crypto import WeComCrypto, decode_aes_key
from bots.wecom.media import encrypt_aibot_media

STREAM_LIMIT_S = 360.0
STREAM_MAX_BYTES = 20480  # stream.content, UTF-8 (智能机器人 被动回复)


@dataclass
class StreamView:
    """Everything the user saw of one answer, in order."""

    stream_id: str = ""
    shown: list[str] = field(default_factory=list)
    finished: bool = False
    first_text_s: float | None = None
    refresh_latencies_s: list[float] = field(default_factory=list)
    first_reply: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.shown[-1] if self.shown else ""


class AIBotReplyError(Exception):
    """The gateway's reply was not a valid, correctly signed envelope."""


ANSWER_WITHIN_S = 5.0  # WeCom waits this long for a callback's answer, then drops the connection (§B [S5])
CALLBACK_RESENDS = 3  # and sends the same callback again, at most this many times


class WeComAIBotUser:
    """Talks to botgw as WeCom does on behalf of users of one AI bot."""

    def __init__(
        self, bot: WeComAIBotConfig, gateways: list[str], simulator_url: str, http: httpx.AsyncClient
    ) -> None:
        self.bot = bot
        self.crypto = WeComCrypto(bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), "")
        self._gateways = itertools.cycle([url.rstrip("/") for url in gateways])
        self._simulator = simulator_url.rstrip("/")
        self._http = http
        self.resent = 0  # callbacks WeCom sent again: not answered within ANSWER_WITHIN_S, or answered 5xx

    def signed(self, payload: dict[str, Any], timestamp: int | None = None) -> tuple[dict[str, str], bytes]:
        """Query and body of one callback carrying `payload`."""
        ts = str(timestamp if timestamp is not None else int(time.time()))
        nonce = str(secrets.randbelow(10**9))
        encrypted, signature = self.crypto.signed_envelope(json.dumps(payload, ensure_ascii=False), ts, nonce)
        params = {"msg_signature": signature, "timestamp": ts, "nonce": nonce}
        return params, json.dumps({"encrypt": encrypted}).encode()

    def open_reply(self, response: httpx.Response, nonce: str | None = None) -> dict[str, Any]:
        """Verify the reply's envelope and decrypt it, and refuse what WeCom would refuse: a reply whose nonce is
        not the callback's own (the doc's envelope carries "the nonce from the callback URL"), a timestamp that
        is not a number of seconds (the doc shows an integer; S3's sample writes a string: whether WeCom takes
        both is UNCONFIRMED, so only the documented form passes), a stream over 20,480 bytes, or a stream reply
        without its stream id."""
        if response.status_code != 200:
            raise AIBotReplyError(f"gateway answered {response.status_code}: {response.text[:200]}")
        if not response.content:
            return {}
        envelope = response.json()
        if nonce is not None and envelope.get("nonce") != nonce:
            raise AIBotReplyError(f"reply nonce {envelope.get('nonce')!r} is not the callback's {nonce!r}")
        if not isinstance(envelope.get("timestamp"), int):
            raise AIBotReplyError(f"reply timestamp {envelope.get('timestamp')!r} is not an integer")
        plaintext = self.crypto.verify_and_decrypt(
            envelope["msgsignature"], str(envelope["timestamp"]), envelope["nonce"], envelope["encrypt"]
        )
        reply = json.loads(plaintext)
        if reply.get("msgtype") == "stream":
            stream = reply.get("stream") or {}
            if not stream.get("id"):
                raise AIBotReplyError("a stream reply without stream.id")
            if len(str(stream.get("content", "")).encode("utf-8")) > STREAM_MAX_BYTES:
                raise AIBotReplyError(f"stream content over {STREAM_MAX_BYTES} bytes")
        return reply

    async def post(self, payload: dict[str, Any], gateway: str | None = None) -> dict[str, Any]:
        """Deliver one callback as WeCom does (platform-protocols.md §B [S5]): "企业微信服务器在五秒内收不到响应会断掉
        连接，并且重新发起请求，总共重试三次". An answer slower than ANSWER_WITHIN_S is dropped and the same
        callback sent again (counted in `resent`); so is one answered 5xx (UNCONFIRMED: the harsher reading)."""
        params, body = self.signed(payload)
        url = f"{gateway or next(self._gateways)}/callback/{self.bot.id}"
        for attempt in range(1 + CALLBACK_RESENDS):
            try:
                response = await self._http.post(url, params=params, content=body, timeout=ANSWER_WITHIN_S)
            except httpx.TransportError:  # no answer in time (a timeout), or none at all: sent again
                if attempt == CALLBACK_RESENDS:
                    raise
                self.resent += 1
                continue
            if response.status_code < 500 or attempt == CALLBACK_RESENDS:
                return self.open_reply(response, nonce=params["nonce"])
            self.resent += 1
        raise AssertionError("unreachable")

    async def new_response_url(self, ttl_s: float | None = None) -> str:
        """A response_url as WeCom issues one with each message (valid an hour; `ttl_s` to test its expiry)."""
        body = {} if ttl_s is None else {"ttl_s": ttl_s}
        response = await self._http.post(f"{self._simulator}/__sim__/wecom-ai/response-url", json=body)
        return response.json()["response_url"]

    async def tell_chat(self, response_url: str, user: str, chat_id: str = "") -> None:
        """Tell the simulator which chat a response_url belongs to (WeCom knows: a card goes only to a one-to-one
        chat's)."""
        chat = {"response_url": response_url, "user": user, "chattype": "group" if chat_id else "single"}
        (await self._http.post(f"{self._simulator}/__sim__/wecom-ai/response-url/chat", json=chat)).raise_for_status()

    async def cards(self, user: str) -> list[dict[str, Any]]:
        """The template cards `user` was shown through response URLs."""
        response = await self._http.get(f"{self._simulator}/__sim__/wecom-ai/cards", params={"touser": user})
        return list(response.json())

    async def tap(self, user: str, key: str, gateway: str | None = None) -> tuple[dict[str, Any], httpx.Response]:
        """`user` taps the button `key` of a card they were shown: the simulator answers the event WeCom sends
        (refused, 409, for a card they never got), posted here signed. The event (its response_url carries the
        answer) and the gateway's raw answer (WeCom drops a card event that gets none within 5 s)."""
        tapped = await self._http.post(f"{self._simulator}/__sim__/wecom-ai/tap", json={"user": user, "key": key})
        tapped.raise_for_status()
        event = {"aibotid": f"aib-{self.bot.id}", **tapped.json()["event"]}
        params, body = self.signed(event)
        url = f"{gateway or next(self._gateways)}/callback/{self.bot.id}"
        return event, await self._http.post(url, params=params, content=body)

    def message_payload(
        self,
        user: str,
        text: str,
        response_url: str,
        msg_id: str = "",
        chat_id: str = "",
        content: dict[str, Any] | None = None,
        quote: str = "",
    ) -> dict:
        """A message callback's plaintext (doc 100719 消息推送): a text message, or `content` (its msgtype and
        that type's object, as `image_content` and the others build them); `quote`: the text message it quotes."""
        payload: dict[str, Any] = {
            "msgid": msg_id or secrets.token_hex(16),
            "aibotid": f"aib-{self.bot.id}",
            "chattype": "group" if chat_id else "single",
            "from": {"userid": user},
            "response_url": response_url,
            **(content or {"msgtype": "text", "text": {"content": text}}),
        }
        if chat_id:
            payload["chatid"] = chat_id
        if quote:
            payload["quote"] = {"msgtype": "text", "text": {"content": quote}}
        return payload

    async def media_url(self, data: bytes) -> str:
        """A picture or file as WeCom hands it to the bot: encrypted with the bot's key (doc 100719 结构体说明 图片),
        at a URL that works five minutes (the simulator's)."""
        encrypted = encrypt_aibot_media(decode_aes_key(self.bot.encoding_aes_key.get_secret_value()), data)
        response = await self._http.post(f"{self._simulator}/__sim__/wecom-ai/media", content=encrypted)
        response.raise_for_status()
        return str(response.json()["url"])

    async def image_content(self, data: bytes, text: str = "") -> dict[str, Any]:
        """An image message, or with `text` a mixed one (the text, then the picture: doc 100719 图文混排)."""
        image = {"url": await self.media_url(data)}
        if not text:
            return {"msgtype": "image", "image": image}
        items = [{"msgtype": "text", "text": {"content": text}}, {"msgtype": "image", "image": image}]
        return {"msgtype": "mixed", "mixed": {"msg_item": items}}

    async def file_content(self, data: bytes) -> dict[str, Any]:
        return {"msgtype": "file", "file": {"url": await self.media_url(data)}}

    @staticmethod
    def voice_content(recognized: str) -> dict[str, Any]:
        """A voice message: WeCom sends only its recognition (voice.content), never the recording."""
        return {"msgtype": "voice", "voice": {"content": recognized}}

    async def ask(
        self,
        user: str,
        text: str,
        *,
        interval_s: float = 0.5,  # WeCom's refresh interval is UNCONFIRMED (platform-protocols.md §E); a guess
        chat_id: str = "",
        on_update: Callable[[str], Awaitable[None]] | None = None,
        content: dict[str, Any] | None = None,
        quote: str = "",
    ) -> StreamView:
        """Send `text` (or `content`) as `user` and follow the stream to its end, as the WeCom client shows it."""
        response_url = await self.new_response_url()
        await self.tell_chat(response_url, user, chat_id)
        started = time.monotonic()
        payload = self.message_payload(user, text, response_url, chat_id=chat_id, content=content, quote=quote)
        view = StreamView()
        view.first_reply = await self.post(payload)
        stream = view.first_reply.get("stream") or {}
        view.stream_id = str(stream.get("id", ""))
        await self._see(view, stream, started, on_update)
        while not view.finished and time.monotonic() - started < STREAM_LIMIT_S:
            await asyncio.sleep(interval_s)
            sent = time.monotonic()
            reply = await self.post(self.refresh_payload(user, view.stream_id))
            view.refresh_latencies_s.append(time.monotonic() - sent)
            await self._see(view, reply.get("stream") or {}, started, on_update)
        return view

    def refresh_payload(self, user: str, stream_id: str) -> dict[str, Any]:
        return {
            "msgid": secrets.token_hex(16),
            "aibotid": f"aib-{self.bot.id}",
            "chattype": "single",
            "from": {"userid": user},
            "msgtype": "stream",
            "stream": {"id": stream_id},
        }

    @staticmethod
    async def _see(
        view: StreamView, stream: dict[str, Any], started: float, on_update: Callable[[str], Awaitable[None]] | None
    ) -> None:
        content = str(stream.get("content", ""))
        view.finished = bool(stream.get("finish"))
        if content and view.first_text_s is None:
            view.first_text_s = time.monotonic() - started
        if not view.shown or content != view.shown[-1]:
            view.shown.append(content)
            if on_update:
                await on_update(content)
