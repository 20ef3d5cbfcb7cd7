"""DingTalk Stream mode: an outbound WebSocket that DingTalk pushes robot messages into.

dingtalk-stream provides the frame types (CallbackMessage, SystemMessage, AckMessage) used
here. Its client is not: it opens connections with blocking `requests` inside the event
loop, probes the local IP by routing toward a public address, pings without ever noticing
a missing pong (a silently dead connection is never replaced), retries at a fixed 10 s,
and reads its endpoint from a process-wide environment variable. So the connection loop
is ours: async connections/open, websockets' ping/pong timeout to detect a silent link,
reconnects with jittered backoff, and an ack only after the message is safely queued.

A SYSTEM `disconnect` is a hand-over, not a loss: DingTalk goes silent on that connection and closes it 10 s later
(S12 protocol.md: "disconnect: 用于网络连接优雅断开，避免直接断连接影响业务连续性"; "服务端在静默10s之后会主动断开
tcp 连接"), time to open the next connection first. The next one is opened at once (no backoff, not logged as a loss),
while the old one is still read until DingTalk closes it or its grace is over, so that the acks of the frames in hand
on it still go out. A robot message pushed while no connection is open is lost: DingTalk does not push it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote_plus

import httpx
import websockets
from dingtalk_stream.chatbot import ChatbotMessage
from dingtalk_stream.frames import AckMessage, CallbackMessage, Headers, SystemMessage

from bots.base import CallbackRejected, InboundMessage
from bots.dingtalk.buttons import CARD_CALLBACK_TOPIC, TrackIds, read_card_tap
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.models import parse_robot_message
from bots.safe_json import parse_json_object

log = logging.getLogger(__name__)

MessageSink = Callable[[InboundMessage], Awaitable[None]]
MAX_BACKOFF_S = 30.0
QUEUE_RETRY_DELAYS_S = (0.1, 0.3, 0.6, 1.0)  # about 2 s in all: well inside the ack window (UNCONFIRMED length)
# A robot message that could not be queued within the ack window is kept trying in the background (DingTalk never
# pushes it again): for this long, at most this many at once, doubling from 1 s up to 30 s between tries. A Redis
# restart that loads its AOF for a minute lost every message pushed meanwhile (found by a review).
LATE_QUEUE_FOR_S = 900.0
LATE_FIRST_DELAY_S = 1.0
MAX_LATE_MESSAGES = 1000
USER_AGENT = "botgw-dingtalk-stream/1"
# How long a connection DingTalk asked to reconnect is still read, at most: DingTalk closes it itself "10s" after its
# SYSTEM disconnect (S12 protocol.md, disconnect 请求处理; the module doc).
HANDOVER_GRACE_S = 10.0
STEADY_CONNECTION_S = 10.0  # a connection that lasted this long resets the reconnect backoff
FRAMES_IN_HAND_S = 5.0  # how long a connection being closed waits for the frames it read to be queued and acked


def _frame(raw: str | bytes) -> dict[str, Any] | None:
    """A frame as a dict, or None (logged) for one that is not a JSON object: skipped, never fatal."""
    try:
        return parse_json_object(raw, "frame")
    except CallbackRejected as exc:
        log.warning("skipped a dingtalk stream frame", extra={"size": len(raw), "reason": exc.reason})
        return None


def _asks_to_reconnect(frame: dict[str, Any]) -> bool:
    """Whether the frame is DingTalk's SYSTEM disconnect (the module doc: a hand-over; no ack is wanted)."""
    headers = frame.get("headers")
    return (frame.get("type") == SystemMessage.TYPE and isinstance(headers, dict)
            and headers.get("topic") == SystemMessage.TOPIC_DISCONNECT)  # fmt: skip


def _frame_data(data: Any) -> dict[str, Any]:
    """A CALLBACK frame's data: a JSON string, as DingTalk sends it, or an object already decoded."""
    if isinstance(data, dict):
        return data
    if isinstance(data, str):
        return parse_json_object(data, "frame data")
    raise CallbackRejected("malformed_frame", 400, "frame data is neither JSON text nor an object")


class StreamOpenError(Exception):
    """connections/open did not give an endpoint and ticket."""


def ack_frame(message_id: str, data: Any, code: int = AckMessage.STATUS_OK, text: str = "OK") -> str:
    ack = AckMessage()
    ack.code = code
    ack.headers.message_id = message_id
    ack.headers.content_type = Headers.CONTENT_TYPE_APPLICATION_JSON
    ack.message = text
    ack.data = data
    return json.dumps(ack.to_dict())


