"""Faults at the answer path's side-effect boundaries, driven in one process on a real redis-server with the
worker's own classes (scheduler, reply record, conversations, presenters, limits). Each test is a defect an
outside review reproduced: it fails on the code before its fix.

The platform is a recording stand-in here where the point is the gateway's order of writes and sends; the
same paths against the simulator are in tests/e2e/wecom_kf/test_kf.py and tests/e2e/wecom_kf/test_kf_faults.py.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from redis.exceptions import RedisError

from bots.base import (
    ConversationTaken,
    EventEffect,
    InboundMessage,
    PermanentSendError,
    ReplyQuota,
    ReplyTarget,
    RetryableSendError,
)
from engine.client import Completion, EngineError
from gateway import texts
from gateway.config import MemorySettings, Settings, WorkerSettings
from gateway.delivery.base import HandedBack
from gateway.delivery.presenters import PiecesPresenter, StreamPresenter
from gateway.pipeline.commands import Commands
from gateway.pipeline.generate import Generate
from gateway.pipeline.job import Job, PromptPlan
from gateway.queue.entry import QueueEntry
from gateway.state.limits import Budget, Budgets, LimitSettings
from gateway.state.memory import ConversationMemory, Scope, Turn
from gateway.state.reply_record import Fence, FencedValues, LeaseLost, ReplyRecord
from gateway.worker.dispatch import answer
from gateway.worker.loop import Worker
from gateway.worker.pulled import PulledWork
from tests.redis.conftest import World

QUOTA = ReplyQuota(limit=5, window_s=48 * 3600, reserve=1)


def kf_message(text: str = "你好", msg_type: str = "text") -> InboundMessage:
    person = "wm" + secrets.token_hex(4)
    return InboundMessage(
        platform="wecom-kf", bot_id="kefu", msg_id=secrets.token_hex(6), conversation_id=f"wk:{person}",
        sender_id=person, text=text, msg_type=msg_type, reply_to=ReplyTarget(chat_id="wk", user_id=person),
    )  # fmt: skip


@dataclass
class KfStandIn:
    """A 微信客服-shaped channel that records its sends (pieces of 2048 bytes, 5 per 48 h, one kept)."""

    sent: list[str] = field(default_factory=list)
    reply_quota: ReplyQuota | None = QUOTA
    duplicate_check_window_s: float = 0.0
    max_stream_bytes: int = 20480
    reply_format: str = "text"

    def max_bytes_for(self, target: ReplyTarget) -> int:
        return 2048

    def pacing(self, target: ReplyTarget) -> list:
        return []

    def platform_message_id(self, piece_key: str) -> str:
        return ""

    async def send_piece(self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = "") -> None:
        self.sent.append(text)


async def leased(world: World, message: InboundMessage) -> tuple[Fence, object]:
    """Queue `message` in its lane and take it: the lease every write is fenced by."""
    lane = Scope.of(message, "per_user").lane
    await world.scheduler.enqueue(lane, QueueEntry(owner=lane, message=message))
    lease = await world.scheduler.take("w", 30_000, 0)
    assert lease is not None and lease.lane == lane
    return Fence(world.keys.lease(lane), lease.epoch), lease


async def customer_wrote(world: World, message: InboundMessage) -> None:
    await world.conversations.renew_quota(message, QUOTA)


async def kf_turn(world: World, text: str = "你好") -> tuple[InboundMessage, Fence, ReplyRecord]:
    """A customer who just wrote `text`: the message leased, their allowance renewed, its reply record open."""
    message = kf_message(text)
    fence, _ = await leased(world, message)
    await customer_wrote(world, message)
    return message, fence, world.records.open(message.dedup_key, fence)


# -- defect 11 and 5: the quota slot and the send's begin mark are one step; notices take slots too --------------


async def test_a_lease_lost_before_a_piece_is_sent_spends_no_quota_slot(world: World) -> None:
    message, fence, record = await kf_turn(world)
    stale = world.records.open(message.dedup_key, Fence(fence.lease_key, str(int(fence.epoch) - 1)))
    adapter = KfStandIn()
    presenter = PiecesPresenter(world.delivery, adapter, message, stale, stale.fence)
    with pytest.raises(LeaseLost):
        await presenter.deliver("回答", await record.load())
    assert adapter.sent == []
    assert await world.conversations.quota_left(message, QUOTA) == 4, "a worker that lost the lease used a slot"


async def test_the_engine_starting_notice_takes_a_quota_slot_so_the_handoff_slot_survives(world: World) -> None:
    message, fence, record = await kf_turn(world)
    adapter = KfStandIn()
    presenter = PiecesPresenter(world.delivery, adapter, message, record, fence)
    assert await presenter.notice(texts.ENGINE_STARTING_TEXT, once="wait_notice")
    assert not await presenter.notice(texts.ENGINE_STARTING_TEXT, once="wait_notice"), "sent twice"
    await presenter.finish("很长的回答。" * 1400, await record.load())  # 5 pieces' worth
    assert len(adapter.sent) == 4, f"notice + {len(adapter.sent) - 1} pieces: the handoff's slot is gone"
    assert adapter.sent[-1].endswith(texts.ANSWER_CUT_TEXT)
    assert await world.conversations.take_slot(message, QUOTA, record, {}, for_handoff=True)


# -- defect 6: an AI-bot answer over the stream cap says it was cut when the overflow post is impossible ----------


async def test_an_answer_over_the_stream_cap_ends_with_the_cut_note_when_response_url_is_unusable(
    world: World,
) -> None:
    person = "u" + secrets.token_hex(4)
    stream_id = secrets.token_hex(8)
    message = InboundMessage(
        platform="wecom-ai", bot_id="ai", msg_id=secrets.token_hex(6), conversation_id=person, sender_id=person,
        text="写长文", reply_to=ReplyTarget(user_id=person, stream_id=stream_id),
    )  # fmt: skip
    await world.delivery.streams.open("ai", person, stream_id, limit=3, max_age_s=600)
    adapter = SimpleNamespace(max_stream_bytes=20480, max_overflow_bytes=20480, overflow_allowed=lambda target: False)
    record = world.records.open(message.dedup_key)
    presenter = StreamPresenter(world.delivery, adapter, message, record, None)
    text = "长" * 10_000  # 30,000 bytes
    for end in range(1000, len(text) + 1, 1000):  # shown while written, as the engine streams it
        await presenter.show(text[:end])
    await presenter.deliver(text, await record.load())
    final = await world.delivery.streams.get(stream_id)
    assert final is not None and final.finished
    assert len(final.content.encode()) <= 20480
    assert final.content.endswith(texts.ANSWER_CUT_TEXT), "the answer was cut without a word"


# -- defect 8: message windows are counted once per message, and a refusal spends no window -----------------------


async def test_a_refusal_by_the_group_window_spends_none_of_the_users(world: World) -> None:
    settings = LimitSettings(per_user="5/minute", group=Budget(messages="1/minute"))
    budgets = Budgets(world.redis, world.redis_url, world.keys, settings)
    user, group = "u" + secrets.token_hex(4), "g" + secrets.token_hex(4)
    first = secrets.token_hex(4)
    assert await budgets.admit_message(user, group, first) is None
    assert await budgets.admit_message(user, group, first) is None, "the same message asked again (a retry)"
    refusal = await budgets.admit_message(user, group, secrets.token_hex(4))
    assert refusal is not None and refusal.who == f"group:{group}"
    used = (await budgets.show(user))[f"user:{user}"]["messages"][0]["used"]
    assert used == 1, f"a retry or the refused message spent the user's window too ({used} used)"


# -- defect 9: /reset's clear is fenced with the commit ------------------------------------------------------------


async def test_a_stale_reset_wipes_nothing_its_successor_wrote(world: World) -> None:
    message = kf_message("/reset")
    fence, _ = await leased(world, message)
    memory_key = world.keys.memory(Scope.of(message, "per_user").lane)
    successor = world.records.open(message.dedup_key, fence)
    await successor.commit("答", "1", memory_key, (Turn("user", "问", 1), Turn("assistant", "答", 1)), 3600, 0)
    stale = world.records.open(message.dedup_key, Fence(fence.lease_key, str(int(fence.epoch) - 1)))
    with pytest.raises(LeaseLost):
        await stale.commit(texts.RESET_TEXT, "2", memory_key, None, 3600, 0, clear_memory=True)
    assert await world.redis.llen(memory_key) == 2, "a stale worker's /reset wiped the successor's memory"

    # nor the files sent since: the /reset stage clears them under the lease too (it deleted them unfenced)
    lane = Scope.of(message, "per_user").lane
    await world.redis.hset(world.keys.attachments(lane), "m2", "a file sent after the real /reset")
    services = SimpleNamespace(redis=world.redis, keys=world.keys)
    job = SimpleNamespace(message=message, record=stale, scope=Scope.of(message, "per_user"))

    async def never(job: object) -> None:
        raise AssertionError("/reset is a command")

    with pytest.raises(LeaseLost):
        await Commands(services)(job, never)  # type: ignore[arg-type]
    assert await world.redis.hlen(world.keys.attachments(lane)) == 1, "a stale /reset wiped the files"


async def test_a_stale_worker_cannot_set_the_holder_or_the_quota(world: World) -> None:
    message = kf_message()
    fence, _ = await leased(world, message)
    stale = Fence(fence.lease_key, str(int(fence.epoch) - 1))
    await world.conversations.set_owner(message, "bot", fence)
    with pytest.raises(LeaseLost):
        await world.conversations.set_owner(message, "human", stale)
    assert await world.conversations.owner(SimpleNamespace(), message) == "bot"
    with pytest.raises(LeaseLost):
        await world.conversations.renew_quota(message, QUOTA, stale)
    assert await world.conversations.quota_left(message, QUOTA) == 0, "a stale worker renewed the allowance"


# -- defect 2: a retry never merges new messages into an answer already recorded -----------------------------------


async def test_a_head_whose_answer_is_recorded_is_not_merged_again(world: World) -> None:
    message = kf_message()
    fence, lease = await leased(world, message)
    record = world.records.open(message.dedup_key, fence)
    job = Job(lease, message, Scope.of(message, "per_user"), SimpleNamespace(merge_window_s=3.0), record, None)  # type: ignore[arg-type]
    assert await Worker._may_merge(job), "a fresh head merges its burst"
    await record.commit("已经写好的回答", "1")
    assert not await Worker._may_merge(job), "what came behind would be absorbed into an answer already written"


# -- defect 4: a Redis error before the answer began is a counted failure with a backoff ---------------------------


async def test_a_redis_error_in_the_merge_is_counted_and_backed_off(world: World) -> None:
    message = kf_message()
    _, lease = await leased(world, message)
    worker = object.__new__(Worker)
    adapter = SimpleNamespace(
        merge_window_s=3.0, reply_style="pieces", reply_quota=QUOTA, duplicate_check_window_s=0,
        sessions=SimpleNamespace(wants_human=lambda text: False),
    )  # fmt: skip
    settings = SimpleNamespace(memory=MemorySettings(), worker=WorkerSettings(max_send_attempts=3))
    worker._rt = SimpleNamespace(adapters={"kefu": adapter})
    worker._settings, worker._cfg, worker._scheduler = settings, settings.worker, world.scheduler

    async def merge_fails(*args: object) -> None:
        raise RedisError("connection reset mid-merge")

    worker.services = SimpleNamespace(  # type: ignore[assignment]
        settings=settings, keys=world.keys, redis=world.redis, scheduler=world.scheduler, records=world.records,
        delivery=world.delivery, memory=ConversationMemory(world.redis, world.keys, 3600, 10),
    )  # fmt: skip
    worker.pulled = SimpleNamespace(merge=merge_fails)  # type: ignore[assignment]
    worker._pipelines = {}
    await worker._handle(lease)  # before the fix: UnboundLocalError (no job yet), never counted
    assert int(await world.redis.get(world.keys.entry_failures(lease.entry_id)) or 0) == 1
    assert await world.scheduler.take("w2", 30_000, 0) is None, "retried at once instead of after a backoff"


# -- defect 7: a continued answer leaves max_tokens room for what is already shown --------------------------------


class ContinuingEngine:
    """Fails mid-stream once after writing `first`, then finishes; records each request's max_tokens."""

    def __init__(self, first: str, rest: str) -> None:
        self.first, self.rest = first, rest
        self.max_tokens: list[int] = []

    async def count_tokens(self, text: str) -> int:
        return len(text)

    async def chat(self, messages: list[dict], *, max_tokens: int, on_delta, **kwargs: object) -> Completion:  # type: ignore[no-untyped-def]
        self.max_tokens.append(max_tokens)
        if len(self.max_tokens) == 1:
            await on_delta(self.first)
            raise EngineError("engine connection lost mid-stream", retryable=True)
        await on_delta(self.rest)
        return Completion(self.rest, 10, len(self.rest), "stop", 0.1, 0.2)


