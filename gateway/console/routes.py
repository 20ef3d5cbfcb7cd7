"""The console's own routes (sign-in, sign-out, language, the audit of changes) and `install`, which adds them and
every page's routes to the gateway's app. The admin listener serves /console/; the public port answers 404
(gateway.edge.admin_listener)."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from gateway.console.auth import (
    SESSION_COOKIE,
    STATE_COOKIE,
    TOKEN_WHO,
    Operator,
    authorize_url,
    digest,
    identity_of,
    role_for,
    token_matches,
)
from gateway.console.pages import PAGE_ROUTERS
from gateway.console.web import (
    HERE,
    LANG_COOKIE,
    LANGUAGES,
    SECURITY_HEADERS,
    ConsoleDenied,
    ConsoleHeaders,
    Viewer,
    bounded,
    current_operator,
    denied,
    json_answer,
    language,
    record,
    render,
    safe_next,
    sessions,
    small_form,
    translator,
)
from gateway.state.redis_text import as_text, is_stream_id, older_than
from gateway.state.tokens import RedisTokenStore
from webchat.sso import LoginRefused, dingtalk_member, wecom_member

router = APIRouter(prefix="/console")
AUDIT_PAGE = 50
FAILED_SIGN_INS = 10  # wrong admin tokens one address may type in a minute (then 429 until the minute is over)
FAILED_WINDOW_S = 60


def install(app: FastAPI) -> None:
    app.add_exception_handler(ConsoleDenied, denied)
    app.add_middleware(ConsoleHeaders)
    app.mount("/console/static", StaticFiles(directory=str(HERE / "static")), name="console-static")
    app.include_router(router)
    for page in PAGE_ROUTERS:
        app.include_router(page)


def _logins(request: Request) -> list[str]:
    login = request.app.state.runtime.settings.console.login
    return [name for name in ("wecom", "dingtalk") if getattr(login, name) is not None]


def _secure(request: Request) -> bool:
    """The cookies are Secure when the browser comes through https: as this request came, or as
    console.public_url says (a proxy that ends TLS and forwards plain http to the admin listener)."""
    public = request.app.state.runtime.settings.console.public_url or ""
    return request.url.scheme == "https" or public.startswith("https://")


def _signed_in(request: Request, cookie: str, target: str) -> Response:
    response = RedirectResponse(safe_next(target), status_code=303)
    hours = request.app.state.runtime.settings.console.session_hours
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(hours * 3600), path="/console", httponly=True,
                        samesite="lax", secure=_secure(request))  # fmt: skip
    response.headers.update(SECURITY_HEADERS)
    return response


def _login_page(request: Request, error: str = "", status_code: int = 200) -> Response:
    settings = request.app.state.runtime.settings
    return render(request, None, "login.html", status_code=status_code, error=error, logins=_logins(request),
                  token_on=settings.admin.token is not None, next=safe_next(request.query_params.get("next")))


@router.get("/login")
async def login_page(request: Request) -> Response:
    if await current_operator(request) is not None:
        return RedirectResponse(safe_next(request.query_params.get("next")), status_code=303)
    return _login_page(request)


_TAKE_BACK = "if (tonumber(redis.call('GET', KEYS[1]) or '0')) > 0 then return redis.call('DECR', KEYS[1]) end return 0"


@router.post("/login")
async def login_with_token(request: Request) -> Response:
    """The admin token typed into the sign-in page."""
    t = translator(language(request))
    try:
        form = await small_form(request)
    except ConsoleDenied as exc:
        return _login_page(request, t("请求无法读取。", "The request cannot be read.") + f" ({exc.reason})", exc.status)
    runtime = request.app.state.runtime
    failures = runtime.keys.console_sign_in_failures(digest(request.client.host if request.client else "-"))
    # Counted before the token is compared, in one step with the check: read, compare, then count let parallel
    # guesses past the limit (13 of 60 against 10, found by a review). A right token takes its count back.
    async with runtime.redis.pipeline(transaction=False) as pipe:
        _, attempts = await pipe.set(failures, 0, nx=True, ex=FAILED_WINDOW_S).incr(failures).execute()
    if int(attempts) > FAILED_SIGN_INS:
        response = _login_page(request, t("输错令牌的次数太多，请一分钟后再试。",
                                          "Too many wrong tokens: try again in a minute."), 429)  # fmt: skip
        response.headers["Retry-After"] = str(FAILED_WINDOW_S)
        return response
    if not token_matches(runtime.settings, str(form.get("token", ""))):
        return _login_page(request, t("令牌不对。", "That is not the admin token."), 401)
    # the right token's count taken back, only while its window lives: a DECR after the minute made a counter
    # with no expiry, and the address was locked out for good (found by a review)
    await runtime.redis.eval(_TAKE_BACK, 1, failures)
    cookie = await sessions(request).open(TOKEN_WHO, "token")
    await record(request, Operator(TOKEN_WHO, "admin", "token"), "sign-in", TOKEN_WHO)
    return _signed_in(request, cookie, str(form.get("next", "")))


def _callback_url(request: Request, login: str) -> str:
    public = request.app.state.runtime.settings.console.public_url
    base = public.rstrip("/") if public else str(request.base_url).rstrip("/")
    return f"{base}/console/login/{login}/callback"


@router.get("/login/{login}")
async def login_with_platform(login: str, request: Request) -> Response:
    """Off to WeCom's or DingTalk's sign-in page, with a fresh state kept in a cookie for the way back."""
    if login not in _logins(request):
        return _login_page(request, "", 404)
    state = secrets.token_urlsafe(24)
    settings = request.app.state.runtime.settings
    response = RedirectResponse(authorize_url(settings, login, _callback_url(request, login), state), 303)
    response.set_cookie(STATE_COOKIE, f"{state}|{safe_next(request.query_params.get('next'))}", max_age=600,
                        path="/console/login", httponly=True, samesite="lax", secure=_secure(request))  # fmt: skip
    return response


@router.get("/login/{login}/callback")
async def login_callback(login: str, request: Request) -> Response:
    """The platform sends the browser back with a code: the state must be this browser's, the code new; the person
    a member of the organisation with a role in `console.roles`."""
    t = translator(language(request))
    if login not in _logins(request):
        return _login_page(request, "", 404)
    kept, _, target = request.cookies.get(STATE_COOKIE, "").partition("|")
    state = request.query_params.get("state", "")
    code = request.query_params.get("code") or request.query_params.get("authCode") or ""

    def refuse(reason: str, status: int = 403) -> Response:
        response = _login_page(request, reason, status)
        response.delete_cookie(STATE_COOKIE, path="/console/login")
        return response

    if not kept or not secrets.compare_digest(kept.encode(), state.encode()):
        return refuse(t("这次登录不是从本浏览器发起的，请重新登录。",
                        "This sign-in was not started from this browser; please sign in again."))  # fmt: skip
    if not code or len(code) > 512:
        return refuse(t("登录已取消或被拒绝。", "The sign-in was declined or cancelled."))
    if not await sessions(request).first_use_of(login, code):
        return refuse(t("这个登录码已经用过，请重新登录。", "This sign-in code was used before; please sign in again."))
    runtime = request.app.state.runtime
    bot = runtime.settings.bot(getattr(runtime.settings.console.login, login).bot)
    resolve = wecom_member if login == "wecom" else dingtalk_member
    try:
        member = await resolve(bot, runtime.http, RedisTokenStore(runtime.redis, runtime.keys), code)  # type: ignore[arg-type]
    except LoginRefused as exc:
        return refuse(exc.reason)
    who = identity_of(member.login, member.userid, member.tenant)
    if role_for(runtime.settings, who, login) is None:
        return refuse(t(f"{who} 没有控制台角色，请让管理员在 console.roles 里加上。",
                        f"{who} has no console role; ask an administrator to add it to console.roles."))  # fmt: skip
    cookie = await sessions(request).open(who, login)
    role = role_for(runtime.settings, who, login)
    assert role is not None
    await record(request, Operator(who, role, login), "sign-in", who)
    response = _signed_in(request, cookie, target)
    response.delete_cookie(STATE_COOKIE, path="/console/login")
    return response


@router.post("/logout")
async def logout(request: Request, operator: Viewer) -> Response:
    await sessions(request).close(request.cookies.get(SESSION_COOKIE, ""))
    await record(request, operator, "sign-out", operator.who)
    response = RedirectResponse("/console/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/console")
    return response


@router.get("")
async def console_root() -> Response:
    return RedirectResponse("/console/", status_code=308)


@router.get("/lang/{lang}")
async def choose_language(lang: str, request: Request) -> Response:
    response = RedirectResponse(safe_next(request.query_params.get("next")), status_code=303)
    if lang in LANGUAGES:
        response.set_cookie(LANG_COOKIE, lang, max_age=365 * 86400, path="/console", samesite="lax")
    return response


@router.get("/audit")
async def audit_page(request: Request, operator: Viewer) -> Response:
    """The console's changes, newest first, a page at a time (`before`: the id the last page ended on)."""
    runtime = request.app.state.runtime
    before = request.query_params.get("before", "")
    limit = bounded(request.query_params.get("limit"), AUDIT_PAGE, 200) or AUDIT_PAGE
    upper = older_than(before if is_stream_id(before) else "")
    items = await runtime.redis.xrevrange(runtime.keys.console_audit, max=upper, min="-", count=limit) if upper else []
    rows = [{"id": as_text(entry_id), **{as_text(k): as_text(v) for k, v in fields.items()}}
            for entry_id, fields in items]  # fmt: skip
    if request.query_params.get("format") == "json":
        return json_answer({"changes": rows})
    more = rows[-1]["id"] if len(rows) == limit else ""
    return render(request, operator, "audit.html", rows=rows, more=more)
