"""The platforms' web sign-in, for the simulator: WeCom's 企业微信Web登录 and DingTalk's 钉钉登录 (OAuth2), as
webchat/sso.py describes them (its docstring has the sources).

Each login page is a small HTML form standing in for the QR code: the person types the member id they sign in as
and presses 登录 (a member of the app's organisation), 以非成员身份登录 (someone outside it) or 取消/拒绝 (declined).
The page then redirects to the redirect URI as the platform does: WeCom with `code` and `state` (no code when
declined), DingTalk with `authCode` and `state` (`error` when declined; the value DingTalk sends is UNCONFIRMED).

Checked as the platforms check, never kinder:
- WeCom's login page takes only its documented parameters (login_type=CorpApp, appid = the corp, agentid = one of
  its self-built apps, redirect_uri, state, lang; anything else is refused: whether WeCom tolerates extras is
  UNCONFIRMED), and the redirect URI's domain (host:port) must be one of the app's 可信域名, which a test
  registers (`POST /__sim__/login/trust`); DingTalk's needs response_type=code, prompt=consent, scope openid (or
  "openid corpid"), a known client_id, and the exact redirect URI registered for it (DingTalk's 重定向URL; exact
  match is the harsher reading of "需要与注册应用时登记的域名保持一致").
- A code lives 5 minutes and is used up by the first attempt to exchange it, whatever that attempt's outcome
  (WeCom: "code只能使用一次，5分钟未被使用自动过期"; for DingTalk's authCode both are UNCONFIRMED, the harsher reading).
- WeCom auth/getuserinfo: the app's access token (40014 unknown, 42001 expired), then 40029 "invalid code" for
  an unknown, used or expired code, 50001 for a code exchanged with another app's token or a redirect domain the
  token's app does not trust, a member's `userid`, and a non-member's `openid` only (also for a member who left:
  `POST /__sim__/wecom/unknown-user`). Faults: endpoint "getuserinfo" in `POST /__sim__/wecom/faults`.
- DingTalk: userAccessToken checks clientId/clientSecret, grantType authorization_code and the authCode (issued
  for that clientId; refused with HTTP 400, the codes UNCONFIRMED); contact/users/me takes only a user token
  (HTTP 400 InvalidAuthentication otherwise); topapi/user/getbyunionid takes only an app token (errcode 40014
  otherwise), and answers 60121 for a unionId that is no staff member of the token's app's organisation (each app
  stands for its own organisation here) or one marked `invalid` (`POST /__sim__/dingtalk/staff`).
"""

from __future__ import annotations

import hashlib
import html
import re
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from simulator.dingtalk.state import TOKEN_REFUSED, DingTalkState
from simulator.wecom.state import WeComApiState

CODE_LIFETIME_S = 300.0
USER_TOKEN_LIFETIME_S = 7200.0
USERID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")  # WeCom's rule for a member id (创建成员)
WECOM_PARAMS = {"login_type", "appid", "agentid", "redirect_uri", "state", "lang"}
DINGTALK_PARAMS = {"redirect_uri", "response_type", "client_id", "scope", "state", "prompt", "org_type", "corpId",
                   "exclusiveLogin", "exclusiveCorpId"}  # fmt: skip


@dataclass
class IssuedCode:
    """A login code: whose app it was issued for, who signed in, where it was sent, and until when it holds."""

    app: str  # WeCom: the agentid; DingTalk: the client_id
    person: str  # WeCom: the userid, or "" for someone outside the corp; DingTalk: the unionId
    redirect: str  # WeCom: the redirect URI's host:port; DingTalk: the redirect URI
    expires_at: float = field(default_factory=lambda: time.time() + CODE_LIFETIME_S)