class ShownStore:
    """A presenter that keeps what the user sees, as the stream store does."""

    streams, interval_s = True, 0.0

    def __init__(self) -> None:
        self.text = ""

    async def shown(self) -> str:
        return self.text

    async def show(self, text: str) -> None:
        self.text = text


async def test_a_continued_answer_asks_for_only_the_tokens_left_and_settles_the_failed_attempt() -> None:
    engine = ContinuingEngine("一二三四五六七八九十", "完")
    generate = Generate(SimpleNamespace(engine=engine))  # type: ignore[arg-type]
    job = SimpleNamespace(presenter=ShownStore(), message=SimpleNamespace(temperature=None), tokens_used=0)
    plan = PromptPlan([], max_tokens=50, prompt_bound=100, message_tokens=None)
    completion = await generate._stream_to_user(job, [], plan)  # type: ignore[arg-type]
    assert completion.text == "一二三四五六七八九十完"
    assert engine.max_tokens == [50, 40], "the continuation may spend a whole max_tokens past the reservation"
    assert job.tokens_used == 100 + 10, "the failed attempt's prompt and written tokens were never settled"


# -- defect 3: a handoff after "nothing in the documents" still happens when its move failed once -----------------


class FlakySessions:
    """Human agents' side: the first move to a human fails (a transient platform error), later ones succeed."""

    def __init__(self) -> None:
        self.moves: list[str] = []
        self.notices: list[str] = []

    async def hand_off(self, target: ReplyTarget, servicer: str | None) -> str:
        self.moves.append("try")
        if len(self.moves) == 1:
            raise RetryableSendError("system busy (-1)", code=-1)
        return "MSG_CODE"

    async def send_notice(
        self, target: ReplyTarget, code: str, text: str, notice_key: str, *, resend: bool = False
    ) -> None:
        self.notices.append(f"{code}:{text}")

    def handoff_text(self) -> str:
        return "正在为您转接人工客服"


