"""DingTalk question cards (bots/dingtalk/buttons.py): the card asked, the outTrackId that carries where it was
shown, and card callbacks read back into taps, hostile ones included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from bots.base import CallbackRejected, ReplyTarget
from bots.buttons import Question, button_key
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.dingtalk.buttons import (
    BUTTON_CARD_TEMPLATE,
    ONE_TO_ONE_CONVERSATION,
    CardPlace,
    DingTalkButtons,
    TrackIds,
    button_id,
    card_params,
    read_card_tap,
    tap_of,
)
from bots.dingtalk.config import DingTalkBotConfig

QUESTION = Question("0123456789abcdef", "确认执行「rooms.book」？", '- Room："泰山厅"')
CONFIG = DingTalkBotConfig(id="ding", mode="stream", app_key="dingkey", app_secret="s3cret")


def callback(track: str, user: str = "asker", action: str = "", content: Any = None) -> dict[str, Any]:
    """A card callback's data as the SDK's sample has it (content: a JSON string)."""
    action = action or button_id(button_key(QUESTION.id, "confirmed"))
    private = {"cardPrivateData": {"actionIds": [action], "params": {}}}
    return {"extension": "{}", "corpId": "corp", "spaceType": "", "userIdType": 1, "type": "actionCallback",
            "userId": user, "outTrackId": track, "spaceId": "",
            "content": json.dumps(private) if content is None else content}


def test_the_card_shows_the_question_with_two_callback_buttons() -> None:
    params = card_params(QUESTION)
    assert all(isinstance(value, str) for value in params.values()), "cardParamMap values are strings"
    assert params["title"] == QUESTION.title and params["markdown"] == QUESTION.text
    shown = json.loads(params["sys_full_json_obj"])["msgButtons"]
    assert [b["text"] for b in shown] == ["确认", "取消"]
    assert all(b["request"] is True and ":" not in b["id"] for b in shown)
    assert [tap_of(b["id"]) for b in shown] == [tap_of(button_id(key)) for key, _ in QUESTION.buttons()]
    assert tap_of(shown[1]["id"]).choice == "cancelled"


@pytest.mark.parametrize("action", ["", "botgw_confirmed", "botgw_confirmed_NOTHEX", "other_confirmed_0123456789abcdef",
                                    "botgw_maybe_0123456789abcdef", "button_node_ocljnpbz4i4", "a_b_c_d"])
def test_a_button_that_is_not_botgws_is_no_tap(action: str) -> None:
    assert tap_of(action) is None


def test_the_track_id_carries_where_the_card_was_shown_and_only_its_signer_reads_it() -> None:
    tracks = TrackIds("s3cret")
    place = CardPlace("asker", "cid+group/x==", "")
    track = tracks.make(place)
    assert tracks.read(track) == place
    assert track != tracks.make(place), "every try a card of its own"
    assert all(c.isalnum() or c in "-_" for c in track), track
    assert TrackIds("another secret").read(track) is None
    tampered = track[:-17] + ("A" if track[-17] != "A" else "B") + track[-16:]
    assert tracks.read(tampered) is None
    for foreign in ("", "bq1", "53d6dda444c74f5f17bf4534333c1a46f690b4ddadac8d7e80fc11c2e4a714cb", "bq1!!!" + "x" * 16):
        assert tracks.read(foreign) is None


def test_the_askers_tap_in_a_group_is_a_message_of_that_group_by_the_callbacks_user() -> None:
    tracks = TrackIds("s3cret")
    track = tracks.make(CardPlace("asker", "cidgroup", ""))
    tap = read_card_tap(CONFIG, tracks, "frame-1", json.dumps(callback(track)), 100.0)
    assert tap is not None and tap.by_asker
    message = tap.message
    assert (message.conversation_id, message.group_id, message.sender_id) == ("cidgroup", "cidgroup", "asker")
    expected = ReplyTarget(user_id="asker", chat_id="cidgroup", conversation_id="cidgroup")
    assert message.reply_to == expected, "no webhook: the OpenAPI answers"
    assert message.tap is not None and (message.tap.question_id, message.tap.choice) == (QUESTION.id, "confirmed")
    assert message.text == "确认" and message.mentioned_bot and message.family == "dingtalk"
    params = tap.response["cardData"]["cardParamMap"]
    assert json.loads(params["sys_full_json_obj"])["msgButtons"] == [] and "确认" in params["tips"]
    again = read_card_tap(CONFIG, tracks, "frame-1", callback(track), 101.0)
    other = read_card_tap(CONFIG, tracks, "frame-2", callback(track), 101.0)
    assert again.message.msg_id == message.msg_id, "a redelivered frame is the same tap"
    assert other.message.msg_id != message.msg_id, "another frame is another tap"


def test_someone_elses_tap_is_read_as_theirs_and_changes_no_card() -> None:
    tracks = TrackIds("s3cret")
    track = tracks.make(CardPlace("asker", "cidgroup", ""))
    tap = read_card_tap(CONFIG, tracks, "frame", callback(track, user="intruder"), 1.0)
    assert not tap.by_asker and tap.message.sender_id == "intruder" and tap.response is None


def test_a_one_to_one_tap_stays_in_the_persons_chat() -> None:
    tracks = TrackIds("s3cret")
    tap = read_card_tap(CONFIG, tracks, "frame", callback(tracks.make(CardPlace("asker", "", ""))), 1.0)
    expected = ReplyTarget(user_id="asker", conversation_id=tap.message.conversation_id)
    assert tap.message.group_id == "" and tap.message.reply_to == expected
    asked_in = tracks.make(CardPlace("asker", "", "cidone2one"))  # the chat's conversationId, as the question had it
    again = read_card_tap(CONFIG, tracks, "frame-2", callback(asked_in), 1.0)
    assert again is not None and again.message.conversation_id == "cidone2one", "the question's own lane"
    assert tap.message.conversation_id == ONE_TO_ONE_CONVERSATION + "asker"
    assert tap.message.session_key == "dm:dingtalk:ding:asker", "the asker's own lane, as their messages"


def test_callbacks_about_other_cards_or_buttons_are_left_alone() -> None:
    tracks = TrackIds("s3cret")
    ours = tracks.make(CardPlace("asker", "cidgroup", ""))
    assert read_card_tap(CONFIG, tracks, "f", callback("a-card-of-someone-else"), 1.0) is None
    assert read_card_tap(CONFIG, tracks, "f", callback(ours, action="button_node_x"), 1.0) is None
    no_ids = callback(ours, content=json.dumps({"cardPrivateData": {"params": {}}}))
    assert read_card_tap(CONFIG, tracks, "f", no_ids, 1.0) is None


@pytest.mark.parametrize("data", ["not json", "[1]", 42, None, '{"outTrackId": ' + "[" * 100 + "]" * 100 + "}"])
def test_unreadable_callback_data_is_refused(data: Any) -> None:
    with pytest.raises(CallbackRejected):
        read_card_tap(CONFIG, TrackIds("s3cret"), "f", data, 1.0)


def test_our_card_with_broken_content_or_no_user_is_refused() -> None:
    tracks = TrackIds("s3cret")
    ours = tracks.make(CardPlace("asker", "cidgroup", ""))
    for content in ("{not json", json.dumps([1, 2])):
        with pytest.raises(CallbackRejected):
            read_card_tap(CONFIG, tracks, "f", callback(ours, content=content), 1.0)
    with pytest.raises(CallbackRejected):
        read_card_tap(CONFIG, tracks, "f", callback(ours, user=""), 1.0)
    with pytest.raises(CallbackRejected):
        read_card_tap(CONFIG, tracks, "", callback(ours), 1.0)
    corp = CONFIG.model_copy(update={"corp_id": "mine"})
    with pytest.raises(CallbackRejected):
        read_card_tap(corp, tracks, "f", callback(ours), 1.0)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def call(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((method, path, body))
        return {}

    async def deliver_card(self, track: str, *, group_id: str, user_id: str) -> None:
        self.calls.append(("POST", "deliver", {"track": track, "group": group_id, "user": user_id}))


@pytest.mark.parametrize("group", ["cidgroup", ""])
def test_asking_creates_the_card_for_stream_callbacks_then_delivers_it(group: str) -> None:
    api = Recorder()
    buttons = DingTalkButtons(api, CONFIG)  # type: ignore[arg-type]
    asyncio.run(buttons.ask(ReplyTarget(user_id="asker", chat_id=group), QUESTION))
    (_, path, create), (_, _, deliver) = api.calls
    assert path == "/v1.0/card/instances"
    assert create["cardTemplateId"] == BUTTON_CARD_TEMPLATE and create["callbackType"] == "STREAM"
    assert create["cardData"]["cardParamMap"] == card_params(QUESTION)
    space = "imGroupOpenSpaceModel" if group else "imRobotOpenSpaceModel"
    assert create[space] == {"supportForward": False}
    assert deliver == {"track": create["outTrackId"], "group": group, "user": "asker"}
    assert buttons.tracks.read(create["outTrackId"]) == CardPlace("asker", group, "")


def test_only_a_stream_mode_robot_offers_buttons() -> None:
    http = httpx.AsyncClient()
    assert DingTalkRobotAdapter(CONFIG, http, None).buttons is not None  # type: ignore[arg-type]
    http_mode = CONFIG.model_copy(update={"mode": "http"})
    assert DingTalkRobotAdapter(http_mode, http, None).buttons is None  # type: ignore[arg-type]
