"""微信客服 beyond text, without processes: sync_msg items read into parts, a burst merged with every part and every
question, and media/get's answers (the bytes, an errcode, a stale token) as the adapter reads them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from bots.base import InboundMessage
from bots.parts import MediaError, Part
from bots.wecom_kf.client import KfApiClient
from bots.wecom_kf.config import WeComKfConfig
from bots.wecom_kf.models import parse_item
from gateway.worker.pulled import merged_message
from testkit.configs import random_aes_key


def item(msgtype: str, body: dict, origin: int = 3, msgid: str = "m1", send_time: int = 100) -> dict:
    return {"msgid": msgid, "open_kfid": "wk1", "external_userid": "wm1", "send_time": send_time, "origin": origin,
            "msgtype": msgtype, msgtype: body}  # fmt: skip


@pytest.mark.parametrize(
    ("msgtype", "kind", "audio_format"), [("image", "image", ""), ("voice", "audio", "amr"), ("file", "file", "")]
)
def test_media_items_become_parts_named_by_media_id(msgtype: str, kind: str, audio_format: str) -> None:
    parsed = parse_item("kefu", item(msgtype, {"media_id": "MEDIA_1"}))
    assert parsed is not None and parsed.kind == "message"
    message = parsed.message
    assert (message.msg_type, message.text) == (msgtype, "")
    assert len(message.parts) == 1 and message.parts[0].kind == kind
    media = message.parts[0].media
    assert media is not None and (media.ref, media.format) == ("MEDIA_1", audio_format)


@pytest.mark.parametrize(
    ("msgtype", "body"),
    [
        ("video", {"media_id": "MEDIA_2"}),
        ("location", {"latitude": 23.1, "longitude": 113.3, "name": "门店", "address": "广州"}),
        ("link", {"title": "t", "desc": "d", "url": "https://example.com", "pic_url": ""}),
        ("business_card", {"userid": "zhangsan"}),
        ("miniprogram", {"appid": "wx1", "title": "t", "thumb_media_id": "M", "pagepath": "p"}),
        ("image", {}),  # no media_id: nothing to fetch
    ],
)
def test_what_cannot_be_read_keeps_its_type_and_no_parts(msgtype: str, body: dict) -> None:
    parsed = parse_item("kefu", item(msgtype, body))
    assert parsed is not None
    assert (parsed.message.msg_type, parsed.message.text, parsed.message.parts) == (msgtype, "", ())


def test_an_agents_photo_has_no_parts() -> None:
    parsed = parse_item("kefu", {**item("image", {"media_id": "M"}, origin=5), "servicer_userid": "zhang"})
    assert parsed is not None and parsed.kind == "agent" and parsed.message.parts == ()


def inbound(msgid: str, text: str = "", parts: tuple[Part, ...] = (), msg_type: str = "text") -> InboundMessage:
    return InboundMessage(
        platform="wecom-kf", bot_id="kefu", msg_id=msgid, conversation_id="wk1:wm1", sender_id="wm1", text=text,
        msg_type=msg_type, parts=parts, received_at=float(len(msgid)),
    )  # fmt: skip


def media_part(kind: str, ref: str) -> Part:
    return parse_item("kefu", item({"image": "image", "file": "file"}[kind], {"media_id": ref})).message.parts[0]  # type: ignore[union-attr]


def test_a_burst_keeps_every_part_in_order_and_every_question() -> None:
    photo, document = media_part("image", "P"), media_part("file", "F")
    burst = [inbound("1", parts=(photo,), msg_type="image"), inbound("22", "这是什么？"),
             inbound("333", parts=(document,), msg_type="file"), inbound("4444", "还有这个文件呢？")]  # fmt: skip
    merged = merged_message(burst[0], burst[1:])
    assert merged.parts == (photo, document)
    assert merged.text == "这是什么？\n还有这个文件呢？" and merged.msg_type == "text"
    assert merged.received_at == 4.0 and merged.msg_id == "1"


def test_a_burst_of_photos_alone_stays_a_photo_message() -> None:
    first, second = media_part("image", "A"), media_part("image", "B")
    head, behind = inbound("1", parts=(first,), msg_type="image"), inbound("2", parts=(second,), msg_type="image")
    merged = merged_message(head, [behind])
    assert (merged.msg_type, merged.text, merged.parts) == ("image", "", (first, second))


class MemoryTokens:
    """The TokenStore protocol in a dict (one process)."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}

    async def get(self, name: str) -> str | None:
        return self.tokens.get(name)

    async def put(self, name: str, token: str, ttl_s: float) -> None:
        self.tokens[name] = token

    async def invalidate(self, name: str, token: str) -> None:
        if self.tokens.get(name) == token:
            del self.tokens[name]

    def refresh_lock(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        @contextlib.asynccontextmanager
        async def held() -> AsyncIterator[None]:
            yield

        return held()


def download(answers: list[httpx.Response], max_bytes: int = 1024) -> tuple[object, list[httpx.Request]]:
    """KfApiClient.media against scripted answers to media/get (gettoken answered with a fresh token each time)."""
    seen: list[httpx.Request] = []
    issued = iter(range(100))

    def platform(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/cgi-bin/gettoken":
            return httpx.Response(200, json={"errcode": 0, "access_token": f"T{next(issued)}", "expires_in": 7200})
        seen.append(request)
        return answers.pop(0)

    config = WeComKfConfig(id="kefu", corp_id="ww1", secret="s", token="t", encoding_aes_key=random_aes_key(),
                           api_base="http://qyapi.test")  # fmt: skip

    async def run() -> object:
        async with httpx.AsyncClient(transport=httpx.MockTransport(platform)) as http:
            try:
                return await KfApiClient(config, http, MemoryTokens()).download_media("MEDIA_1", max_bytes)  # type: ignore[arg-type]
            except MediaError as exc:
                return exc

    return asyncio.run(run()), seen


def error(errcode: int, content_type: str = "application/json") -> httpx.Response:
    return httpx.Response(200, content=json.dumps({"errcode": errcode, "errmsg": "x"}).encode(),
                          headers={"content-type": content_type})  # fmt: skip


def test_the_file_comes_with_its_type_and_name() -> None:
    headers = {"content-type": "application/pdf", "content-disposition": 'attachment; filename="MEDIA_1.pdf"'}
    got, seen = download([httpx.Response(200, content=b"%PDF-1.7", headers=headers)])
    assert (got.data, got.mime, got.name) == (b"%PDF-1.7", "application/pdf", "MEDIA_1.pdf")  # type: ignore[attr-defined]
    assert seen[0].url.params["media_id"] == "MEDIA_1" and seen[0].url.host == "qyapi.test"


def test_a_percent_encoded_name_is_read() -> None:
    disposition = "attachment; filename=\"a.pdf\"; filename*=UTF-8''%E6%8A%A5%E9%94%80.pdf"
    headers = {"content-type": "application/pdf", "content-disposition": disposition}
    got, _ = download([httpx.Response(200, content=b"x", headers=headers)])
    assert got.name == "报销.pdf"  # type: ignore[attr-defined]


ERRORS = [(error(40007), "expired"), (error(40007, "text/plain"), "expired"), (error(60020), "refused"),
          (httpx.Response(502), "unavailable")]  # fmt: skip


@pytest.mark.parametrize(("answer", "reason"), ERRORS)
def test_errcode_answers_are_media_errors(answer: httpx.Response, reason: str) -> None:
    got, _ = download([answer])
    assert isinstance(got, MediaError) and got.reason == reason


def test_a_stale_token_is_refetched_once() -> None:
    got, seen = download([error(42001), httpx.Response(200, content=b"img", headers={"content-type": "image/png"})])
    assert got.data == b"img"  # type: ignore[attr-defined]
    assert [request.url.params["access_token"] for request in seen] == ["T0", "T1"]


def test_over_the_cap_is_too_large() -> None:
    got, _ = download([httpx.Response(200, content=b"x" * 2048, headers={"content-type": "image/png"})])
    assert isinstance(got, MediaError) and got.reason == "too_large"


def test_the_simulators_saved_state_keeps_voice_video_and_file_items() -> None:
    from simulator.wecom_kf.snapshot import KfSnapshot
    from simulator.wecom_kf.state import KfState, media_item

    config = WeComKfConfig(id="kefu", corp_id="ww1", secret="s", token="t", encoding_aes_key=random_aes_key(),
                           open_kfids=["wk1"])  # fmt: skip
    state = KfState.from_bots([config])
    for msgtype in ("image", "voice", "video", "file"):
        state.append("wk1", media_item("wk1", "wm1", msgtype, f"MEDIA_{msgtype}", 100.0))
    saved = state.snapshot()
    again = KfState.from_bots([config])
    again.restore(KfSnapshot.model_validate_json(json.dumps(saved)))
    assert again.snapshot() == saved
    assert [item["msgtype"] for _, item in again.log] == ["image", "voice", "video", "file"]
    assert again.log[1][1]["voice"] == {"media_id": "MEDIA_voice"}