async def never_composed(job: Job) -> None:
    raise AssertionError("the answer was committed already: nothing is composed again")


async def test_a_no_answer_handoff_whose_move_fails_once_is_made_on_the_retry(world: World) -> None:
    message = kf_message("你们的退货政策？")
    fence, lease = await leased(world, message)
    await customer_wrote(world, message)
    record = world.records.open(message.dedup_key, fence)
    await record.commit("抱歉，资料里没有找到答案。", "1")
    await record.mark(no_answer="1")
    adapter = KfStandIn()
    adapter.sessions = FlakySessions()  # type: ignore[attr-defined]
    presenter = PiecesPresenter(world.delivery, adapter, message, record, fence)
    job = Job(lease, message, Scope.of(message, "per_user"), adapter, record, presenter)  # type: ignore[arg-type]
    services = SimpleNamespace(conversations=world.conversations)
    with pytest.raises(RetryableSendError):
        await answer(job, services, never_composed)  # type: ignore[arg-type]
    outcome = await answer(job, services, never_composed)  # type: ignore[arg-type]
    assert outcome.endswith("handed off (no answer)"), "the retry took the answer for done"
    assert adapter.sent == ["抱歉，资料里没有找到答案。"], "the answer was sent again"
    assert adapter.sessions.notices == ["MSG_CODE:正在为您转接人工客服"]  # type: ignore[attr-defined]
    assert (await record.load()).state == "done"


