"""A DingTalk robot message of each type (as the simulator writes it, from DingTalk's message.md) becomes the
normalized message's text and parts; a markdown answer's title is its first line as plain text."""

from __future__ import annotations

import time

from bots.dingtalk.adapter import TITLE_MAX_CHARS, title_of
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.models import parse_robot_message
from bots.parts import Media, Part
from simulator.dingtalk import messages
from simulator.dingtalk.user import robot_payload

BOT = DingTalkBotConfig(id="d", app_key="dingkey", app_secret="secret")
WEBHOOK = {"url": "https://oapi.dingtalk.com/robot/sendBySession?session=s", "expires_ms": 0}


def parse(message: dict, group: bool = False):  # type: ignore[no-untyped-def]
    payload = robot_payload(BOT, "u1", "", conversation="cid", group=group, webhook=WEBHOOK, message=message)
    return parse_robot_message("d", payload, time.time())


def test_text_in_a_group_is_stripped() -> None:
    parsed = parse(messages.text_message("hello"), group=True)
    assert (parsed.text, parsed.msg_type, parsed.parts) == ("hello", "text", ())


def test_rich_text_keeps_its_text_and_its_pictures_in_order() -> None:
    parsed = parse(messages.rich_text_message("看这张图：", ("code-1",), "和这张", ("code-2",)))
    assert parsed.msg_type == "richText"
    assert parsed.text == "看这张图：\n和这张"
    assert parsed.parts == tuple(Part(kind="image", media=Media(ref=code)) for code in ("code-1", "code-2"))


def test_picture_audio_and_file() -> None:
    assert parse(messages.picture_message("p")).parts == (Part(kind="image", media=Media(ref="p")),)
    (audio,) = parse(messages.audio_message("a", recognition=" 明天几点开会 ")).parts
    assert (audio.kind, audio.text, audio.media) == ("audio", "明天几点开会", Media(ref="a"))
    assert parse(messages.audio_message("a")).parts[0].text == ""
    (file,) = parse(messages.file_message("f", "报销制度.pdf")).parts
    assert (file.kind, file.media) == ("file", Media(ref="f", name="报销制度.pdf"))


def test_video_and_unknown_types_have_no_readable_part() -> None:
    video = parse(messages.video_message("v"))
    assert (video.msg_type, video.text, video.parts) == ("video", "", ())
    unknown = parse({"msgtype": "unknownMsgType", "content": {"unknownMsgType": "机器人暂不支持接收。"}})
    assert (unknown.msg_type, unknown.parts) == ("unknownMsgType", ())


def test_a_reply_carries_the_quoted_text() -> None:
    parsed = parse(messages.text_message("这是什么意思？", quote="下周三开始放假"))
    assert parsed.text == "这是什么意思？"
    assert parsed.parts == (Part(kind="quote", text="下周三开始放假"),)
    picture = messages.text_message("这张呢？")
    picture["text"].update(isReplyMsg=True, repliedMsg={"msgType": "picture", "content": {"downloadCode": "x"}})
    assert parse(picture).parts == (Part(kind="quote", text="[picture]"),)


def test_title_is_the_first_line_as_plain_text() -> None:
    assert title_of("## 报销 **流程**\n\n1. 填单") == "报销 流程"
    long = title_of("字" * 100)
    assert len(long) == TITLE_MAX_CHARS and long.endswith("…")
    assert title_of("   \n") == "…"


def test_a_member_of_another_organisation_is_not_the_member_with_the_same_staff_id() -> None:
    """A group shared across organisations: another one's "alice" keys her own memory, lanes and limits, and is
    not in allow_users as the robot organisation's alice; replies still address the staffId DingTalk gave."""
    own = robot_payload(BOT, "alice", "hi", conversation="cid", group=True, webhook=WEBHOOK)
    outsider = {**own, "senderCorpId": "corpEVIL"}
    ours, theirs = (BOT.identity.stamp(parse_robot_message("d", p, time.time())) for p in (own, outsider))
    assert ours.sender_id == "alice" and theirs.sender_id == "corpEVIL/alice"
    assert ours.person != theirs.person and theirs.reply_to.user_id == "alice"
    without_corps = {key: value for key, value in own.items() if key not in ("senderCorpId", "chatbotCorpId")}
    assert parse_robot_message("d", without_corps, time.time()).sender_id == "alice"
