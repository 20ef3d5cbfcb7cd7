"""The web chat page's HTTP API: a message in, its answer streamed back as server-sent events.

The message takes the same path as every platform's (limits, memory, queue, worker); the
answer is read from the stream store as the worker writes it, so any gateway replica can
serve the page. The store publishes every update, and the page's request waits on that
notification (its own pub/sub subscription) instead of polling Redis.

A file the page user attaches is posted first, alone (`POST /web/{bot}/uploads`): checked (the key, the size
against the bot's max_media_bytes, the type against its name and its bytes, the user's allowance of uploads) and
kept under its owner's name for `upload_ttl_s` (gateway/state/uploads.py); the chat message then names the ref
it got, and a ref that is not the sender's is refused before anything is queued.

A click on one of the buttons under a question (a tool call's 确认/取消) is the same post with `button` (its key)
instead of text (bots/web/adapter.py): its answer streams back like any other, and the final event of an answer
that asks a question carries the question's buttons.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from redis.asyncio import Redis

from bots.base import CallbackRejected, InboundMessage
from bots.buttons import Question
from bots.channels import PageChannel
from bots.safe_json import parse_json_object
from bots.web.adapter import WebAdapter
from bots.web.uploads import Upload, canonical_type, clean_name, content_matches
from gateway import metrics
from gateway.edge.routes import BodyTooLarge, read_body
from gateway.state.limits import MovingWindowLimiter, windows
from gateway.state.pulse import PULSE
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
    redis: Redis,
    streams: StreamStore,
    stream_id: str,
    timeout_s: float,
    details: Callable[[], Awaitable[dict]],
    settled: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[str]:
    """Deltas of the answer as it grows, then one `done` event with `details()` (the experts, the knowledge
    base's sources) and the buttons of a question it asks, or an `error` event on timeout.

    A message may be done with nothing to show (a tap on a question settled before: it does nothing): no update
    announces that, so `settled()` (its reply record is done) is asked first and whenever a wait passed without
    an update, and the `done` event then carries no text."""
    sent = ""
    deadline = time.monotonic() + timeout_s
    yield _event({"status": "queued"})
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(streams.events_channel(stream_id))  # before the first read: no update is missed
        quiet = True  # no update announced since the last read
        while True:
            done_elsewhere = quiet and settled is not None and await settled()  # read before the stream: in order
            state = await streams.get(stream_id)
            if state and len(state.content) > len(sent):
                yield _event({"delta": state.content[len(sent) :]})
                sent = state.content
            if state and state.finished:
                yield _event({"done": True, "text": sent, **await details(), **question_event(state.question)})
                return
            if done_elsewhere:
                yield _event({"done": True, "text": sent, **await details()})
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                yield _event({"error": "timeout", "message": "The answer did not arrive in time; please try again."})
                return
            woke = await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(remaining, SAFETY_REREAD_S))
            quiet = woke is None


def question_event(stored: str) -> dict:
    """The buttons the page shows under the answer (`question`: its id and each button's key and label), from
    what the stream carries; nothing when it asks nothing."""
    question = Question.from_json(stored)
    if question is None:
        return {}
    buttons = [{"key": key, "label": label} for key, label in question.buttons()]
    return {"question": {"id": question.id, "title": question.title, "buttons": buttons}}


@router.post("/web/{bot_id}/chat")
async def web_chat(bot_id: str, request: Request) -> Response:
    adapter = _web_adapter(request, bot_id)
    if adapter is None:
        return JSONResponse({"error": "unknown web bot"}, status_code=404)
    runtime = request.app.state.runtime
    try:
        body = await read_body(request, runtime.settings.max_body_bytes)
        message = parse_message(adapter, request.headers, body, time.time())
        if isinstance(adapter, WebAdapter):
            await adapter.check_uploads(message)  # every attachment the sender's own upload, still kept
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
    PULSE.callback(bot_id)
    record_key = runtime.keys.reply(message.dedup_key)

    async def details() -> dict:
        experts, knowledge = await runtime.redis.hmget(record_key, "experts", "knowledge")
        return {"experts": experts.decode() if experts else "", **answer_sources(knowledge)}

    async def settled() -> bool:
        return await runtime.redis.hget(record_key, "state") in (b"done", b"failed")

    events = answer_events(runtime.redis, streams, stream_id, adapter.answer_timeout_s, details, settled)
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


def _refused(status: int, error: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An upload refused, counted like a refused message."""
    metrics.REJECTED.labels("web", error).inc()
    return JSONResponse({"error": error, "message": message}, status_code=status, headers=headers)


def _upload_limiter(request: Request) -> MovingWindowLimiter:
    """The uploads' moving windows, shared by every replica (opened on first use)."""
    state = request.app.state
    if getattr(state, "upload_limiter", None) is None:
        settings, keys = state.runtime.settings, state.runtime.keys
        state.upload_limiter = MovingWindowLimiter(
            settings.redis_url, f"{keys.limits_prefix}:upload", **settings.redis_options()
        )
    return state.upload_limiter


@router.post("/web/{bot_id}/uploads")
async def web_upload(bot_id: str, request: Request, user: str = "", login: str = "", name: str = "") -> Response:
    """One attached file, the body as it is (its type in Content-Type, its name in `name`), for the page user
    `user` signed in by `login`: 201 with its ref, or a 4xx that says why and keeps nothing."""
    adapter = request.app.state.runtime.adapters.get(bot_id)
    if not isinstance(adapter, WebAdapter) or adapter.uploads is None:
        return _refused(404, "unknown_web_bot", "no web page with uploads here")
    try:
        adapter.authorize(request.headers)  # first: nothing of the checks below is told without the key
        owner = adapter.owner_of(user, login)
        data = await read_body(request, adapter.max_media_bytes)
    except BodyTooLarge:
        return _refused(413, "too_large", f"files are taken up to {adapter.max_media_bytes // 1024} KB")
    except CallbackRejected as exc:
        return _refused(exc.status, exc.reason, exc.detail)
    name = clean_name(name)
    mime = canonical_type(request.headers.get("content-type", ""), name)
    if not data:
        return _refused(400, "empty", "the file is empty")
    if mime is None or not content_matches(mime, data):
        return _refused(415, "unsupported_type",
                        "images (PNG, JPEG, WebP, GIF) and documents (TXT, MD, PDF, DOCX, XLSX) only, "
                        "and the file must be what its name says")
    decision = await _upload_limiter(request).hit(owner, windows(adapter.config.uploads_per_user))
    if not decision.allowed:
        return _refused(429, "too_many_uploads", f"too many files: try again in {decision.retry_after_s} s",
                        {"Retry-After": str(decision.retry_after_s)})
    ref = secrets.token_hex(16)
    await adapter.uploads.put(bot_id, owner, ref, Upload(data, mime, name), adapter.config.upload_ttl_s)
    return JSONResponse({"ref": ref, "name": name, "mime": mime, "size": len(data)}, status_code=201)
