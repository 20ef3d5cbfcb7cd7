"""WeCom and DingTalk sign-in on the web page, as Chainlit OAuth providers (webchat/sso.py does the platform calls).

`install(web_bot)` (webchat/app.py calls it at import, before the server starts) registers a provider for each
login the bot's `web_login` names, the `@cl.oauth_callback`, and `CompanyLoginGuard` in front of Chainlit's routes.
Chainlit then shows "Continue with Wecom/Dingtalk" on its login page, sends the browser to the platform with a
random `state` it also keeps in the `oauth_state` cookie, and on the way back calls the provider with the code.
The redirect URI is `<page>/auth/oauth/<wecom|dingtalk>/callback`, from the request or from CHAINLIT_URL (set it
to the page's public address behind a proxy): WeCom needs that domain among the app's 可信域名, DingTalk needs
the URL among the app's 重定向URL.

The guard, not Chainlit, decides the refusals, so that each gets a page saying why (Chainlit answers every failure
with the same "Sign in failed" and logs a traceback):
- the `state` must equal the `oauth_state` cookie (the CSRF check; Chainlit repeats it), and a refused callback
  clears the cookie, so that a state serves one attempt;
- a code is tried once: a code this process has seen is refused before the platform is asked (the platforms also
  refuse a used code: WeCom 40029);
- no code (the person declined: WeCom sends none, DingTalk sends `error`), a code the platform refuses, a person
  outside the organisation, a platform error: a 403 page with the reason and a link back to the sign-in page.
- the calls that reach the platform are limited per client network (webchat/call_budget.py: only those that sign
  nobody in are counted, and a burst takes turns): past it a 429 page.
DingTalk sends the code as `authCode`: the guard hands it to Chainlit as `code`. For WeCom it drops the
`client_id` Chainlit adds to the authorize URL (WeCom's documented parameters do not include it; whether WeCom
tolerates it is UNCONFIRMED). Nothing secret is logged: no code, token or app secret, only the platform's errcode
and message and, on success, who signed in.

The person signed in is `cl.User(identifier="wecom:<userid>", metadata={"login": "wecom", "name": <userid>})`
(likewise dingtalk); app.py posts `login` and `name` to the gateway, which makes them the WeCom member
`wecom:<corp_id>:<userid>` (the DingTalk staff member `dingtalk:<corp_id>:<staffId>`).
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import chainlit as cl
import httpx
from chainlit import oauth_providers
from chainlit.oauth_providers import OAuthProvider
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bots.dingtalk.config import DingTalkBotConfig
from bots.web.config import WebBotConfig
from bots.wecom.config import WeComAppConfig
from webchat.call_budget import Busy, CallBudget, OverBudget
from webchat.sso import (
    LOGINS,
    LoginRefused,
    Member,
    MemoryTokenStore,
    dingtalk_member,
    refused_code,
    web_login_problems,
    wecom_member,
)

log = logging.getLogger("botgw.web.oauth")

STATE_COOKIE = "oauth_state"  # chainlit.auth.cookie: the state Chainlit set when it sent the browser away
MAX_CODE_BYTES = 512  # WeCom: "code...最大为512字节"
SEEN_CODES_S = 600.0  # both platforms' codes live 5 minutes: remembered twice as long
SEEN_CODES_MAX = 10_000  # a hard cap: past it (after the expired are dropped) the oldest half goes
TOO_MANY = "Too many failed sign-ins from your network in the last minute. Please wait a minute and try again."
BUSY = "Many people on your network are signing in at this moment. Please sign in again in a few seconds."
BUSY_RETRY_AFTER_S = 5  # a full waiting room empties in about this long: 68 calls, 4 at a time, a round trip each


@dataclass
class Attempt:
    """One callback request: what the provider found out, for the guard to answer with."""

    login: str
    refusal: LoginRefused | None = None
    member: Member | None = None


ATTEMPT: ContextVar[Attempt | None] = ContextVar("botgw_web_login", default=None)


@dataclass
class _Runtime:
    """What the providers share in the page process: one HTTP client (made in the running loop) and the tokens."""

    tokens: MemoryTokenStore = field(default_factory=MemoryTokenStore)
    http: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self.http is None:
            self.http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0), follow_redirects=False)
        return self.http


RUNTIME = _Runtime()


class CompanyLogin(OAuthProvider):
    """A Chainlit provider over one configured bot: `get_token` does the whole exchange (code → member), never
    raises (a refusal is left in the request's `Attempt`), and hands Chainlit a one-time key for the member."""

    env: list[str] = []  # noqa: RUF012 - Chainlit's class attribute; configured from botgw's config, not the env

    def __init__(self, login: str, resolve: Callable[[str], Awaitable[Member]]) -> None:
        self.id = login
        self._resolve = resolve
        self._members: dict[str, Member] = {}
        self.client_secret = ""  # never sent by Chainlit for these providers; the bots' secrets stay in sso.py

    def is_configured(self) -> bool:
        return True

    async def get_token(self, code: str, url: str) -> str:
        attempt = ATTEMPT.get()
        try:
            member = await self._resolve(code)
        except LoginRefused as exc:
            log.warning("web sign-in through %s refused: %s", self.id, exc.detail)
            if attempt is not None:
                attempt.refusal = exc
            return ""
        except Exception as exc:  # anything unforeseen is a refusal too, never a traceback on the page
            log.error("web sign-in through %s failed: %s", self.id, type(exc).__name__)
            if attempt is not None:
                attempt.refusal = LoginRefused(f"Sign-in through {LOGINS[self.id]} failed; please try again.")
            return ""
        key = secrets.token_urlsafe(24)
        self._members[key] = member
        if attempt is not None:
            attempt.member = member
        return key

    async def get_user_info(self, token: str) -> tuple[dict[str, str], cl.User]:
        member = self._members.pop(token, None)
        if member is None:
            return {}, cl.User(identifier="", metadata={})
        user = cl.User(identifier=f"{member.login}:{member.userid}", display_name=member.userid,
                       metadata={"login": member.login, "name": member.userid})  # fmt: skip
        return {"login": member.login, "userid": member.userid}, user


def wecom_provider(bot: WeComAppConfig) -> CompanyLogin:
    async def resolve(code: str) -> Member:
        return await wecom_member(bot, RUNTIME.client(), RUNTIME.tokens, code)

    provider = CompanyLogin("wecom", resolve)
    provider.client_id = bot.corp_id  # Chainlit adds client_id to the authorize URL; the guard drops it again
    provider.authorize_url = f"{bot.login_base}/wwlogin/sso/login"
    provider.authorize_params = {"login_type": "CorpApp", "appid": bot.corp_id, "agentid": str(bot.agent_id)}
    return provider


def dingtalk_provider(bot: DingTalkBotConfig) -> CompanyLogin:
    async def resolve(code: str) -> Member:
        return await dingtalk_member(bot, RUNTIME.client(), RUNTIME.tokens, code)

    provider = CompanyLogin("dingtalk", resolve)
    provider.client_id = bot.app_key
    provider.authorize_url = f"{bot.login_base}/oauth2/auth"
    provider.authorize_params = {"response_type": "code", "scope": "openid", "prompt": "consent"}
    return provider


# -- the guard -----------------------------------------------------------------------------------------------------

REFUSAL_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign-in refused · 登录未完成</title>
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;padding:0 1rem;line-height:1.5}}</style>
</head><body>
<h1>Sign-in refused · 登录未完成</h1>
<p id="reason">{reason}</p>
<p><a id="back" href="{login}">Back to the sign-in page · 返回登录页</a></p>
</body></html>
"""


class CompanyLoginGuard:
    """ASGI middleware in front of Chainlit's /auth/oauth/<login> routes (see the module's docstring)."""

    def __init__(self, app: ASGIApp, logins: tuple[str, ...], root_path: str = "") -> None:
        self.app = app
        self.logins = logins
        self.root_path = root_path.rstrip("/")
        self._seen: dict[str, float] = {}
        self._budget = CallBudget()  # the callbacks that reach the platform, per client network

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "GET":
            path = scope.get("path", "")
            for login in self.logins:
                start = f"{self.root_path}/auth/oauth/{login}"
                if path == start and login == "wecom":
                    return await self.app(scope, receive, _without_client_id(send))
                if path == f"{start}/callback":
                    return await self._callback(login, scope, receive, send)
        return await self.app(scope, receive, send)

    async def _callback(self, login: str, scope: Scope, receive: Receive, send: Send) -> None:
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        if login == "dingtalk" and "authCode" in query and not query.get("code"):
            query["code"] = query.pop("authCode")  # DingTalk's name for it
        code, state = query.get("code", ""), query.get("state", "")
        name = LOGINS[login]
        if query.get("error") or not code:
            log.info("web sign-in through %s: no code (declined or cancelled)", login)
            return await refuse(send, f"{name} did not sign you in (the sign-in was declined or cancelled).",
                                self.root_path)  # fmt: skip
        if not state or not hmac.compare_digest(state.encode(), _state_cookie(scope).encode()):
            log.warning("web sign-in through %s refused: the state does not match this browser's", login)
            return await refuse(send, "This sign-in was not started from this browser, or it took too long. "
                                "Please sign in again.", self.root_path)  # fmt: skip
        if len(code.encode()) > MAX_CODE_BYTES or self._seen_before(login, code):
            log.warning("web sign-in through %s refused: a code used before (or too long)", login)
            return await refuse(send, refused_code(login, "").reason, self.root_path)
        address = (scope.get("client") or ("unknown", 0))[0]  # the page's guard put the real client there
        try:
            async with self._budget.turn(client_network(str(address))) as turn:
                attempt = Attempt(login)
                inner = {**scope, "query_string": urlencode(query).encode()}
                reset = ATTEMPT.set(attempt)
                try:
                    await self.app(inner, receive, _answering(attempt, send, self.root_path))
                finally:
                    ATTEMPT.reset(reset)
                    if attempt.member is None:  # signed nobody in: the kind of call a forged code makes
                        turn.failed()
        except Busy:  # a crowd of good sign-ins can fill the waiting room too: not their failure, so not a minute
            log.warning("web sign-in through %s refused: too many sign-ins from one network at once", login)
            return await refuse(send, BUSY, self.root_path, status=429, retry_after_s=BUSY_RETRY_AFTER_S)
        except OverBudget:  # raised only on entering the turn, before anything reached the platform or the client
            log.warning("web sign-in through %s refused: too many failed sign-ins from one network", login)
            return await refuse(send, TOO_MANY, self.root_path, status=429)

    def _seen_before(self, login: str, code: str) -> bool:
        now = time.monotonic()
        if len(self._seen) > SEEN_CODES_MAX:
            self._seen = {key: at for key, at in self._seen.items() if now - at < SEEN_CODES_S}
            if len(self._seen) > SEEN_CODES_MAX // 2:  # a flood of fresh codes: the platform refuses reuse itself
                self._seen = dict(list(self._seen.items())[-(SEEN_CODES_MAX // 2) :])
        key = hashlib.sha256(f"{login}\0{code}".encode()).hexdigest()  # the code itself is not kept
        seen = key in self._seen and now - self._seen[key] < SEEN_CODES_S
        self._seen[key] = now
        return seen


def client_network(address: str) -> str:
    """What the per-address limit counts: an IPv4 address, or an IPv6 address's /64 (one subscriber holds a whole
    /64, so counting single IPv6 addresses would give one attacker as many budgets as it likes)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:128]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _state_cookie(scope: Scope) -> str:
    cookies = SimpleCookie()
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            try:
                cookies.load(value.decode("latin-1"))
            except Exception:  # a malformed Cookie header holds no state
                return ""
    morsel = cookies.get(STATE_COOKIE)
    return morsel.value if morsel else ""


