"""The console's overview: is every bot alive, and if not, why. For the IT admin who asks why the DingTalk bot went
quiet: each bot with its platform, its callbacks and answers of the last minutes, its last answer, its Stream
connection, its token refresh errors (60020 with the 可信IP hint); the engines (ready, load, KV cache); the queue
(depth, oldest wait); the dead letters waiting; answers per minute; every live botgw process.

The whole deployment, not this process: every gateway, worker and Stream process reports its activity to Redis
(gateway/state/pulse.py); the engines are this gateway's own pool's view (it watches them: engine/pool.py).
`/console/overview/fragment` re-renders the live part (the page asks every 5 s), `/console/overview.json` (or
`/console/?format=json`) is the same for scripts.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response

from bots.registry import PLATFORMS, holds_connection
from gateway.console.web import Viewer, _ago, json_answer, render, wants_json
from gateway.runtime import Runtime
from gateway.state.pulse import Activity, read_pulse

router = APIRouter(prefix="/console")

WINDOW_MIN = 15  # the minutes the overview looks back
RECENT_MIN = 5
QUEUE_WAIT_WARN_S = 60.0
QUEUE_WAIT_BAD_S = 300.0
TOKEN_ERROR_SHOWN_S = 86400.0  # a token error older than a day, with nothing since, is no longer shown
UNANSWERED_AFTER_S = 120.0  # messages came, none was answered for this long: said
LEVELS = {"ok": 0, "idle": 0, "warn": 1, "bad": 2}
# What the overview says of a problem, (中文, English), formatted with the problem's numbers.
SAID = {
    "token": ("换取 access_token 失败（{code}），这个机器人发不出回答。",
              "Getting an access token failed ({code}): this bot cannot send answers."),
    "no_stream": ("没有 Stream 连接：没有 botgw dingtalk-stream 进程在为这个机器人运行，钉钉推送的消息无人接收。",
                  "No Stream connection: no botgw dingtalk-stream process runs for this bot, so no message DingTalk "
                  "pushes is received."),
    "stream_down": ("Stream 连接已断开 {lost}，正在重连。", "The Stream connection is down for {lost}, reconnecting."),
    "rejected": ("最近 15 分钟拒收了 {n} 个回调（{reason}）：检查回调的 Token、EncodingAESKey 或密钥。",
                 "Callbacks refused in the last 15 minutes: {n} ({reason}): check the callback's token, EncodingAESKey "
                 "or secret."),
    "failed": ("最近 15 分钟有 {n} 条消息没能回答，成了死信。",
               "Messages not answered in the last 15 minutes: {n} (now dead letters)."),
    "unanswered": ("收到了消息，但几分钟都没有回答。", "Messages came in, but nothing was answered for minutes."),
    "no_worker": ("没有 worker 在运行：消息会排队，但没人回答。",
                  "No worker is running: messages are queued, but no one answers them."),
    "no_engine": ("没有就绪的引擎：回答会等待，然后失败。", "No engine is ready: answers wait, then fail."),
    "queue_wait": ("队列里最早的消息已经等了 {waited}。", "The oldest queued message has waited {waited}."),
    "dead_letters": ("{n} 条死信等待处理。", "Dead letters waiting: {n}."),
    "engine_down": ("引擎没有就绪。", "The engine is not ready."),
    "engine_warming": ("引擎正在预热。", "The engine is warming up."),
    "kv_full": ("KV 缓存将满：增加引擎或调低 max_in_flight。",
                "KV cache nearly full: add engines or lower max_in_flight."),
}


def _problem(level: str, kind: str, numbers: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A problem to show: its level (bad: red, warn: amber), its kind, and what it says in both languages."""
    zh, en = SAID[kind]
    return {"level": level, "kind": kind, "zh": zh.format(**numbers or {}), "en": en.format(**numbers or {}), **extra}


def _worst(problems: list[dict[str, Any]], otherwise: str = "ok") -> str:
    return max((p["level"] for p in problems), key=LEVELS.__getitem__, default=otherwise)


