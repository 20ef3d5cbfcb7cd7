"""Soak: mixed traffic through every kind of fault at once; nothing acknowledged is lost, nothing is answered twice.

Why: each guarantee in the README ("Guarantees and how they are kept") has a test of its own, one fault at a time.
In production the faults come together and under load: a worker dies while a gateway restarts, Redis comes back while
WeCom is throttling, an engine goes away while DingTalk's Stream connection drops. This runs all of them against
real processes, bounded in count and in time, and counts every message.

What: redis-server with AOF (`--appendonly yes --appendfsync everysec`), two tiny vLLM CPU engines
(`engine.endpoints`), the simulator, two gateways, three workers and one `botgw dingtalk-stream` process, all on
127.0.0.1. Four bots: a WeCom app, a WeCom AI bot, a DingTalk robot in HTTP mode and one in Stream mode. `--users`
users send `--messages` messages at random times over `--duration-s` seconds (one-to-one, and on DingTalk some in
groups; some DingTalk answers go through the OpenAPI because the sessionWebhook is about to expire; a few are
`/help`). Every message carries a unique token in its text. As platforms do, `--retry-share` (30%) of the HTTP
callbacks are delivered again, the same signed callback to either gateway: at the same moment, soon, or a few
seconds later; and a callback that fails (connection refused, 5xx, 5 s without an answer) is sent again to the
other gateway, for up to 60 s. DingTalk pushes Stream messages once and never again, so those are not repeated.
A WeCom AI-bot user polls its stream with refresh callbacks (alternating gateways) until it is finished, and only
then asks the next question, as WeCom's client shows one answer at a time.

During the run, on a schedule drawn from `--seed`: SIGKILL a worker (several times) and restart it; SIGKILL a
gateway and restart it; SIGTERM a worker while it holds a message; restart Redis (SIGTERM: it writes its AOF, and
is started again on the same files); SIGKILL an engine and start it again; make WeCom's API answer 42001 (token
expired), 45009 (rate limit), 503 and slowly, and DingTalk's 130101 (send too fast), 502 and slowly (the
simulator's fault endpoints); and drop the Stream connection (`/__sim__/dingtalk/stream/drop`). Stream pushes
pause around the drop: DingTalk discards what it pushes into a connection that is gone, by design; any such push
is counted apart, never as lost.

Counted per message, after the queue has drained:
- accepted: its callback was answered 200 (original, retry or failover), for Stream: it was queued (its dedup key
  is in Redis; the stream process acks a frame only after that);
- answered: WeCom app and DingTalk: the simulator recorded a delivery whose text is the message's answer (its
  reply record in Redis, where the worker commits the answer before sending it; the tiny model's answers are
  gibberish, so the answer is matched by its text, and the token ties the message to its memory turn); AI bot: a
  refresh showed its stream finished with text. An answer in several pieces counts once.
- answered twice: a message whose answer was delivered more than once (AI bot: a second stream, or text that went
  backwards); lost: accepted and not answered. Both must be 0; the exit status says so. One exception, the one the
  README states: DingTalk has no duplicate check, so a worker SIGKILLed between a DingTalk post and its sent-mark
  leaves the post to be made again by the worker that takes over. Each such kill excuses at most one DingTalk answer
  delivered twice, of a lane the killed worker held, whose first delivery came just before the kill (or during a
  slow send it cut off) and whose second after it (as the model test allows one repeat per kill); it is counted
  "repeat (kill)", printed, and not broken.
- latency: from sending the callback (or the Stream push) to the delivery the simulator recorded (AI bot: the
  refresh that saw the stream finished, so it includes up to one refresh interval).

Run: `.venv/bin/python bench/soak.py [--messages 400 --duration-s 180 --users 48 --seed 1]` (a few minutes: the
engines take one to two minutes to start); `--profile short` is the version tests/e2e/general/test_soak.py runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import secrets
import shlex
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError

# `python bench/soak.py` puts bench/, not the project, on the path; `bench.common` needs the project.
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Broken,
    http_ok,
    main_async,
    ms,
    percentile,
    table,
    wait_ready,
)
from bots.base import InboundMessage
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.crypto import sign
from bots.markdown import to_text
from bots.text import utf8_len
from bots.wecom.config import WeComAIBotConfig, WeComAppConfig
from gateway import texts
from gateway.state.keys import Keys
from gateway.state.memory import Scope
from simulator.dingtalk.user import robot_payload
from simulator.replies import dingtalk_messages, wecom_messages
from simulator.wecom.ai_user import WeComAIBotUser
from simulator.wecom.signer import WeComCallbackSigner
from testkit.configs import botgw_config, dingtalk_robot, random_aes_key, wecom_app
from testkit.processes import BOTGW, Proc, free_port
from testkit.services import gateway_args, simulator_args, worker_args
from testkit.stacks import Stack

NAMESPACE = "soak"
MODEL = "ernie-tiny"
SYSTEM_PROMPT = "You are the company's helpful assistant. Answer briefly and politely."
GATEWAYS = ("gateway-1", "gateway-2")
WORKERS = ("worker-1", "worker-2", "worker-3")
ENGINES = ("engine-1", "engine-2")

# channel -> (bot id, platform, user prefix, share of the messages)
CHANNELS: dict[str, tuple[str, str, str, float]] = {
    "wecom": ("app", "wecom", "wc", 0.30),
    "wecom-ai": ("ai", "wecom-ai", "ai", 0.20),
    "ding-http": ("ding-http", "dingtalk", "dh", 0.25),
    "ding-stream": ("ding-stream", "dingtalk", "ds", 0.25),
}
CHANNEL_NAMES = {
    "wecom": "WeCom app",
    "wecom-ai": "WeCom AI bot",
    "ding-http": "DingTalk HTTP",
    "ding-stream": "DingTalk Stream",
}
PROMPTS = (
    "你好，请介绍一下你自己",
    "How do I reset my VPN password?",
    "明天下午三点的会议室还有空吗？",
    "Summarise the travel reimbursement policy in two sentences.",
    "打印机卡纸了怎么办",
    "What is the difference between a process and a thread?",
    "报销发票抬头应该怎么写？",
    "Give me three ideas for the team offsite.",
)
GROUP_SHARE = 0.25  # DingTalk messages written in a group (the asker is @-mentioned in the answer)
GROUPS_PER_BOT = 2
OPENAPI_SHARE = 0.2  # DingTalk messages whose sessionWebhook expires too soon: answered through the OpenAPI
SHORT_WEBHOOK_S = 30  # the worker uses a webhook only while it has a minute left
HELP_SHARE = 0.04  # `/help`: answered without the engine
RETRY_MODES = ("concurrent", "soon", "late")

CALLBACK_TIMEOUT_S = 5.0  # WeCom waits 5 s for an answer before it retries
CALLBACK_GIVE_UP_S = 60.0  # the callers' patience with a failing callback (retrying on the other gateway)
AI_REFRESH_S = 0.5
SERVER_START_S = 60.0
ENGINE_START_S = 300.0
RESTART_READY_S = 40.0
MIN_FAULT_GAP_S = 3.0
SETTLE_S = 3.0  # quiet time after the queue drained, so that a late duplicate would be seen
POLL_S = 0.25
KILL_AFTER_POST_S = 1.0  # a DingTalk post and its sent-mark are this close at most (2 loaded cores, generous)
ANSWERED = ("once", "twice", "repeat")
MAX_TOKENS_CAP = 64  # answers stay one piece on every platform (see `collect`)
# WeCom pieces may end in invisible marks that make a repeated text unique for WeCom's duplicate check.
INVISIBLE_MARKS = "\u200b\u200c\u2060\u200d"
NOTICES = {texts.ENGINE_STARTING_TEXT: "engine starting"}

# Faults: how many of each a profile runs. Platform faults are consumed by the next sends, whoever's.
PLATFORM_FAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "wecom-42001": ("wecom", {"errcode": 42001, "errmsg": "access_token expired", "times": 2}),
    "wecom-45009": ("wecom", {"errcode": 45009, "errmsg": "api freq out of limit", "times": 3}),
    "wecom-503": ("wecom", {"http_status": 503, "times": 3}),
    "wecom-slow": ("wecom", {"delay_s": 3.0, "times": 3}),
    "ding-130101": ("dingtalk", {"errcode": 130101, "errmsg": "send too fast", "times": 2}),
    "ding-502": ("dingtalk", {"http_status": 502, "times": 3}),
    "ding-slow": ("dingtalk", {"delay_s": 2.0, "times": 3}),
}
# A slow DingTalk send is recorded by the simulator this long after it arrived: a worker killed meanwhile made it.
DING_SEND_DELAY_S = float(PLATFORM_FAULTS["ding-slow"][1]["delay_s"]) + 1.0
PROCESS_FAULTS = ("kill-worker", "term-worker", "kill-gateway", "restart-redis", "drop-stream", "kill-engine")


@dataclass(frozen=True)
class Profile:
    messages: int
    duration_s: float
    users: int
    faults: dict[str, int]
    drain_s: float  # longest wait for the queue to drain after the last message was sent
    time_limit_s: float


FULL_FAULTS = {
    "kill-worker": 4,
    "term-worker": 2,
    "kill-gateway": 2,
    "restart-redis": 2,
    "drop-stream": 2,
    "kill-engine": 1,  # a restarted CPU engine takes two minutes or more to come back on a busy 2-core machine
    **dict.fromkeys(PLATFORM_FAULTS, 2),
}
SHORT_FAULTS = {
    "kill-worker": 2,
    "term-worker": 1,
    "kill-gateway": 1,
    "restart-redis": 1,
    "drop-stream": 1,
    "kill-engine": 1,
    **dict.fromkeys(PLATFORM_FAULTS, 1),
}
PROFILES = {
    "full": Profile(messages=400, duration_s=180, users=48, faults=FULL_FAULTS, drain_s=120, time_limit_s=900),
    "short": Profile(messages=64, duration_s=42, users=16, faults=SHORT_FAULTS, drain_s=45, time_limit_s=240),
}


# --------------------------------------------------------------------------- configuration


def soak_config(redis_url: str, engine_urls: list[str], sim_url: str, max_tokens: int) -> dict[str, Any]:
    """The four bots on the simulator, both engines, quick takeovers (a SIGKILLed worker's message is handed on
    after 4 s), short backoffs and drain, INFO logs (kept with a failed run's logs)."""
    bots = [
        wecom_app("app", sim_url),
        {
            "id": "ai",
            "platform": "wecom-ai",
            "token": secrets.token_hex(8),
            "encoding_aes_key": random_aes_key(),
            "api_base": sim_url,
        },
        dingtalk_robot("ding-http", "http", sim_url),
        dingtalk_robot("ding-stream", "stream", sim_url),
    ]
    engine = {
        "base_url": engine_urls[0],
        "endpoints": engine_urls,
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "poll_interval_s": 0.5,
    }
    config = botgw_config(
        redis_url,
        NAMESPACE,
        bots,
        engine,
        system_prompt=SYSTEM_PROMPT,
        memory={"token_budget": 256},
        worker={"claim_idle_ms": 4000, "backoff_base_s": 0.2, "backoff_max_s": 2.0, "drain_s": 10.0},
    )
    config["log_level"] = "INFO"
    return config


# --------------------------------------------------------------------------- messages


@dataclass
class Message:
    """One message as its user sent it and saw it answered."""

    index: int
    channel: str
    user: str
    token: str
    text: str
    at: float  # seconds after the traffic starts
    inbound: InboundMessage  # what botgw makes of it: its dedup key, its session (memory) key
    group: str = ""
    webhook_ttl_s: float = 5400.0
    retry: str = ""  # "", or how the platform delivers it again: concurrent, soon, late
    # what happened
    sent_at: float = 0.0  # wall clock of the first send
    acked: bool = False  # some delivery of the callback got 200
    acks: int = 0  # deliveries that got 200 (original, retries, failovers)
    retries: int = 0  # deliberate platform retries sent
    failovers: int = 0  # sends again after a failed attempt
    refusal: str = ""  # a 4xx for the callback
    gave_up: bool = False  # no 200 within CALLBACK_GIVE_UP_S
    error: str = ""
    queued: bool = False  # its dedup key is in Redis (set with the enqueue, atomically)
    # the answer
    answer: str | None = None  # the reply record's text
    record_state: str = ""
    deliveries: list[float] = field(default_factory=list)  # when the answer was delivered (each time)
    # WeCom AI bot
    stream_ids: set[str] = field(default_factory=set)
    shown: list[str] = field(default_factory=list)
    finished_at: float | None = None
    busy: bool = False  # a delivery was answered "still answering your earlier questions" (and not queued)
    # outcome
    # once, twice, repeat (twice, excused by a worker kill: see `excuse_kill_repeats`), lost, apart (a Stream push
    # never queued), refused (never accepted)
    outcome: str = ""

    @property
    def address(self) -> str:
        """Where its answer is shown: the WeCom member, the DingTalk group, or the DingTalk user."""
        return self.group or self.user

    @property
    def bot_id(self) -> str:
        return CHANNELS[self.channel][0]

    @property
    def http(self) -> bool:
        return self.channel != "ding-stream"

    @property
    def latency(self) -> float | None:
        if self.outcome not in ANSWERED or not self.sent_at:
            return None
        done = self.finished_at if self.channel == "wecom-ai" else (min(self.deliveries) if self.deliveries else None)
        return None if done is None else done - self.sent_at


def plan(args: argparse.Namespace) -> list[Message]:
    """The messages of the run, drawn from `--seed`: who sends what, when, where, and whether it is retried."""
    rng = random.Random(args.seed)
    weights = [share for *_, share in CHANNELS.values()]
    users = {
        channel: [f"{prefix}{i:02d}" for i in range(max(2, round(args.users * share)))]
        for channel, (_, _, prefix, share) in CHANNELS.items()
    }
    times = sorted(rng.uniform(0, args.duration_s) for _ in range(args.messages))
    messages = []
    for index, at in enumerate(times):
        channel = rng.choices(list(CHANNELS), weights)[0]
        bot_id, platform, prefix, _ = CHANNELS[channel]
        user = rng.choice(users[channel])
        token = f"soak-{index:04d}-{rng.getrandbits(24):06x}"
        text = f"[{token}] {PROMPTS[index % len(PROMPTS)]}"
        if rng.random() < HELP_SHARE:
            text = f"/help {token}"
        group, ttl = "", 5400.0
        if platform == "dingtalk":
            if rng.random() < GROUP_SHARE:
                group = f"cid-{prefix}-team-{rng.randrange(GROUPS_PER_BOT)}"
            if rng.random() < OPENAPI_SHARE:
                ttl = SHORT_WEBHOOK_S
        if platform == "wecom":
            msg_id = str(rng.getrandbits(63))
        elif platform == "wecom-ai":
            msg_id = f"{rng.getrandbits(128):032x}"
        else:
            msg_id = f"msg{rng.getrandbits(96):024x}"
        retry = rng.choice(RETRY_MODES) if channel != "ding-stream" and rng.random() < args.retry_share else ""
        conversation = group or (user if platform != "dingtalk" else f"cid-single-{user}")
        inbound = InboundMessage(
            platform=platform,
            bot_id=bot_id,
            msg_id=msg_id,
            conversation_id=conversation,
            sender_id=user,
            text=text,
            group_id=group,
        )
        messages.append(Message(index, channel, user, token, text, at, inbound, group, ttl, retry))
    return messages


# --------------------------------------------------------------------------- the platforms' side


class Traffic:
    """Plays WeCom and DingTalk for every user: signed callbacks to the gateways, Stream pushes, AI-bot refreshes."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        config: dict[str, Any],
        gateways: list[str],
        sim_url: str,
        rng: random.Random,
    ) -> None:
        self.http = http
        self.gateways = gateways
        self.sim = sim_url
        self.rng = rng
        bots = {bot["id"]: bot for bot in config["bots"]}
        self.wecom = WeComCallbackSigner(WeComAppConfig(**bots["app"]))
        self.ai = WeComAIBotUser(WeComAIBotConfig(**bots["ai"]), gateways, sim_url, http)
        self.ding = {bot_id: DingTalkBotConfig(**bots[bot_id]) for bot_id in ("ding-http", "ding-stream")}
        self.stream_open = asyncio.Event()  # cleared while the Stream connection is being dropped
        self.stream_open.set()
        self.pushing = 0
        self.ai_turns: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.follow_until = math.inf  # monotonic deadline of AI-bot refresh polling
        self.background: set[asyncio.Task[None]] = set()
        self.refresh_failures = 0

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def send(self, message: Message, t0: float) -> None:
        """Send one message at its time (an AI-bot user first waits for the answer to its previous question)."""
        await asyncio.sleep(max(0.0, t0 + message.at - time.monotonic()))
        try:
            if message.channel == "wecom":
                callback = self.wecom.text(message.user, message.text, msg_id=message.inbound.msg_id)
                await self._callback(message, "/callback/app", {"params": callback.params, "content": callback.body})
            elif message.channel == "wecom-ai":
                async with self.ai_turns[message.user]:
                    await self._ask_ai(message)
            elif message.channel == "ding-http":
                await self._ding_http(message)
            else:
                await self._ding_stream(message)
        except Exception as exc:  # a result to report (the run goes on), not a crash of the soak
            message.error = f"{type(exc).__name__}: {exc}"

    # -- HTTP callbacks, as the platforms deliver them -----------------------------------------

    async def _callback(
        self,
        message: Message,
        path: str,
        request: dict[str, Any],
        on_ok: Callable[[httpx.Response], None] | None = None,
    ) -> None:
        """The original delivery, and the platform's retry of the very same request if the plan says so."""
        first = self.rng.randrange(len(self.gateways))
        message.sent_at = time.time()
        if message.retry == "concurrent":
            message.retries += 1
            await asyncio.gather(
                self._post(message, path, first, request, on_ok), self._post(message, path, 1 - first, request, on_ok)
            )
            return
        await self._post(message, path, first, request, on_ok)
        if message.retry:
            message.retries += 1
            delay = self.rng.uniform(0.2, 1.5) if message.retry == "soon" else self.rng.uniform(3.0, 8.0)
            self._spawn(self._retry_later(message, path, request, on_ok, delay))

    async def _retry_later(
        self,
        message: Message,
        path: str,
        request: dict[str, Any],
        on_ok: Callable[[httpx.Response], None] | None,
        delay: float,
    ) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(Exception):
            await self._post(message, path, self.rng.randrange(len(self.gateways)), request, on_ok)

    async def _post(
        self,
        message: Message,
        path: str,
        gateway: int,
        request: dict[str, Any],
        on_ok: Callable[[httpx.Response], None] | None,
    ) -> None:
        """POST until a gateway answers 200, alternating gateways; a 4xx is final (a refusal), a failure is not."""
        deadline = time.monotonic() + CALLBACK_GIVE_UP_S
        attempt = 0
        while True:
            url = self.gateways[(gateway + attempt) % len(self.gateways)] + path
            try:
                response: httpx.Response | None = await self.http.post(url, timeout=CALLBACK_TIMEOUT_S, **request)
            except httpx.HTTPError:
                response = None
            if response is not None and response.status_code == 200:
                message.acked = True
                message.acks += 1
                if on_ok is not None:
                    on_ok(response)
                return
            if response is not None and response.status_code < 500:
                message.refusal = f"HTTP {response.status_code}: {response.text[:160]}"
                return
            attempt += 1
            message.failovers += 1
            if time.monotonic() > deadline:
                message.gave_up = True
                return
            await asyncio.sleep(min(2.0, 0.25 * attempt))

    # -- WeCom AI bot ----------------------------------------------------------------------------

    async def _ask_ai(self, message: Message) -> None:
        response_url = (await self.http.post(f"{self.sim}/__sim__/wecom-ai/response-url", json={})).json()
        payload = self.ai.message_payload(
            message.user, message.text, response_url["response_url"], msg_id=message.inbound.msg_id
        )
        params, body = self.ai.signed(payload)

        def on_ok(response: httpx.Response) -> None:
            reply = self.ai.open_reply(response, nonce=params["nonce"])
            stream = reply.get("stream") or {}
            if stream.get("finish") and stream.get("content") == texts.TOO_MANY_STREAMS_TEXT:
                message.busy = True  # refused (not queued): the user has three unfinished answers, botgw says
                return
            message.stream_ids.add(str(stream.get("id", "")))
            self._see(message, stream)

        await self._callback(message, "/callback/ai", {"params": params, "content": body}, on_ok)
        if not message.stream_ids:
            return
        stream_id = sorted(message.stream_ids)[0]
        turn = self.rng.randrange(len(self.gateways))
        while message.finished_at is None and time.monotonic() < self.follow_until:
            await asyncio.sleep(AI_REFRESH_S)
            turn += 1
            params, body = self.ai.signed(self.ai.refresh_payload(message.user, stream_id))
            url = f"{self.gateways[turn % len(self.gateways)]}/callback/ai"
            try:
                response = await self.http.post(url, params=params, content=body, timeout=CALLBACK_TIMEOUT_S)
                reply = self.ai.open_reply(response, nonce=params["nonce"])
            except Exception:  # a gateway down, Redis restarting: WeCom just refreshes again
                self.refresh_failures += 1
                continue
            self._see(message, reply.get("stream") or {})

    @staticmethod
    def _see(message: Message, stream: dict[str, Any]) -> None:
        content = str(stream.get("content", ""))
        if not message.shown or content != message.shown[-1]:
            message.shown.append(content)
        if stream.get("finish") and message.finished_at is None:
            message.finished_at = time.time()

    # -- DingTalk --------------------------------------------------------------------------------

    async def _payload(self, message: Message) -> dict[str, Any]:
        """The robot message as DingTalk sends it, with a sessionWebhook the simulator issued for it."""
        conversation = message.inbound.conversation_id
        session = {"conversation": conversation, "user": message.user, "group": bool(message.group)}
        response = await self.http.post(
            f"{self.sim}/__sim__/dingtalk/session", json={**session, "ttl_s": message.webhook_ttl_s}
        )
        response.raise_for_status()
        bot, webhook, group = self.ding[message.bot_id], response.json(), bool(message.group)
        text = message.text
        payload = robot_payload(bot, message.user, text, conversation=conversation, group=group, webhook=webhook)
        payload["msgId"] = message.inbound.msg_id
        return payload

    async def _ding_http(self, message: Message) -> None:
        payload = await self._payload(message)
        timestamp = str(int(time.time() * 1000))
        secret = self.ding["ding-http"].app_secret.get_secret_value()
        headers = {"timestamp": timestamp, "sign": sign(timestamp, secret), "content-type": "application/json"}
        body = json.dumps(payload, ensure_ascii=False).encode()
        await self._callback(message, "/callback/ding-http", {"content": body, "headers": headers})

    async def _ding_stream(self, message: Message) -> None:
        payload = await self._payload(message)
        await self.stream_open.wait()
        self.pushing += 1
        try:
            message.sent_at = time.time()
            body = {"client_id": self.ding["ding-stream"].app_key, "payload": payload}
            response = await self.http.post(f"{self.sim}/__sim__/dingtalk/stream/push", json=body)
            response.raise_for_status()
        finally:
            self.pushing -= 1


# --------------------------------------------------------------------------- faults


@dataclass
class FaultRecord:
    at: float  # seconds after the traffic started
    kind: str
    detail: str
    failed: bool = False

    @property
    def text(self) -> str:
        return f"FAILED: {self.detail}" if self.failed else self.detail


class Faults:
    """Kills and restarts processes and injects platform faults, on a schedule; keeps a log of what it did."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.stack = soak.stack
        self.rng = random.Random(soak.args.seed + 1)
        self.log: list[FaultRecord] = []
        self.restarting: set[str] = set()  # children being restarted: not dead, as far as the watchdog cares
        self.incarnations: Counter[str] = Counter()
        self.engine_kills = 0
        self.engines_starting: dict[str, float] = {}  # engine -> monotonic time of its restart
        # each worker SIGKILL: its wall-clock time (the simulator's clock) and the lanes the worker held then
        self.worker_kills: list[tuple[float, set[str]]] = []
        self.watchers: set[asyncio.Task[None]] = set()

    @staticmethod
    def lane(kind: str) -> str:
        """Faults of a lane happen one after another; the three lanes run side by side."""
        return "engine" if kind == "kill-engine" else "platform" if kind in PLATFORM_FAULTS else "process"

    def schedule(self, faults: dict[str, int], duration_s: float) -> list[tuple[float, str]]:
        """Fault times. Process faults and platform faults: each lane shuffled into even slots between 5% and 85%
        of the run. Engine kills at 10% (and 60%): a restarted engine takes a minute or two to come back."""
        lanes: dict[str, list[str]] = defaultdict(list)
        for kind, count in faults.items():
            lanes[self.lane(kind)] += [kind] * count
        timed = [(duration_s * (0.10 + 0.50 * i), kind) for i, kind in enumerate(lanes.pop("engine", []))]
        for kinds in lanes.values():
            self.rng.shuffle(kinds)
            timed += [(duration_s * (0.05 + 0.80 * (i + 0.5) / len(kinds)), kind) for i, kind in enumerate(kinds)]
        return sorted(timed)

    async def run(self, schedule: list[tuple[float, str]], t0: float) -> None:
        """Each lane on its own, so that a slow restart does not hold the platform faults back."""
        lanes: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for item in schedule:
            lanes[self.lane(item[1])].append(item)
        await asyncio.gather(*(self._run(items, t0) for items in lanes.values()))

    async def _run(self, schedule: list[tuple[float, str]], t0: float) -> None:
        for number, (at, kind) in enumerate(schedule):
            # A lane that fell behind (a restart took long) still leaves the system a moment between two faults.
            await asyncio.sleep(max(MIN_FAULT_GAP_S if number else 0.0, t0 + at - time.monotonic()))
            started = time.monotonic() - t0
            try:
                record = FaultRecord(started, kind, await self._do(kind))
            except Broken:
                raise
            except Exception as exc:
                record = FaultRecord(started, kind, f"{type(exc).__name__}: {exc}", failed=True)
            self.note(record)

    def note(self, record: FaultRecord) -> None:
        self.log.append(record)
        print(f"  {record.at:6.1f} s  {record.kind:14} {record.text}", flush=True)

    async def _do(self, kind: str) -> str:
        if kind in PLATFORM_FAULTS:
            platform, fault = PLATFORM_FAULTS[kind]
            response = await self.soak.http.post(f"{self.soak.sim_url}/__sim__/{platform}/faults", json=fault)
            response.raise_for_status()
            what = ", ".join(f"{key} {value}" for key, value in fault.items())
            return f"the next sends of {platform} answer: {what}"
        return await getattr(self, kind.replace("-", "_"))()

    def dead(self) -> list[str]:
        """Children that exited without being told to (not being restarted)."""
        return [
            f"{name} exited with {child.popen.returncode}:\n{child.tail()}"
            for name, child in list(self.stack.procs.items())
            if name not in self.restarting and not child.alive()
        ]

    # -- processes -------------------------------------------------------------------------------

    def _start(self, name: str, args: list[str], env: dict[str, str] | None) -> Proc:
        """Start a child again (its log directory too, should something have removed it meanwhile)."""
        self.stack.log_dir.mkdir(parents=True, exist_ok=True)
        return self.stack.start(name, args, env)

    async def _stop(self, name: str, sig: int, timeout: float) -> tuple[Proc, float]:
        """Signal a child's whole session and wait for it to exit (in a thread: the loop keeps running)."""
        child = self.stack.procs[name]
        if sig == signal.SIGKILL and name in WORKERS:
            held = set(await self.soak.lanes_of(self.consumer(name)))
            self.worker_kills.append((time.time(), held))
        started = time.monotonic()
        child.kill(sig)
        await asyncio.to_thread(child.wait, timeout)
        return child, time.monotonic() - started

    def worker_args(self, name: str) -> list[str]:
        """A worker's command line, with a new consumer name for each incarnation (easier to follow in logs)."""
        self.incarnations[name] += 1
        return worker_args(self.soak.config_path, self.consumer(name))

    def consumer(self, name: str) -> str:
        return f"soak-{name}-{self.incarnations[name]}"

    async def _restart_worker(self, name: str, sig: int, timeout: float) -> str:
        self.restarting.add(name)
        try:
            old_consumer = self.consumer(name)
            old, took = await self._stop(name, sig, timeout)
            try:
                offset = old.log_path.stat().st_size
            except OSError:  # removed meanwhile (another test session clearing test-artifacts/logs)
                offset = 0
            child = self._start(name, self.worker_args(name), None)
            up = await self.soak.wait_log(child, "worker started", RESTART_READY_S, offset)
        finally:
            self.restarting.discard(name)
        return f"{old_consumer} exited after {took:.1f} s; {self.consumer(name)} up {up:.1f} s later"

    async def _busiest_worker(self, patience_s: float) -> tuple[str, int]:
        """The worker holding the most messages right now (ties drawn), waiting up to `patience_s` for one to hold
        any: a fault on a worker with work in hand is the one that can lose or double something."""
        deadline = time.monotonic() + patience_s
        while True:
            names = [w for w in WORKERS if w not in self.restarting]
            held = {w: await self.soak.leases_of(self.consumer(w)) for w in names}
            most = max(held.values())
            if most or time.monotonic() > deadline:
                return self.rng.choice([w for w in names if held[w] == most]), most
            await asyncio.sleep(0.05)

    async def kill_worker(self) -> str:
        name, held = await self._busiest_worker(3.0)
        detail = await self._restart_worker(name, signal.SIGKILL, 5)
        return f"SIGKILL {name} holding {held} message(s): {detail}"

    async def term_worker(self) -> str:
        name, held = await self._busiest_worker(10.0)
        drain = float(self.soak.config["worker"]["drain_s"])
        detail = await self._restart_worker(name, signal.SIGTERM, drain + 15)
        return f"SIGTERM {name} holding {held} message(s) (mid-answer): {detail}"

    async def kill_gateway(self) -> str:
        name = self.rng.choice(GATEWAYS)
        self.restarting.add(name)
        try:
            old, _ = await self._stop(name, signal.SIGKILL, 5)
            await asyncio.sleep(1.0)  # the platforms' callers meanwhile fail over to the other gateway
            child = self._start(name, old.args, old.env)
            url = self.soak.gateway_urls[GATEWAYS.index(name)]
            started = time.monotonic()
            await self.soak.wait_up(child, lambda: http_ok(self.soak.http, f"{url}/healthz"), RESTART_READY_S)
        finally:
            self.restarting.discard(name)
        return f"SIGKILL {name}; started again after 1 s, listening {time.monotonic() - started:.1f} s later"

    async def restart_redis(self) -> str:
        """SIGTERM redis-server (it fsyncs its AOF and exits) and start it again on the same files."""
        before = await self.soak.counter("enqueued")
        self.restarting.add("redis")
        try:
            old, took = await self._stop("redis", signal.SIGTERM, 20)
            started = time.monotonic()
            child = self._start("redis", old.args, old.env)
            await self.soak.wait_up(child, self.soak.redis.ping, RESTART_READY_S)
            down = took + time.monotonic() - started
        finally:
            self.restarting.discard("redis")
        after = await self.soak.counter("enqueued")
        if after < before:
            raise RuntimeError(f"Redis came back without acknowledged work: enqueued {before} before, {after} after")
        return f"SIGTERM redis-server, started again on its AOF: down {down:.1f} s; entries enqueued {before} → {after}"

    async def drop_stream(self) -> str:
        """Close every Stream connection; pushes pause meanwhile (DingTalk discards a push with nowhere to go)."""
        traffic, http, sim = self.soak.traffic, self.soak.http, self.soak.sim_url
        app_key = traffic.ding["ding-stream"].app_key
        traffic.stream_open.clear()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the frames already pushed reach the connection first
                stats = (await http.get(f"{sim}/__sim__/dingtalk/stream/stats")).json()
                if traffic.pushing == 0 and stats["pending"] == 0:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            opened = stats["opened"]
            dropped = (await http.post(f"{sim}/__sim__/dingtalk/stream/drop")).json()["dropped"]
            started = time.monotonic()
            while True:
                stats = (await http.get(f"{sim}/__sim__/dingtalk/stream/stats")).json()
                if stats["opened"] > opened and stats["live"].get(app_key, 0) >= 1:
                    break
                if time.monotonic() - started > RESTART_READY_S:
                    raise RuntimeError(f"botgw dingtalk-stream did not reconnect: {stats}")
                await asyncio.sleep(0.05)
        finally:
            traffic.stream_open.set()
        return f"dropped {dropped} Stream connection(s); reconnected in {time.monotonic() - started:.1f} s"

    async def kill_engine(self) -> str:
        """SIGKILL one engine (alternately) once both are up, then start it again; it warms up in the background."""
        urls = self.soak.engine_urls
        deadline = self.soak.t0 + 0.95 * self.soak.args.duration_s
        while not all([await self.soak.engine_up(url) for url in urls]):
            if time.monotonic() > deadline:
                return "skipped: the other engine was not up, and killing the only one would stop every answer"
            await asyncio.sleep(1.0)
        index = self.engine_kills % len(ENGINES)
        self.engine_kills += 1
        name, url = ENGINES[index], urls[index]
        running = await self.soak.engine_running(url)
        self.restarting.add(name)
        try:
            old, _ = await self._stop(name, signal.SIGKILL, 10)
            self._start(name, old.args, old.env)
        finally:
            self.restarting.discard(name)
        self.engines_starting[name] = time.monotonic()
        watcher = asyncio.create_task(self._engine_back(name, url))
        self.watchers.add(watcher)
        return f"SIGKILL {name} with {running} request(s) running; started again (vLLM takes a minute or more)"

    async def _engine_back(self, name: str, url: str) -> None:
        while not await self.soak.engine_up(url):
            await asyncio.sleep(1.0)
        took = time.monotonic() - self.engines_starting.pop(name)
        detail = f"{name} up {took:.0f} s after its restart"
        self.note(FaultRecord(time.monotonic() - self.soak.t0, "engine-back", detail))

    def still_starting(self) -> None:
        """Note the engines whose restart had not finished when the run ended (the other engine served alone)."""
        for name, since in self.engines_starting.items():
            detail = f"{name} still starting at the end, {time.monotonic() - since:.0f} s after its restart"
            self.log.append(FaultRecord(time.monotonic() - self.soak.t0, "engine-back", detail))


# --------------------------------------------------------------------------- the run

LEASES_KEY = Keys(NAMESPACE).scheduler_leases  # the scheduler's set of held leases (gateway/queue/scheduler.py)


@dataclass
class Results:
    messages: list[Message]
    faults: list[FaultRecord]
    counters: dict[str, int]  # the scheduler's: enqueued, handled, takeovers
    stream: dict[str, Any]  # the simulated Stream gateway's own counts
    notices: Counter[str]  # notices delivered outside any answer (the engine is starting)
    strangers: list[str]  # deliveries that are neither a message's answer nor a notice
    dead_letters: list[str]
    memory: Counter[str]  # per answered engine question: its token in its session's memory once, missing, more
    ai_record_mismatch: int  # AI-bot streams whose final text is not the reply record's (a notice appended, say)
    queue_left: int
    refresh_failures: int
    started_s: float  # until the traffic began (process and engine start)
    wall_s: float


class Soak:
    """One run: the processes, the traffic, the faults, the drain and the count."""

    def __init__(self, args: argparse.Namespace, stack: Stack) -> None:
        self.args = args
        self.stack = stack
        self.ports = {name: free_port() for name in ("redis", "simulator", *GATEWAYS, *ENGINES)}
        self.engine_urls = [f"http://127.0.0.1:{self.ports[name]}" for name in ENGINES]
        self.gateway_urls = [f"http://127.0.0.1:{self.ports[name]}" for name in GATEWAYS]
        self.sim_url = f"http://127.0.0.1:{self.ports['simulator']}"
        redis_url = f"redis://127.0.0.1:{self.ports['redis']}/0"
        self.config = soak_config(redis_url, self.engine_urls, self.sim_url, args.max_tokens)
        self.config_path = stack.write_config(self.config)
        self.keys = Keys(NAMESPACE)
        self.redis = Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
        self.faults = Faults(self)
        self.t0 = math.inf
        self.admin_urls: list[str] = []

    async def run(self) -> Results:
        began = time.monotonic()
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=32)
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=3.0), limits=limits) as http:
                self.http = http
                await self.start()
                started_s = time.monotonic() - began
                rng = random.Random(self.args.seed)
                self.traffic = Traffic(http, self.config, self.gateway_urls, self.sim_url, rng)
                messages = plan(self.args)
                main = asyncio.create_task(self.traffic_and_drain(messages))
                watchdog = asyncio.create_task(self.watch())
                try:
                    await asyncio.wait({main, watchdog}, return_when=asyncio.FIRST_COMPLETED)
                    if watchdog.done():
                        watchdog.result()  # raises Broken: a process died that nobody killed
                    queue_left = main.result()
                finally:
                    for task in (main, watchdog, *self.traffic.background, *self.faults.watchers):
                        task.cancel()
                    await asyncio.gather(main, watchdog, return_exceptions=True)
                self.faults.still_starting()
                return await self.collect(messages, queue_left, started_s, time.monotonic() - began)
        finally:
            await self.redis.aclose()

    # -- start-up --------------------------------------------------------------------------------

    async def start(self) -> None:
        stack, path, ports = self.stack, self.config_path, self.ports
        data = stack.log_dir / "redis-data"
        data.mkdir(exist_ok=True)
        stack.start_redis(ports["redis"], "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(data))
        for name in ENGINES:
            stack.start_engine(ports[name], name)
        stack.start("simulator", simulator_args(path, ports["simulator"]))
        for name in GATEWAYS:
            serve, admin_url = gateway_args(path, ports[name])
            stack.start(name, serve)
            self.admin_urls.append(admin_url)
        for name in WORKERS:
            stack.start(name, self.faults.worker_args(name))
        stack.start("stream", [*BOTGW, "dingtalk-stream", "--config", str(path)])

        children, http = stack.procs, self.http
        await wait_ready(stack, children["redis"], self.redis.ping, SERVER_START_S)
        await wait_ready(stack, children["simulator"], lambda: http_ok(http, f"{self.sim_url}/__sim__/healthz"), 60)
        for name, url in zip(GATEWAYS, self.gateway_urls, strict=True):
            await wait_ready(stack, children[name], lambda url=url: http_ok(http, f"{url}/healthz"), SERVER_START_S)
        for name in WORKERS:
            child = children[name]

            async def started(child: Proc = child) -> bool:
                return b"worker started" in child.log_path.read_bytes()

            await wait_ready(stack, child, started, SERVER_START_S)
        app_key = next(bot for bot in self.config["bots"] if bot["id"] == "ding-stream")["app_key"]

        async def connected() -> bool:
            stats = (await http.get(f"{self.sim_url}/__sim__/dingtalk/stream/stats")).json()
            return stats["live"].get(app_key, 0) >= 1

        await wait_ready(stack, children["stream"], connected, SERVER_START_S)
        print(f"servers up; waiting for both engines (logs in {stack.log_dir}) ...", flush=True)
        for name, url in zip(ENGINES, self.engine_urls, strict=True):
            await wait_ready(stack, children[name], lambda url=url: http_ok(http, f"{url}/health"), ENGINE_START_S)
        for name, url in zip(GATEWAYS, self.admin_urls, strict=True):
            await wait_ready(stack, children[name], lambda url=url: http_ok(http, f"{url}/readyz"), SERVER_START_S)

    async def wait_up(self, child: Proc, probe: Callable[[], Awaitable[Any]], timeout: float) -> None:
        """Like bench.common.wait_ready, for a restarted child while others may be down for a fault."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not child.alive():
                raise Broken(f"{child.name} exited with {child.popen.returncode} after a restart:\n{child.tail()}")
            with contextlib.suppress(Exception):
                if await probe():
                    return
            await asyncio.sleep(0.1)
        raise Broken(f"{child.name} not up {timeout:.0f} s after a restart:\n{child.tail()}")

    async def wait_log(self, child: Proc, text: str, timeout: float, offset: int = 0) -> float:
        """Until `text` shows up in the child's log after `offset` (where this incarnation's part begins); seconds."""
        started = time.monotonic()

        async def logged() -> bool:
            with child.log_path.open("rb") as log:
                log.seek(offset if child.log_path.stat().st_size >= offset else 0)  # 0: the file was made anew
                return text.encode() in log.read()

        await self.wait_up(child, logged, timeout)
        return time.monotonic() - started

    async def watch(self) -> None:
        """Raise Broken as soon as a process dies that no fault killed (a crash is a finding, not noise)."""
        while True:
            await asyncio.sleep(1.0)
            dead = self.faults.dead()
            if dead:
                raise Broken(f"a process died on its own: {dead[0]}")

    # -- traffic ---------------------------------------------------------------------------------

    async def traffic_and_drain(self, messages: list[Message]) -> int:
        args = self.args
        schedule = self.faults.schedule(args.faults, args.duration_s)
        self.t0 = time.monotonic()
        end = self.t0 + args.duration_s + args.drain_s
        self.traffic.follow_until = end
        print(
            f"traffic: {len(messages)} messages over {args.duration_s:g} s, {len(schedule)} faults; "
            f"then up to {args.drain_s:g} s for the queue to drain",
            flush=True,
        )
        senders = [asyncio.create_task(self.traffic.send(message, self.t0)) for message in messages]
        faults = asyncio.create_task(self.faults.run(schedule, self.t0))
        try:
            await asyncio.wait(senders, timeout=max(1.0, end - time.monotonic()) + CALLBACK_GIVE_UP_S)
            await asyncio.wait_for(faults, timeout=max(1.0, end - time.monotonic()) + 60)
        finally:
            for task in (*senders, faults):
                task.cancel()
        print(f"sent everything after {time.monotonic() - self.t0:.0f} s; draining ...", flush=True)
        return await self.drain(messages, end)

    async def drain(self, messages: list[Message], end: float) -> int:
        """Until the queue is empty, nothing is leased, no Stream frame is pending, no retry is on its way and every
        AI-bot user saw its answer; or `end`. Then a quiet SETTLE_S, in which a late duplicate would show."""
        while True:
            left = await self.queue_left()
            stats = (await self.http.get(f"{self.sim_url}/__sim__/dingtalk/stream/stats")).json()
            following = any(m.stream_ids and m.finished_at is None for m in messages if m.channel == "wecom-ai")
            if left == 0 and stats["pending"] == 0 and not following and not self.traffic.background:
                break
            if time.monotonic() > end:
                break
            await asyncio.sleep(POLL_S)
        await asyncio.sleep(SETTLE_S)
        return await self.queue_left()

    # -- Redis and engines, as seen from outside -------------------------------------------------

    async def _redis(self, call: Callable[[], Awaitable[Any]], default: Any = None, patience_s: float = 15.0) -> Any:
        """A read of botgw's Redis that waits out a restart (the soak restarts it)."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                return await call()
            except (RedisError, OSError):
                if time.monotonic() > deadline:
                    return default
                await asyncio.sleep(0.2)

    async def counter(self, name: str) -> int:
        return int(await self._redis(lambda: self.redis.hget(self.keys.scheduler_stats, name), 0) or 0)

    async def queue_left(self) -> int:
        """Entries enqueued and not yet handled (answered, or dead-lettered)."""
        values = await self._redis(lambda: self.redis.hmget(self.keys.scheduler_stats, "enqueued", "handled"))
        enqueued, handled = values or (0, 0)
        return int(enqueued or 0) - int(handled or 0)

    async def leases_of(self, consumer: str) -> int:
        """Messages the worker `consumer` holds a lease on right now."""
        return len(await self.lanes_of(consumer))

    async def lanes_of(self, consumer: str) -> list[str]:
        """The lanes whose head the worker `consumer` holds a lease on right now."""
        try:
            lanes = [lane.decode() for lane in await self.redis.zrange(LEASES_KEY, 0, -1)]
            pipe = self.redis.pipeline(transaction=False)
            for lane in lanes:
                pipe.hget(self.keys.lease(lane), "owner")
            owners = await pipe.execute()
        except (RedisError, OSError):
            return []
        return [lane for lane, owner in zip(lanes, owners, strict=True) if owner and owner.decode() == consumer]

    async def engine_up(self, url: str) -> bool:
        try:
            return await http_ok(self.http, f"{url}/health")
        except httpx.HTTPError:
            return False

    async def engine_running(self, url: str) -> int:
        try:
            text = (await self.http.get(f"{url}/metrics", timeout=5)).text
        except httpx.HTTPError:
            return 0
        prefix = "vllm:num_requests_running{"
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)))

    # -- the count -------------------------------------------------------------------------------

    async def collect(self, messages: list[Message], queue_left: int, started_s: float, wall_s: float) -> Results:
        http, sim = self.http, self.sim_url
        wecom = await wecom_messages(http, sim)
        ding = await dingtalk_messages(http, sim)
        stream = (await http.get(f"{sim}/__sim__/dingtalk/stream/stats")).json()

        pipe = self.redis.pipeline(transaction=False)
        for message in messages:
            pipe.hgetall(self.keys.reply(message.inbound.dedup_key))
            pipe.exists(self.keys.dedup(message.inbound.dedup_key))
        replies = await pipe.execute()
        for message, record, queued in zip(messages, replies[::2], replies[1::2], strict=True):
            fields = {key.decode(): value.decode(errors="replace") for key, value in record.items()}
            message.answer = fields.get("text")
            message.record_state = fields.get("state", "")
            message.queued = bool(queued)
        lanes = sorted({Scope.of(message.inbound, "per_user").lane for message in messages})
        pipe = self.redis.pipeline(transaction=False)
        for lane in lanes:
            pipe.lrange(self.keys.memory(lane), 0, -1)
        memories = dict(zip(lanes, await pipe.execute(), strict=True))
        stats = await self.redis.hgetall(self.keys.scheduler_stats)
        counters = {key.decode(): int(value) for key, value in stats.items()}
        dead = await self.redis.xrange(self.keys.dead_letters)

        notices, strangers = match_deliveries(messages, wecom, ding)
        for message in messages:
            message.outcome = outcome(message)
        excuse_kill_repeats(messages, self.faults.worker_kills)
        return Results(
            messages=messages,
            faults=sorted(self.faults.log, key=lambda record: record.at),
            counters=counters,
            stream=stream,
            notices=notices,
            strangers=strangers,
            dead_letters=dead_letter_lines(dead, messages),
            memory=memory_check(messages, memories),
            ai_record_mismatch=sum(
                1 for m in messages if m.channel == "wecom-ai" and m.outcome == "once" and m.shown[-1] != m.answer
            ),
            queue_left=queue_left,
            refresh_failures=self.traffic.refresh_failures,
            started_s=started_s,
            wall_s=wall_s,
        )


