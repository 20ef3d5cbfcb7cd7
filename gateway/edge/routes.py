"""HTTP routes: platform callbacks, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from bots.base import CallbackRejected
from bots.channels import CallbackRequest
from gateway import metrics
from gateway.logs import request_id, request_id_for
from gateway.runtime import Runtime
from gateway.state.pulse import PULSE

log = logging.getLogger(__name__)
router = APIRouter()


class BodyTooLarge(Exception):
    """The request body is larger than `max_body_bytes`."""


BODY_DEADLINE_S = 30.0  # a body arrives in time when it comes at BODY_MIN_BYTES_PER_S after this grace
BODY_MIN_BYTES_PER_S = 256 * 1024


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read at most max_bytes of the body; an announced or actual overflow is refused early, and a body the client
    hung up on before its end is refused (no one reads that answer, but it keeps a traceback out of the log)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_DEADLINE_S + max_bytes / BODY_MIN_BYTES_PER_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise BodyTooLarge
                chunks.append(chunk)
    except ClientDisconnect as exc:
        raise CallbackRejected("body_cut_off", 400, "the client hung up before the end of the body") from exc
    except TimeoutError as exc:  # a body dripped to hold the connection
        raise CallbackRejected("body_too_slow", 408, "the body did not arrive in time") from exc
    return b"".join(chunks)


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def _rejected(platform: str, exc: CallbackRejected) -> PlainTextResponse:
    metrics.REJECTED.labels(platform, exc.reason).inc()
    log.warning("callback rejected", extra={"reason": exc.reason, "status": exc.status})
    # A 405 here is a bot with no URL check (a GET or HEAD to it): POST is what its URL serves (RFC 9110 §15.5.6).
    headers = {"Allow": "POST"} if exc.status == 405 else None
    return PlainTextResponse(exc.detail, status_code=exc.status, headers=headers)


async def verify_url(request: Request) -> Response:
    """URL verification when the operator saves the callback URL: answer the decrypted echostr, bare."""
    handler = request.app.state.callbacks.get(request.path_params["bot_id"])
    if handler is None:
        return PlainTextResponse("unknown bot", status_code=404)
    try:
        echo = handler.adapter.handshake(request.query_params, time.time())
    except CallbackRejected as exc:
        return _rejected(handler.adapter.platform, exc)
    return Response(content=echo, media_type="text/plain")


async def receive(request: Request) -> Response:
    """A platform callback: verify, parse, dedup, enqueue, and acknowledge at once.

    A plain Starlette endpoint (CALLBACK_ROUTE), not a FastAPI one: FastAPI's dependency solving and its nested
    routers' matching cost more CPU than everything else the gateway does per callback (issue 22's profile)."""
    started = time.perf_counter()
    bot_id: str = request.path_params["bot_id"]
    handler = request.app.state.callbacks.get(bot_id)
    if handler is None:
        return PlainTextResponse("unknown bot", status_code=404)
    platform = handler.adapter.platform
    try:
        body = await read_body(request, _runtime(request).settings.max_body_bytes)
        reply = await handler.handle(CallbackRequest(request.query_params, request.headers, body, time.time()))
    except BodyTooLarge:
        PULSE.rejected(bot_id, "body_too_large")
        return _rejected(platform, CallbackRejected("body_too_large", 413, "request body too large"))
    except CallbackRejected as exc:
        PULSE.rejected(bot_id, exc.reason)
        return _rejected(platform, exc)
    PULSE.callback(bot_id)
    metrics.ACK_LATENCY.labels(platform).observe(time.perf_counter() - started)
    return Response(content=reply.body, status_code=reply.status, media_type=reply.media_type)


async def callback(request: Request) -> Response:
    """GET (and HEAD, as HTTP has it) is the URL check, POST a callback: one route for both, so that any other
    method's 405 names them all."""
    request_id.set(request_id_for(request.headers.get("x-request-id")))
    if request.method == "POST":
        return await receive(request)
    return await verify_url(request)


CALLBACK_ROUTE = Route("/callback/{bot_id}", callback, methods=["GET", "POST"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (no dependency is checked)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when Redis answers and an engine is up, has our model loaded and answered its warm-up."""
    runtime = _runtime(request)
    try:
        redis_ok = bool(await runtime.redis.ping())
    except Exception:
        redis_ok = False
    engine_ok = runtime.engine.ready
    ready = redis_ok and engine_ok
    engines = {endpoint.url: endpoint.status for endpoint in runtime.engine.endpoints}
    body = {"ready": ready, "redis": redis_ok, "engine": engine_ok, "model": runtime.engine.model, "engines": engines}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    runtime = _runtime(request)
    try:
        gauges = await runtime.scheduler.gauges()
        metrics.QUEUE_DEPTH.set(gauges.depth)
        metrics.QUEUE_AGE.set(gauges.oldest_age_s)
        metrics.DEAD_LETTERS.set(gauges.dead_letters)
        metrics.DEATHS_ALONE.set(gauges.deaths_alone)
    except Exception:
        log.warning("queue stats unavailable")
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
