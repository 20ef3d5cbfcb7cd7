"""Web sign-in through the company's own identities: a login `code` from WeCom or DingTalk turned into the member
it names, with the credentials of one of the configured bots. No Chainlit here (webchat/oauth.py is the glue),
so the configuration check can run wherever the configuration is loaded.

WeCom (企业微信Web登录, a self-built app, login_type=CorpApp):
  authorize  {login_base}/wwlogin/sso/login?login_type=CorpApp&appid=<corp_id>&agentid=<agent_id>
             &redirect_uri=<url-encoded>&state=<state>         → redirect_uri?code=CODE&state=STATE
             (developer.work.weixin.qq.com/document/path/98171 "构造企业微信登录链接"; the redirect_uri's domain
             must be one of the app's 可信域名; "用户禁止授权则无code参数",
             blog.csdn.net/baidu_36095053/article/details/132224370)
  identity   GET {api_base}/cgi-bin/auth/getuserinfo?access_token=<the app's token, gettoken>&code=CODE
             → {"errcode":0,"userid":...} for a member, {"errcode":0,"openid":...,"external_userid":...} for anyone
             else; "code只能使用一次，5分钟未被使用自动过期"; a redirect domain not trusted by the token's app: 50001;
             a bad, used or expired code: 40029 (developer.work.weixin.qq.com/document/path/98177 获取用户登录身份;
             40029's causes: the WeCom team's answer, developers.weixin.qq.com/community/develop/doc/
             000e629c11ca80f1b03c3ce1351000).
  userid     1–64 bytes of letters, digits and _-@. starting with a letter or digit (创建成员,
             developer.work.weixin.qq.com/document/path/90331). 上下游/互联企业 ids (CorpId/userid) are refused here.

DingTalk (钉钉登录, an internal app, open-dingtalk/developerpedia docs/develop/permission/token/browser/
get_user_app_token_browser.md, which cites open.dingtalk.com/document/isvapp/obtain-identity-credentials):
  authorize  {login_base}/oauth2/auth?client_id=<app_key>&redirect_uri=...&state=...&response_type=code
             &prompt=consent&scope=openid     → redirect_uri?authCode=CODE&state=STATE, or ?error=...&state=...
             (the code comes back as `authCode`, not `code`).
  user token POST {api_base}/v1.0/oauth2/userAccessToken {clientId, clientSecret, code, grantType:
             "authorization_code"} → {accessToken, refreshToken, expireIn, corpId?} (help.dingtalk.io/zh/open/
             development/obtain-user-token; field names as in aliyun/dingtalk-sdk oauth2_1_0 GetUserToken).
  unionId    GET {api_base}/v1.0/contact/users/me, header x-acs-dingtalk-access-token: <user token> → {nick, unionId,
             openId, ...} (aliyun/dingtalk-sdk contact_1_0 GetUserResponseBody; "me" for the signed-in user).
  staff id   POST {oapi_base}/topapi/user/getbyunionid?access_token=<the app's token> {"unionid": ...} →
             {"errcode":0,"result":{"contact_type":0,"userid":...}} (help.dingtalk.io/open/development/
             query-a-user-by-the-union-id: the app's access_token, never the user's); 60121: not in the
             organisation (casdoor/casdoor idp/dingtalk.go). contact_type 1 (an external contact) is refused.
  The app's token from /v1.0/oauth2/accessToken (bots/dingtalk/client.py) serves oapi too (casdoor does the same).

UNCONFIRMED, and read the harsher way: the errcodes and bodies DingTalk gives userAccessToken for a bad, used or
expired authCode (any refusal is taken as "code not valid"); that an authCode is single-use and lives 5 minutes
(community answers say single-use, developer.aliyun.com/ask/588527); the characters a DingTalk staff userid may
hold (the WeCom rule is applied); whether an attempt that fails for another reason (another app's token) uses the
code up (taken as used).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bots.base import RetryableSendError, SendError, TokenStore
from bots.dingtalk.client import TOKEN_HEADER, DingTalkApiClient
from bots.dingtalk.config import DingTalkBotConfig
from bots.http import request_json
from bots.web.config import WebBotConfig
from bots.wecom.client import WeComApiClient
from bots.wecom.config import WeComAppConfig
from bots.wecom.exceptions import TOKEN_INVALID_CODES

log = logging.getLogger(__name__)

LOGINS = {"wecom": "WeCom", "dingtalk": "DingTalk"}
USERID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")  # fullmatch
WECOM_BAD_CODE = 40029  # "invalid code": wrong, already used, or older than 5 minutes
WECOM_UNTRUSTED_REDIRECT = 50001  # the redirect domain is not one of the token's app's 可信域名
DINGTALK_NOT_IN_ORG = 60121
DINGTALK_TOKEN_CODES = frozenset({40014, 42001, 88})  # 不合法的/过期的 access_token (oapi)


@dataclass(frozen=True)
class Member:
    """Who signed in: `login` (wecom, dingtalk), the organisation's id for them, and the organisation."""

    login: str
    userid: str
    tenant: str