def _plain(text: str) -> str:
    """A delivered text without the invisible marks that make a repeat unique for WeCom's duplicate check."""
    return text.rstrip(INVISIBLE_MARKS)


def match_deliveries(
    messages: list[Message], wecom: list[dict[str, Any]], ding: list[dict[str, Any]]
) -> tuple[Counter[str], list[str]]:
    """Give each delivery the simulator recorded to the message whose answer it is: same recipient (WeCom member,
    DingTalk user or group), same text as the reply record. Two messages of one recipient with the same answer
    share its deliveries in the order sent. Returns the notices delivered and the deliveries nobody's answer."""
    delivered: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for item in wecom:
        delivered[("wecom", item["touser"])].append((item["at"], _plain(item["content"])))
    for item in ding:
        address = item["conversation"] if item["group"] else item["user"]
        delivered[("dingtalk", address)].append((item["at"], _plain(item["content"])))
    expected: dict[tuple[str, str], dict[str, list[Message]]] = defaultdict(lambda: defaultdict(list))
    for message in messages:
        if message.channel != "wecom-ai" and message.answer is not None:
            platform = CHANNELS[message.channel][1]
            # the WeCom app answers in plain text (reply_format text): the record's Markdown, made readable
            sent = to_text(message.answer) if message.channel == "wecom" else message.answer
            expected[(platform, message.address)][_plain(sent)].append(message)
    notices: Counter[str] = Counter()
    strangers: list[str] = []
    plain_notices = {_plain(text): name for text, name in NOTICES.items()}
    for key, items in delivered.items():
        by_text = expected.get(key, {})
        for at, content in sorted(items):
            owners = by_text.get(content)
            if owners:
                # the first owner not yet answered, else the last one (a second delivery: answered twice)
                owner = next((m for m in sorted(owners, key=lambda m: m.sent_at) if not m.deliveries), owners[-1])
                owner.deliveries.append(at)
            elif content in plain_notices:
                notices[plain_notices[content]] += 1
            else:
                strangers.append(f"{key[0]} {key[1]}: {content[:80]!r}")
    return notices, strangers


