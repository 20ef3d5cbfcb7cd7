"""The console's overview page (gateway/console/web.py says what a page module is)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.console.web import Viewer, render

router = APIRouter(prefix="/console")


@router.get("/")
async def overview(request: Request, operator: Viewer) -> Response:
    return render(request, operator, "message.html", title="概览", message="")