class RefusingKf(KfStandIn):
    """WeCom refuses the send itself (its count of the allowance differs from botgw's: 95001)."""

    async def send_piece(self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = "") -> None:
        raise ConversationTaken("send msg count limit (95001)", code=95001)


@pytest.mark.parametrize("refused_by", ["botgw's count", "WeCom"])
async def test_a_no_answer_handoff_is_made_when_the_customers_allowance_is_used_up(
    world: World, refused_by: str
) -> None:
    """The answers to earlier questions took the four answer slots: "nothing in the documents" cannot be said, and
    used to end the message there (withheld), so the customer got neither an answer nor a person. The move to a
    person takes no message: it is made, and its notice goes in the slot kept for it. Alike when WeCom refuses the
    send though botgw counted a slot left."""
    message = kf_message("你们的退货政策？")
    fence, lease = await leased(world, message)
    await customer_wrote(world, message)
    if refused_by == "botgw's count":
        for earlier in range(QUOTA.limit - 1):
            await world.conversations.take_slot(message, QUOTA, world.records.open(f"earlier{earlier}"), {"x": "1"})
    record = world.records.open(message.dedup_key, fence)
    await record.commit("抱歉，资料里没有找到答案。", "1")
    await record.mark(no_answer="1")
    adapter = KfStandIn() if refused_by == "botgw's count" else RefusingKf()
    adapter.sessions = FlakySessions()  # type: ignore[attr-defined]
    adapter.sessions.moves.append("a first move that failed")  # type: ignore[attr-defined]  # the next one works
    presenter = PiecesPresenter(world.delivery, adapter, message, record, fence)
    job = Job(lease, message, Scope.of(message, "per_user"), adapter, record, presenter)  # type: ignore[arg-type]
    outcome = await answer(job, SimpleNamespace(conversations=world.conversations), never_composed)  # type: ignore[arg-type]
    assert outcome == "handed off (no answer; the customer could not be told)", outcome
    assert adapter.sent == [], "no slot was left for the answer"
    assert adapter.sessions.notices == ["MSG_CODE:正在为您转接人工客服"]  # type: ignore[attr-defined]
    assert (await record.load()).state == "done"