def outcome(message: Message) -> str:
    """once, twice, lost; apart: a Stream push never queued (DingTalk never resends); refused: no 200, never."""
    accepted = message.acked if message.http else message.queued
    if message.channel == "wecom-ai":
        answered = message.finished_at is not None and bool(message.shown and message.shown[-1])
        backwards = any(not later.startswith(earlier) for earlier, later in itertools.pairwise(message.shown))
        twice = len(message.stream_ids) > 1 or backwards
    else:
        answered = bool(message.deliveries)
        twice = len(message.deliveries) > 1
        if message.answer is not None and utf8_len(message.answer) > 1900:
            message.error = message.error or "an answer in several pieces: not matched (keep --max-tokens small)"
            answered = False
    if twice:
        return "twice"
    if answered:
        return "once"
    if not accepted:
        return "refused" if message.http else "apart"
    return "lost"


def excuse_kill_repeats(messages: list[Message], kills: list[tuple[float, set[str]]]) -> None:
    """The one repeat the README allows: DingTalk has no duplicate check, so a worker SIGKILLed between a post and
    its sent-mark leaves the post to be made again by the worker that takes over. Each kill excuses at most one
    DingTalk answer delivered exactly twice, of a lane the killed worker held at the kill: its first delivery
    recorded within KILL_AFTER_POST_S before the kill (or up to DING_SEND_DELAY_S after it: a slow send the
    simulator records late), its second after the kill."""
    unused = sorted(kills, key=lambda kill: kill[0])
    for message in sorted(messages, key=lambda m: max(m.deliveries, default=0.0)):
        if message.outcome != "twice" or CHANNELS[message.channel][1] != "dingtalk" or len(message.deliveries) != 2:
            continue
        first, second = sorted(message.deliveries)
        lane = Scope.of(message.inbound, "per_user").lane
        at_kill = [kill for kill in unused if lane in kill[1] and second > kill[0]]
        kill = next((k for k in at_kill if k[0] - KILL_AFTER_POST_S <= first <= k[0] + DING_SEND_DELAY_S), None)
        if kill is not None:
            unused.remove(kill)
            message.outcome = "repeat"


