"""The console's dead_letters page (gateway/console/web.py says what a page module is)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/console")