@dataclass
class LoginState:
    """What the simulated login services know: trusted redirects, codes, user tokens and who each unionId is."""

    wecom_trusted: dict[str, set[str]] = field(default_factory=dict)  # agentid -> trusted domains (host:port)
    dingtalk_redirects: dict[str, set[str]] = field(default_factory=dict)  # client_id -> registered redirect URIs
    codes: dict[str, IssuedCode] = field(default_factory=dict)
    user_tokens: dict[str, tuple[str, float]] = field(default_factory=dict)  # DingTalk user token -> unionId, expiry
    unions: dict[str, tuple[str, str]] = field(default_factory=dict)  # unionId -> (the org's client_id, staff id)
    issued: int = 0
    exchanged: int = 0  # codes that came back for an exchange (used up, whatever the outcome)
    refused: int = 0  # exchanges refused (bad, used or expired code, wrong app)

    def take(self, code: str) -> IssuedCode | None:
        """The code, used up now; None if unknown, used or expired."""
        issued = self.codes.pop(code, None)
        self.exchanged += issued is not None
        return issued if issued is not None and issued.expires_at > time.time() else None


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
                        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>", status)  # fmt: skip


def _error_page(message: str) -> HTMLResponse:
    return _page("登录失败 · Sign-in error", f"<p id='error'>{html.escape(message)}</p>", 400)


def _form(action: str, params: dict[str, str], who: str, buttons: list[tuple[str, str]], note: str = "") -> str:
    hidden = "".join(f"<input type='hidden' name='{html.escape(k)}' value='{html.escape(v)}'>"
                     for k, v in params.items())  # fmt: skip
    pressed = "".join(f"<button type='submit' name='action' value='{v}' id='{v}'>{html.escape(t)}</button> "
                      for v, t in buttons)  # fmt: skip
    return (f"<p>{html.escape(who)}</p>{note}<form method='post' action='{html.escape(action)}'>{hidden}"
            f"<label>userid <input name='userid' id='userid' autocomplete='off'></label> {pressed}</form>")  # fmt: skip


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + [(k, v) for k, v in params.items() if v]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def _form_fields(request: Request) -> dict[str, str]:
    return dict(parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True))


def _union_id(client_id: str, userid: str) -> str:
    return "union" + hashlib.sha256(f"{client_id}\0{userid}".encode()).hexdigest()[:24]