def memory_check(messages: list[Message], memories: dict[str, list[bytes]]) -> Counter[str]:
    """The token of each answered engine question appears in exactly one user turn of its session's memory (the
    turn is committed with the answer, once per message): the question was asked and remembered once."""
    checked: Counter[str] = Counter()
    for message in messages:
        if message.outcome not in ANSWERED or message.text.startswith("/"):
            continue
        turns = [json.loads(item) for item in memories.get(Scope.of(message.inbound, "per_user").lane, [])]
        asked = [i for i, turn in enumerate(turns) if turn["role"] == "user" and message.token in turn["content"]]
        if not asked:
            checked["missing"] += 1  # an engine that failed for good: the notice is not remembered
        elif len(asked) > 1:
            checked["more than once"] += 1
        else:
            checked["once"] += 1
    return checked


def dead_letter_lines(dead: list[tuple[bytes, dict[bytes, bytes]]], messages: list[Message]) -> list[str]:
    by_msg_id = {message.inbound.msg_id: message.token for message in messages}
    lines = []
    for _, fields in dead:
        letter = json.loads(fields.get(b"entry", b"{}"))
        msg_id = str(((letter.get("entry") or {}).get("msg") or {}).get("msg_id", ""))
        lines.append(f"{by_msg_id.get(msg_id, msg_id)}: {str(letter.get('reason', ''))[:160]}")
    return lines