def _answering(attempt: Attempt, send: Send, root_path: str) -> Send:
    """Chainlit's answer to the callback, unless the provider refused: then the refusal page instead."""
    replaced = False

    async def wrapped(message: Message) -> None:
        nonlocal replaced
        if message["type"] == "http.response.start" and attempt.refusal is not None:
            replaced = True
            await refuse(send, attempt.refusal.reason, root_path)
            return
        if replaced:
            return  # Chainlit's own (redirect) body, replaced
        if message["type"] == "http.response.start" and attempt.member is not None:
            member = attempt.member
            log.info("web sign-in through %s: %s:%s:%s", member.login, member.login, member.tenant, member.userid)
        await send(message)

    return wrapped


def _without_client_id(send: Send) -> Send:
    """The redirect to WeCom's login page with only WeCom's own parameters."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = []
            for name, value in message.get("headers", []):
                if name.lower() == b"location":
                    parts = urlsplit(value.decode("latin-1"))
                    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "client_id"]
                    value = urlunsplit(parts._replace(query=urlencode(query))).encode("latin-1")
                headers.append((name, value))
            message = {**message, "headers": headers}
        await send(message)

    return wrapped


async def refuse(send: Send, reason: str, root_path: str = "", status: int = 403, retry_after_s: int = 60) -> None:
    """The refusal page (403, or 429 when over a limit), which also ends the state: the next attempt starts from
    the sign-in page."""
    body = REFUSAL_PAGE.format(reason=html.escape(reason), login=html.escape(f"{root_path}/login")).encode()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"content-security-policy", b"default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'"),
        (b"set-cookie", f"{STATE_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=lax".encode()),
    ]
    if status == 429:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- registration --------------------------------------------------------------------------------------------------


def providers_for(web: WebBotConfig, bots: list[object]) -> list[CompanyLogin]:
    """The providers the bot's `web_login` asks for; SystemExit with every problem, one line each, if any."""
    if problems := web_login_problems(web, bots):
        raise SystemExit("botgw web: " + "; ".join(problems))
    by_id = {getattr(bot, "id", ""): bot for bot in bots}
    made = []
    if web.web_login.wecom is not None:
        made.append(wecom_provider(by_id[web.web_login.wecom.bot]))  # type: ignore[arg-type]
    if web.web_login.dingtalk is not None:
        made.append(dingtalk_provider(by_id[web.web_login.dingtalk.bot]))  # type: ignore[arg-type]
    return made


def install(web: WebBotConfig) -> tuple[str, ...]:
    """Register the bot's company logins with Chainlit (providers, callback, guard); the logins installed."""
    if web.web_login.wecom is None and web.web_login.dingtalk is None:
        return ()
    from chainlit.config import config
    from chainlit.server import app

    from webchat.bot_settings import page_settings

    made = providers_for(web, page_settings().bots)
    ids = {provider.id for provider in made}
    oauth_providers.providers[:] = [p for p in oauth_providers.providers if p.id not in ids] + made

    @cl.oauth_callback
    async def company_login(provider_id: str, token: str, raw_user_data: dict, default_user: cl.User,
                            id_token: str | None = None) -> cl.User | None:  # fmt: skip
        return default_user if provider_id in ids and raw_user_data.get("userid") else None

    # httpx logs every request's URL at INFO, and auth/getuserinfo takes the app's access token and the code in
    # its query string: the page logs httpx's warnings only (as the gateway does, gateway/logs.py).
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger(noisy).getEffectiveLevel()))
    logins = tuple(provider.id for provider in made)
    app.add_middleware(CompanyLoginGuard, logins=logins, root_path=config.run.root_path or "")
    return logins
