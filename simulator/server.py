"""The simulator process: the platforms' servers, on one local port (`botgw sim serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from bots.dingtalk.config import DingTalkBotConfig
from bots.wecom.config import WeComAppConfig
from bots.wecom_kf.config import WeComKfConfig
from simulator.dingtalk.api import dingtalk_api_router
from simulator.dingtalk.cards import cards_router
from simulator.dingtalk.control import dingtalk_control_router
from simulator.dingtalk.state import DingTalkState
from simulator.dingtalk.stream import FreezableRelay, deliver_stream_frames, stream_router
from simulator.state_file import StateFile, StateFileError, changes_kf_state
from simulator.web_login import LoginState, web_login_router
from simulator.wecom.api import wecom_api_router
from simulator.wecom.control import robots_control_router, wecom_control_router
from simulator.wecom.robots import RobotState, robots_router
from simulator.wecom.state import WeComApiState
from simulator.wecom_kf.api import kf_router
from simulator.wecom_kf.control import kf_control_router
from simulator.wecom_kf.state import KfState

log = logging.getLogger(__name__)


def create_simulator_app(bots: Sequence[object], port: int, state_path: Path | None = None) -> FastAPI:
    """WeCom (apps, group robots, AI-bot response URLs) and DingTalk (OpenAPI, sessionWebhooks, Stream)
    for the configured bots; `port` is the simulator's own, behind the Stream relay. With `state_path`, the
    微信客服 state is read from it now and kept in it (simulator/state_file.py: why); StateFileError says
    when the file cannot be used."""
    apps = {(bot.corp_id, bot.secret.get_secret_value()) for bot in bots if isinstance(bot, WeComAppConfig)}
    kf_bots = [bot for bot in bots if isinstance(bot, WeComKfConfig)]
    apps |= {(bot.corp_id, bot.secret.get_secret_value()) for bot in kf_bots}  # gettoken for the 微信客服 secret
    app_bots = [bot for bot in bots if isinstance(bot, WeComAppConfig)]
    agents = {bot.agent_id: (bot.corp_id, bot.secret.get_secret_value()) for bot in app_bots}
    wecom = WeComApiState(apps=apps, agents=agents)
    kf = KfState.from_bots(kf_bots)
    state_file = StateFile(state_path, kf) if state_path else None
    if state_file is not None:
        state_file.load()
    robots = RobotState()
    dingtalk = DingTalkState(
        apps={(bot.app_key, bot.app_secret.get_secret_value()) for bot in bots if isinstance(bot, DingTalkBotConfig)},
        robots={bot.robot for bot in bots if isinstance(bot, DingTalkBotConfig)},
    )
    relay = FreezableRelay(port)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await relay.start()
        delivery = asyncio.create_task(deliver_stream_frames(dingtalk))
        yield
        delivery.cancel()
        await relay.stop()
        if state_file is not None:
            try:
                await state_file.save()
            except StateFileError as exc:
                log.error("%s; what changed since the last write is lost", exc)

    app = FastAPI(title="botgw platform simulator", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.wecom = wecom
    app.state.kf = kf
    # Each platform: its API, then the simulator's control routes (/__sim__/<platform>/...).
    app.include_router(wecom_api_router(wecom))
    app.include_router(wecom_control_router(wecom))
    app.include_router(kf_router(kf, wecom))
    app.include_router(kf_control_router(kf))
    app.include_router(robots_router(robots))
    app.include_router(robots_control_router(robots))
    app.include_router(dingtalk_api_router(dingtalk))
    app.include_router(cards_router(dingtalk))
    app.include_router(stream_router(dingtalk, relay))
    app.include_router(dingtalk_control_router(dingtalk, relay))
    app.include_router(web_login_router(LoginState(), wecom, dingtalk))  # the pages' sign-in

    if state_file is not None:

        @app.middleware("http")
        async def keep_state(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            """Written before the answer leaves: what a caller was told (a cursor) survives a kill. A state that
            cannot be written is a failed call (-1, as the platform's own system errors), never a silent success
            whose cursor a restart would then refuse."""
            response = await call_next(request)
            if changes_kf_state(request.method, request.url.path):
                try:
                    await state_file.save()
                except StateFileError as exc:
                    log.error("%s", exc)
                    return JSONResponse({"errcode": -1, "errmsg": "system error (simulator: state not saved)"},
                                        status_code=503)
            return response

    @app.get("/__sim__/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
