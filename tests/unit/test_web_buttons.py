"""The page's confirmation buttons, piece by piece on the session's real Redis: a tap posted by the page becomes the
signed-in person's message in their own conversation (anything but one of botgw's keys refused), the question goes
with the answer's stream before it is finished, and the page's final event carries its buttons; a tap that is done
with nothing to show still ends the page's wait."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from bots.base import CallbackRejected, InboundMessage
from bots.buttons import Question, button_key
from bots.web.adapter import WebAdapter
from bots.web.config import WebBotConfig
from gateway.config import WorkerSettings
from gateway.delivery.base import Delivery
from gateway.delivery.page import PagePresenter
from gateway.edge.web_routes import answer_events
from gateway.state.keys import Keys
from gateway.state.limits import MovingWindowLimiter
from gateway.state.reply_record import Fence, LeaseLost, ReplyRecords
from gateway.state.streams import StreamStore

KEY = "k-" + secrets.token_hex(8)
AUTH = {"authorization": f"Bearer {KEY}"}
QUESTION = Question(secrets.token_hex(8), "确认执行「rooms.book」？", "- room：\"泰山厅\"")


def adapter() -> WebAdapter:
    return WebAdapter(WebBotConfig(id="web", api_key=KEY))


def post(body: dict) -> InboundMessage:
    return adapter().parse(AUTH, json.dumps(body).encode(), 1000.0)


# The tap, parsed


def test_a_tap_is_the_signed_in_person_s_message_in_their_own_conversation() -> None:
    said = post({"user": "alice", "text": "book a room"})
    tapped = post({"user": "alice", "button": button_key(QUESTION.id, "confirmed")})
    assert tapped.tap is not None and (tapped.tap.question_id, tapped.tap.choice) == (QUESTION.id, "confirmed")
    assert (tapped.text, tapped.msg_type) == ("确认", "text")
    same = ("platform", "bot_id", "conversation_id", "sender_id", "group_id", "family", "tenant", "memory_by_person")
    assert [getattr(tapped, name) for name in same] == [getattr(said, name) for name in same]
    assert tapped.person == said.person and tapped.conversation_key == said.conversation_key
    assert tapped.reply_to.user_id == said.reply_to.user_id == "alice"
    assert tapped.reply_to.stream_id and tapped.reply_to.stream_id != said.reply_to.stream_id
    cancelled = post({"user": "alice", "button": button_key(QUESTION.id, "cancelled")})
    assert (cancelled.text, cancelled.tap.choice if cancelled.tap else None) == ("取消", "cancelled")


def test_a_tap_is_one_delivery_per_person_and_button() -> None:
    key = button_key(QUESTION.id, "confirmed")
    first, again = post({"user": "alice", "button": key}), post({"user": "alice", "button": key, "msg_id": "x"})
    assert first.dedup_key == again.dedup_key, "the same tap posted again must be the same delivery"
    other_choice = post({"user": "alice", "button": button_key(QUESTION.id, "cancelled")})
    other_person = post({"user": "bob", "button": key})
    assert len({first.dedup_key, other_choice.dedup_key, other_person.dedup_key}) == 3


def test_a_clients_msg_id_is_one_delivery_of_its_sender_only() -> None:
    """Two users posting one msg_id were one delivery: the second was dropped and shown the first's answer (a
    review). The same sender's retry still is one delivery."""
    alice, again, bob = (post({"user": u, "text": "hi", "msg_id": "m-1"}) for u in ("alice", "alice", "bob"))
    assert alice.dedup_key == again.dedup_key and alice.reply_to.stream_id == again.reply_to.stream_id
    assert bob.dedup_key != alice.dedup_key and bob.reply_to.stream_id != alice.reply_to.stream_id


@pytest.mark.parametrize("body", [
    {"user": "alice", "button": "botgw:maybe:" + "a" * 16},
    {"user": "alice", "button": "card:confirmed:" + "a" * 16},
    {"user": "alice", "button": "botgw:confirmed:NOT-HEX"},
    {"user": "alice", "button": ""},
    {"user": "alice", "button": ["botgw:confirmed:" + "a" * 16]},
    {"user": "alice", "button": None},
    {"user": "alice", "text": "确认", "msg_id": f"tap:web:web:alice:confirmed:{'a' * 16}"},  # a tap's name, typed
    {"user": "alice", "button": "botgw:confirmed:" + "a" * 16, "text": "确认 and more"},
    {"user": "alice", "button": "botgw:confirmed:" + "a" * 16,
     "attachments": [{"ref": "a" * 32, "name": "x.png", "mime": "image/png", "size": 3}]},
])
def test_anything_but_one_of_botgw_s_buttons_is_refused(body: dict) -> None:
    with pytest.raises(CallbackRejected) as refused:
        post(body)
    assert refused.value.status == 400


def test_a_tap_without_the_key_is_refused_first() -> None:
    with pytest.raises(CallbackRejected) as refused:
        adapter().parse({}, json.dumps({"user": "alice", "button": "nonsense"}).encode(), 1000.0)
    assert refused.value.status == 401


# The question, with the stream


