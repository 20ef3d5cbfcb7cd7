"""WeCom's button card for a tool's confirmation question: the card's JSON (checked against the simulator's reading of
the docs), the tap events of the app (XML) and the AI bot (JSON) read into messages in the question's lane, and
hostile events (another card's, missing or malformed fields) giving no message or a clear rejection."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from bots.base import CallbackRejected, PermanentSendError, ReplyTarget
from bots.buttons import Question, button_key
from bots.wecom.adapter import WeComAppAdapter
from bots.wecom.aibot import WeComAIBotAdapter
from bots.wecom.cards import AIBOT_CARD, APP_CARD, button_card, read_card_tap, task_id_for
from bots.wecom.config import WeComAIBotConfig, WeComAppConfig
from bots.wecom.models import parse_app_message
from simulator.wecom.ai_user import WeComAIBotUser
from simulator.wecom.cards import AIBOT_LIMITS, APP_LIMITS, card_problem
from simulator.wecom.signer import WeComCallbackSigner, card_event_xml, text_message_xml
from tests.unit.test_kf_parts import MemoryTokens

KEY = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR"
APP = WeComAppConfig(id="app", token="tok", encoding_aes_key=KEY, corp_id="wwcorp", agent_id=1000002, secret="s")
AIBOT = WeComAIBotConfig(id="ai", token="tok", encoding_aes_key=KEY, corp_id="wwcorp")
QUESTION = Question("0123456789abcdef", "确认执行「rooms.book」？", '- 房间："泰山厅"\n- start："2026-12-03T15:00"')


def app_event(user: str = "zhangsan", key: str | None = None, task_id: str | None = None, created: int = 1700000000,
              **extra: str) -> str:
    event = {"FromUserName": user, "CreateTime": str(created), "MsgType": "event", "Event": "template_card_event",
             "EventKey": button_key(QUESTION.id, "confirmed") if key is None else key,
             "TaskId": task_id_for(QUESTION.id) if task_id is None else task_id,
             "CardType": "button_interaction", "ResponseCode": "rc", "AgentID": "1000002", **extra}
    return card_event_xml(APP, {name: value for name, value in event.items() if value != "<absent>"})


def test_the_card_shows_the_question_with_two_buttons_keyed_to_it() -> None:
    card = button_card(QUESTION, APP_CARD)
    assert card["card_type"] == "button_interaction"
    assert card["task_id"] == "botgw-0123456789abcdef"
    assert card["main_title"] == {"title": QUESTION.title}
    assert [(b["text"], b["key"]) for b in card["button_list"]] == [
        ("确认", "botgw:confirmed:0123456789abcdef"), ("取消", "botgw:cancelled:0123456789abcdef")]
    assert "泰山厅" in card["sub_title_text"] and "- " not in card["sub_title_text"], "plain text, no Markdown"
    assert card_problem(card, APP_LIMITS) == "" and card_problem(button_card(QUESTION, AIBOT_CARD), AIBOT_LIMITS) == ""


def test_long_texts_are_cut_to_the_documented_lengths_and_the_card_stays_acceptable() -> None:
    lines = "\n".join(f"- 参数{i}：" + "值" * 80 for i in range(9))
    long = Question("ab" * 32, "确认执行「" + "很长的工具名" * 20 + "」？", lines)
    for limits, sim_limits in ((APP_CARD, APP_LIMITS), (AIBOT_CARD, AIBOT_LIMITS)):
        card = button_card(long, limits)
        assert len(card["main_title"]["title"]) == limits.title_chars and card["main_title"]["title"].endswith("…")
        assert len(card["sub_title_text"]) <= limits.sub_title_chars
        assert card_problem(card, sim_limits) == "", card
        json.dumps(card, ensure_ascii=False).encode("utf-8")  # every cut left whole characters


def test_the_simulator_refuses_what_the_docs_rule_out() -> None:
    card = button_card(QUESTION, APP_CARD)
    assert "task_id" in card_problem({**card, "task_id": "has space"}, APP_LIMITS)
    assert "task_id" in card_problem({**card, "task_id": "x" * 129}, APP_LIMITS)
    assert "button_list" in card_problem({**card, "button_list": card["button_list"] * 4}, APP_LIMITS)
    assert "repeat" in card_problem({**card, "button_list": [card["button_list"][0]] * 2}, APP_LIMITS)
    assert "main_title" in card_problem({**card, "main_title": {}}, APP_LIMITS)
    assert "card_type" in card_problem({**card, "card_type": "vote_interaction"}, APP_LIMITS)


def test_a_tap_is_botgws_only_with_its_key_on_its_questions_card() -> None:
    key = button_key(QUESTION.id, "cancelled")
    tap = read_card_tap(key, task_id_for(QUESTION.id))
    assert tap is not None and tap.question_id == QUESTION.id and tap.choice == "cancelled"
    assert read_card_tap(key, "botgw-ffffffffffffffff") is None, "the key on another question's card"
    assert read_card_tap("approve:42", "task-1") is None, "another app's card"
    assert read_card_tap(None, task_id_for(QUESTION.id)) is None
    assert read_card_tap(key, ["not", "a", "string"]) is None


def test_the_apps_tap_is_a_message_in_the_askers_one_to_one_lane() -> None:
    typed = parse_app_message("app", text_message_xml(APP, "zhangsan", "确认", "1", 1700000000), 1.0)
    tapped = parse_app_message("app", app_event(), 2.0)
    assert typed is not None and tapped is not None
    assert tapped.tap is not None and tapped.tap.choice == "confirmed" and tapped.text == "确认"
    assert tapped.conversation_key == typed.conversation_key and tapped.reply_to == typed.reply_to
    assert tapped.sender_id == "zhangsan" and tapped.msg_type == "text"
    again = parse_app_message("app", app_event(), 3.0)
    other_button = parse_app_message("app", app_event(key=button_key(QUESTION.id, "cancelled")), 3.0)
    later = parse_app_message("app", app_event(created=1700000009), 3.0)
    assert again is not None and other_button is not None and later is not None
    assert again.dedup_key == tapped.dedup_key, "a retry of one tap is one delivery"
    assert len({tapped.dedup_key, other_button.dedup_key, later.dedup_key}) == 3, "two taps are two"
    assert tapped.tap.card_ref == "rc", "the tap's ResponseCode: the app may update that card once"
    unbounded = parse_app_message("app", app_event(ResponseCode="x" * 600), 4.0)
    assert unbounded is not None and unbounded.tap is not None and unbounded.tap.card_ref == "", "not a code"


async def test_the_apps_tapped_card_gets_one_button_that_cannot_be_tapped() -> None:
    posted: list[tuple[str, dict[str, Any]]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/gettoken"):
            return httpx.Response(200, json={"errcode": 0, "access_token": "t", "expires_in": 7200})
        posted.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"errcode": 0, "errmsg": "ok"})

    tapped = parse_app_message("app", app_event(), 2.0)
    assert tapped is not None and tapped.tap is not None
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        adapter = WeComAppAdapter(APP, http, MemoryTokens())
        assert adapter.buttons is not None
        await adapter.buttons.answered(tapped.reply_to, tapped.tap, "已确认")
        await adapter.buttons.answered(tapped.reply_to, tapped.tap.model_copy(update={"card_ref": ""}), "已确认")
    assert posted == [("/cgi-bin/message/update_template_card", {
        "userids": ["zhangsan"], "agentid": 1000002, "response_code": "rc", "button": {"replace_name": "已确认"}})], \
        "once, with the tap's code; a tap without one updates nothing"


def test_the_apps_adapter_stamps_a_tap_as_it_stamps_a_message() -> None:
    adapter = WeComAppAdapter(APP, httpx.AsyncClient(), tokens=None)  # type: ignore[arg-type]
    signer = WeComCallbackSigner(APP)
    now = time.time()
    typed = adapter.parse((s := signer.text("zhangsan", "hi")).params, s.body, now)
    tapped = adapter.parse((s := signer.card_event(_fresh(app_event()))).params, s.body, now)
    assert typed is not None and tapped is not None and tapped.tap is not None
    assert (tapped.person, tapped.session_key, tapped.conversation_key) == (
        typed.person, typed.session_key, typed.conversation_key)


def _fresh(xml: str) -> dict[str, str]:
    """The event's fields again, stamped now (the adapter refuses a timestamp outside its replay window)."""
    from bots.xml import parse_flat_xml

    fields = {k: v for k, v in parse_flat_xml(xml).items() if k != "ToUserName"}
    return {**fields, "CreateTime": str(int(time.time()))}


