"""Every answer reaches a final state: presenters on a real Redis, with a recording stand-in for DingTalk's card API.

These paths are hard to reach end to end (an engine failing after a partial answer, a worker dying between
the card's create and its finish), so they are driven here directly, with the same stores the worker uses.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis

from bots.base import InboundMessage, PermanentSendError, ReplyTarget, RetryableSendError, SendError
from bots.dingtalk.cards import DingTalkCards
from bots.dingtalk.client import FLOW_FAILED, FLOW_FINISHED
from gateway.config import WorkerSettings
from gateway.delivery.presenters import CardPresenter, Delivery, PagePresenter
from gateway.state.keys import Keys
from gateway.state.limits import MovingWindowLimiter
from gateway.state.reply_record import ReplyRecords
from gateway.state.streams import StreamStore


class CardApi:
    """Records what the presenter asked of DingTalk; the first `create_failures` creates and `deliver_failures`
    deliveries fail (before their effect)."""

    def __init__(self, create_failures: int = 0, deliver_failures: int = 0) -> None:
        self.calls: list[tuple] = []
        self.create_failures = create_failures
        self.deliver_failures = deliver_failures
        self.cards_created: list[str] = []
        self.cards_delivered: list[str] = []

    @staticmethod
    def new_track_id(*parts: str) -> str:
        return secrets.token_hex(8)

    async def create_card(self, track_id: str, *, group_id: str) -> None:
        if self.create_failures:
            self.create_failures -= 1
            raise RetryableSendError("card create failed")
        self.cards_created.append(track_id)

    async def deliver_card(self, track_id: str, *, group_id: str, user_id: str) -> None:
        assert track_id in self.cards_created, "delivered a card that was never created"
        if self.deliver_failures:
            self.deliver_failures -= 1
            raise RetryableSendError("card deliver failed")
        self.cards_delivered.append(track_id)

    async def set_card_status(self, track_id: str, flow_status: int, content: str | None = None) -> None:
        self.calls.append(("status", track_id, flow_status, content))

    async def stream_card(self, track_id: str, content: str, *, final: bool = False) -> None:
        self.calls.append(("stream", track_id, content, final))


@pytest.fixture
async def delivery(redis_url: str) -> AsyncIterator[Delivery]:
    client = aioredis.Redis.from_url(redis_url)
    keys = Keys("p" + secrets.token_hex(4))
    pacer = MovingWindowLimiter(redis_url, f"{keys.namespace}:pace")
    settings = WorkerSettings(backoff_base_s=0.01, backoff_max_s=0.05)
    yield Delivery(client, keys, StreamStore(client, keys), pacer, settings)
    await client.aclose()


def card_message() -> InboundMessage:
    user = "d" + secrets.token_hex(4)
    return InboundMessage(
        platform="dingtalk", bot_id="dt", msg_id=secrets.token_hex(6), conversation_id=f"c-{user}",
        sender_id=user, text="hi", reply_to=ReplyTarget(user_id=user),
    )  # fmt: skip


def card_presenter(delivery: Delivery, api: CardApi, message: InboundMessage) -> CardPresenter:
    adapter = SimpleNamespace(cards=DingTalkCards(api, updates_per_second=10))  # DingTalk's cards, a stand-in API
    record = ReplyRecords(delivery.redis, delivery.keys, 3600).open(message.dedup_key)
    return CardPresenter(delivery, adapter, message, record, None)


async def test_a_final_text_that_does_not_extend_the_card_is_added_after_it(delivery: Delivery) -> None:
    api, message = CardApi(), card_message()
    presenter = card_presenter(delivery, api, message)
    state = await presenter.record.load()
    await presenter.open(state)
    await presenter.show("The first half of an answer")
    await presenter.deliver("Sorry, the assistant failed.", state)

    expected = "The first half of an answer\n\nSorry, the assistant failed."
    assert api.calls[-2] == ("stream", presenter.track_id, expected, True)
    assert api.calls[-1] == ("status", presenter.track_id, FLOW_FINISHED, expected)
    stored = await delivery.streams.get(presenter.track_id)
    assert stored is not None and stored.finished and stored.content == expected


async def test_a_card_update_refused_for_now_is_skipped_and_the_finish_carries_the_whole_text(
    delivery: Delivery,
) -> None:
    """DingTalk's OpenAPI limit is per app and API (QpsLimitForAppkeyAndApi, retryable): an update on the way that it
    refuses is skipped, not raised (which failed the whole answer, to be generated again); a permanent refusal still
    raises."""
    api, message = CardApi(), card_message()
    presenter = card_presenter(delivery, api, message)
    state = await presenter.record.load()
    await presenter.open(state)
    stream_card = api.stream_card

    async def limited(track_id: str, content: str, *, final: bool = False) -> None:
        if not final:
            raise RetryableSendError("DingTalk API rate limit", code="Forbidden.AccessDenied.QpsLimitForAppkeyAndApi")
        await stream_card(track_id, content, final=final)

    api.stream_card = limited  # type: ignore[method-assign]
    await presenter.show("The first half")  # refused: skipped
    await presenter.show("The first half and the second")
    await presenter.deliver("The first half and the second.", state)
    assert [call for call in api.calls if call[0] == "stream"] == [
        ("stream", presenter.track_id, "The first half and the second.", True)
    ]

    async def refused(track_id: str, content: str, *, final: bool = False) -> None:
        raise PermanentSendError("DingTalk API /v1.0/card/streaming: param.invalid", code="param.invalid")

    other = card_presenter(delivery, api, card_message())
    await other.open(await other.record.load())
    api.stream_card = refused  # type: ignore[method-assign]
    with pytest.raises(PermanentSendError):
        await other.show("text")


async def test_a_card_whose_create_failed_is_created_on_the_retry_and_finished_once(delivery: Delivery) -> None:
    attempts = delivery.settings.max_send_attempts
    api, message = CardApi(create_failures=attempts), card_message()  # every try of the first attempt fails
    first = card_presenter(delivery, api, message)
    with pytest.raises(SendError):
        await first.open(await first.record.load())
    assert api.cards_created == []

    # The retry (another presenter, as after a hand-back) creates the card, under an id no try has used (a try
    # whose outcome is unknown may have made a card of its id), delivers it and finishes it.
    retry = card_presenter(delivery, api, message)
    await retry.finish("the answer", await retry.record.load())
    assert api.cards_created == api.cards_delivered == [retry.track_id]
    finished = [call for call in api.calls if call[0] == "status" and call[2] == FLOW_FINISHED]
    assert finished == [("status", retry.track_id, FLOW_FINISHED, "the answer")]

    # A takeover after the finish (the record said delivered) does not push the card again.
    calls = len(api.calls)
    again = card_presenter(delivery, api, message)
    await again.deliver("the answer", await again.record.load())
    assert len(api.calls) == calls and api.cards_created == api.cards_delivered == [retry.track_id]


async def test_a_card_whose_delivery_failed_is_delivered_on_the_retry_not_created_again(delivery: Delivery) -> None:
    attempts = delivery.settings.max_send_attempts
    api, message = CardApi(deliver_failures=attempts), card_message()
    first = card_presenter(delivery, api, message)
    with pytest.raises(SendError):
        await first.open(await first.record.load())
    assert len(api.cards_created) == 1 and api.cards_delivered == []

    retry = card_presenter(delivery, api, message)
    await retry.finish("the answer", await retry.record.load())
    assert api.cards_created == api.cards_delivered == [retry.track_id]
    assert api.calls[-1] == ("status", retry.track_id, FLOW_FINISHED, "the answer")


async def test_a_failed_card_ends_failed_with_what_was_shown_kept(delivery: Delivery) -> None:
    api, message = CardApi(), card_message()
    presenter = card_presenter(delivery, api, message)
    state = await presenter.record.load()
    await presenter.open(state)
    await presenter.show("partial")
    await presenter.fail("The assistant is unavailable.", state)
    assert api.calls[-1] == ("status", presenter.track_id, FLOW_FAILED, "partial\n\nThe assistant is unavailable.")


async def test_a_page_answer_that_failed_after_a_partial_answer_is_finished_not_left_open(delivery: Delivery) -> None:
    message = card_message().model_copy(update={"platform": "web", "reply_to": ReplyTarget(stream_id="s1")})
    stream_id = f"{delivery.keys.namespace}-s1"
    message = message.model_copy(update={"reply_to": ReplyTarget(stream_id=stream_id)})
    assert await delivery.streams.open("web", message.sender_id, stream_id, limit=3, max_age_s=60)
    record = ReplyRecords(delivery.redis, delivery.keys, 3600).open(message.dedup_key)
    presenter = PagePresenter(delivery, SimpleNamespace(), message, record, None)
    await presenter.show("half an answ")
    await presenter.deliver("a different final text", await record.load())
    stored = await delivery.streams.get(stream_id)
    assert stored is not None and stored.finished
    assert stored.content == "half an answ\n\na different final text"
    # Finished means the user's stream slot is free again.
    assert await delivery.redis.zcard(delivery.keys.active_streams("web", message.sender_id)) == 0


def test_max_tokens_is_lowered_to_what_the_platform_can_show() -> None:
    from bots.wecom.aibot import WeComAIBotAdapter
    from gateway.pipeline.prompt_plan import MAX_BYTES_PER_TOKEN, answer_token_cap

    cap = WeComAIBotAdapter.max_answer_bytes
    assert cap == 20480 + 20480
    assert answer_token_cap(WeComAIBotAdapter, 100_000) == cap // MAX_BYTES_PER_TOKEN
    assert answer_token_cap(WeComAIBotAdapter, 512) == 512
    assert answer_token_cap(SimpleNamespace(max_answer_bytes=None), 100_000) == 100_000


async def test_a_finished_stream_opened_again_does_not_hold_a_slot(delivery: Delivery) -> None:
    """WeCom retries a message's first callback late: the finished stream is rejoined, and the user's three
    slots stay free for new questions (found by the soak: the 4th question was refused as 'still answering')."""
    streams, user = delivery.streams, "u" + secrets.token_hex(4)
    for number in range(3):
        stream_id = f"{delivery.keys.namespace}-s{number}"
        assert await streams.open("ai", user, stream_id, limit=3, max_age_s=360)
        assert await streams.update(stream_id, "done", finish=True)
        assert await streams.open("ai", user, stream_id, limit=3, max_age_s=360)  # the late retry
    assert await delivery.redis.zcard(delivery.keys.active_streams("ai", user)) == 0
    assert await streams.open("ai", user, f"{delivery.keys.namespace}-new", limit=3, max_age_s=360)


# -- the AI bot's stream closed at the time limit ------------------------------------------------------------------


async def test_a_stream_closed_at_the_time_limit_is_known_by_its_mark_not_its_text(delivery: Delivery) -> None:
    """A refresh at the limit closes the stream marked `timed_out` in the same step; an answer that happens to end
    with the apology's words is no such stream; one closed by a gateway older than the mark (a rolling upgrade: the
    old apology, no mark) still is."""
    from gateway import texts
    from gateway.delivery.stream import StreamPresenter

    streams, ended_early = delivery.streams, StreamPresenter._ended_early
    closed, answered, old = (secrets.token_hex(8) for _ in range(3))
    for stream_id in (closed, answered, old):
        assert await streams.open("ai", "u" + stream_id, stream_id, limit=3, max_age_s=400)
    assert await streams.close_late(closed, texts.STREAM_TIMEOUT_TEXT)
    assert await streams.update(answered, "an answer quoting it: " + texts.STREAM_TIMEOUT_TEXT, finish=True)
    assert await streams.update(old, texts.STREAM_TIMEOUT_TEXTS_BEFORE[0], finish=True)
    assert ended_early(await streams.get(closed)) and (await streams.get(closed)).timed_out  # type: ignore[union-attr]
    assert not ended_early(await streams.get(answered))
    assert ended_early(await streams.get(old))
    assert ended_early(None), "a stream gone from the store shows nothing more"
    assert not await streams.close_late(closed, texts.STREAM_TIMEOUT_TEXT + "!"), "finished: nothing changes"


class OverflowApi:
    """The AI bot's response_url side: records its one post."""

    max_overflow_bytes = 20480
    max_stream_bytes = 20480

    def __init__(self) -> None:
        self.posts: list[str] = []

    def overflow_allowed(self, target: ReplyTarget) -> bool:
        return True

    async def send_overflow(self, target: ReplyTarget, text: str) -> None:
        self.posts.append(text)