@pytest.fixture
async def delivery(redis: Redis, redis_url: str) -> AsyncIterator[Delivery]:
    keys = Keys("b" + secrets.token_hex(4))
    pacer = MovingWindowLimiter(redis_url, f"{keys.namespace}:pace")
    yield Delivery(redis, keys, StreamStore(redis, keys), pacer, WorkerSettings(backoff_base_s=0.01))


async def page_presenter(delivery: Delivery, message: InboundMessage, fence: Fence | None = None) -> PagePresenter:
    stream_id = message.reply_to.stream_id
    assert await delivery.streams.open("web", message.person, stream_id, limit=3, max_age_s=600)
    record = ReplyRecords(delivery.redis, delivery.keys, 3600).open(message.dedup_key)
    await record.mark(question=QUESTION.to_json())  # as the tool rounds do before committing the question
    return PagePresenter(delivery, adapter(), message, record, fence)


async def events(delivery: Delivery, stream_id: str, timeout_s: float = 5.0, settled: object = None) -> list[dict]:
    async def details() -> dict:
        return {}

    read = answer_events(delivery.redis, delivery.streams, stream_id, timeout_s, details, settled)  # type: ignore[arg-type]
    return [json.loads(line.removeprefix("data: ")) async for line in read]


async def test_the_final_event_carries_the_question_s_buttons(delivery: Delivery) -> None:
    message = post({"user": "alice", "text": "tool:rooms__book {}"})
    presenter = await page_presenter(delivery, message)
    state = await presenter.record.load()
    await presenter.finish("将要执行「rooms.book」…回复「确认」执行", state)

    stored = await delivery.streams.get(message.reply_to.stream_id)
    assert stored is not None and stored.finished and Question.from_json(stored.question) == QUESTION
    recorded = await presenter.record.load()
    assert (recorded.buttons_sent, recorded.state) == ("1", "done")
    done = (await events(delivery, message.reply_to.stream_id))[-1]
    assert done["done"] and done["text"].startswith("将要执行")
    assert done["question"]["id"] == QUESTION.id
    assert done["question"]["buttons"] == [{"key": f"botgw:confirmed:{QUESTION.id}", "label": "确认"},
                                           {"key": f"botgw:cancelled:{QUESTION.id}", "label": "取消"}]


async def test_an_answer_without_a_question_has_no_buttons(delivery: Delivery) -> None:
    message = post({"user": "alice", "text": "hello"})
    stream_id = message.reply_to.stream_id
    assert await delivery.streams.open("web", message.person, stream_id, limit=3, max_age_s=600)
    record = ReplyRecords(delivery.redis, delivery.keys, 3600).open(message.dedup_key)
    presenter = PagePresenter(delivery, adapter(), message, record, None)
    await presenter.finish("answer to: hello", await record.load())
    done = (await events(delivery, stream_id))[-1]
    assert done == {"done": True, "text": "answer to: hello"}
    assert (await record.load()).buttons_sent == ""


async def test_a_takeover_after_the_finish_records_the_buttons_shown(delivery: Delivery) -> None:
    """The first worker stored the question and finished the stream, then died before recording it."""
    message = post({"user": "alice", "text": "tool:rooms__book {}"})
    first = await page_presenter(delivery, message)
    stream_id = message.reply_to.stream_id
    assert await delivery.streams.ask(stream_id, QUESTION.to_json())
    assert await delivery.streams.update(stream_id, "the question", finish=True)
    again = PagePresenter(delivery, adapter(), message, first.record, None)
    await again.finish("the question", await again.record.load())
    assert (await again.record.load()).buttons_sent == "1"
    other = Question(secrets.token_hex(8), "t", "x")
    assert await delivery.streams.ask(stream_id, other.to_json()) is False, "a finished stream takes nothing new"


async def test_a_worker_that_lost_its_lease_stores_no_question(delivery: Delivery) -> None:
    message = post({"user": "alice", "text": "tool:rooms__book {}"})
    lease = delivery.keys.lease("web:alice")
    await delivery.redis.hset(lease, "epoch", "2")
    presenter = await page_presenter(delivery, message, Fence(lease, "1"))
    with pytest.raises(LeaseLost):
        await presenter.finish("the question", await presenter.record.load())
    stored = await delivery.streams.get(message.reply_to.stream_id)
    assert stored is not None and stored.question == "" and not stored.finished
    await delivery.redis.delete(lease)


async def test_a_message_done_with_nothing_to_show_ends_the_page_s_wait(delivery: Delivery) -> None:
    """A second tap of a settled question is done without a word: the page is told, not left to time out."""
    message = post({"user": "alice", "button": button_key(QUESTION.id, "cancelled")})
    stream_id = message.reply_to.stream_id
    assert await delivery.streams.open("web", message.person, stream_id, limit=3, max_age_s=600)
    done_now = {"value": False}

    async def settled() -> bool:
        return done_now["value"]

    done_now["value"] = True
    read = await events(delivery, stream_id, timeout_s=30, settled=settled)
    assert read == [{"status": "queued"}, {"done": True, "text": ""}]

    done_now["value"] = False  # not done: the wait ends at its timeout, with an error
    read = await events(delivery, stream_id, timeout_s=0.3, settled=settled)
    assert read[-1]["error"] == "timeout"
