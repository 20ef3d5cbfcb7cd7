"""DingTalk's OpenAPI for a robot: access token, group and one-to-one messages, AI cards.

All calls are async (httpx): the dingtalk-stream SDK's helpers use blocking `requests`.
The access token is shared by all replicas through the TokenStore (Redis) and refreshed
by one process at a time, five minutes before it expires.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from typing import Any

import httpx

from bots.base import PermanentSendError, RetryableSendError, SendError, Throttled, TokenStore
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.exceptions import THROTTLE_PROBE_S, error_for
from bots.http import cached_token, token_name
from bots.parts import MediaError

log = logging.getLogger(__name__)
# 附录B：如何处理钉钉服务端API限流
# (open.dingtalk.com/document/development/how-to-process-api-throttling-on-the-dingtalk-server):
# an app's calls of one API past its QPS (20 on the standard plan) answer QpsLimitForAppkeyAndApi, every app's
# together past the API's QpsLimitForApi; "sleep 1秒，然后继续执行". A rate limit sends nothing.
QPS_LIMIT_CODES = frozenset({"Forbidden.AccessDenied.QpsLimitForAppkeyAndApi", "Forbidden.AccessDenied.QpsLimitForApi"})
TOKEN_HEADER = "x-acs-dingtalk-access-token"

FLOW_PROCESSING, FLOW_INPUTTING, FLOW_FINISHED, FLOW_FAILED = 1, 2, 3, 5
# DingTalk refuses a bad, expired or revoked token with HTTP 400 and this code, not 401 (public clients' logs:
# satorijs/satori#240 `[400] {"code":"InvalidAuthentication", "message":"不合法的access_token"}`,
# alibabacloud-sdk-php/dingtalk#1, ClouGence/open-cdm#342); 401 is taken as the same, whatever its body.
TOKEN_REFUSED_CODE = "InvalidAuthentication"
# oToMessages/batchSend answers 200 and lists the recipients it did not deliver to (aliyun/dingtalk-sdk
# robot_1_0 BatchSendOTOResponseBody: flowControlledStaffIdList "推送频繁，被限流的用户", invalidStaffIdList
# "无效的用户"; filteredStaffIdList in newer clients, its meaning undocumented). A flow-controlled recipient is
# tried again; the others will be refused again.
UNDELIVERED_LISTS = {
    "invalidStaffIdList": "not a valid user of the organisation (left it, or a wrong id)",
    "filteredStaffIdList": "filtered out by DingTalk",
}


class DingTalkApiClient:
    """OpenAPI calls of one robot."""

    def __init__(self, config: DingTalkBotConfig, http: httpx.AsyncClient, tokens: TokenStore) -> None:
        self._config = config
        self._http = http
        self._tokens = tokens
        self._token_name = token_name("dingtalk", config.app_key, config.app_secret.get_secret_value())

    async def access_token(self, stale: str | None = None) -> str:
        return await cached_token(self._tokens, self._token_name, self._fetch_token, stale)

    async def _fetch_token(self) -> tuple[str, float]:
        body = {"appKey": self._config.app_key, "appSecret": self._config.app_secret.get_secret_value()}
        data = await self._call("POST", "/v1.0/oauth2/accessToken", body, token=None)
        log.info("dingtalk token refreshed", extra={"bot_id": self._config.id})
        return str(data["accessToken"]), float(data.get("expireIn", 7200))

    async def send_text(self, *, group_id: str, user_id: str, text: str) -> None:
        """A text message through the OpenAPI: to the group, or one-to-one to the user."""
        await self.send_message(group_id=group_id, user_id=user_id, key="sampleText", params={"content": text})

    async def send_markdown(self, *, group_id: str, user_id: str, title: str, text: str) -> None:
        """A Markdown message (msgKey sampleMarkdown, msgParam {title, text}: platform-protocols.md §F)."""
        params = {"title": title, "text": text}
        await self.send_message(group_id=group_id, user_id=user_id, key="sampleMarkdown", params=params)

    async def send_message(self, *, group_id: str, user_id: str, key: str, params: dict[str, str]) -> None:
        """One message of template `key` through the OpenAPI (msgParam is a JSON string): to the group, or one-to-one
        to the user."""
        param = json.dumps(params, ensure_ascii=False)
        body: dict[str, Any] = {"robotCode": self._config.robot, "msgKey": key, "msgParam": param}
        if group_id:
            await self.call("POST", "/v1.0/robot/groupMessages/send", {**body, "openConversationId": group_id})
        else:
            batch = {**body, "userIds": [user_id]}
            _check_delivered(await self.call("POST", "/v1.0/robot/oToMessages/batchSend", batch))

    async def download_url(self, code: str) -> str:
        """The temporary download link of a message's picture, voice or file (获取机器人消息中文件下载链接:
        POST /v1.0/robot/messageFiles/download {downloadCode, robotCode} → {downloadUrl}). The doc lists no error
        for an unknown or expired downloadCode (UNCONFIRMED): any refusal but an access denial is taken as one
        that will not pass ("expired": the user is asked to send it again)."""
        body = {"downloadCode": code, "robotCode": self._config.robot}
        try:
            data = await self.call("POST", "/v1.0/robot/messageFiles/download", body)
        except PermanentSendError as exc:
            refused = str(exc.code).startswith("Forbidden") or exc.code == TOKEN_REFUSED_CODE  # access, not the code
            reason = "refused" if refused else "expired"
            raise MediaError(reason, f"messageFiles/download: {exc}") from exc
        except SendError as exc:  # unreachable, 5xx, a rate limit: it may pass
            raise MediaError("unavailable", f"messageFiles/download: {exc}") from exc
        url = data.get("downloadUrl")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise MediaError("unavailable", "messageFiles/download answered no downloadUrl")
        return url

    # -- AI cards ----------------------------------------------------------------------------

    @staticmethod
    def new_track_id(*parts: str) -> str:
        return hashlib.sha256("|".join([*parts, uuid.uuid1().hex]).encode()).hexdigest()

    async def create_card(self, track_id: str, *, group_id: str) -> None:
        """Create the AI card; it shows nowhere until delivered (S13 card_replier: "两步骤：创建+投放")."""
        space = {"supportForward": True}
        body: dict[str, Any] = {
            "cardTemplateId": self._config.ai_card.template_id,
            "outTrackId": track_id,
            "cardData": {"cardParamMap": {"flowStatus": str(FLOW_PROCESSING), "msgContent": ""}},
            "callbackType": "STREAM",
            "imGroupOpenSpaceModel" if group_id else "imRobotOpenSpaceModel": space,
        }
        await self.call("POST", "/v1.0/card/instances", body)

    async def deliver_card(self, track_id: str, *, group_id: str, user_id: str) -> None:
        """Deliver the created card into the group, or into the user's chat with the robot."""
        deliver: dict[str, Any] = {"outTrackId": track_id, "userIdType": 1}
        if group_id:
            deliver["openSpaceId"] = f"dtv1.card//IM_GROUP.{group_id}"
            deliver["imGroupOpenDeliverModel"] = {"robotCode": self._config.robot}
        else:
            deliver["openSpaceId"] = f"dtv1.card//IM_ROBOT.{user_id}"
            deliver["imRobotOpenDeliverModel"] = {"spaceType": "IM_ROBOT"}
        await self.call("POST", "/v1.0/card/instances/deliver", deliver)

    async def set_card_status(self, track_id: str, flow_status: int, content: str | None = None) -> None:
        params: dict[str, str] = {"flowStatus": str(flow_status)}
        if content is not None:
            params["msgContent"] = content
        body = {"outTrackId": track_id, "cardData": {"cardParamMap": params}}
        await self.call("PUT", "/v1.0/card/instances", body)

    async def stream_card(self, track_id: str, content: str, *, final: bool = False) -> None:
        """Show the full text so far in the card."""
        body = {
            "outTrackId": track_id,
            "guid": uuid.uuid1().hex,
            "key": "msgContent",
            "content": content,
            "isFull": True,
            "isFinalize": final,
            "isError": False,
        }
        await self.call("PUT", "/v1.0/card/streaming", body)

    # -- transport ---------------------------------------------------------------------------

    async def call(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAPI call with the token; refetch the token once when DingTalk refuses it (a revoked or expired
        token, another replica's refresh): a second refusal is an error like any other."""
        token = await self.access_token()
        try:
            return await self._call(method, path, body, token=token)
        except _TokenRejected:
            pass
        try:
            return await self._call(method, path, body, token=await self.access_token(stale=token))
        except _TokenRejected as exc:  # a race with a refresh elsewhere may pass; the worker's retries are bounded
            raise RetryableSendError("DingTalk refused a fresh access token", code=TOKEN_REFUSED_CODE,
                                     not_sent=True) from exc

    async def _call(self, method: str, path: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        headers = {TOKEN_HEADER: token} if token else {}
        try:
            response = await self._http.request(method, f"{self._config.api_base}{path}", json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise RetryableSendError(f"DingTalk API unreachable: {type(exc).__name__}", code="network") from exc
        data = _json_body(response)
        if token and (response.status_code == 401 or data.get("code") == TOKEN_REFUSED_CODE):
            raise _TokenRejected
        if response.status_code == 429 or response.status_code >= 500:
            status = response.status_code
            raise RetryableSendError(f"DingTalk API answered HTTP {status}", code=status, not_sent=status == 429)
        if response.status_code != 200:
            code = str(data.get("code", response.status_code))
            if code in QPS_LIMIT_CODES:
                raise RetryableSendError("DingTalk API rate limit", code=code, retry_after=1.0, not_sent=True)
            raise PermanentSendError(f"DingTalk API {path}: {code} {data.get('message', '')}".strip(), code=code)
        if int(data.get("errcode", 0) or 0):
            raise error_for(int(data["errcode"]), str(data.get("errmsg", "")))
        return data


def _json_body(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object. An error page that is not JSON (a proxy's) is judged by its status alone; a 200
    that is not JSON leaves the outcome unknown, as a failure that may pass."""
    try:
        data = response.json() if response.content else {}
    except ValueError as exc:
        if response.status_code == 200:
            raise RetryableSendError("DingTalk API answered non-JSON", code="bad_json") from exc
        return {}
    return data if isinstance(data, dict) else {}


def _check_delivered(data: dict[str, Any]) -> None:
    """batchSend's 200 is not delivery: raise when the one recipient is in a list of those not delivered to."""
    if data.get("flowControlledStaffIdList"):
        raise Throttled("DingTalk flow-controlled the recipient (flowControlledStaffIdList)",
                        code="flowControlled", retry_after=THROTTLE_PROBE_S, not_sent=True)  # fmt: skip
    for name, why in UNDELIVERED_LISTS.items():
        if data.get(name):
            raise PermanentSendError(f"DingTalk did not deliver the message: the recipient is {why} ({name})",
                                     code=name)  # fmt: skip


class _TokenRejected(Exception):
    """The OpenAPI refused the cached token (400 InvalidAuthentication, or 401): it is no longer valid."""
