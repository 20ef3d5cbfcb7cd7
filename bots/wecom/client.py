"""WeCom's server API for an app: access token, message/send (pieces, template cards) and media/get, asynchronously.

wechatpy's client is synchronous (requests), which would block the worker's event loop,
so the calls we need are made here with the shared httpx.AsyncClient. The token is
kept in the shared `TokenStore` (Redis), so every worker and replica uses one token and
only one process at a time asks WeCom for a new one (gettoken is rate-limited).
"""

from __future__ import annotations

import logging

import httpx

from bots.base import PermanentSendError, RetryableSendError, SendError, TokenStore
from bots.http import cached_token, download_bounded, request_json, token_name
from bots.parts import Downloaded, MediaError
from bots.wecom.config import WeComAppConfig
from bots.wecom.exceptions import TOKEN_INVALID_CODES, error_for
from bots.wecom.media import filename_from, media_error_for, platform_error

log = logging.getLogger(__name__)


class WeComApiClient:
    """Token, send and media calls for one WeCom app."""

    def __init__(self, config: WeComAppConfig, http: httpx.AsyncClient, tokens: TokenStore) -> None:
        self._config = config
        self._http = http
        self._tokens = tokens
        self._token_name = token_name("wecom", config.corp_id, config.secret.get_secret_value())

    async def access_token(self, stale: str | None = None) -> str:
        """A valid token from the cache, fetched once for everyone when missing or `stale`."""
        return await cached_token(self._tokens, self._token_name, self._fetch_token, stale)

    async def _fetch_token(self) -> tuple[str, float]:
        params = {"corpid": self._config.corp_id, "corpsecret": self._config.secret.get_secret_value()}
        data = await self._get_json("/cgi-bin/gettoken", params)
        errcode = int(data.get("errcode", 0))
        if errcode != 0:
            raise error_for(errcode, str(data.get("errmsg", "")))
        log.info("wecom token refreshed", extra={"bot_id": self._config.id})
        return str(data["access_token"]), float(data.get("expires_in", 7200))

    async def send_text(self, user_id: str, content: str, *, duplicate_check: bool) -> None:
        await self.send(user_id, "text", content, duplicate_check=duplicate_check)

    async def send(self, user_id: str, msgtype: str, content: str, *, duplicate_check: bool) -> None:
        """POST message/send for one piece (`msgtype` text or markdown, both {"content": …} per doc 90236)."""
        payload = {
            "touser": user_id,
            "msgtype": msgtype,
            "agentid": self._config.agent_id,
            msgtype: {"content": content},
            **({"safe": 0} if msgtype == "text" else {}),  # markdown messages have no `safe` field (doc 90236)
            "enable_duplicate_check": 1 if duplicate_check else 0,
            "duplicate_check_interval": self._config.duplicate_check_interval_s,
        }
        await self._send_message(payload)

    async def send_card(self, user_id: str, card: dict) -> None:
        """POST message/send with a template card (doc 90236 模板卡片消息: msgtype template_card). No duplicate
        check: the card's task_id is unique, and WeCom takes each task_id once."""
        payload = {"touser": user_id, "msgtype": "template_card", "agentid": self._config.agent_id,
                   "template_card": card}  # fmt: skip
        await self._send_message(payload)

    async def update_card_button(self, user_id: str, response_code: str, label: str) -> None:
        """message/update_template_card (doc 94888): the card's buttons become one that cannot be tapped, named
        `label`; a response_code works once, within 72 h."""
        payload = {"userids": [user_id], "agentid": self._config.agent_id, "response_code": response_code,
                   "button": {"replace_name": label}}  # fmt: skip
        await self._send_message(payload, "/cgi-bin/message/update_template_card")

    async def _send_message(self, payload: dict, path: str = "/cgi-bin/message/send") -> None:
        """message/send (or another call that answers like it), the token refetched once if WeCom says it is
        invalid; errcode 0 that names the user invalid or unlicensed is a delivery to nobody."""
        token = await self.access_token()
        for _ in range(2):
            data = await self._post_json(path, token, payload)
            errcode = int(data.get("errcode", 0))
            if errcode == 0:
                refused = [name for name in ("invaliduser", "unlicenseduser") if data.get(name)]
                if refused:
                    raise PermanentSendError(f"WeCom did not deliver: {refused[0]}", code=refused[0])
                return
            if errcode in TOKEN_INVALID_CODES:
                token = await self.access_token(stale=token)
                continue
            raise error_for(errcode, str(data.get("errmsg", "")))
        raise RetryableSendError("WeCom kept rejecting fresh access tokens", code="token", not_sent=True)

    async def download_media(self, media_id: str, max_bytes: int) -> Downloaded:
        """GET media/get (doc 96486) for a message's MediaId, at most `max_bytes`; the token refetched once when
        WeCom says it is invalid, as for sends. MediaError says why not (bots/wecom/media.py)."""
        try:
            token = await self.access_token()
            for _ in range(2):
                params = {"access_token": token, "media_id": media_id}
                url = f"{self._config.api_base}/cgi-bin/media/get"
                data, headers = await download_bounded(self._http, url, "WeCom media/get", max_bytes, params=params)
                error = platform_error(data, headers)
                if error is None:
                    mime = headers.get("content-type", "").split(";")[0].strip().lower()
                    return Downloaded(data, mime, filename_from(headers))
                if error[0] not in TOKEN_INVALID_CODES:
                    raise media_error_for(*error)
                token = await self.access_token(stale=token)
        except SendError as exc:  # the token could not be had
            raise MediaError("unavailable", f"WeCom token: {exc}") from exc
        raise MediaError("unavailable", "WeCom kept rejecting fresh access tokens")

    async def _get_json(self, path: str, params: dict[str, str]) -> dict:
        return await self._request("GET", path, params=params)

    async def _post_json(self, path: str, token: str, payload: dict) -> dict:
        return await self._request("POST", path, params={"access_token": token}, json=payload)

    async def _request(self, method: str, path: str, **kwargs: object) -> dict:
        return await request_json(self._http, method, f"{self._config.api_base}{path}", "WeCom API", **kwargs)
