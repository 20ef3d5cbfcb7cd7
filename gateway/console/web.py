"""What every console page shares: who is asking (`require`), the CSRF check on every change, rendering a template
in the reader's language with the page's Content-Security-Policy, the audit of changes, and bounded lists.

A page module (gateway/console/pages/) declares `router = APIRouter()` with its routes under /console/<page>, takes
`operator: Viewer` (or `Editor`, `Admin`: the signed-in operator with that role or higher), and answers with
`render(...)`; a change
(any method but GET and HEAD) is refused before the route runs unless it carries the session's CSRF token, as the
`X-CSRF-Token` header (console.js sends it) or the form field `csrf` (the pages' plain forms), and `record(...)`
writes what it did to the audit stream.
"""

from __future__ import annotations

import hmac
import json
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, unquote, urlsplit

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.datastructures import FormData, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bots.base import CallbackRejected
from bots.safe_json import parse_json_object
from gateway.console.auth import SESSION_COOKIE, Operator, Sessions, bearer_matches
from gateway.console.settings import Role
from gateway.edge.admin_listener import is_console_path
from gateway.edge.routes import BodyTooLarge, read_body
from webchat.guard import content_security_policy

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=str(HERE / "templates"))


def _datetime(at: object) -> str:
    """An epoch time as the server's local date and time ('' for none)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(at)))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        return ""


def _ago(at: object) -> str:
    """How long ago an epoch time was: 5s, 3m, 2h, 4d ('' for none)."""
    try:
        seconds = max(0, int(time.time() - float(at)))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


TEMPLATES.env.filters["datetime"] = _datetime
TEMPLATES.env.filters["ago"] = _ago
LANG_COOKIE = "botgw_lang"
LANGUAGES = ("zh", "en")
SAFE_METHODS = ("GET", "HEAD")
NEXT_MAX = 2000  # a console page's path and query, as `next` carries it
AUDIT_MAX = 100_000  # the audit stream keeps about this many changes
SECURITY_HEADERS = {
    "Content-Security-Policy": content_security_policy([]),  # the page's policy: scripts and styles from itself only
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "SAMEORIGIN",
    "Cache-Control": "no-store",
}

# (path, role needed, 中文, English): the navigation, in order
PAGES = (
    ("/console/", "viewer", "概览", "Overview"),
    ("/console/dead-letters", "viewer", "死信", "Dead letters"),
    ("/console/knowledge", "viewer", "知识库", "Knowledge"),
    ("/console/kf", "viewer", "微信客服", "WeChat Kefu"),
    ("/console/limits", "viewer", "限额", "Limits"),
    ("/console/tools", "viewer", "工具审计", "Tool audit"),
    ("/console/audit", "viewer", "操作记录", "Changes"),
    ("/console/config", "viewer", "配置", "Configuration"),
)


class ConsoleDenied(Exception):
    """A request the console answers with a refusal: 401 (not signed in: a page read gets the sign-in page
    instead), 403 (role or CSRF)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class ConsoleHeaders:
    """ASGI middleware: every answer under /console (a redirect, a 404 or 405, a static file, an error) carries
    SECURITY_HEADERS where the route did not set its own; an exception's 500 too (then re-raised to be logged)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        started = False

        async def with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        except Exception:
            if not started:
                await PlainTextResponse("Internal Server Error", 500, headers=SECURITY_HEADERS)(scope, receive, send)
            raise


def language(request: Request) -> str:
    chosen = request.cookies.get(LANG_COOKIE, "")
    return chosen if chosen in LANGUAGES else "zh"


def wants_html(request: Request) -> bool:
    return request.method in SAFE_METHODS and "text/html" in request.headers.get("accept", "")


def sessions(request: Request) -> Sessions:
    runtime = request.app.state.runtime
    return Sessions(runtime.redis, runtime.keys, runtime.settings)


async def current_operator(request: Request) -> Operator | None:
    """A script's `Authorization: Bearer` (right or wrong: it said who it is), else the session's cookie. Another
    scheme (a proxy's Basic auth in front of the admin listener, which the browser then sends with every request)
    is not the console's and does not hide the session."""
    settings = request.app.state.runtime.settings
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return Operator("admin-token", "admin", "bearer") if bearer_matches(settings, header) else None
    return await sessions(request).operator(request.cookies.get(SESSION_COOKIE, ""))


def _same_origin(request: Request) -> bool:
    """A change's Origin (or Referer), when the browser sends one, is this console's own host."""
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    if not source or source == "null":
        return not source
    return urlsplit(source).netloc == request.headers.get("host", "")


async def _small_body(request: Request) -> bytes:
    """The body, read within `max_body_bytes` (Starlette's own body() and form() read any size, chunked or not);
    over it, or cut off: ConsoleDenied with 413 or 400. Read once: later calls get the same."""
    if not hasattr(request, "_body"):
        try:
            request._body = await read_body(request, request.app.state.runtime.settings.max_body_bytes)
        except BodyTooLarge:
            raise ConsoleDenied(413, "the request is too large") from None
        except CallbackRejected as exc:
            raise ConsoleDenied(exc.status, exc.detail) from None
    return request._body


async def small_form(request: Request) -> FormData:
    """A plain form's fields, the body bounded first (see _small_body)."""
    if request.headers.get("content-type", "").startswith("multipart/"):
        raise ConsoleDenied(415, "this route takes a plain form (application/x-www-form-urlencoded) or JSON")
    await _small_body(request)
    return await request.form()


async def small_json(request: Request) -> dict[str, Any]:
    """A script's JSON object, bounded first (see _small_body); an empty body is {}; not a JSON object, or one
    nested too deeply (bots.safe_json: json.loads would raise RecursionError, a 500): ConsoleDenied 400."""
    body = await _small_body(request)
    try:
        return parse_json_object(body or b"{}", "the body")
    except CallbackRejected as refused:
        raise ConsoleDenied(400, refused.detail) from None


async def _csrf_ok(request: Request, operator: Operator) -> bool:
    if operator.via == "bearer":
        return True
    if not _same_origin(request):
        return False
    given = request.headers.get("x-csrf-token", "")
    if not given and request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        given = str((await small_form(request)).get("csrf", ""))
    return bool(given) and hmac.compare_digest(given.encode(), operator.csrf.encode())


def require(role: Role):
    """The dependency of a console route: the operator, when signed in with `role` or higher (and, for a change,
    with the session's CSRF token); otherwise ConsoleDenied."""

    async def dependency(request: Request) -> Operator:
        operator = await current_operator(request)
        if operator is None:
            raise ConsoleDenied(401, "sign in first")
        if request.method not in SAFE_METHODS and not await _csrf_ok(request, operator):
            raise ConsoleDenied(403, "this change did not come from the console's own page (CSRF token missing "
                                     "or wrong): reload the page and try again")  # fmt: skip
        if not operator.may(role):
            raise ConsoleDenied(403, f"your role {operator.role} cannot do this ({role} or higher can)")
        return operator

    return dependency


Viewer = Annotated[Operator, Depends(require("viewer"))]
Editor = Annotated[Operator, Depends(require("editor"))]
Admin = Annotated[Operator, Depends(require("admin"))]


async def denied(request: Request, exc: Exception) -> Response:
    """ConsoleDenied as the reader should see it: the sign-in page for a page read without a session."""
    assert isinstance(exc, ConsoleDenied)
    if exc.status == 401 and wants_html(request):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/console/login?next={quote_next(target)}", status_code=303)
    if wants_html(request):
        return render(request, None, "message.html", status_code=exc.status, title="403", message=exc.reason)
    return JSONResponse({"error": exc.reason}, status_code=exc.status, headers=SECURITY_HEADERS)


def quote_next(target: str) -> str:
    return quote(safe_next(target), safe="/")


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of the console only (never another site: `//evil`, `/\\evil`), and
    none a browser resolves out of /console/ (`/console/../admin`, `%2e%2e`, a tab or newline it drops)."""
    if not target or not target.startswith("/console/") or len(target) > NEXT_MAX:
        return "/console/"
    path = unquote(target.partition("?")[0].partition("#")[0])
    if "\\" in target or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target + path):
        return "/console/"
    if any(segment in (".", "..") for segment in path.replace("\\", "/").split("/")):
        return "/console/"
    return target


def translator(lang: str):
    def t(zh: str, en: str) -> str:
        return zh if lang == "zh" else en

    return t


def render(request: Request, operator: Operator | None, template: str, status_code: int = 200,
           **context: Any) -> HTMLResponse:
    """A console page in the reader's language, with the navigation their role sees."""
    lang = language(request)
    nav = [(path, zh if lang == "zh" else en) for path, role, zh, en in PAGES if operator and operator.may(role)]
    response = TEMPLATES.TemplateResponse(
        request, template,
        {"operator": operator, "t": translator(lang), "lang": lang, "nav": nav, "path": request.url.path,
         "csrf": operator.csrf if operator else "", **context},
        status_code=status_code,
    )
    response.headers.update(SECURITY_HEADERS)
    return response


def wants_json(request: Request, operator: Operator | None = None) -> bool:
    """Whether to answer with JSON, not a page: `?format=json`, an Accept of application/json that is not a
    browser's page request, or a script signed in with the Bearer token."""
    accept = request.headers.get("accept", "")
    return (operator is not None and operator.via == "bearer") or request.query_params.get("format") == "json" or (
        "application/json" in accept and "text/html" not in accept)  # fmt: skip


def json_answer(data: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status_code, headers=SECURITY_HEADERS)


async def record(request: Request, operator: Operator, action: str, target: str, detail: Any = None) -> None:
    """Write a change to the audit stream, after it was made: who, how they signed in, what, on what."""
    runtime = request.app.state.runtime
    fields = {"at": f"{time.time():.3f}", "who": operator.who, "role": operator.role, "via": operator.via,
              "action": action, "target": target[:500],
              "detail": json.dumps(detail, ensure_ascii=False)[:2000] if detail is not None else ""}  # fmt: skip
    await runtime.redis.xadd(runtime.keys.console_audit, fields, maxlen=AUDIT_MAX, approximate=True)


def bounded(value: str | None, default: int, maximum: int) -> int:
    """A page size or offset from the query: a whole number within 0..maximum, else `default`."""
    if value is None or not value.isascii() or not value.isdigit():
        return default
    return min(int(value), maximum)