# --------------------------------------------------------------------------- report


@dataclass
class Row:
    name: str
    sent: int = 0
    retries: int = 0
    accepted: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    def add(self, message: Message) -> None:
        self.sent += 1
        self.retries += message.retries
        self.accepted += message.acked if message.http else message.queued
        self.outcomes[message.outcome] += 1
        if (latency := message.latency) is not None:
            self.latencies.append(latency)

    def cells(self) -> list[str]:
        o = self.outcomes
        return [
            self.name,
            str(self.sent),
            str(self.retries),
            str(self.accepted),
            str(o["once"]),
            str(o["twice"]),
            str(o["repeat"]),
            str(o["lost"]),
            str(o["apart"]),
            *(ms(percentile(self.latencies, pct), 0) for pct in (50, 99)),
        ]


def totals(results: Results) -> Row:
    row = Row("all")
    for message in results.messages:
        row.add(message)
    return row


def command_line(args: argparse.Namespace) -> str:
    return shlex.join(
        [
            ".venv/bin/python",
            "bench/soak.py",
            "--profile",
            args.profile,
            "--messages",
            str(args.messages),
            "--duration-s",
            f"{args.duration_s:g}",
            "--users",
            str(args.users),
            "--seed",
            str(args.seed),
            "--retry-share",
            f"{args.retry_share:g}",
            "--max-tokens",
            str(args.max_tokens),
        ]
    )