async def test_a_stale_puller_cannot_move_the_cursor(world: World) -> None:
    message = kf_message()
    fence, _ = await leased(world, message)
    values, key = FencedValues(world.redis), world.keys.pull_cursor("kefu", "wk")
    await values.set(fence, key, "cursor-2")
    with pytest.raises(LeaseLost):
        await values.set(Fence(fence.lease_key, str(int(fence.epoch) - 1)), key, "cursor-1")
    assert await world.redis.get(key) == b"cursor-2"


# -- msg_send_fail: a message the platform accepted and then could not deliver is not recorded as delivered -------


async def test_a_send_reported_failed_later_is_recorded_on_its_reply_refunded_and_dead_lettered(world: World) -> None:
    message, fence, record = await kf_turn(world)
    adapter = KfStandIn()
    adapter.platform_message_id = lambda piece_key: "m" + piece_key.replace(":", "")[-24:]  # type: ignore[method-assign]
    await PiecesPresenter(world.delivery, adapter, message, record, fence).finish("回答", await record.load())
    assert await world.conversations.quota_left(message, QUOTA) == 3
    failed_id = adapter.platform_message_id(f"{message.dedup_key}:0")
    effect = EventEffect(label="msg_send_fail:10", failed_msgid=failed_id, fail_type="10", quota_refund=1,
                         dead_letter=True)  # fmt: skip
    adapter.sessions = SimpleNamespace(on_event=lambda event, target: effect)  # type: ignore[attr-defined]
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    pulled.conversations = world.conversations
    event_message = kf_message()
    event_record = world.records.open(event_message.dedup_key)
    assert await pulled.event(adapter, message, {}, event_record) == "msg_send_fail:10"
    assert (await world.records.open(message.dedup_key).load()).send_failed == "10:0"
    assert await world.conversations.quota_left(message, QUOTA) == 4, "the slot the platform did not count"
    letters = await world.redis.xrange(world.keys.dead_letters)
    assert any(b"msg_send_fail" in fields[b"entry"] for _, fields in letters)
    # The event run again (a retry, a takeover): the slot is not given back twice (botgw could then send past
    # WeCom's 5), nor is a second letter kept (found by a review).
    assert await pulled.event(adapter, message, {}, event_record) == "msg_send_fail:10"
    assert await world.conversations.quota_left(message, QUOTA) == 4, "the slot was given back twice"
    assert len(await world.redis.xrange(world.keys.dead_letters)) == len(letters)


