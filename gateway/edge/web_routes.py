"""The web chat page's HTTP API: a message in, its answer streamed back as server-sent events.

The message takes the same path as every platform's (limits, memory, queue, worker); the
answer is read from the stream store as the worker writes it, so any gateway replica can
serve the page. The store publishes every update, and the page's request waits on that
notification (its own pub/sub subscription) instead of polling Redis.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from redis.asyncio import Redis

from bots.base import CallbackRejected, InboundMessage
from bots.channels import PageChannel
from bots.safe_json import parse_json_object
from gateway import metrics
from gateway.edge.routes import BodyTooLarge, read_body
from gateway.state.streams import StreamStore

router = APIRouter()
SAFETY_REREAD_S = 5.0  # re-read even without a notification (one lost in a Redis restart)
MAX_OPEN_PER_USER = 3


def _web_adapter(request: Request, bot_id: str) -> PageChannel | None:
    """The bot answered on the page (reply style `page`), or None (no such bot, or one of another platform)."""
    adapter = request.app.state.runtime.adapters.get(bot_id)
    return adapter if isinstance(adapter, PageChannel) and adapter.reply_style == "page" else None


def parse_message(adapter: PageChannel, headers: Mapping[str, str], body: bytes, now: float) -> InboundMessage:
    """adapter.parse, with the body held to what the platform adapters accept (bots.safe_json: nesting, NaN, lone
    surrogates) and a field it cannot convert (a temperature that is not a number in range) refused as a 400."""
    adapter.authorize(headers)  # first: no one learns anything of the body's checks without the key
    parse_json_object(body, "body")
    try:
        return adapter.parse(headers, body, now)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise CallbackRejected("malformed_fields", 400, "a field has the wrong type or is out of range") from exc


def answer_sources(knowledge: bytes | None) -> dict:
    """What the page shows under an answer grounded in a knowledge base, from the reply record's `knowledge`
    field (the worker's Retrieval.record()): the sources, each document and section once, best first, and
    whether nothing in the documents answered (`no_answer`)."""
    try:
        used = json.loads(knowledge) if knowledge else {}
        if not isinstance(used, dict):
            raise TypeError("not an object")
        sources = [{"doc": str(p["doc"]), "section": str(p.get("section") or "")} for p in used.get("passages") or []]
    except (ValueError, TypeError, KeyError, AttributeError):
        return {"sources": [], "no_answer": False}
    if used.get("direct"):
        sources = sources[:1]  # a Q&A row answered as it is: its own source only
    unique = list({(s["doc"], s["section"]): s for s in sources}.values())
    return {"sources": unique, "no_answer": bool(used.get("no_answer"))}


def _event(payload: dict) -> str:
    # ASCII-escaped: U+2028 and the other Unicode line breaks must not reach a client that splits lines at them
    return f"data: {json.dumps(payload)}\n\n"


async def answer_events(
    redis: Redis, streams: StreamStore, stream_id: str, timeout_s: float, details: Callable[[], Awaitable[dict]]
) -> AsyncIterator[str]:
    """Deltas of the answer as it grows, then one `done` event with `details()` (the experts, the knowledge
    base's sources), or an `error` event on timeout."""
    sent = ""
    deadline = time.monotonic() + timeout_s
    yield _event({"status": "queued"})
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(streams.events_channel(stream_id))  # before the first read: no update is missed
        while True:
            state = await streams.get(stream_id)
            if state and len(state.content) > len(sent):
                yield _event({"delta": state.content[len(sent) :]})
                sent = state.content
            if state and state.finished:
                yield _event({"done": True, "text": sent, **await details()})
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                yield _event({"error": "timeout", "message": "The answer did not arrive in time; please try again."})
                return
            await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(remaining, SAFETY_REREAD_S))


@router.post("/web/{bot_id}/chat")
async def web_chat(bot_id: str, request: Request) -> Response:
    adapter = _web_adapter(request, bot_id)
    if adapter is None:
        return JSONResponse({"error": "unknown web bot"}, status_code=404)
    runtime = request.app.state.runtime
    try:
        body = await read_body(request, runtime.settings.max_body_bytes)
        message = parse_message(adapter, request.headers, body, time.time())
    except BodyTooLarge:
        return JSONResponse({"error": "body_too_large"}, status_code=413)
    except CallbackRejected as exc:
        metrics.REJECTED.labels(adapter.platform, exc.reason).inc()
        return JSONResponse({"error": exc.reason, "message": exc.detail}, status_code=exc.status)
    streams: StreamStore = request.app.state.streams
    stream_id = message.reply_to.stream_id
    if not await streams.open(bot_id, message.person, stream_id, limit=MAX_OPEN_PER_USER, max_age_s=600):
        message_text = "Please wait for your earlier questions to be answered."
        return JSONResponse({"error": "busy", "message": message_text}, status_code=429)
    outcome = await request.app.state.ingest.accept(message)
    metrics.CALLBACKS.labels(adapter.platform, outcome).inc()
    record_key = runtime.keys.reply(message.dedup_key)

    async def details() -> dict:
        experts, knowledge = await runtime.redis.hmget(record_key, "experts", "knowledge")
        return {"experts": experts.decode() if experts else "", **answer_sources(knowledge)}

    events = answer_events(runtime.redis, streams, stream_id, adapter.answer_timeout_s, details)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/web/{bot_id}/status")
async def web_status(bot_id: str, request: Request) -> JSONResponse:
    """What the page shows: loading (no engine ready), busy (every engine at its cap), or ready. It needs the
    web key like the chat endpoint: engine addresses and load are not for the open internet."""
    adapter = _web_adapter(request, bot_id)
    if adapter is None:
        return JSONResponse({"error": "unknown web bot"}, status_code=404)
    try:
        adapter.authorize(request.headers)
    except CallbackRejected as exc:
        return JSONResponse({"error": exc.reason, "message": exc.detail}, status_code=exc.status)
    pool = request.app.state.runtime.engine
    ready = [e for e in pool.endpoints if e.status == "ready"]
    cap = request.app.state.runtime.settings.engine.max_in_flight
    if not ready:
        status = "loading"
    elif all(e.load.running + e.load.waiting >= cap for e in ready):
        status = "busy"
    else:
        status = "ready"
    return JSONResponse({"engine": status, "endpoints": {e.url: e.status for e in pool.endpoints}})
