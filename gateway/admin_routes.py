"""The operators' HTTP API: the same operations as the `botgw limits` commands, behind a bearer token.

Off (404) unless `admin.token` is configured; a wrong or missing token gets 401 and changes nothing.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.limits import Budgets

router = APIRouter(prefix="/admin")


def _refused(request: Request) -> JSONResponse | None:
    token = request.app.state.runtime.settings.admin.token
    if token is None:
        return JSONResponse({"error": "admin API disabled: set admin.token"}, status_code=404)
    expected = f"Bearer {token.get_secret_value()}".encode()
    if not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
        return JSONResponse({"error": "missing or wrong admin token"}, status_code=401)
    return None


def _budgets(request: Request) -> Budgets:
    runtime = request.app.state.runtime
    return Budgets(runtime.redis, runtime.settings.redis_url, runtime.keys, runtime.settings.limits)


@router.get("/limits/{who}")
async def show_limits(who: str, request: Request) -> JSONResponse:
    """A user's or group's usage against its limits (as `botgw limits show`)."""
    return _refused(request) or JSONResponse(await _budgets(request).show(who))


@router.delete("/limits/{who}")
async def reset_limits(who: str, request: Request) -> JSONResponse:
    """Clear a user's or group's windows and budgets (as `botgw limits reset`)."""
    return _refused(request) or JSONResponse({"reset": who, "cleared": await _budgets(request).reset(who)})
