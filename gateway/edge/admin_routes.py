"""The operators' HTTP API: the same operations as the `botgw limits` commands and `botgw tools audit`, behind a
bearer token (the knowledge bases' are in gateway/edge/kb_routes.py).

Off (404) unless `admin.token` is configured; a wrong or missing token gets 401 and changes nothing.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from bots.base import CallbackRejected, SendError
from bots.safe_json import parse_json_object
from gateway.edge.routes import BodyTooLarge, read_body
from gateway.queue.push import enqueue_handoff
from gateway.state.identities import IdentityError, qualify, tenants_by_family
from gateway.state.limits import Budgets
from tools.audit import MAX_READ, ToolAudit, parse_duration

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


def _not_an_id(who: str) -> JSONResponse | None:
    """An id is taken literally, and the reset SCANs with it: `*`, `?` or `[` would clear other users' budgets."""
    if any(char in who for char in "*?[]\\"):
        return JSONResponse({"error": "an id has no *, ?, [, ] or \\"}, status_code=400)
    return None


def _budgets(request: Request) -> Budgets:
    runtime = request.app.state.runtime
    return Budgets(runtime.redis, runtime.settings.redis_url, runtime.keys, runtime.settings.limits)


def _identity(who: str, request: Request) -> str | JSONResponse:
    """The qualified identity an operator named (`wecom:zhangsan` → `wecom:<corp>:zhangsan`), or a 400 with the
    forms a bare id could mean."""
    try:
        return qualify(who, tenants_by_family(request.app.state.runtime.settings.bots))
    except IdentityError as exc:
        return JSONResponse({"error": "unqualified_identity", "message": str(exc)}, status_code=400)


@router.get("/limits/{who}")
async def show_limits(who: str, request: Request) -> JSONResponse:
    """A user's or group's usage against its limits (as `botgw limits show`)."""
    refusal = refused(request)
    if refusal:
        return refusal
    identity = _identity(who, request)
    return identity if isinstance(identity, JSONResponse) else JSONResponse(await _budgets(request).show(identity))


@router.delete("/limits/{who}")
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
    Any bot whose platform has human agents (`adapter.sessions`) takes it; the route keeps its first name."""
    refusal = refused(request)
    if refusal:
        return refusal
    runtime = request.app.state.runtime
    try:
        body = parse_json_object(await read_body(request, runtime.settings.max_body_bytes), "body")
        adapter = runtime.adapters.get(bot_id)
        if adapter is None:
            return JSONResponse({"error": f"no bot {bot_id!r}"}, status_code=404)
        if adapter.sessions is None:
            return JSONResponse({"error": f"bot {bot_id!r} has no human agents to hand over to"}, status_code=400)
        bot = runtime.settings.bot(bot_id)
        message = bot.handoff_request(body.get("open_kfid"), body.get("customer") or "", body.get("servicer"))
    except BodyTooLarge:
        return JSONResponse({"error": "request body too large"}, status_code=413)
    except CallbackRejected as exc:  # as a callback's body: nesting, NaN, lone surrogates (bots.safe_json)
        return JSONResponse({"error": exc.detail}, status_code=exc.status)
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    servicer = str(body.get("servicer") or "")
    # Asked first, as `botgw kf handoff` does: a person without an open conversation cannot be handed to anyone,
    # and queueing the move anyway only had the worker dead-letter it after this said "queued".
    account, person = message.reply_to.chat_id, message.sender_id
    try:
        if not await adapter.sessions.is_open(message.reply_to):
            return JSONResponse({"error": f"{person} has no open session with {account} (ended, or never "
                                          "started): nothing to hand off until they write again"}, status_code=409)
    except SendError as exc:  # the platform refused or did not answer: its words (no token, no secret in them)
        return JSONResponse({"error": f"cannot ask the platform for the conversation: {exc}"}, status_code=502)
    place = await enqueue_handoff(runtime.scheduler, message, runtime.settings.memory.group, servicer)
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
    runtime = request.app.state.runtime
    records = await ToolAudit(runtime.redis, runtime.keys, runtime.settings.tools).read(
        user=who, since_s=since_s, limit=int(limit))
    return JSONResponse({"records": [record.to_json() for record in records]})
