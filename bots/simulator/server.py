"""The simulator process: the platforms' servers, on one local port (`botgw sim serve`)."""

from __future__ import annotations

from fastapi import FastAPI

from bots.simulator.wecom_api import WeComApiState, wecom_api_router
from bots.wecom.config import WeComAppConfig


def create_simulator_app(wecom_apps: list[WeComAppConfig]) -> FastAPI:
    """WeCom's API for the given apps (their corp ids and secrets are the accepted credentials)."""
    state = WeComApiState(apps={(app.corp_id, app.secret.get_secret_value()) for app in wecom_apps})
    app = FastAPI(title="botgw platform simulator", docs_url=None, redoc_url=None)
    app.state.wecom = state
    app.include_router(wecom_api_router(state))

    @app.get("/__sim__/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
