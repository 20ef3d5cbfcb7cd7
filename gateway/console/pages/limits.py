"""The console's limits: look a person or group up by qualified identity (what operators type, `wecom:zhangsan`,
is qualified as `botgw limits` and /admin/limits qualify it), see usage against each window and budget, and reset
(admins only, audited). The same functions as the admin API: gateway/edge/admin_routes.py."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from gateway.console.auth import Operator
from gateway.console.web import (
    SECURITY_HEADERS,
    Admin,
    Viewer,
    json_answer,
    language,
    record,
    render,
    small_form,
    small_json,
    translator,
)
from gateway.edge.admin_routes import NOT_AN_ID, budgets, not_an_id, qualified_identity
from gateway.state.identities import IdentityError

router = APIRouter(prefix="/console")
WHO_MAX = 512
TOKEN_KINDS = ("tokens_per_minute", "tokens_per_day")


def _qualified(request: Request, written: str) -> tuple[str, str]:
    """(the qualified identity, '') or ('', why not) for what an operator typed."""
    t = translator(language(request))
    written = written.strip()
    if not written:
        return "", ""
    if len(written) > WHO_MAX or not_an_id(written):
        return "", t("编号里不能有 *、?、[、] 或 \\，也不能太长。",
                     f"Not an id: {NOT_AN_ID}, at most {WHO_MAX} characters.")
    try:
        return qualified_identity(written, request.app.state.runtime), ""
    except IdentityError as exc:
        return "", str(exc)


def _parties(report: dict) -> list[dict[str, Any]]:
    """`Budgets.show`'s report as the page lists it: per party (user:…, group:…) its windows and token budgets."""
    shown = []
    for party, entry in report.items():
        kind, _, _ = party.partition(":")
        tokens = [{"kind": name, **entry[name]} for name in TOKEN_KINDS if name in entry]
        shown.append({"party": party, "kind": kind, "budget": entry.get("budget", {}), "messages": entry["messages"],
                      "tokens": tokens, "notice_pending": entry.get("notice_pending", False)})  # fmt: skip
    return shown


@router.get("/limits")
async def limits_page(request: Request, operator: Viewer) -> Response:
    """`?who=` looked up: usage of the person (and of a group of that id) against each window and budget."""
    written = request.query_params.get("who", "")
    identity, error = _qualified(request, written)
    report = await budgets(request.app.state.runtime).show(identity) if identity else {}
    if request.query_params.get("format") == "json" or operator.via == "bearer":
        if error:
            return json_answer({"error": "unqualified_identity", "message": error}, 400)
        return json_answer({"who": identity, "limits": report})
    cleared = request.query_params.get("cleared", "")
    return render(request, operator, "limits.html", status_code=400 if error else 200, written=written,
                  identity=identity, error=error, parties=_parties(report),
                  cleared=int(cleared) if cleared.isascii() and cleared.isdigit() else None)  # fmt: skip


@router.post("/limits/reset")
async def limits_reset(request: Request, operator: Admin) -> Response:
    """Clear the windows, token counters and notice marks of the form's `who` (as `botgw limits reset`)."""
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await small_json(request)
        written = str(body.get("who", "")) if isinstance(body, dict) else ""
    else:
        written = str((await small_form(request)).get("who", ""))
    identity, error = _qualified(request, written)
    if not identity:
        return _refused(request, operator, written, error or "who?")
    cleared = await budgets(request.app.state.runtime).reset(identity)
    await record(request, operator, "limits.reset", identity, {"cleared": cleared})
    if "application/json" in request.headers.get("accept", "") or operator.via == "bearer":
        return json_answer({"reset": identity, "cleared": cleared})
    response = RedirectResponse(f"/console/limits?{urlencode({'who': identity, 'cleared': cleared})}", 303)
    response.headers.update(SECURITY_HEADERS)
    return response


def _refused(request: Request, operator: Operator, written: str, error: str) -> Response:
    if "application/json" in request.headers.get("accept", "") or operator.via == "bearer":
        return json_answer({"error": "unqualified_identity", "message": error}, 400)
    return render(request, operator, "limits.html", status_code=400, written=written, identity="", error=error,
                  parties=[], cleared=None)  # fmt: skip