@pytest.mark.parametrize("change", [
    {"EventKey": "someone-elses-button"},
    {"TaskId": "another-task"},
    {"EventKey": "<absent>"},
    {"Event": "template_card_menu_event"},
])
def test_another_cards_event_gives_no_message(change: dict[str, str]) -> None:
    assert parse_app_message("app", app_event(**change), 1.0) is None  # type: ignore[arg-type]


def test_botgws_card_event_without_its_sender_is_rejected() -> None:
    with pytest.raises(CallbackRejected) as rejected:
        parse_app_message("app", app_event(user=""), 1.0)
    assert rejected.value.status == 400


def aibot_tap(**overrides: Any) -> dict[str, Any]:
    event = {"eventtype": "template_card_event", "template_card_event": {
        "card_type": "button_interaction", "event_key": button_key(QUESTION.id, "confirmed"),
        "task_id": task_id_for(QUESTION.id)}}
    payload = {"msgid": "m-1", "create_time": 1700000000, "aibotid": "aib", "from": {"userid": "lisi"},
               "chattype": "single", "response_url": "https://qyapi.weixin.qq.com/cgi-bin/aibot/response?c=1",
               "msgtype": "event", "event": event}
    return {**payload, **overrides}


def parsed(payload: dict[str, Any]) -> Any:
    async def go() -> Any:
        async with httpx.AsyncClient() as http:
            params, body = WeComAIBotUser(AIBOT, [], "http://sim", http).signed(payload)
            return WeComAIBotAdapter(AIBOT, http).parse(params, body, time.time())

    import asyncio

    return asyncio.run(go())


