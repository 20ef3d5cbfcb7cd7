"""WeCom callbacks that are signed and decrypt, yet are not this bot's or this corporation's (a review found each
accepted): another app's AgentID, another AI bot's aibotid, an outside corporation's user, media on a foreign host."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from bots.base import CallbackRejected
from bots.parts import Media, MediaError
from bots.wecom.adapter import WeComAppAdapter
from bots.wecom.aibot import WeComAIBotAdapter
from bots.wecom.config import WeComAIBotConfig, WeComAppConfig
from bots.wecom.crypto import WeComCrypto, sign

KEY = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR"
TEXT = (
    "<xml><ToUserName>ww1</ToUserName><FromUserName>u1</FromUserName><CreateTime>1</CreateTime>"
    "<MsgType>text</MsgType><Content>hi</Content><MsgId>42</MsgId><AgentID>{agent}</AgentID></xml>"
)


def app_callback(inner: str) -> tuple[dict[str, str], bytes]:
    timestamp = str(int(time.time()))
    encrypted, signature = WeComCrypto("tok", KEY, "ww1").signed_envelope(inner, timestamp, "n1")
    body = f"<xml><Encrypt><![CDATA[{encrypted}]]></Encrypt></xml>".encode()
    return {"msg_signature": signature, "timestamp": timestamp, "nonce": "n1"}, body


def aibot_callback(payload: dict) -> tuple[dict[str, str], bytes]:
    timestamp = str(int(time.time()))
    encrypted = WeComCrypto("tok", KEY, "").encrypt(json.dumps(payload))
    query = {"msg_signature": sign("tok", timestamp, "n1", encrypted), "timestamp": timestamp, "nonce": "n1"}
    return query, json.dumps({"encrypt": encrypted}).encode()


def aibot(**settings: object) -> WeComAIBotAdapter:
    config = WeComAIBotConfig(id="ai", token="tok", encoding_aes_key=KEY, corp_id="wwMINE", **settings)
    return WeComAIBotAdapter(config, httpx.AsyncClient())


def test_an_app_refuses_a_callback_that_names_another_app() -> None:
    app = WeComAppAdapter(
        WeComAppConfig(id="app", token="tok", encoding_aes_key=KEY, corp_id="ww1", agent_id=1, secret="s"),
        httpx.AsyncClient(),
        None,  # no token cache: nothing is sent
    )
    message = app.parse(*app_callback(TEXT.format(agent=1)), time.time())
    assert message is not None and message.text == "hi"
    with pytest.raises(CallbackRejected) as refused:
        app.parse(*app_callback(TEXT.format(agent=999)), time.time())
    assert (refused.value.reason, refused.value.status) == ("wrong_agent", 403)
    # an event names its app too (enter_agent), and one with no AgentID at all is still read
    event = (
        "<xml><FromUserName>u1</FromUserName><MsgType>event</MsgType><Event>enter_agent</Event>"
        "<AgentID>7</AgentID></xml>"
    )
    with pytest.raises(CallbackRejected, match="another app"):
        app.parse(*app_callback(event), time.time())
    assert app.parse(*app_callback(TEXT.replace("<AgentID>{agent}</AgentID>", "")), time.time()) is not None


def test_an_ai_bot_refuses_another_bots_callback_once_its_id_is_set() -> None:
    payload = {
        "msgid": "m1",
        "aibotid": "OTHER",
        "from": {"userid": "u1"},
        "msgtype": "text",
        "text": {"content": "hi"},
    }
    assert aibot().parse(*aibot_callback(payload), time.time()) is not None  # not set: not checked
    with pytest.raises(CallbackRejected) as refused:
        aibot(aibot_id="MINE").parse(*aibot_callback(payload), time.time())
    assert (refused.value.reason, refused.value.status) == ("wrong_bot", 403)
    assert aibot(aibot_id="OTHER").parse(*aibot_callback(payload), time.time()) is not None


def test_a_user_of_another_corporation_is_not_the_member_of_the_same_userid() -> None:
    bot = aibot()
    outsider = {"msgid": "m1", "from": {"corpid": "wwOTHER", "userid": "alice"}, "msgtype": "text",
                "text": {"content": "hi"}}  # fmt: skip
    member = {"msgid": "m2", "from": {"userid": "alice"}, "msgtype": "text", "text": {"content": "hi"}}
    named_own = {"msgid": "m3", "from": {"corpid": "wwMINE", "userid": "alice"}, "msgtype": "text",
                 "text": {"content": "hi"}}  # fmt: skip
    theirs, ours, ours_named = (bot.parse(*aibot_callback(p), time.time()) for p in (outsider, member, named_own))
    assert ours.person == ours_named.person == "wecom:wwMINE:alice"
    assert theirs.person == "wecom:wwOTHER:wwOTHER/alice" and theirs.reply_to.user_id == "alice"
    # nor does the outsider read the member's memory, by person or by the bot's own name for it (which a member's
    # first read adopts), nor share her lane
    assert ours.session_key == "dm:wecom:wwMINE:alice"
    assert theirs.session_key not in (ours.session_key, ours.bot_session_key)
    assert theirs.bot_session_key != ours.bot_session_key and theirs.conversation_key != ours.conversation_key
    in_group = {"chattype": "group", "chatid": "g1", "msgtype": "text", "text": {"content": "hi"}}
    senders = ({"corpid": "wwOTHER", "userid": "alice"}, {"userid": "alice"})
    theirs, ours = (bot.parse(*aibot_callback({**in_group, "msgid": f"g{i}", "from": who}), time.time())
                    for i, who in enumerate(senders))  # fmt: skip
    assert theirs.bot_session_key != ours.bot_session_key and theirs.person != ours.person


async def test_media_is_fetched_only_from_wecoms_media_host() -> None:
    fetched: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        fetched.append(str(request.url))
        return httpx.Response(404)

    bot = aibot()
    bot._http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    for url in ("https://169.254.169.254/latest/meta-data", "https://internal.corp.local:8443/admin",
                "https://evil.example/a.png", "http://ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com/x",
                "https://user:pw@ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com/x"):  # fmt: skip
        with pytest.raises(MediaError) as refused:
            await bot.download(Media(ref=url))
        assert refused.value.reason == "refused"
    assert fetched == []
    with pytest.raises(MediaError):  # WeCom's own host is asked (here it answers 404)
        await bot.download(Media(ref="https://ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com/BHo/1?sign=x"))
    assert len(fetched) == 1
    other = aibot(media_hosts=["media.example.cn"])
    other._http = bot._http
    with pytest.raises(MediaError):
        await other.download(Media(ref="https://media.example.cn/1"))
    assert fetched[-1] == "https://media.example.cn/1"