def web_login_router(login: LoginState, wecom: WeComApiState, dingtalk: DingTalkState) -> APIRouter:
    router = APIRouter()

    # -- WeCom -------------------------------------------------------------------------------------------------

    def wecom_problem(params: dict[str, str]) -> str:
        if extra := sorted(set(params) - WECOM_PARAMS):
            return f"unknown parameter(s): {', '.join(extra)}"
        if params.get("login_type") != "CorpApp":
            return "login_type must be CorpApp (ServiceApp is not played)"
        agent = params.get("agentid", "")
        owner = wecom.agents.get(int(agent)) if agent.isdigit() else None
        if owner is None or owner[0] != params.get("appid"):
            return "appid and agentid do not name a self-built app of that corp"
        redirect = urlsplit(params.get("redirect_uri", ""))
        if redirect.scheme not in ("http", "https") or redirect.netloc not in login.wecom_trusted.get(agent, set()):
            return "redirect_uri需使用应用可信域名 (the redirect URI's domain is not a trusted domain of the app)"
        return ""

    @router.get("/wwlogin/sso/login")
    async def wecom_login_page(request: Request) -> Response:
        params = dict(request.query_params)
        if problem := wecom_problem(params):
            return _error_page(problem)
        buttons = [("member", "登录 Sign in"), ("outsider", "以非成员身份登录 Not a member"), ("cancel", "取消 Cancel")]
        who = f"企业微信 · sign in to app {params['agentid']} of {params['appid']}"
        return _page("企业微信登录", _form(request.url.path, params, who, buttons))

    @router.post("/wwlogin/sso/login")
    async def wecom_login_submit(request: Request) -> Response:
        fields = await _form_fields(request)
        action, userid = fields.pop("action", ""), fields.pop("userid", "").strip()
        if problem := wecom_problem(fields):
            return _error_page(problem)
        state = fields.get("state", "")
        if action == "cancel":  # "用户禁止授权则无code参数"
            return RedirectResponse(_with_query(fields["redirect_uri"], state=state), 302)
        if action == "member" and not USERID.match(userid):
            return _error_page("userid: 1-64 letters, digits or _-@. starting with a letter or digit")
        person = userid if action == "member" else ""
        code = secrets.token_urlsafe(32)
        login.codes[code] = IssuedCode(fields["agentid"], person, urlsplit(fields["redirect_uri"]).netloc)
        login.issued += 1
        return RedirectResponse(_with_query(fields["redirect_uri"], code=code, state=state), 302)

    @router.get("/cgi-bin/auth/getuserinfo")
    async def getuserinfo(access_token: str = "", code: str = "") -> JSONResponse:
        fault = wecom.faults.take("getuserinfo")
        if fault and fault.errcode is not None:
            return JSONResponse({"errcode": fault.errcode, "errmsg": fault.errmsg or "simulated"})
        expires_at = wecom.tokens.get(access_token)
        if expires_at is None:
            return JSONResponse({"errcode": 40014, "errmsg": "invalid access_token"})
        if expires_at < time.time():
            return JSONResponse({"errcode": 42001, "errmsg": "access_token expired"})
        issued = login.take(code) if code else None
        if issued is None or not issued.app.isdigit():
            login.refused += 1
            return JSONResponse({"errcode": 40029, "errmsg": "invalid code"})
        owner = wecom.agents.get(int(issued.app))
        trusted = issued.redirect in login.wecom_trusted.get(issued.app, set())  # still a 可信域名 of the app
        if owner is None or wecom.token_apps.get(access_token) != owner or not trusted:
            login.refused += 1
            return JSONResponse({"errcode": 50001, "errmsg": "redirect_uri unauthorized"})
        if not issued.person or issued.person in wecom.unknown_users:
            openid = "o" + hashlib.sha256(f"{owner[0]}\0{issued.person or code}".encode()).hexdigest()[:27]
            return JSONResponse({"errcode": 0, "errmsg": "ok", "openid": openid})
        return JSONResponse({"errcode": 0, "errmsg": "ok", "userid": issued.person})

    # -- DingTalk ----------------------------------------------------------------------------------------------

    def client_ids() -> set[str]:
        return {key for key, _ in dingtalk.apps}

    def dingtalk_problem(params: dict[str, str]) -> str:
        if extra := sorted(set(params) - DINGTALK_PARAMS):
            return f"unknown parameter(s): {', '.join(extra)}"
        if params.get("response_type") != "code" or params.get("prompt") != "consent":
            return "response_type must be code and prompt consent"
        scope = params.get("scope", "").split()
        if "openid" not in scope or not set(scope) <= {"openid", "corpid"}:
            return "scope must be openid (or openid corpid)"
        client = params.get("client_id", "")
        if client not in client_ids():
            return "no app with this client_id"
        if params.get("redirect_uri", "") not in login.dingtalk_redirects.get(client, set()):
            return "redirect_uri is not a 重定向URL registered for the app"
        return ""

    @router.get("/oauth2/auth")
    async def dingtalk_login_page(request: Request) -> Response:
        params = dict(request.query_params)
        if problem := dingtalk_problem(params):
            return _error_page(problem)
        buttons = [("member", "同意 Authorize"), ("outsider", "以非成员身份登录 Not a member"), ("deny", "拒绝 Deny")]
        return _page("钉钉登录", _form(request.url.path, params, f"钉钉 · sign in to {params['client_id']}", buttons))

    @router.post("/oauth2/auth")
    async def dingtalk_login_submit(request: Request) -> Response:
        fields = await _form_fields(request)
        action, userid = fields.pop("action", ""), fields.pop("userid", "").strip()
        if problem := dingtalk_problem(fields):
            return _error_page(problem)
        state, client = fields.get("state", ""), fields["client_id"]
        if action == "deny":
            return RedirectResponse(_with_query(fields["redirect_uri"], error="access_denied", state=state), 302)
        if action == "member":
            if not USERID.match(userid):
                return _error_page("userid: 1-64 letters, digits or _-@. starting with a letter or digit")
            union = _union_id(client, userid)
            login.unions[union] = (client, userid)
        else:
            union = "union" + secrets.token_hex(12)  # a DingTalk user, staff of no organisation here
            login.unions[union] = ("", "")
        code = secrets.token_hex(16)
        login.codes[code] = IssuedCode(client, union, fields["redirect_uri"])
        login.issued += 1
        return RedirectResponse(_with_query(fields["redirect_uri"], authCode=code, state=state), 302)

    @router.post("/v1.0/oauth2/userAccessToken")
    async def user_access_token(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body, dict) or (body.get("clientId"), body.get("clientSecret")) not in dingtalk.apps:
            return JSONResponse({"code": "InvalidAuthentication", "message": "bad clientId/clientSecret"}, 400)
        if body.get("grantType") != "authorization_code":
            return JSONResponse({"code": "invalidParameter.grantType", "message": "grantType"}, 400)
        issued = login.take(str(body.get("code") or ""))
        if issued is None or issued.app != body["clientId"]:
            login.refused += 1
            return JSONResponse({"code": "invalidParameter.authCode", "message": "不合法的临时授权码"}, 400)
        token = secrets.token_hex(16)
        login.user_tokens[token] = (issued.person, time.time() + USER_TOKEN_LIFETIME_S)
        return JSONResponse({"accessToken": token, "refreshToken": secrets.token_hex(16),
                             "expireIn": int(USER_TOKEN_LIFETIME_S)})  # fmt: skip

    @router.get("/v1.0/contact/users/me")
    async def users_me(request: Request) -> JSONResponse:
        union, expires_at = login.user_tokens.get(request.headers.get("x-acs-dingtalk-access-token", ""), ("", 0.0))
        if not union or expires_at < time.time():
            return JSONResponse(TOKEN_REFUSED, 400)
        staff = login.unions.get(union, ("", ""))[1]
        return JSONResponse({"nick": staff or "访客", "unionId": union, "openId": "o" + union[5:], "avatarUrl": "",
                             "stateCode": "86"})  # fmt: skip

    @router.post("/topapi/user/getbyunionid")
    async def getbyunionid(request: Request, access_token: str = "") -> JSONResponse:
        if dingtalk.tokens.get(access_token, 0.0) < time.time():
            return JSONResponse({"errcode": 40014, "errmsg": "不合法的access_token"})
        body = await request.json()
        union = body.get("unionid") if isinstance(body, dict) else None
        if not isinstance(union, str) or not union:
            return JSONResponse({"errcode": 40035, "errmsg": "不合法的参数"})
        org, staff = login.unions.get(union, ("", ""))
        if not staff or org != dingtalk.token_apps.get(access_token) or dingtalk.staff_status.get(staff) == "invalid":
            return JSONResponse({"errcode": 60121, "errmsg": "找不到该用户"})
        return JSONResponse({"errcode": 0, "errmsg": "ok", "result": {"contact_type": 0, "userid": staff},
                             "request_id": secrets.token_hex(6)})  # fmt: skip

    # -- controls ----------------------------------------------------------------------------------------------

    @router.post("/__sim__/login/trust")
    async def trust(request: Request) -> dict[str, object]:
        """Register a redirect URI as the admin console would: `agentid` (WeCom: its domain becomes a 可信域名 of
        the app) or `client_id` (DingTalk: the URI becomes one of the app's 重定向URL)."""
        body = await request.json()
        uri = str(body.get("redirect_uri", ""))
        if "agentid" in body:
            login.wecom_trusted.setdefault(str(body["agentid"]), set()).add(urlsplit(uri).netloc)
        else:
            login.dingtalk_redirects.setdefault(str(body["client_id"]), set()).add(uri)
        return {"wecom": {k: sorted(v) for k, v in login.wecom_trusted.items()},
                "dingtalk": {k: sorted(v) for k, v in login.dingtalk_redirects.items()}}  # fmt: skip

    @router.get("/__sim__/login/stats")
    async def stats() -> dict[str, int]:
        return {"issued": login.issued, "exchanged": login.exchanged, "refused": login.refused,
                "outstanding": len(login.codes)}  # fmt: skip

    return router