async def test_a_welcome_reported_failed_later_makes_no_letter_that_a_replay_would_answer_as_a_chat(
    world: World,
) -> None:
    """A welcome or a notice is no piece of an answer: no question to replay. Its letter was the event itself,
    which a replay answered as the customer's chat ("not this kind of message"), renewing their allowance."""
    message, _, _ = await kf_turn(world)
    adapter = KfStandIn()
    effect = EventEffect(label="msg_send_fail:10", failed_msgid="welcome-msgid", fail_type="10", quota_refund=1,
                         dead_letter=True)  # fmt: skip
    adapter.sessions = SimpleNamespace(on_event=lambda event, target: effect)  # type: ignore[attr-defined]
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    pulled.conversations = world.conversations
    assert await pulled.event(adapter, message, {}, world.records.open(kf_message().dedup_key)) == "msg_send_fail:10"
    assert await world.redis.xrange(world.keys.dead_letters) == []


async def test_a_welcome_takes_a_slot_when_the_customer_has_written_and_never_the_handoffs(world: World) -> None:
    sent: list[str] = []

    async def send_notice(target: ReplyTarget, code: str, text: str, key: str, *, resend: bool = False) -> None:
        sent.append(code)

    adapter = SimpleNamespace(reply_quota=QUOTA, sessions=SimpleNamespace(send_notice=send_notice))
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    pulled.conversations = world.conversations
    welcome = EventEffect(welcome_code="W1", welcome_text="欢迎", label="enter_session")
    newcomer = kf_message()  # entered, has not written: the welcome goes, outside any window
    await pulled._welcome(adapter, newcomer, welcome, world.records.open(newcomer.dedup_key))
    message, _, record = await kf_turn(world)
    for slot in range(4):  # an answer used every slot but the handoff's
        assert await world.conversations.take_slot(message, QUOTA, record, {f"s{slot}": 1})
    await pulled._welcome(adapter, message, welcome, world.records.open("w:" + message.dedup_key))
    assert sent == ["W1"], "the welcome took the slot kept for the handoff notice"
    assert await world.conversations.take_slot(message, QUOTA, record, {}, for_handoff=True)


# -- model seed 219: WeCom counts from the customer's message, botgw renewed from its handling of it -------------


async def test_sends_after_the_customer_wrote_again_still_count_when_their_message_renews_the_allowance(
    world: World,
) -> None:
    """The customer writes q1, then q2 while q1's answer is still being written: that answer (and a welcome) reach
    WeCom after q2, so WeCom counts them against q2's 5. The renewal on q2, handled after them, must not forget
    them (it reset to 0: the 6th message was refused with 95001)."""
    first, fence, record = await kf_turn(world, "q1")
    second = first.model_copy(update={"msg_id": secrets.token_hex(6), "text": "q2", "received_at": time.time()})
    assert await world.conversations.take_slot(first, QUOTA, record, {"s0": 1})  # q1's answer, after q2 was written
    assert await world.conversations.take_slot(first, QUOTA, record, {"s1": 1}, outside_window_ok=True)  # a welcome
    await world.conversations.renew_quota(second, QUOTA, fence)
    assert await world.conversations.quota_left(second, QUOTA) == 2, "the sends WeCom counts against q2 forgotten"


async def test_sends_well_before_the_customer_wrote_again_are_forgotten_by_the_renewal(world: World) -> None:
    first, fence, record = await kf_turn(world, "q1")
    for slot in range(4):
        assert await world.conversations.take_slot(first, QUOTA, record, {f"s{slot}": 1})
    later = time.time() + 120  # the customer wrote minutes after the answer went
    second = first.model_copy(update={"msg_id": secrets.token_hex(6), "text": "q2", "received_at": later})
    await world.conversations.renew_quota(second, QUOTA, fence)
    assert await world.conversations.quota_left(second, QUOTA) == 4


# -- model seed 219: an operator's handoff overtook the pull; welcome codes expired while the lane waited ----------


