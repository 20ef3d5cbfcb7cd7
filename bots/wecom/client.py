"""WeCom's server API for an app: access token and message/send, asynchronously.

wechatpy's client is synchronous (requests), which would block the worker's event loop,
so the two calls we need are made here with the shared httpx.AsyncClient. The token is
kept in the shared `TokenStore` (Redis), so every worker and replica uses one token and
only one process at a time asks WeCom for a new one (gettoken is rate-limited).
"""

from __future__ import annotations

import logging

import httpx

from bots.base import PermanentSendError, RetryableSendError, TokenStore
from bots.http import cached_token, request_json, token_name
from bots.wecom.config import WeComAppConfig
from bots.wecom.exceptions import TOKEN_INVALID_CODES, error_for

log = logging.getLogger(__name__)


class WeComApiClient:
    """Token and send calls for one WeCom app."""

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
        """POST message/send for one piece of text; refetch the token once if WeCom says it is invalid."""
        payload = {
            "touser": user_id,
            "msgtype": "text",
            "agentid": self._config.agent_id,
            "text": {"content": content},
            "safe": 0,
            "enable_duplicate_check": 1 if duplicate_check else 0,
            "duplicate_check_interval": self._config.duplicate_check_interval_s,
        }
        token = await self.access_token()
        for _ in range(2):
            data = await self._post_json("/cgi-bin/message/send", token, payload)
            errcode = int(data.get("errcode", 0))
            if errcode == 0:
                # errcode 0 with the user listed as invalid or unlicensed means WeCom delivered to nobody
                refused = [name for name in ("invaliduser", "unlicenseduser") if data.get(name)]
                if refused:
                    raise PermanentSendError(f"WeCom did not deliver: {refused[0]}", code=refused[0])
                return
            if errcode in TOKEN_INVALID_CODES:
                token = await self.access_token(stale=token)
                continue
            raise error_for(errcode, str(data.get("errmsg", "")))
        raise RetryableSendError("WeCom kept rejecting fresh access tokens", code="token")

    async def _get_json(self, path: str, params: dict[str, str]) -> dict:
        return await self._request("GET", path, params=params)

    async def _post_json(self, path: str, token: str, payload: dict) -> dict:
        return await self._request("POST", path, params={"access_token": token}, json=payload)

    async def _request(self, method: str, path: str, **kwargs: object) -> dict:
        return await request_json(self._http, method, f"{self._config.api_base}{path}", "WeCom API", **kwargs)
