"""The operators' HTTP API: the same operations as the `botgw limits` commands and `botgw tools audit`, behind a
bearer token (the knowledge bases' are in gateway/edge/kb_routes.py).

Off (404) unless `admin.token` is configured; a wrong or missing token gets 401 and changes nothing.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from bots.base import CallbackRejected
from bots.safe_json import parse_json_object
from gateway.edge.kf_handoff import HandoffRefused, queue_handoff
from gateway.edge.routes import BodyTooLarge, read_body
from gateway.state.identities import IdentityError, qualify, tenants_by_family
from gateway.state.limits import Budgets
from tools.audit import MAX_READ, ToolAudit, parse_duration

if TYPE_CHECKING:
    from gateway.runtime import Runtime

router = APIRouter(prefix="/admin")


def refused(request: Request) -> JSONResponse | None:
    """None when the request carries the admin token; otherwise the answer (404 with no token configured, 401)."""
    token = request.app.state.runtime.settings.admin.token
    if token is None:
        return JSONResponse({"error": "admin API disabled: set admin.token"}, status_code=404)
    expected = f"Bearer {token.get_secret_value()}".encode()
    if not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
        return JSONResponse({"error": "missing or wrong admin token"}, status_code=401)
    return None


NOT_AN_ID = "an id has no *, ?, [, ] or \\"


def not_an_id(who: str) -> bool:
    """An id is taken literally, and the reset SCANs with it: `*`, `?` or `[` would clear other users' budgets."""
    return any(char in who for char in "*?[]\\")


def _not_an_id(who: str) -> JSONResponse | None:
    return JSONResponse({"error": NOT_AN_ID}, status_code=400) if not_an_id(who) else None


def budgets(runtime: Runtime) -> Budgets:
    """The limits of the running gateway, as the operators' routes and the console read and reset them."""
    return Budgets(runtime.redis, runtime.settings.redis_url, runtime.keys, runtime.settings.limits)


def _budgets(request: Request) -> Budgets:
    return budgets(request.app.state.runtime)


def qualified_identity(who: str, runtime: Runtime) -> str:
    """The qualified identity an operator named (`wecom:zhangsan` → `wecom:<corp>:zhangsan`); IdentityError with
    the forms a bare id could mean."""
    return qualify(who, tenants_by_family(runtime.settings.bots))


def _identity(who: str, request: Request) -> str | JSONResponse:
    try:
        return qualified_identity(who, request.app.state.runtime)
    except IdentityError as exc:
        return JSONResponse({"error": "unqualified_identity", "message": str(exc)}, status_code=400)


def tool_audit(runtime: Runtime) -> ToolAudit:
    """The tools' audit trail of the running gateway (this route's and the console's reader)."""
    return ToolAudit(runtime.redis, runtime.keys, runtime.settings.tools)


@router.get("/limits/{who:path}")  # an id may hold "/" (a DingTalk senderId is base64)
async def show_limits(who: str, request: Request) -> JSONResponse:
    """A user's or group's usage against its limits (as `botgw limits show`)."""
    refusal = refused(request)
    if refusal:
        return refusal
    identity = _identity(who, request)
    return identity if isinstance(identity, JSONResponse) else JSONResponse(await _budgets(request).show(identity))


@router.delete("/limits/{who:path}")
async def reset_limits(who: str, request: Request) -> JSONResponse:
    """Clear a user's or group's windows and budgets (as `botgw limits reset`)."""
    refusal = refused(request) or _not_an_id(who)
    if refusal:
        return refusal
    identity = _identity(who, request)
    if isinstance(identity, JSONResponse):
        return identity
    return JSONResponse({"reset": identity, "cleared": await _budgets(request).reset(identity)})


@router.post("/kf/{bot_id}/handoff")
async def kf_handoff(bot_id: str, request: Request) -> JSONResponse:
    """Hand a 微信客服 customer to a human (as `botgw kf handoff`): {"customer", "servicer"?, "open_kfid"?}.
    Any bot whose platform has human agents (`adapter.sessions`) takes it; the route keeps its first name.
    The platform is asked first (gateway/edge/kf_handoff.py, shared with the console): 409 with no open session."""
    refusal = refused(request)
    if refusal:
        return refusal
    runtime = request.app.state.runtime
    try:
        body = parse_json_object(await read_body(request, runtime.settings.max_body_bytes), "body")
        place = await queue_handoff(runtime, bot_id, body.get("open_kfid"), body.get("customer") or "",
                                    body.get("servicer"))  # fmt: skip
    except BodyTooLarge:
        return JSONResponse({"error": "request body too large"}, status_code=413)
    except CallbackRejected as exc:  # as a callback's body: nesting, NaN, lone surrogates (bots.safe_json)
        return JSONResponse({"error": exc.detail}, status_code=exc.status)
    except HandoffRefused as exc:
        return JSONResponse({"error": exc.error}, status_code=exc.status)
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    return JSONResponse({"queued": True, "place": place}, status_code=202)


@router.get("/tools/audit")
async def tools_audit(request: Request, user: str | None = None, since: str | None = None,
                      limit: str = "1000") -> JSONResponse:
    """The tools' audit trail (as `botgw tools audit --json`): {"records": [...]}, newest last; `user` as limits
    take it, `since` a duration (90s, 30m, 12h, 7d, bare seconds), `limit` the most recent that many."""
    refusal = refused(request)
    if refusal:
        return refusal
    who = _identity(user, request) if user else None
    if isinstance(who, JSONResponse):
        return who
    try:
        since_s = parse_duration(since) if since else None
    except ValueError as exc:
        return JSONResponse({"error": "bad_since", "message": str(exc)}, status_code=400)
    if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= MAX_READ:
        return JSONResponse({"error": "bad_limit", "message": f"limit is a whole number from 1 to {MAX_READ}"},
                            status_code=400)
    records = await tool_audit(request.app.state.runtime).read(user=who, since_s=since_s, limit=int(limit))
    return JSONResponse({"records": [record.to_json() for record in records]})
