"""DingTalk's client side: a person writing to a robot, one-to-one or @-mentioning it in a group.

For an HTTP-mode robot the message is POSTed to the gateway with DingTalk's signed headers;
for a Stream-mode robot it is pushed through the simulated Stream gateway. Either way it
carries a sessionWebhook issued by the simulator, where the answer then shows up.
"""

from __future__ import annotations

import mimetypes
import secrets
import time
from pathlib import Path
from typing import Any

import httpx

from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.crypto import sign
from simulator.dingtalk import messages
from simulator.replies import dingtalk_messages


def robot_payload(
    bot: DingTalkBotConfig,
    user: str,
    text: str,
    *,
    conversation: str,
    group: bool,
    webhook: dict[str, Any],
    message: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The callback of a message `user` writes: `text`, or `message` (messages.py: a picture, a file…)."""
    now_ms = int(time.time() * 1000)
    payload: dict[str, Any] = {
        **(message or {"msgtype": "text", "text": {"content": text}}),
        "msgId": "msg" + secrets.token_hex(12),
        "createAt": now_ms,
        "conversationType": "2" if group else "1",
        "conversationId": conversation,
        "senderId": "$:LWCP_v1:$" + secrets.token_hex(8),
        "senderNick": user,
        "senderCorpId": "ding-sim-corp",
        "senderStaffId": user,
        "chatbotCorpId": "ding-sim-corp",
        "chatbotUserId": "$:LWCP_v1:$bot",
        "robotCode": bot.robot,
        "isAdmin": False,
        "isInAtList": group,
        "sessionWebhook": webhook["url"],
        "sessionWebhookExpiredTime": webhook["expires_ms"],
    }
    if group and payload["msgtype"] == "text":  # in a group, the text after the @mention keeps its space
        payload["text"] = {**payload["text"], "content": " " + payload["text"]["content"]}
    if group:
        payload["conversationTitle"] = "botgw test group"
        payload["atUsers"] = [{"dingtalkId": "$:LWCP_v1:$bot"}]
    return payload


class DingTalkUser:
    """Sends robot messages as DingTalk would and reads what the robot answered."""

    def __init__(self, bot: DingTalkBotConfig, gateway_url: str, simulator_url: str, http: httpx.AsyncClient) -> None:
        self.bot = bot
        self._gateway = gateway_url.rstrip("/")
        self._sim = simulator_url.rstrip("/")
        self._http = http

    async def send(
        self,
        user: str,
        text: str,
        *,
        group: str = "",
        webhook_ttl_s: float = 5400,
        payload: dict | None = None,
        message: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Deliver one message (`text`, or `message`: messages.py); returns the payload (its conversationId and
        msgId)."""
        conversation = group or f"cid-single-{user}"
        if payload is None:
            webhook = (
                await self._http.post(
                    f"{self._sim}/__sim__/dingtalk/session",
                    json={"conversation": conversation, "user": user, "group": bool(group), "ttl_s": webhook_ttl_s},
                )
            ).json()
            payload = robot_payload(
                self.bot, user, text, conversation=conversation, group=bool(group), webhook=webhook, message=message
            )
        if self.bot.mode == "http":
            response = await self.post_signed(payload)
            response.raise_for_status()
        else:
            body = {"client_id": self.bot.app_key, "payload": payload}
            (await self._http.post(f"{self._sim}/__sim__/dingtalk/stream/push", json=body)).raise_for_status()
        return payload

    async def upload(self, data: bytes, *, name: str = "", mime: str = "", ttl_s: float | None = None) -> str:
        """Hand DingTalk what the person sends (a picture, a recording, a file); the downloadCode its message
        carries."""
        params: dict[str, Any] = {"robot": self.bot.robot, "name": name, "mime": mime}
        if ttl_s is not None:
            params["ttl_s"] = ttl_s
        response = await self._http.post(f"{self._sim}/__sim__/dingtalk/media", params=params, content=data)
        response.raise_for_status()
        return str(response.json()["downloadCode"])

    async def compose(
        self,
        text: str,
        *,
        image: Path | None = None,
        voice: Path | None = None,
        file: Path | None = None,
        quote: str | None = None,
    ) -> list[dict[str, Any]]:
        """The messages a person sends for `botgw sim dingtalk`'s attachments, in order, their media uploaded: a
        file, then a voice (the text stands for DingTalk's recognition of it: the simulator cannot hear), a picture
        (with the text: one rich-text message), and what text is left (replying to `quote`)."""
        sent: list[dict[str, Any]] = []
        if file is not None:
            sent.append(messages.file_message(await self._upload_file(file), file.name))
        if voice is not None:
            sent.append(messages.audio_message(await self._upload_file(voice), recognition=text))
            text = ""
        if image is not None:
            code = await self._upload_file(image)
            sent.append(messages.rich_text_message(text, (code,)) if text else messages.picture_message(code))
            text = ""
        if text or quote is not None or not sent:
            sent.append(messages.text_message(text, quote=quote))
        return sent

    async def _upload_file(self, path: Path) -> str:
        return await self.upload(path.read_bytes(), name=path.name, mime=mimetypes.guess_type(path.name)[0] or "")

    async def post_signed(self, payload: dict[str, Any], timestamp_ms: int | None = None) -> httpx.Response:
        ts = str(timestamp_ms if timestamp_ms is not None else int(time.time() * 1000))
        headers = {"timestamp": ts, "sign": sign(ts, self.bot.app_secret.get_secret_value())}
        return await self._http.post(f"{self._gateway}/callback/{self.bot.id}", json=payload, headers=headers)

    async def replies(self, conversation: str) -> list[dict[str, Any]]:
        return await dingtalk_messages(self._http, self._sim, conversation)

    async def cards(self, user: str = "", *, group: str = "") -> list[dict[str, Any]]:
        """The cards shown in `group`, or in `user`'s chat with the robot: track, template, params as shown now."""
        params = {"conversation": group} if group else {"user": user}
        response = await self._http.get(f"{self._sim}/__sim__/dingtalk/cards/shown", params=params)
        response.raise_for_status()
        return list(response.json())

    async def tap(
        self, user: str, track: str, button: str, *, group: str = "", stale_view: bool = False
    ) -> httpx.Response:
        """`user` taps the button (its id) of card `track`, in `group` or their chat with the robot: DingTalk then
        pushes the card callback over the robot's Stream connection (card_taps.py). 409: they could not have."""
        body = {"track": track, "user": user, "button": button, "conversation": group, "stale_view": stale_view}
        return await self._http.post(f"{self._sim}/__sim__/dingtalk/cards/tap", json=body)
