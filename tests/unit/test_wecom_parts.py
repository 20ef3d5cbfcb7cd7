"""WeCom messages' parts: the app's message types (doc 96467), the AI bot's (doc 100719) with their quotes, media/get
and its errors through the simulator, and the AI bot's encrypted media."""

from __future__ import annotations

import base64
import secrets

import httpx
import pytest
from fastapi import FastAPI

from bots.parts import MediaError
from bots.wecom.aibot_parts import aibot_content
from bots.wecom.crypto import decode_aes_key
from bots.wecom.media import decrypt_aibot_media, encrypt_aibot_media, platform_error
from bots.wecom.models import parse_app_message
from simulator.wecom.api import wecom_api_router
from simulator.wecom.state import WeComApiState

APP = ("wwcorp", "secret-a")


def xml(msg_type: str, **fields: str) -> str:
    own = "".join(f"<{k}><![CDATA[{v}]]></{k}>" for k, v in fields.items())
    return (f"<xml><ToUserName>wwcorp</ToUserName><FromUserName>zhangsan</FromUserName><CreateTime>1</CreateTime>"
            f"<MsgType>{msg_type}</MsgType>{own}<MsgId>42</MsgId><AgentID>1</AgentID></xml>")


def test_app_voice_with_recognition_is_an_audio_part_not_text() -> None:
    message = parse_app_message("app", xml("voice", MediaId="m1", Format="AMR", Recognition="明天开会吗"), 0.0)
    assert message is not None and message.text == "" and message.msg_type == "voice"
    (part,) = message.parts
    assert part.kind == "audio" and part.text == "明天开会吗"
    assert part.media is not None and part.media.ref == "m1" and part.media.format == "amr"


def test_app_image_names_its_media_id_and_other_types_have_no_parts() -> None:
    image = parse_app_message("app", xml("image", PicUrl="https://p/x", MediaId="m2"), 0.0)
    assert image is not None and [(p.kind, p.media.ref if p.media else "") for p in image.parts] == [("image", "m2")]
    for kind, fields in [("video", {"MediaId": "v", "ThumbMediaId": "t"}),
                         ("location", {"Location_X": "23.1", "Location_Y": "113.3", "Scale": "20", "Label": "广州"}),
                         ("link", {"Title": "t", "Description": "d", "Url": "https://x", "PicUrl": "https://p"})]:
        message = parse_app_message("app", xml(kind, **fields), 0.0)
        assert message is not None and message.msg_type == kind and message.parts == () and message.text == ""


def test_aibot_mixed_quote_voice_and_file() -> None:
    mixed = {"msg_item": [{"msgtype": "text", "text": {"content": "看看"}},
                          {"msgtype": "image", "image": {"url": "https://a/1"}},
                          {"msgtype": "text", "text": {"content": "这个"}},
                          {"msgtype": "image", "image": {"url": "https://a/2"}}]}
    quote = {"msgtype": "text", "text": {"content": "这是今日的测试情况"}}
    text, parts = aibot_content({"msgtype": "mixed", "mixed": mixed, "quote": quote}, "mixed")
    assert text == "看看\n这个"
    assert [(p.kind, p.text, p.media.ref if p.media else "") for p in parts] == [
        ("quote", "这是今日的测试情况", ""), ("image", "", "https://a/1"), ("image", "", "https://a/2")]
    text, parts = aibot_content({"msgtype": "voice", "voice": {"content": "语音转文字"}}, "voice")
    assert text == "" and [(p.kind, p.text, p.media) for p in parts] == [("audio", "语音转文字", None)]
    _, parts = aibot_content({"msgtype": "file", "file": {"url": "https://a/f"}}, "file")
    assert [(p.kind, p.media.ref if p.media else "") for p in parts] == [("file", "https://a/f")]
    _, parts = aibot_content({"msgtype": "text", "text": {"content": "?"}, "quote": {"msgtype": "image"}}, "text")
    assert [(p.kind, p.text) for p in parts] == [("quote", "[图片]")]


def test_aibot_media_round_trip_and_a_wrong_key_is_refused() -> None:
    key = decode_aes_key(base64.b64encode(secrets.token_bytes(32)).decode().rstrip("="))
    for size in (0, 1, 31, 32, 1000):
        data = secrets.token_bytes(size)
        assert decrypt_aibot_media(key, encrypt_aibot_media(key, data)) == data
    other = decode_aes_key(base64.b64encode(secrets.token_bytes(32)).decode().rstrip("="))
    with pytest.raises(MediaError) as refused:
        decrypt_aibot_media(other, encrypt_aibot_media(key, b"x" * 100))
    assert refused.value.reason == "unsupported"


def test_platform_error_reads_wecom_json_not_a_picture() -> None:
    json_error = b'{"errcode": 40007, "errmsg": "invalid media_id"}'
    assert platform_error(json_error, httpx.Headers({"content-type": "text/plain"})) == (40007, "invalid media_id")
    assert platform_error(b"\x89PNG....", httpx.Headers({"content-type": "image/png"})) is None


async def test_simulated_media_get_serves_the_file_then_40007_when_expired() -> None:
    app = FastAPI()
    state = WeComApiState(apps={APP}, agents={1: APP})
    app.include_router(wecom_api_router(state))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://wecom") as http:
        token = (await http.get("/cgi-bin/gettoken", params={"corpid": APP[0], "corpsecret": APP[1]})).json()
        picture = {"name": "a.png", "mime": "image/png"}
        sent = await http.post("/__sim__/wecom/media", params=picture, content=b"PNGDATA")
        media_id = sent.json()["media_id"]
        params = {"access_token": token["access_token"], "media_id": media_id}
        got = await http.get("/cgi-bin/media/get", params=params)
        assert got.content == b"PNGDATA" and got.headers["content-type"] == "image/png"
        assert 'filename="a.png"' in got.headers["content-disposition"]
        await http.post(f"/__sim__/wecom/media/{media_id}/expire")
        expired = await http.get("/cgi-bin/media/get", params=params)
        assert platform_error(expired.content, expired.headers) == (40007, "invalid media_id")
        markdown = {"touser": "u", "msgtype": "markdown", "agentid": 1, "markdown": {"content": "好" * 683}}
        refused = await http.post("/cgi-bin/message/send", params={"access_token": token["access_token"]},
                                  json=markdown)
        assert refused.json()["errcode"] == 40058, "over 2048 bytes of markdown"