def test_the_ai_bots_tap_opens_no_stream_and_answers_through_its_response_url() -> None:
    message = {"msgid": "m-0", "aibotid": "aib", "chattype": "single", "from": {"userid": "lisi"},
               "response_url": "https://qyapi.weixin.qq.com/x", "msgtype": "text", "text": {"content": "hi"}}
    typed, tapped = parsed(message), parsed(aibot_tap())
    assert tapped.tap is not None and tapped.tap.choice == "confirmed" and tapped.text == "确认"
    assert tapped.reply_to.stream_id == "" and typed.reply_to.stream_id, "a tap opens no stream"
    assert tapped.reply_to.webhook_url == aibot_tap()["response_url"]
    assert tapped.conversation_key == typed.conversation_key and tapped.session_key == typed.session_key
    assert tapped.msg_id == "m-1"
    # the general event protocol shows a chatid with chattype single: still the one-to-one lane
    assert parsed(aibot_tap(chatid="CHATID")).conversation_key == typed.conversation_key


def test_the_ai_bots_tap_in_a_group_is_in_the_groups_lane() -> None:
    tapped = parsed(aibot_tap(chatid="wrGROUP", chattype="group"))
    assert tapped.conversation_id == "wrGROUP" and tapped.group_id == "wrGROUP"
    assert tapped.reply_to.chat_id == "wrGROUP"


def test_the_ai_bots_hostile_card_events() -> None:
    other = aibot_tap()
    other["event"]["template_card_event"]["event_key"] = "not-ours"
    assert parsed(other) is None
    assert parsed(aibot_tap(event={"eventtype": "template_card_event"})) is None, "no card event: nothing to do"
    for broken in (aibot_tap(event={"eventtype": "template_card_event", "template_card_event": "x"}),
                   aibot_tap(**{"from": {}})):
        with pytest.raises(CallbackRejected) as rejected:
            parsed(broken)
        assert rejected.value.status == 400


async def test_the_ai_bot_posts_its_card_only_in_a_one_to_one_chat() -> None:
    posted: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        return httpx.Response(200, json={"errcode": 0, "errmsg": "ok"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        adapter = WeComAIBotAdapter(AIBOT, http)
        url = "https://qyapi.weixin.qq.com/cgi-bin/aibot/response?response_code=1"
        assert adapter.buttons is not None
        with pytest.raises(PermanentSendError):  # refused, so the record does not say the buttons were shown
            await adapter.buttons.ask(ReplyTarget(user_id="lisi", chat_id="wrGROUP", webhook_url=url), QUESTION)
        assert posted == [], "a group's response_url takes no template card"
        await adapter.buttons.ask(ReplyTarget(user_id="lisi", webhook_url=url), QUESTION)
    assert [p["msgtype"] for p in posted] == ["template_card"]
    assert card_problem(posted[0]["template_card"], AIBOT_LIMITS) == ""