def _token_problem(bot: Any, error: dict[str, Any], last_answer: float | None, now: float) -> dict[str, Any] | None:
    """The bot's last token refresh error, while nothing was answered since (and not older than a day)."""
    at = float(error.get("at") or 0)
    if (last_answer and last_answer > at) or now - at > TOKEN_ERROR_SHOWN_S:
        return None
    code, said = str(error.get("code", "")), str(error.get("message", ""))
    problem = _problem("bad", "token", {"code": code}, code=code, said=said, at=at)
    platform = PLATFORMS.get(bot.platform)
    hint = platform.token_hints.get(code) if platform else None
    if hint is not None:  # the platform's hint said once, then the platform's own words
        problem.update(zh=hint.zh, en=hint.en, hint=hint.name, said=said.removeprefix(hint.said_prefix))
    return problem


def _stream_view(bot_id: str, activity: Activity, now: float) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The bot's Stream connection as the live Stream processes hold it, and the problem if none is up."""
    held = [p["streams"][bot_id] for p in activity.processes if isinstance(p.get("streams"), dict)
            and isinstance(p["streams"].get(bot_id), dict)]  # fmt: skip
    up = [h for h in held if h.get("connected")]
    view = {"processes": len(held), "connected": len(up),
            "since": min((float(h.get("since") or now) for h in (up or held)), default=None)}  # fmt: skip
    if not held:
        return view, _problem("bad", "no_stream")
    if not up:
        return view, _problem("bad", "stream_down", {"lost": _ago(float(view["since"] or now))})
    return view, None


def bot_view(bot: Any, activity: Activity, now: float) -> dict[str, Any]:
    """One bot's state: its numbers of the last minutes and its problems, worst first."""
    bot_id = bot.id
    stream_mode = holds_connection(bot)
    last_answer, last_callback = activity.last_at("answer", bot_id), activity.last_at("callback", bot_id)
    view: dict[str, Any] = {
        "id": bot_id,
        "platform": bot.platform,
        "platform_name": PLATFORMS[bot.platform].title if bot.platform in PLATFORMS else (bot.platform,) * 2,
        "mode": getattr(bot, "mode", None),
        "callbacks_5m": activity.total("callback", bot_id, RECENT_MIN),
        "callbacks_15m": activity.total("callback", bot_id),
        "rejected_15m": activity.total("rejected", bot_id),
        "answers_5m": activity.total("answer", bot_id, RECENT_MIN),
        "answers_15m": activity.total("answer", bot_id),
        "failed_15m": activity.total("failed", bot_id),
        "answers_per_minute": activity.series("answer", bot_id),
        "last_callback": last_callback,
        "last_answer": last_answer,
        "token_error": activity.token_errors.get(bot_id),
        "last_rejection": activity.rejections.get(bot_id),
        "stream": None,
    }
    problems: list[dict[str, Any]] = []
    if view["token_error"] and (token := _token_problem(bot, view["token_error"], last_answer, now)):
        problems.append(token)
    if stream_mode:
        view["stream"], lost = _stream_view(bot_id, activity, now)
        if lost:
            problems.append(lost)
    if view["rejected_15m"]:
        reason = str((view["last_rejection"] or {}).get("reason", ""))
        level = "bad" if not view["callbacks_15m"] else "warn"
        problems.append(_problem(level, "rejected", {"n": view["rejected_15m"], "reason": reason}))
    if view["failed_15m"]:
        problems.append(_problem("warn", "failed", {"n": view["failed_15m"]}))
    if (last_callback and view["callbacks_15m"] and not view["answers_15m"]
            and now - last_callback > UNANSWERED_AFTER_S and (last_answer or 0) < last_callback):  # fmt: skip
        problems.append(_problem("warn", "unanswered"))
    problems.sort(key=lambda p: -LEVELS[p["level"]])
    view["problems"] = problems
    quiet = not view["callbacks_15m"] and not view["answers_15m"]
    view["state"] = _worst(problems, "idle" if quiet else "ok")
    return view