class DingTalkStreamConnection:
    """Keeps one bot's Stream connection alive and hands its messages to `sink` (the ingest path)."""

    def __init__(self, config: DingTalkBotConfig, http: httpx.AsyncClient, sink: MessageSink) -> None:
        self.config = config
        self.bot_id = config.id
        self._http = http
        self._sink = sink
        self._tracks = TrackIds(config.app_secret.get_secret_value())  # the question cards' (buttons.py)
        self.connections = 0
        self._readers: set[asyncio.Task[None]] = set()  # the open connections' readers (one, two in a hand-over)
        self._late: set[asyncio.Task[None]] = set()  # robot messages still being queued after their ack

    @property
    def connected(self) -> bool:
        """A socket is open and its pings are answered (exported by the Stream process). In a hand-over the old one
        counts until it is closed: DingTalk closes it 10 s after its disconnect, the next one being open by then."""
        return bool(self._readers)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._connect_until(stop)
        finally:  # stopped, or cancelled: what is still being queued is said, not left running unseen
            await self._end_late()

    async def _connect_until(self, stop: asyncio.Event) -> None:
        backoff = 1.0
        hurried = 0  # hand-overs in a row asked before their connection was steady
        draining: set[asyncio.Task[None]] = set()  # connections handed over, read until closed (module doc)
        try:
            while not stop.is_set():
                opened_at = math.inf
                try:
                    endpoint, ticket = await self._open()
                    uri = f"{endpoint}?ticket={quote_plus(ticket)}"
                    socket = await websockets.connect(
                        uri,
                        ping_interval=self.config.stream_ping_interval_s,
                        ping_timeout=self.config.stream_ping_timeout_s,
                        open_timeout=10,
                        close_timeout=2,
                    )
                    self.connections += 1
                    opened_at = time.monotonic()
                    log.info("dingtalk stream connected", extra={"bot_id": self.config.id})
                    if await self._serve_until_handed_over(socket, stop, draining):
                        steady = time.monotonic() - opened_at >= STEADY_CONNECTION_S
                        hurried = 0 if steady else hurried + 1
                        if steady:
                            backoff = 1.0
                        if hurried <= 1:
                            continue  # DingTalk asked for a new connection: opened now, the old one drains meanwhile
                        # asked again right after the last hand-over: not at once, or an endpoint that always asks
                        # would have botgw open connections (and drain old ones) in a loop
                        log.warning("dingtalk asked to reconnect right after connecting again; waiting",
                                    extra={"bot_id": self.config.id, "retry_in_s": backoff})  # fmt: skip
                except (OSError, TimeoutError, httpx.HTTPError, websockets.WebSocketException, StreamOpenError) as exc:
                    if time.monotonic() - opened_at >= STEADY_CONNECTION_S:
                        backoff, hurried = 1.0, 0  # a connection that served a while: lost, not refused
                    log.warning(
                        "dingtalk stream lost; reconnecting",
                        extra={"bot_id": self.config.id, "error": f"{type(exc).__name__}: {exc}",
                               "retry_in_s": backoff},
                    )
                except Exception as exc:  # anything else must not end the process: DingTalk does not resend what it
                    # pushed while no connection was open (its type and where it came from: its text may carry the
                    # ticket)
                    log.error(
                        "dingtalk stream failed unexpectedly; reconnecting",
                        extra={"bot_id": self.config.id, "error": type(exc).__name__, "retry_in_s": backoff,
                               "where": "".join(traceback.format_tb(exc.__traceback__))},
                    )
                if stop.is_set():
                    break
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(MAX_BACKOFF_S, backoff * 2)
        finally:  # stopped: each drained connection ends with its frames in hand; cancelled: they are cancelled too
            if draining and not stop.is_set():
                for task in draining:
                    task.cancel()
            await asyncio.gather(*draining, return_exceptions=True)

    async def _serve_until_handed_over(
        self, socket: websockets.ClientConnection, stop: asyncio.Event, draining: set[asyncio.Task[None]]
    ) -> bool:
        """Serve `socket` (which it then owns and closes) until stopped (False), the link is lost (raised), or DingTalk
        asks for a new connection (True): the socket's reader is then left in `draining`, to end on its own."""
        told = asyncio.Event()
        reader = asyncio.create_task(self._serve(socket, stop, told))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        asked = asyncio.create_task(told.wait())
        try:
            await asyncio.wait({reader, asked}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await socket.close()  # a reader cancelled before it ran never closed it
            raise
        finally:
            asked.cancel()
        if not told.is_set():
            reader.result()  # what ended it: a lost link raises
            return False
        if reader.done():
            self._handed_over(reader)
        else:
            draining.add(reader)
            reader.add_done_callback(draining.discard)
            reader.add_done_callback(self._handed_over)
        return True

    def _handed_over(self, reader: asyncio.Task[None]) -> None:
        """A connection DingTalk asked to replace has ended: how, if not as it should."""
        if not reader.cancelled() and (exc := reader.exception()) is not None:
            log.warning("a dingtalk stream connection being replaced failed",
                        extra={"bot_id": self.config.id, "error": type(exc).__name__})  # fmt: skip

    async def _end_late(self) -> None:
        """At shutdown: what is still being queued is lost with the process (DingTalk will not resend it): said."""
        if not self._late:
            return
        log.error("stopping with dingtalk messages not yet queued; DingTalk will not resend them",
                  extra={"bot_id": self.config.id, "messages": len(self._late)})  # fmt: skip
        for task in list(self._late):
            task.cancel()
        await asyncio.gather(*self._late, return_exceptions=True)

    async def _open(self) -> tuple[str, str]:
        body = {
            "clientId": self.config.app_key,
            "clientSecret": self.config.app_secret.get_secret_value(),
            "subscriptions": [
                {"type": "CALLBACK", "topic": ChatbotMessage.TOPIC},
                {"type": "CALLBACK", "topic": CARD_CALLBACK_TOPIC},  # taps on a question's buttons (buttons.py)
                {"type": "EVENT", "topic": "*"},
            ],
            "ua": USER_AGENT,
            "localIp": "",
        }
        response = await self._http.post(f"{self.config.api_base}/v1.0/gateway/connections/open", json=body)
        if response.status_code != 200:
            raise StreamOpenError(f"connections/open answered HTTP {response.status_code}")
        try:
            data = response.json()
        except ValueError:  # a proxy's or firewall's page answering 200: reconnect later, never end the process
            raise StreamOpenError("connections/open answered 200 without JSON") from None
        if not isinstance(data, dict) or not data.get("endpoint") or not data.get("ticket"):
            raise StreamOpenError("connections/open gave no endpoint or ticket")
        return str(data["endpoint"]), str(data["ticket"])

    async def _serve(self, socket: websockets.ClientConnection, stop: asyncio.Event, told: asyncio.Event) -> None:
        """Read frames until stopped, or the link is lost (raised); after DingTalk's SYSTEM disconnect (`told` is then
        set), until DingTalk closes the connection or HANDOVER_GRACE_S is over. Each frame is handled (and acked) in
        its own task, so that a burst of messages shares Redis round trips instead of waiting in line; a frame read in
        the same pass as the stop is still handled (DingTalk never pushes a robot message again). Then the frames in
        hand are given FRAMES_IN_HAND_S, and the socket is closed."""
        loop = asyncio.get_running_loop()
        stopping = asyncio.create_task(stop.wait())
        handling: set[asyncio.Task[None]] = set()
        receiving: asyncio.Task[str | bytes] | None = None
        grace_ends: float | None = None  # the loop's time when a handed-over connection is closed

        async def handle(frame: dict[str, Any]) -> None:
            reply = await self._route(frame)
            if reply:
                with contextlib.suppress(websockets.ConnectionClosed):  # its ack is lost with the link: nothing to do
                    await socket.send(reply)

        try:
            while True:
                receiving = asyncio.create_task(socket.recv())
                timeout = None if grace_ends is None else max(0.0, grace_ends - loop.time())
                done, _ = await asyncio.wait({receiving, stopping}, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if receiving not in done:  # stopped, or the hand-over's grace is over
                    break
                try:
                    frame = _frame(receiving.result())
                except websockets.ConnectionClosed:
                    if grace_ends is None:
                        raise
                    break  # DingTalk closed the connection it had replaced, as it said it would
                if frame is not None and _asks_to_reconnect(frame):
                    if grace_ends is None:
                        log.info("dingtalk asked to reconnect", extra={"bot_id": self.config.id})
                        grace_ends = loop.time() + HANDOVER_GRACE_S
                        told.set()
                elif frame is not None:
                    task = asyncio.create_task(handle(frame))
                    handling.add(task)
                    task.add_done_callback(handling.discard)
                if stopping in done:
                    break
        finally:
            stopping.cancel()
            if receiving is not None and not receiving.done():
                receiving.cancel()  # safe: websockets loses no data on a cancelled recv
            if handling:
                await asyncio.wait(handling, timeout=FRAMES_IN_HAND_S)
            await socket.close()

    async def _route(self, frame: dict[str, Any]) -> str | None:
        """The frame's ack, if any; a robot message is acked only once it is queued."""
        frame_type = frame.get("type")
        headers = frame.get("headers")
        headers = headers if isinstance(headers, dict) else {}
        message_id = str(headers.get("messageId", ""))
        if frame_type == SystemMessage.TYPE:
            if headers.get("topic") == SystemMessage.TOPIC_DISCONNECT:
                return None  # read by _serve: a hand-over, which wants no ack (S12 protocol.md)
            try:  # ping: echo the opaque data decoded, as the SDK does (to_dict encodes it once)
                data = frame.get("data")
                opaque = parse_json_object(data, "ping data") if isinstance(data, str) and data else {}
            except CallbackRejected:
                opaque = {}
            return ack_frame(message_id, opaque)
        if frame_type == CallbackMessage.TYPE and headers.get("topic") == ChatbotMessage.TOPIC:
            return await self._robot_message(message_id, frame.get("data"))
        if frame_type == CallbackMessage.TYPE and headers.get("topic") == CARD_CALLBACK_TOPIC:
            return await self._card_tap(message_id, frame.get("data"))
        return ack_frame(message_id, {"response": None})

    async def _robot_message(self, message_id: str, data: Any) -> str:
        try:
            message = self.config.identity.stamp(parse_robot_message(self.config.id, _frame_data(data), time.time()))
        except (ValueError, TypeError, CallbackRejected) as exc:
            log.warning("unreadable dingtalk stream message", extra={"error": str(exc)})
            return ack_frame(message_id, {"response": None}, AckMessage.STATUS_BAD_REQUEST, "bad message")
        if await self._queue(message):
            return ack_frame(message_id, {"response": None})
        self._keep_queueing(message)
        return ack_frame(message_id, {"response": None}, AckMessage.STATUS_SYSTEM_EXCEPTION, "not queued yet")

    def _keep_queueing(self, message: InboundMessage) -> None:
        if len(self._late) >= MAX_LATE_MESSAGES:
            log.error("could not queue a dingtalk message, and too many wait already; DingTalk will not resend it",
                      extra={"bot_id": self.config.id, "msg_id": message.msg_id})  # fmt: skip
            return
        task = asyncio.create_task(self._queue_late(message))
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    async def _queue_late(self, message: InboundMessage) -> None:
        """Keep handing `message` to the sink, for up to LATE_QUEUE_FOR_S (the ingest path deduplicates it, so a
        try that worked without saying so is harmless)."""
        deadline, delay = time.monotonic() + LATE_QUEUE_FOR_S, LATE_FIRST_DELAY_S
        while True:
            await asyncio.sleep(delay)
            try:
                await self._sink(message)
            except Exception as exc:
                if time.monotonic() + delay > deadline:
                    extra = {"bot_id": self.config.id, "msg_id": message.msg_id, "error": str(exc)}
                    log.error("gave up queueing a dingtalk message; DingTalk will not resend it", extra=extra)
                    return
                delay = min(MAX_BACKOFF_S, delay * 2)
                continue
            log.info("queued a dingtalk message late", extra={"bot_id": self.config.id, "msg_id": message.msg_id})
            return

    async def _card_tap(self, message_id: str, data: Any) -> str:
        """A card callback: the asker's tap on a question's button is queued like a message, then acked with the
        card's update (the choice shown, the buttons gone); anyone else's tap, or a callback about anything else,
        is acked and left."""
        try:
            tap = read_card_tap(self.config, self._tracks, message_id, data, time.time())
        except (ValueError, TypeError, CallbackRejected) as exc:
            log.warning("unreadable dingtalk card callback", extra={"error": str(exc)})
            return ack_frame(message_id, {"response": None}, AckMessage.STATUS_BAD_REQUEST, "bad callback")
        if tap is None:
            return ack_frame(message_id, {"response": None})
        if not tap.by_asker:  # the answer path would refuse it: the card stays as it is
            log.info("a question's button tapped by someone other than its asker", extra={"bot_id": self.config.id})
            return ack_frame(message_id, {"response": None})
        if await self._queue(tap.message):
            return ack_frame(message_id, {"response": tap.response})
        self._keep_queueing(tap.message)  # answered late rather than never (whether DingTalk resends is UNCONFIRMED)
        return ack_frame(message_id, {"response": None}, AckMessage.STATUS_SYSTEM_EXCEPTION, "not queued yet")

    async def _queue(self, message: InboundMessage) -> bool:
        """Hand `message` to the sink, retried inside the ack window. DingTalk pushes robot messages once
        ("fire-forgot", no resend on a missing ack), and whether it resends a card callback is UNCONFIRMED (taken
        as never): False (logged with its msgId) when it could not be queued within the window."""
        for delay in (*QUEUE_RETRY_DELAYS_S, None):
            try:
                await self._sink(message)
                return True
            except Exception as exc:
                if delay is None:
                    log.warning(
                        "could not queue a dingtalk message within its ack window",
                        extra={"bot_id": self.config.id, "msg_id": message.msg_id, "error": str(exc)},
                    )
                    break
                await asyncio.sleep(delay)
        return False
