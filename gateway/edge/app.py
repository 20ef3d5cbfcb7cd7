"""The FastAPI gateway: create_app and its lifespan."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.config import Settings
from gateway.console.routes import install as install_console
from gateway.edge.admin_listener import AdminListenerGuard
from gateway.edge.admin_routes import router as admin_router
from gateway.edge.batching import RedisBatcher
from gateway.edge.callbacks import callback_handlers
from gateway.edge.flood_guard import FloodGuard
from gateway.edge.ingest import Ingest
from gateway.edge.kb_routes import router as kb_router
from gateway.edge.routes import CALLBACK_ROUTE, router
from gateway.edge.web_routes import router as web_router
from gateway.runtime import open_runtime
from gateway.state.pulse import start_pulse, stop_pulse
from gateway.state.streams import StreamStore

# FastAPI from 0.16x asks OpenTelemetry on every request whether a provider is configured (about 6 µs each, issue 22);
# botgw exports Prometheus metrics and configures none. Older FastAPI has no such option (nor the cost).
NO_OTEL = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(settings: Settings, admin_port: int | None = None) -> FastAPI:
    """A gateway process: callbacks in, durable queue out. Replicas share nothing but Redis.

    `admin_port` is the local port of the admin listener (see gateway.edge.admin_listener), if the process has one."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_runtime(settings) as runtime:
            await runtime.scheduler.load_scripts()
            batcher = RedisBatcher(runtime.redis)
            batcher.start()
            app.state.runtime = runtime
            ingest = Ingest(batcher, runtime.keys, runtime.scheduler, settings)
            app.state.ingest = ingest
            app.state.streams = StreamStore(runtime.redis, runtime.keys)
            app.state.callbacks = callback_handlers(runtime.adapters, ingest, app.state.streams)
            app.state.knowledge = None  # the admin API's knowledge store, opened on first use (gateway.edge.kb_routes)
            pulse = start_pulse(runtime.redis, runtime.keys, "gateway", lambda: runtime.engine.endpoints)
            try:
                yield
            finally:
                await stop_pulse(pulse)
                await batcher.aclose()
                if app.state.knowledge is not None:
                    await app.state.knowledge.aclose()

    # No schema or docs routes on any listener: /openapi.json would list every admin route to anyone on the public
    # port (and the admin listener serves only operator paths anyway, gateway.edge.admin_listener).
    app = FastAPI(title="botgw", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None, **NO_OTEL)
    # Flood guard at the HTTP layer; per-user fairness is MovingWindowLimiter's job, after decryption.
    limits = settings.limits
    app.add_middleware(FloodGuard, spec=limits.http_per_source, storage_url=limits.http_storage,
                       key_prefix=f"{settings.namespace}:http")  # fmt: skip
    token = settings.admin.token.get_secret_value() if settings.admin.token else None
    app.add_middleware(AdminListenerGuard, admin_port=admin_port, token=token)
    app.router.routes.insert(0, CALLBACK_ROUTE)  # first: the hot path is matched before anything else
    app.include_router(router)
    app.include_router(web_router)
    app.include_router(admin_router)
    app.include_router(kb_router)
    install_console(app)
    return app