def _shown_url(url: str) -> str:
    """An engine's address without any user:password in it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def engine_views(runtime: Runtime, activity: Activity) -> list[dict[str, Any]]:
    """Each engine as this gateway's pool sees it (status, vLLM's running/waiting and KV cache at its last read),
    with the requests the workers have open on it."""
    now = time.monotonic()
    threshold = runtime.settings.engine.kv_warn_threshold
    views = []
    for endpoint in runtime.engine.endpoints:
        in_flight = sum(int((p.get("engines") or {}).get(endpoint.url, {}).get("in_flight", 0))
                        for p in activity.processes if p.get("role") == "worker")  # fmt: skip
        load = endpoint.load
        problems = []
        if endpoint.status != "ready":
            problems.append(_problem("bad", "engine_down" if endpoint.status == "down" else "engine_warming"))
        elif load.kv_cache_usage >= threshold:
            problems.append(_problem("warn", "kv_full"))
        views.append({
            "url": _shown_url(endpoint.url), "status": endpoint.status, "vision": endpoint.vision,
            "running": load.running, "waiting": load.waiting, "kv_cache_usage": load.kv_cache_usage,
            "in_flight": in_flight,
            "read_s_ago": round(now - endpoint.scraped_at, 1) if endpoint.scraped_at else None,
            "problems": problems, "state": _worst(problems),
        })  # fmt: skip
    return views


async def overview_data(runtime: Runtime) -> dict[str, Any]:
    """Everything the overview shows, as plain data (the page, the fragment and the JSON all start here)."""
    now = time.time()
    activity = await read_pulse(runtime.redis, runtime.keys, WINDOW_MIN, now)
    depth, oldest_s = await runtime.scheduler.stats()
    dead_letters = int(await runtime.redis.xlen(runtime.keys.dead_letters))
    bots = [bot_view(bot, activity, now) for bot in runtime.settings.bots]
    engines = engine_views(runtime, activity)
    processes = [{"id": p["id"], "role": p.get("role"), "host": p.get("host"), "pid": p.get("pid"),
                  "started": p.get("started"), "at": p.get("at")} for p in activity.processes]  # fmt: skip
    roles = {role: sum(1 for p in processes if p["role"] == role) for role in ("gateway", "worker", "stream")}
    problems: list[dict[str, Any]] = []
    queue_state = "bad" if oldest_s >= QUEUE_WAIT_BAD_S else "warn" if oldest_s >= QUEUE_WAIT_WARN_S else "ok"
    if not roles["worker"]:
        problems.append(_problem("bad", "no_worker"))
    if engines and not any(e["status"] == "ready" for e in engines):
        problems.append(_problem("bad", "no_engine"))
    if queue_state != "ok":
        problems.append(_problem(queue_state, "queue_wait", {"waited": _ago(now - oldest_s)}))
    if dead_letters:
        problems.append(_problem("warn", "dead_letters", {"n": dead_letters}, link="/console/dead-letters"))
    answers = activity.series("answer")
    return {
        "at": now,
        "minutes": WINDOW_MIN,
        "bots": bots,
        "engines": engines,
        "queue": {"depth": depth, "oldest_wait_s": round(oldest_s, 1), "state": queue_state},
        "dead_letters": dead_letters,
        "answers_per_minute": answers,
        "answers_per_minute_5m": round(sum(answers[-RECENT_MIN:]) / RECENT_MIN, 1),  # with the minute under way
        "answers_15m": sum(answers),
        "processes": processes,
        "process_counts": roles,
        "problems": problems,
        "state": _worst(problems + [p for view in bots + engines for p in view["problems"]]),
    }


def bars(series: list[int], width: int = 150, height: int = 32) -> list[dict[str, float]]:
    """The SVG bars of a per-minute series (attributes only: the page's CSP allows no inline style)."""
    top = max(series, default=0) or 1
    step = width / max(1, len(series))
    shown = []
    for i, count in enumerate(series):
        tall = round(height * count / top, 1) if count else 0.0
        shown.append({"x": round(i * step + 1, 1), "y": round(height - tall, 1), "w": round(step - 2, 1),
                      "h": tall, "count": count})  # fmt: skip
    return shown


@router.get("/")
async def overview(request: Request, operator: Viewer) -> Response:
    data = await overview_data(request.app.state.runtime)
    if wants_json(request):
        return json_answer(data)
    return render(request, operator, "overview.html", data=data, bars=bars)


@router.get("/overview.json")
async def overview_json(request: Request, operator: Viewer) -> Response:
    return json_answer(await overview_data(request.app.state.runtime))


@router.get("/overview/fragment")
async def overview_fragment(request: Request, operator: Viewer) -> Response:
    """The live part of the page, which the page fetches every few seconds (console.js `data-refresh`)."""
    data = await overview_data(request.app.state.runtime)
    return render(request, operator, "overview_live.html", data=data, bars=bars)
