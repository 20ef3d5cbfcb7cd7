"""A WeCom AI bot's refresh is answered from the stream store only for the bot that opened the stream (a review found
any stream readable, and endable past the time limit, by whoever could sign a refresh for any bot: stream ids are
derived from message ids); a first callback opened again under another sender does not take the stream over."""

from __future__ import annotations

import json
import time

import httpx

from bots.channels import CallbackRequest
from bots.wecom.aibot import WeComAIBotAdapter
from bots.wecom.config import WeComAIBotConfig
from bots.wecom.crypto import WeComCrypto, sign
from gateway.edge.callbacks import PolledStreamHandler
from gateway.state.streams import StreamStore
from tests.redis.conftest import World

KEY = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR"


def refresh(stream_id: str, user: str | None) -> CallbackRequest:
    payload: dict = {"msgid": "r1", "msgtype": "stream", "stream": {"id": stream_id}}
    if user is not None:
        payload["from"] = {"userid": user}
    timestamp = str(int(time.time()))
    encrypted = WeComCrypto("tok", KEY, "").encrypt(json.dumps(payload))
    query = {"msg_signature": sign("tok", timestamp, "n1", encrypted), "timestamp": timestamp, "nonce": "n1"}
    return CallbackRequest(query, {}, json.dumps({"encrypt": encrypted}).encode(), time.time())


async def shown(handler: PolledStreamHandler, request: CallbackRequest) -> dict:
    reply = await handler.handle(request)
    envelope = json.loads(reply.body)
    plain = WeComCrypto("tok", KEY, "").verify_and_decrypt(
        envelope["msgsignature"], str(envelope["timestamp"]), envelope["nonce"], envelope["encrypt"]
    )
    return json.loads(plain)["stream"]


async def test_a_refresh_reads_only_its_own_bots_stream_for_its_user(world: World) -> None:
    streams = StreamStore(world.redis, world.keys)
    http = httpx.AsyncClient()
    ours, theirs = (
        PolledStreamHandler(WeComAIBotAdapter(WeComAIBotConfig(id=bot, token="tok", encoding_aes_key=KEY), http),
                            None, streams)  # type: ignore[arg-type]  # a refresh queues nothing
        for bot in ("ai", "other")
    )  # fmt: skip
    assert await streams.open("ai", "alice", "s1", limit=3, max_age_s=400)
    assert await streams.update("s1", "alice's answer")

    assert (await shown(ours, refresh("s1", "alice")))["content"] == "alice's answer"
    assert (await shown(ours, refresh("s1", None)))["content"] == "alice's answer"  # names nobody: the bot's own
    assert await streams.open("ai", "mallory", "s1", limit=3, max_age_s=400)  # a forged first callback of it
    assert (await shown(ours, refresh("s1", "alice")))["content"] == "alice's answer", "taken over"
    state = await streams.get("s1")
    assert state is not None and state.owner == world.keys.active_streams("ai", "alice")
    for handler, user in ((theirs, "alice"), (theirs, None)):
        stream = await shown(handler, refresh("s1", user))
        assert stream["content"] == "" and stream["finish"] is True

    # past the time limit another bot's refresh does not end alice's stream either
    stale = refresh("s1", "alice")
    late = CallbackRequest(stale.query, stale.headers, stale.body, time.time() + 1000)
    await shown(theirs, late)
    state = await streams.get("s1")
    assert state is not None and not state.finished and state.content == "alice's answer"
    await http.aclose()
