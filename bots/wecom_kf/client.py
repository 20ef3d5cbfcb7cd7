"""The 微信客服 API (kf/…): pull, send, session state, accounts, with the Kefu secret's own access token.

The token comes from gettoken with the corp id and the 微信客服 secret, cached in the shared TokenStore
like an app's (one refresher at a time, refetched once on 40014/42001).
"""

from __future__ import annotations

from typing import Any

from bots.base import RetryableSendError, SendError
from bots.wecom.client import WeComApiClient
from bots.wecom.exceptions import TOKEN_INVALID_CODES
from bots.wecom_kf.exceptions import SESSION_ENDED, error_for

SYNC_LIMIT = 1000  # the most sync_msg returns per call
SESSION_STATE_ENDED = 4  # service_state 4: 已结束 (reference wecom-kf.md, "States")
# media/get answers an unknown or expired media_id (kept 3 days: "该media_id仅三天内有效", the Kefu 素材管理 page,
# kancloud wikizhima/wechatkf-api 2376706) with errcode JSON instead of the bytes: 40007 "无效媒体文件 ID" (the
# media/get pages' error example).


class KfApiClient(WeComApiClient):
    """kf/… calls for one 微信客服 secret (the app client's token handling, other endpoints)."""

    async def call(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST one kf endpoint; a stale token is refetched once; other errcodes become typed send errors."""
        token = await self.access_token()
        for _ in range(2):
            data = await self._post_json(path, token, payload)
            errcode = int(data.get("errcode", 0))
            if errcode == 0:
                return data
            if errcode in TOKEN_INVALID_CODES:
                token = await self.access_token(stale=token)
                continue
            raise error_for(errcode, str(data.get("errmsg", "")))
        # As for app sends: retried with backoff, not dead-lettered (a token WeCom refuses twice is WeCom's
        # hiccup or a secret being rotated, and the message is still worth answering).
        raise RetryableSendError("WeCom kept rejecting fresh access tokens", code="token", not_sent=True)

    async def sync_msg(self, open_kfid: str, cursor: str, token: str) -> dict[str, Any]:
        payload = {"cursor": cursor, "token": token, "limit": SYNC_LIMIT, "voice_format": 0, "open_kfid": open_kfid}
        return await self.call("/cgi-bin/kf/sync_msg", payload)

    async def send_text(self, open_kfid: str, customer: str, content: str, msgid: str) -> None:  # type: ignore[override]
        text = {"content": content}
        payload = {"touser": customer, "open_kfid": open_kfid, "msgid": msgid, "msgtype": "text", "text": text}
        await self.call("/cgi-bin/kf/send_msg", payload)

    async def send_on_event(self, code: str, content: str, msgid: str) -> None:
        payload = {"code": code, "msgid": msgid, "msgtype": "text", "text": {"content": content}}
        await self.call("/cgi-bin/kf/send_msg_on_event", payload)

    async def service_state(self, open_kfid: str, customer: str) -> tuple[int, str]:
        data = await self.call("/cgi-bin/kf/service_state/get", {"open_kfid": open_kfid, "external_userid": customer})
        return int(data.get("service_state", 0)), str(data.get("servicer_userid", ""))

    async def has_session(self, open_kfid: str, customer: str) -> bool:
        """Whether the customer has a session a handoff can move: not ended (state 4), and not unknown (95013,
        "the session has ended"). A refusal of another kind, or no answer, raises."""
        try:
            state, _ = await self.service_state(open_kfid, customer)
        except SendError as exc:
            if exc.code != SESSION_ENDED:
                raise
            return False
        return state != SESSION_STATE_ENDED

    async def trans(self, open_kfid: str, customer: str, state: int, servicer: str | None = None) -> str:
        """Move the session to `state`; returns the msg_code for the notice that may follow ('' if none)."""
        payload: dict[str, Any] = {"open_kfid": open_kfid, "external_userid": customer, "service_state": state}
        if servicer:
            payload["servicer_userid"] = servicer
        data = await self.call("/cgi-bin/kf/service_state/trans", payload)
        return str(data.get("msg_code", ""))

    async def accounts(self) -> list[str]:
        """Every account's open_kfid (kf/account/list, paged by 100)."""
        found: list[str] = []
        while True:
            data = await self.call("/cgi-bin/kf/account/list", {"offset": len(found), "limit": 100})
            page = [str(item.get("open_kfid", "")) for item in data.get("account_list") or []]
            found += [kfid for kfid in page if kfid]
            if len(page) < 100:
                return found

