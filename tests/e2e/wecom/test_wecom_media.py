"""WeCom beyond text, end to end (gateway, worker, Redis, simulator, stub engine): a voice message's Recognition
answered as text, a picture read by an engine that sees (a data: URL in the request) or declined by one that does
not, an expired media_id told, Markdown answers as plain text or as a markdown message, an AI bot's quote in the
prompt."""

from __future__ import annotations

import asyncio
import io

import httpx
from PIL import Image

from bots.text import utf8_len
from bots.wecom.config import WeComAIBotConfig
from simulator.wecom.ai_user import WeComAIBotUser
from testkit.fakes.stub_engine import answer_for
from testkit.stacks import Cluster

MARKDOWN_QUESTION = "**粗体** 和\n\n1. 第一\n2. 第二\n# 标题"


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def member_sends(c: Cluster, data: bytes, name: str, mime: str) -> dict[str, str]:
    """A member's WeCom client uploads a picture or recording: its MediaId and PicUrl."""
    answer = httpx.post(f"{c.stack.sim_url}/__sim__/wecom/media", params={"name": name, "mime": mime}, content=data)
    answer.raise_for_status()
    return answer.json()


def started(cluster, **overrides: object) -> Cluster:  # type: ignore[no-untyped-def]
    c = cluster(0.0, **overrides)
    c.add_gateway()
    c.add_worker("w")
    return c


def bots_with(**app: object) -> list[dict]:
    """The stack's app and AI bot (their credentials filled in by Cluster) with `app` settings of their own."""
    return [{"id": "app", "platform": "wecom", **app}, {"id": "ai", "platform": "wecom-ai"}]


def test_text_engine_voice_picture_markdown_and_quote(cluster, user: str) -> None:
    c = started(cluster, bots=bots_with())
    signer = c.stack.signer()

    recording = member_sends(c, b"#!AMR\n" + bytes(200), "voice.amr", "audio/amr")
    assert c.stack.post_callback(signer.voice(user, recording["media_id"], "amr", "明天几点开会")).status_code == 200
    assert c.stack.wait_delivered(user, 1)[0]["content"] == answer_for("明天几点开会")
    assert [r["user"] for r in c.engine_requests()] == ["明天几点开会"], "the recognition is the user's turn"

    picture = member_sends(c, png(), "photo.png", "image/png")
    c.stack.post_callback(signer.image(user, picture["media_id"], picture["pic_url"]))
    declined = c.stack.wait_delivered(user, 2)[1]["content"]
    assert "当前模型看不了图片" in declined and len(c.engine_requests()) == 1, "a text engine is not asked"

    c.stack.post_callback(signer.text(user, MARKDOWN_QUESTION))
    plain = c.stack.wait_delivered(user, 3)[2]
    assert plain["msgtype"] == "text" and "**" not in plain["content"] and "#" not in plain["content"]
    assert "1. 第一" in plain["content"] and "2. 第二" in plain["content"] and "粗体" in plain["content"]

    async def quoted() -> str:
        async with httpx.AsyncClient(timeout=30) as http:
            bot = WeComAIBotConfig(**next(b for b in c.config["bots"] if b["id"] == "ai"))
            view = await WeComAIBotUser(bot, c.gateways, c.stack.sim_url, http).ask(
                user, "这说的是什么意思？", interval_s=0.1, quote="项目周五上线"
            )
            assert view.finished
            return view.text

    answered = asyncio.run(quoted())
    asked = c.engine_requests()[-1]["user"]
    assert "项目周五上线" in asked and "这说的是什么意思？" in asked, asked
    assert answered == answer_for(asked)


def test_seeing_engine_picture_expiry_and_markdown_messages(cluster, user: str) -> None:
    c = started(cluster, engine={"vision": True}, bots=bots_with(reply_format="markdown"))
    signer = c.stack.signer()

    picture = member_sends(c, png(), "photo.png", "image/png")
    c.stack.post_callback(signer.image(user, picture["media_id"], picture["pic_url"]))
    c.stack.wait_delivered(user, 1)
    (request,) = c.engine_requests()
    assert len(request["images"]) == 1 and request["images"][0].startswith("data:image/")

    old = member_sends(c, png(), "old.png", "image/png")
    httpx.post(f"{c.stack.sim_url}/__sim__/wecom/media/{old['media_id']}/expire").raise_for_status()
    c.stack.post_callback(signer.image(user, old["media_id"], old["pic_url"]))
    assert "附件已过期" in c.stack.wait_delivered(user, 2)[1]["content"]
    assert len(c.engine_requests()) == 1

    c.stack.post_callback(signer.text(user, MARKDOWN_QUESTION))
    sent = c.stack.wait_delivered(user, 3)[2]
    assert sent["msgtype"] == "markdown" and sent["content"].rstrip("\u200b") == answer_for(MARKDOWN_QUESTION)
    assert utf8_len(sent["content"]) <= 2048