async def test_a_failure_after_the_stream_closed_at_the_time_limit_is_told_through_response_url(
    delivery: Delivery,
) -> None:
    """The apology promised a separate message: when the answer then fails for good, the failure notice is that
    message (the stream can show nothing more). Before, nothing was sent and the person waited for ever."""
    from gateway import texts
    from gateway.delivery.stream import StreamPresenter

    user, stream_id = "u" + secrets.token_hex(4), secrets.token_hex(8)
    message = InboundMessage(
        platform="wecom-ai", bot_id="ai", msg_id=secrets.token_hex(6), conversation_id=user, sender_id=user,
        text="hi", reply_to=ReplyTarget(user_id=user, stream_id=stream_id, webhook_url="https://example.invalid/r"),
    )  # fmt: skip
    assert await delivery.streams.open("ai", user, stream_id, limit=3, max_age_s=400)
    assert await delivery.streams.close_late(stream_id, texts.STREAM_TIMEOUT_TEXT)
    api = OverflowApi()
    record = ReplyRecords(delivery.redis, delivery.keys, 3600).open(message.dedup_key)
    presenter = StreamPresenter(delivery, api, message, record, None)  # type: ignore[arg-type]
    await presenter.fail(texts.ENGINE_UNAVAILABLE_TEXT, await record.load())
    assert api.posts == [texts.ENGINE_UNAVAILABLE_TEXT]
    await presenter.fail(texts.ENGINE_UNAVAILABLE_TEXT, await record.load())
    assert len(api.posts) == 1, "response_url takes one post"
    assert (await delivery.streams.get(stream_id)).content == texts.STREAM_TIMEOUT_TEXT  # type: ignore[union-attr]