def report(args: argparse.Namespace, results: Results) -> bool:
    """Print the table, the faults and the checks; True if something broke (twice, lost, not accepted...)."""
    messages = results.messages
    rows = {channel: Row(CHANNEL_NAMES[channel]) for channel in CHANNELS}
    for message in messages:
        rows[message.channel].add(message)
    total = totals(results)
    faults = [record for record in results.faults if record.kind != "engine-back"]
    print()
    print(
        f"botgw soak: 2 gateways, 3 workers, redis-server (AOF, fsync every second), 2 tiny vLLM CPU engines "
        f"(max_tokens {args.max_tokens}, temperature 0), the simulator, 1 dingtalk-stream process; "
        f"{os.cpu_count()} cores shared by everything"
    )
    print(
        f"{total.sent} messages from {args.users} users over {args.duration_s:g} s (seed {args.seed}); "
        f"{args.retry_share:.0%} of the HTTP callbacks delivered again as platform retries; {len(faults)} faults; "
        f"processes and engines took {results.started_s:.0f} s to start"
    )
    print(
        "answered: the simulator recorded the answer's delivery (WeCom app, DingTalk), or a refresh showed the "
        "stream finished (AI bot); latency: callback or Stream push sent -> that delivery"
    )
    print()
    header = ["channel", "sent", "retries", "accepted", "answered once", "twice", "repeat (kill)", "lost", "apart"]
    header += ["p50 ms", "p99 ms"]
    print(table(header, [*(row.cells() for row in rows.values()), total.cells()]))
    print("apart: DingTalk Stream pushes never queued (no live connection to push into); DingTalk never resends them")
    print(
        "repeat (kill): a DingTalk answer sent again because a worker was SIGKILLed between its post and its mark "
        "(DingTalk has no duplicate check; the README allows one repeat per such kill)"
    )
    print()

    acks = sum(m.acks for m in messages if m.http)
    enqueued = results.counters.get("enqueued", 0)
    suppressed = acks + int(results.stream.get("acked", 0)) - enqueued
    failovers = sum(m.failovers for m in messages)
    print(
        f"duplicates suppressed: {suppressed} (callbacks answered 200: {acks}, Stream frames acked: "
        f"{results.stream.get('acked', 0)}, entries queued: {enqueued}); sends again after a failed callback "
        f"(gateway down, Redis restarting): {failovers}; AI-bot refreshes that failed and were repeated: "
        f"{results.refresh_failures}"
    )
    print(
        f"worker takeovers of a stalled message: {results.counters.get('takeovers', 0)}; "
        f"notices outside an answer: {dict(results.notices) or 0}; dead letters: {len(results.dead_letters)}; "
        f"Stream connections opened: {results.stream.get('opened', 0)}, frames unacked: "
        f"{results.stream.get('unacked', 0)}, pushed with no connection: {results.stream.get('dropped_offline', 0)}"
    )
    memory = results.memory
    print(
        f"memory cross-check (token -> one user turn): once {memory['once']}, missing {memory['missing']}, "
        f"more than once {memory['more than once']}; AI-bot streams ending other than the reply record: "
        f"{results.ai_record_mismatch}; queue left at the end: {results.queue_left}"
    )
    for line in results.dead_letters[:5]:
        print(f"  dead letter {line}")
    print()
    print(f"faults ({len(faults)}), seconds after the traffic started:")
    for record in results.faults:
        print(f"  {record.at:6.1f}  {record.kind:14} {record.text}")
    print()

    busy = [m for m in messages if m.outcome == "lost" and m.busy and not m.stream_ids]
    if busy:
        users = sorted({m.user for m in busy})
        print(
            f"of the lost, {len(busy)} WeCom AI-bot question(s) of {', '.join(users)} were answered at once with "
            f"{texts.TOO_MANY_STREAMS_TEXT!r} and never queued, although each soak user asks only after its "
            "previous answer finished"
        )
    twice, lost = total.outcomes["twice"], total.outcomes["lost"]
    failed_faults = [record for record in results.faults if record.failed]
    problems = {
        "answered twice": twice,
        "lost": lost,
        "not accepted": total.sent - total.accepted,
        "deliveries nobody's answer": len(results.strangers),
        "memory more than once": memory["more than once"],
        "faults that failed": len(failed_faults),
    }
    broken = any(problems.values())
    print(
        "checks: "
        + ", ".join(f"{name} {count}" for name, count in problems.items())
        + (" -> BROKEN" if broken else " -> OK")
    )
    for message in messages:
        if message.outcome in ("twice", "repeat", "lost", "refused", "apart") or message.error:
            print(f"  {describe(message)}")
    for stranger in results.strangers[:10]:
        print(f"  delivered, nobody's answer: {stranger}")
    print(f"command: {command_line(args)}")
    print(f"run time: {results.wall_s:.0f} s")
    return broken