async def test_an_operators_handoff_before_the_customers_message_is_handled_still_sends_the_notice(
    world: World,
) -> None:
    """The pull of the customer's messages is held up (WeCom unreachable) while an operator hands them over: the
    handoff is the first thing botgw handles for them, with no allowance renewed yet. The notice rides on the
    move's msg_code, as a welcome on its code: it goes (it was skipped: no message left in the allowance)."""
    message = kf_message("")
    fence, _ = await leased(world, message)
    sessions = FlakySessions()
    sessions.moves.append("an earlier try")  # the move succeeds at once
    code = await world.conversations.hand_off(sessions, QUOTA, message, world.records.open(message.dedup_key, fence))
    assert code == "MSG_CODE"
    assert sessions.notices == ["MSG_CODE:正在为您转接人工客服"], "the handoff was made without its notice"
    await customer_wrote(world, message)  # their message, handled after the notice went: the notice counts
    assert await world.conversations.quota_left(message, QUOTA) == 3


async def test_a_welcome_refused_outright_gives_its_slot_back_to_the_customers_question(world: World) -> None:
    """The lane reached the enter_session event after its code's 20 s: WeCom refuses the welcome (40058) and sends
    nothing. Its slot (and its stamp, which the renewal of the customer's next message counts) must not stay
    taken: the answer to their last question was withheld for it."""
    attempts: list[bool] = []

    async def send_notice(target: ReplyTarget, code: str, text: str, key: str, *, resend: bool = False) -> None:
        attempts.append(resend)
        raise PermanentSendError("WeCom errcode 40058: invalid code", code=40058)

    adapter = SimpleNamespace(reply_quota=QUOTA, sessions=SimpleNamespace(send_notice=send_notice))
    pulled = PulledWork(world.redis, world.keys, world.scheduler, Settings())
    pulled.conversations = world.conversations
    welcome = EventEffect(welcome_code="W1", welcome_text="欢迎", label="enter_session")
    first, fence, _ = await kf_turn(world, "q1")
    last = first.model_copy(update={"msg_id": secrets.token_hex(6), "text": "q2", "received_at": time.time()})
    event = first.model_copy(update={"msg_id": secrets.token_hex(6), "text": "enter_session"})
    event_record = world.records.open(event.dedup_key)
    # refused: no raise, so no dead letter and no alert for each customer who came in during a backlog (a review)
    await pulled._welcome(adapter, event, welcome, event_record)
    assert await world.conversations.quota_left(first, QUOTA) == 4, "a welcome never sent kept its slot"
    await world.conversations.renew_quota(last, QUOTA, fence)
    assert await world.conversations.quota_left(last, QUOTA) == 4, "the renewal counted the refused welcome"
    await pulled._welcome(adapter, event, welcome, event_record)  # the event again (a retry): settled, not resent
    assert attempts == [False]
    assert (await event_record.load()).welcome_sent == "refused"


# -- the over-limit notice belongs to the message that claimed it --------------------------------------------------


async def test_the_over_limit_notice_survives_a_crash_before_its_commit(world: World) -> None:
    """A worker that claimed the window's notice and died before committing it left a bare mark: the retry found it
    and sent nothing, so the person over the limit was never told. The claim is the message's own now: its retry
    still sends the notice, and another message in the same window still does not."""
    from gateway.pipeline.limits import refusal_notice
    from gateway.state.limits import Refusal

    services = SimpleNamespace(settings=Settings(), keys=world.keys, redis=world.redis)
    refusal = Refusal(kind="messages", who="user:wmcarol", limit="20/minute", retry_after_s=60)
    first, second = kf_message("一"), kf_message("二")

    def job_of(message: InboundMessage) -> SimpleNamespace:
        return SimpleNamespace(message=message, presenter=SimpleNamespace(always_answers=False))

    told = await refusal_notice(services, job_of(first), refusal)  # type: ignore[arg-type]
    assert told, "the first over-limit message is told"
    assert await refusal_notice(services, job_of(first), refusal) == told, "its retry (after a crash) is told too"  # type: ignore[arg-type]
    assert await refusal_notice(services, job_of(second), refusal) == "", "once per window"  # type: ignore[arg-type]