class LoginRefused(Exception):
    """A sign-in the page refuses: `reason` is shown to the person, `detail` (no secret in it) is logged."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail or reason


def refused_code(login: str, detail: str) -> LoginRefused:
    return LoginRefused(
        f"This {LOGINS[login]} sign-in could not be completed: its code is not valid (already used, or expired). "
        "Please sign in again.",
        detail,
    )


def not_a_member(login: str, detail: str) -> LoginRefused:
    return LoginRefused(
        f"Your {LOGINS[login]} account is not a member of this company's organisation, so it cannot sign in here.",
        detail,
    )


def platform_failure(login: str, exc: SendError) -> LoginRefused:
    if isinstance(exc, RetryableSendError):
        return LoginRefused(f"{LOGINS[login]} cannot be reached right now; please try again in a minute.", str(exc))
    return LoginRefused(
        f"Sign-in through {LOGINS[login]} is not set up correctly on this server ({exc.code or 'error'}); "
        "please tell the administrator.",
        str(exc),
    )


def checked_userid(login: str, userid: object) -> str:
    if not isinstance(userid, str) or not USERID.fullmatch(userid):
        raise LoginRefused(
            f"Your {LOGINS[login]} account id cannot be used on this page; please tell the administrator.",
            f"{login} returned a member id botgw does not accept ({len(str(userid))} characters)",
        )
    return userid


class MemoryTokenStore:
    """The page's own cache of the apps' access tokens (a `TokenStore`). The page does not reach Redis (in
    Kubernetes only the gateway, workers and the Stream connection may), and a second gettoken while a token is
    valid returns the same token on both platforms ("有效期内重复获取返回相同结果"), so a cache per page process
    costs one call per app every two hours."""

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[str, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, name: str) -> str | None:
        token, expires_at = self._tokens.get(name, ("", 0.0))
        return token if token and expires_at > time.monotonic() else None

    async def put(self, name: str, token: str, ttl_s: float) -> None:
        self._tokens[name] = (token, time.monotonic() + ttl_s)

    async def invalidate(self, name: str, token: str) -> None:
        if self._tokens.get(name, ("", 0.0))[0] == token:
            self._tokens.pop(name, None)

    def refresh_lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


# -- configuration ------------------------------------------------------------------------------------------------


def web_login_problems(web: WebBotConfig, bots: Sequence[object]) -> list[str]:
    """What is wrong with a web bot's `web_login`, one line each (empty: nothing). gateway/config.py refuses the
    same when the configuration loads; the page checks again before it offers a login."""
    by_id = {getattr(bot, "id", ""): bot for bot in bots}
    problems = []
    for login, wanted, platform in (("wecom", WeComAppConfig, "wecom"), ("dingtalk", DingTalkBotConfig, "dingtalk")):
        through = getattr(web.web_login, login)
        if through is None:
            continue
        bot = by_id.get(through.bot)
        where = f"bots.{web.id}.web_login.{login}.bot"
        if bot is None:
            problems.append(f"{where}: no bot {through.bot!r} in the configuration")
        elif not isinstance(bot, wanted):
            kind = getattr(bot, "platform", type(bot).__name__)
            hint = " (a WeCom AI bot has no app secret: name the self-built app)" if kind == "wecom-ai" else ""
            problems.append(f"{where}: {through.bot!r} is a {kind} bot, sign-in needs a {platform} bot{hint}")
        elif isinstance(bot, DingTalkBotConfig) and not bot.corp_id:
            problems.append(f"{where}: DingTalk bot {through.bot!r} has no corp_id (a staff id is qualified by it)")
    return problems


# -- WeCom ---------------------------------------------------------------------------------------------------------


async def _with_app_token(
    platform: str, client: Any, stale_codes: Collection[int], call: Callable[[str], Awaitable[dict]]
) -> tuple[dict, int]:
    """(answer, errcode) of a call with the app's access token, the token refetched once when the platform says
    it went stale; unreachable or failing: LoginRefused (try again)."""
    try:
        token = await client.access_token()
        data = await call(token)
        errcode = int(data.get("errcode", 0) or 0)
        if errcode in stale_codes:
            data = await call(await client.access_token(stale=token))
            errcode = int(data.get("errcode", 0) or 0)
    except SendError as exc:
        raise platform_failure(platform, exc) from None
    return data, errcode


async def wecom_member(bot: WeComAppConfig, http: httpx.AsyncClient, tokens: TokenStore, code: str) -> Member:
    """The WeCom member a login code names (auth/getuserinfo with the app's token; a stale token refetched once)."""
    async def getuserinfo(token: str) -> dict:
        return await request_json(http, "GET", f"{bot.api_base}/cgi-bin/auth/getuserinfo", "WeCom API",
                                  params={"access_token": token, "code": code})  # fmt: skip

    data, errcode = await _with_app_token("wecom", WeComApiClient(bot, http, tokens), TOKEN_INVALID_CODES, getuserinfo)
    detail = f"WeCom auth/getuserinfo errcode {errcode}: {str(data.get('errmsg', ''))[:200]}"
    if errcode == WECOM_BAD_CODE:
        raise refused_code("wecom", detail)
    if errcode == WECOM_UNTRUSTED_REDIRECT:
        raise LoginRefused(
            "Sign-in through WeCom is not set up correctly on this server (WeCom error 50001: this page's address "
            "is not a trusted domain of the app); please tell the administrator.",
            detail,
        )
    if errcode:
        raise LoginRefused(f"WeCom refused the sign-in (error {errcode}); please try again or tell the administrator.",
                           detail)  # fmt: skip
    if not data.get("userid"):
        raise not_a_member("wecom", "WeCom auth/getuserinfo: no userid (a non-member's openid)")
    return Member("wecom", checked_userid("wecom", data["userid"]), bot.corp_id)


# -- DingTalk ------------------------------------------------------------------------------------------------------


async def _dingtalk_json(http: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> tuple[int, dict]:
    """(HTTP status, JSON object) of a DingTalk call; unreachable or 5xx/429: LoginRefused (try again)."""
    try:
        response = await http.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise platform_failure("dingtalk", RetryableSendError(f"DingTalk unreachable: {type(exc).__name__}")) from None
    if response.status_code >= 500 or response.status_code == 429:
        raise platform_failure("dingtalk", RetryableSendError(f"DingTalk answered HTTP {response.status_code}"))
    try:
        data = response.json() if response.content else {}
    except ValueError:
        data = {}
    return response.status_code, data if isinstance(data, dict) else {}


def _dingtalk_said(path: str, status: int, data: dict) -> str:
    return f"DingTalk {path}: HTTP {status} {str(data.get('code', ''))[:80]} {str(data.get('message', ''))[:200]}"


async def dingtalk_member(bot: DingTalkBotConfig, http: httpx.AsyncClient, tokens: TokenStore, code: str) -> Member:
    """The staff member an authCode names: authCode → user token → unionId → (the app's token) staff userid."""
    body = {"clientId": bot.app_key, "clientSecret": bot.app_secret.get_secret_value(), "code": code,
            "grantType": "authorization_code"}  # fmt: skip
    status, data = await _dingtalk_json(http, "POST", f"{bot.api_base}/v1.0/oauth2/userAccessToken", json=body)
    user_token = data.get("accessToken") if status == 200 else None
    if not isinstance(user_token, str) or not user_token:
        raise refused_code("dingtalk", _dingtalk_said("userAccessToken", status, data))
    status, data = await _dingtalk_json(http, "GET", f"{bot.api_base}/v1.0/contact/users/me",
                                        headers={TOKEN_HEADER: user_token})  # fmt: skip
    union_id = data.get("unionId") if status == 200 else None
    if not isinstance(union_id, str) or not union_id:
        raise LoginRefused("DingTalk did not say who signed in; please sign in again.",
                           _dingtalk_said("contact/users/me", status, data))  # fmt: skip
    async def getbyunionid(token: str) -> dict:
        return await request_json(http, "POST", f"{bot.oapi_base}/topapi/user/getbyunionid", "DingTalk API",
                                  params={"access_token": token}, json={"unionid": union_id})  # fmt: skip

    client = DingTalkApiClient(bot, http, tokens)
    data, errcode = await _with_app_token("dingtalk", client, DINGTALK_TOKEN_CODES, getbyunionid)
    detail = f"DingTalk getbyunionid errcode {errcode}: {str(data.get('errmsg', ''))[:200]}"
    if errcode == DINGTALK_NOT_IN_ORG:
        raise not_a_member("dingtalk", detail)
    if errcode:
        raise LoginRefused(f"DingTalk refused the sign-in (error {errcode}); please tell the administrator.", detail)
    result = data.get("result") if isinstance(data.get("result"), dict) else {}
    if int(result.get("contact_type", 0) or 0) != 0:
        raise not_a_member("dingtalk", "DingTalk getbyunionid: an external contact (contact_type 1), not staff")
    return Member("dingtalk", checked_userid("dingtalk", result.get("userid")), bot.corp_id)