def describe(message: Message) -> str:
    """One message's story, for the lines under the checks (grep its token in the logs)."""
    parts = [
        f"{message.outcome or '?'}: {message.token} {message.channel} {message.user}",
        f"group {message.group}" if message.group else "",
        f"sent at t={message.at:.1f} s" + (f", retried {message.retry}" if message.retry else ""),
        f"200s {message.acks}, failovers {message.failovers}" if message.http else f"queued {message.queued}",
        f"record {message.record_state or 'none'}",
        f"deliveries {len(message.deliveries)}"
        if message.channel != "wecom-ai"
        else (f"streams {len(message.stream_ids)}, finished {message.finished_at is not None}, busy {message.busy}"),
        f"refused {message.refusal}" if message.refusal else "",
        "gave up" if message.gave_up else "",
        f"error {message.error}" if message.error else "",
    ]
    return "; ".join(part for part in parts if part)


# --------------------------------------------------------------------------- main


async def run_soak(args: argparse.Namespace, stack: Stack) -> Results:
    """The whole soak in `stack` (the caller stops it): start, traffic and faults, drain, count."""
    return await Soak(args, stack).run()


async def benchmark(args: argparse.Namespace, stack: Stack) -> bool:
    return report(args, await run_soak(args, stack))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full", help="defaults for the rest")
    parser.add_argument("--messages", type=int, default=None, help="messages in all (full 400, short 64)")
    parser.add_argument("--duration-s", type=float, default=None, help="seconds the messages are spread over")
    parser.add_argument("--users", type=int, default=None, help="users across the four bots (full 48)")
    parser.add_argument("--drain-s", type=float, default=None, help="longest wait for the queue to drain")
    parser.add_argument("--seed", type=int, default=1, help="draws the messages and the fault schedule")
    parser.add_argument("--retry-share", type=float, default=0.3, help="HTTP callbacks delivered again (0.3)")
    parser.add_argument("--max-tokens", type=int, default=16, help="engine.max_tokens (16)")
    parser.add_argument("--time-limit", type=float, default=None, help="stop and fail after this many seconds")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs and config")
    parser.add_argument("--log-dir", default=None, help="the processes' logs and config here (kept), not in a temp dir")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    for name in ("messages", "duration_s", "users", "drain_s"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(profile, name))
    if args.time_limit is None:
        args.time_limit = profile.time_limit_s
    args.faults = dict(profile.faults)
    if min(args.messages, args.users) < 1 or args.duration_s <= 0 or args.drain_s <= 0:
        parser.error("--messages, --users, --duration-s and --drain-s must be positive")
    if not 0 <= args.retry_share <= 1 or not 1 <= args.max_tokens <= MAX_TOKENS_CAP:
        parser.error(f"--retry-share must be in [0, 1] and --max-tokens in [1, {MAX_TOKENS_CAP}]")
    return args


def main(argv: list[str] | None = None) -> int:
    return main_async(parse_args(argv), "botgw-soak-", benchmark, failures=(httpx.HTTPError, OSError, RedisError))


if __name__ == "__main__":
    sys.exit(main())