@dataclass
class RefusingRepeats(KfStandIn):
    """A 微信客服 stand-in whose sends fail with `failure` (run 1), then are refused (95013: the session ended); a
    refusal of a resend is taken as delivered, as the real adapter does (bots/wecom_kf/adapter.py)."""

    failure: Exception | None = None
    refused_as_delivered: int = 0

    async def send_piece(self, target: ReplyTarget, text: str, *, duplicate_check: bool, piece_key: str = "") -> None:
        if self.failure is not None:
            raise self.failure
        if duplicate_check:
            self.refused_as_delivered += 1
            return
        raise PermanentSendError("WeCom errcode 95013: the session ended", code=95013)


@pytest.mark.parametrize("first_run", ["rate-limited", "timed-out"])
async def test_a_run_after_a_rate_limit_that_outlasted_the_attempts_is_no_resend(world: World, first_run: str) -> None:
    """A rate limit sent nothing, however many attempts it lasted: the message's next run must not take a refusal
    for the platform refusing a repeat (found by a review: the piece's started mark made it a resend)."""
    import dataclasses

    world.delivery = dataclasses.replace(world.delivery, settings=WorkerSettings(
        backoff_base_s=0.001, backoff_max_s=0.002, max_send_attempts=2))  # fmt: skip
    message, fence, record = await kf_turn(world)
    failure = (RetryableSendError("HTTP 429", code=429, not_sent=True) if first_run == "rate-limited"
               else RetryableSendError("unreachable: ReadTimeout", code="network"))  # fmt: skip
    adapter = RefusingRepeats(failure=failure)
    presenter = PiecesPresenter(world.delivery, adapter, message, record, fence)
    with pytest.raises(RetryableSendError):
        await presenter.finish("回答", await record.load())
    adapter.failure = None  # the message's next run
    state = await record.load()
    if first_run == "rate-limited":
        with pytest.raises(PermanentSendError):
            await PiecesPresenter(world.delivery, adapter, message, record, fence).finish("回答", state)
        assert adapter.refused_as_delivered == 0 and (await record.load()).sent == 0
    else:  # a timeout may have delivered it: the refusal is the repeat refused
        await PiecesPresenter(world.delivery, adapter, message, record, fence).finish("回答", state)
        assert adapter.refused_as_delivered == 1


# -- the shutdown's hand-back: a piece on its way finishes, none is begun after it ---------------------------------


async def test_a_hand_back_lets_the_piece_on_its_way_finish_and_begins_no_other(world: World) -> None:
    """Cancelled mid-send by the hand-back, a piece was sent again by the next owner (twice on DingTalk, which has
    no duplicate check; found by a review). Now the hand-back sets `stopping`: the piece on its way completes and
    is marked, and the answer goes back to the queue before its next piece."""
    message, fence, record = await kf_turn(world)
    on_its_way, let_finish = asyncio.Event(), asyncio.Event()

    class SlowKf(KfStandIn):
        async def send_piece(self, target: ReplyTarget, text: str, **options: object) -> None:
            on_its_way.set()
            await let_finish.wait()
            self.sent.append(text)

    adapter = SlowKf(reply_quota=None)
    presenter = PiecesPresenter(world.delivery, adapter, message, record, fence)
    answer = asyncio.create_task(presenter.deliver("一" * 1000 + "二" * 1000, await record.load()))  # two pieces
    await on_its_way.wait()
    worker = SimpleNamespace(services=SimpleNamespace(delivery=world.delivery), _held={"lane": (None, answer)},
                             _scheduler=SimpleNamespace(release=lambda *a, **k: asyncio.sleep(0, True)),
                             _weight=lambda lease: 1.0)  # fmt: skip
    handing_back = asyncio.create_task(Worker._hand_back(worker))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    let_finish.set()  # the piece's send completes within the grace
    await handing_back
    with pytest.raises(HandedBack):
        await answer
    assert len(adapter.sent) == 1, "a second piece was begun after the hand-back"
    state = await record.load()
    assert state.sent == 1 and state.started == 1, "the piece sent is not marked: the next owner would resend it"
    world.delivery.stopping.clear()
