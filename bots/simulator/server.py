"""The simulator process: the platforms' servers, on one local port (`botgw sim serve`)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI

from bots.simulator.wecom_api import WeComApiState, wecom_api_router
from bots.simulator.wecom_robots import RobotState, robots_router
from bots.wecom.config import WeComAppConfig


def create_simulator_app(bots: Sequence[object]) -> FastAPI:
    """WeCom's API for the configured apps (their corp ids and secrets are the accepted credentials),
    group robots and AI-bot response URLs."""
    apps = {(bot.corp_id, bot.secret.get_secret_value()) for bot in bots if isinstance(bot, WeComAppConfig)}
    state = WeComApiState(apps=apps)
    robots = RobotState()
    app = FastAPI(title="botgw platform simulator", docs_url=None, redoc_url=None)
    app.state.wecom = state
    app.include_router(wecom_api_router(state))
    app.include_router(robots_router(robots))

    @app.post("/__sim__/reset-all")
    async def reset_all() -> dict[str, str]:
        state.reset()
        robots.reset()
        return {"status": "reset"}

    @app.get("/__sim__/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
