"""The console's configuration page: the effective configuration as `botgw config check` prints it, every secret
masked (Settings.shown), so that an operator can see what this deployment runs with without a shell."""

from __future__ import annotations

import yaml
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.console.web import Viewer, json_answer, render

router = APIRouter(prefix="/console")


@router.get("/config")
async def configuration(request: Request, operator: Viewer) -> Response:
    shown = request.app.state.runtime.settings.shown()
    if request.query_params.get("format") == "json":
        return json_answer(shown)
    text = yaml.safe_dump(shown, allow_unicode=True, sort_keys=False)
    return render(request, operator, "config.html", text=text)
