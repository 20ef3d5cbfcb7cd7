"""Replaying a dead letter against a real redis-server: a half-delivered answer resumes where it stopped (its text,
its progress and its pieces' marks kept), the failure is reset only while the record still says failed, and the
reset, the re-queueing and the letter's removal are one step, so two replays at once cannot both act."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from bots.base import InboundMessage, ReplyTarget
from gateway.config import Settings
from gateway.queue.dead_letters import DeadLetters, NoSuchDeadLetter, ReportedUndelivered
from gateway.queue.entry import QueueEntry
from gateway.queue.scheduler import Scheduler
from gateway.state.keys import Keys
from gateway.state.memory import Scope
from gateway.state.reply_record import ReplyState

# A half-delivered answer of three pieces on 微信客服 that gave up on its second one: piece 0 delivered, piece 1
# begun (its outcome unknown), and what the first attempt recorded to send the rest alike.
HALF_DELIVERED = {
    "text": "the answer, in three pieces",
    "created": "1712345678.0",
    "state": "failed",
    "reason": "failed 1 times: refused",
    "started": "2",
    "sent": "1",
    "v0": "0",
    "v1": "3",
    "quota_pieces": "3",
    "wait_notice": "1",
}


@pytest.fixture
async def letters(redis_url: str) -> AsyncIterator[DeadLetters]:
    redis = Redis.from_url(redis_url)
    keys = Keys("d" + secrets.token_hex(4))
    scheduler = Scheduler(redis, keys)
    await scheduler.load_scripts()
    await asyncio.gather(*(redis.ping() for _ in range(4)))  # connections ready: replays at once interleave
    yield DeadLetters(redis, keys, scheduler, Settings(bots=[]))
    await redis.aclose()


def message(msg_id: str = "m1") -> InboundMessage:
    return InboundMessage(platform="wecom-kf", bot_id="kf", msg_id=msg_id, conversation_id="ww:wm1",
                          sender_id="wm1", text="a long question", reply_to=ReplyTarget(user_id="wm1"))  # fmt: skip


async def dead_letter(letters: DeadLetters, of: InboundMessage) -> str:
    """A dead letter of `of`, as a worker's give-up writes it."""
    entry = QueueEntry(owner=Scope.of(of, Settings(bots=[]).memory.group).owner, message=of)
    letter = json.dumps({"reason": "failed 1 times: refused", "entry": entry.wire()})
    return (await letters._redis.xadd(letters._keys.dead_letters, {"entry": letter})).decode()


async def record(letters: DeadLetters, of: InboundMessage) -> dict[str, str]:
    raw = await letters._redis.hgetall(letters._keys.reply(of.dedup_key))
    return {key.decode(): value.decode() for key, value in raw.items()}


async def queued(letters: DeadLetters, of: InboundMessage) -> list[QueueEntry]:
    lane = Scope.of(of, Settings(bots=[]).memory.group).lane
    return [QueueEntry.from_json(item) for item in await letters._redis.lrange(letters._keys.lane(lane), 0, -1)]


async def test_a_replay_keeps_the_answer_and_its_progress_and_resets_only_the_failure(letters: DeadLetters) -> None:
    """Composed afresh from piece 0, 微信客服 would refuse piece 0 (its msgid, derived from the piece, was used) and
    give up again at once, and other platforms would send the delivered pieces twice."""
    replied = message()
    await letters._redis.hset(letters._keys.reply(replied.dedup_key), mapping=HALF_DELIVERED)
    letter_id = await dead_letter(letters, replied)
    assert await letters.replay(letter_id) == "queued"
    kept = await record(letters, replied)
    assert kept == {**{k: v for k, v in HALF_DELIVERED.items() if k != "reason"}, "state": "committed"}
    state = ReplyState.from_hash(await letters._redis.hgetall(letters._keys.reply(replied.dedup_key)))
    assert not state.done and (state.sent, state.started, state.variants) == (1, 2, {0: 0, 1: 3})
    assert [entry.message.msg_id for entry in await queued(letters, replied)] == ["m1"]
    assert await letters._redis.xlen(letters._keys.dead_letters) == 0

    # An answer that failed before it was composed has nothing to keep: composed afresh, as before.
    unanswered = message("m2")
    await letters._redis.hset(letters._keys.reply(unanswered.dedup_key), mapping={"state": "failed", "reason": "x"})
    assert await letters.replay(await dead_letter(letters, unanswered)) == "queued"
    assert await record(letters, unanswered) == {}


async def test_a_failed_cards_fields_are_dropped_so_the_replay_opens_a_new_card(letters: DeadLetters) -> None:
    """The failed card was finished showing the failure: the kept answer goes into a new one."""
    replied = message()
    card = {"card_track": "t1", "card_created": "1", "card_deliver_started": "1", "card_sent": "1"}
    await letters._redis.hset(letters._keys.reply(replied.dedup_key), mapping={**HALF_DELIVERED, **card})
    assert await letters.replay(await dead_letter(letters, replied)) == "queued"
    kept = await record(letters, replied)
    assert kept["text"] == HALF_DELIVERED["text"] and kept["state"] == "committed"
    assert not set(card) & set(kept)


async def test_two_replays_of_one_letter_at_once_act_once(letters: DeadLetters) -> None:
    replied = message()
    await letters._redis.hset(letters._keys.reply(replied.dedup_key), mapping=HALF_DELIVERED)
    letter_id = await dead_letter(letters, replied)
    outcomes = await asyncio.gather(letters.replay(letter_id), letters.replay(letter_id), return_exceptions=True)
    assert len(await queued(letters, replied)) == 1, f"queued twice: {outcomes}"
    assert sorted(map(repr, outcomes)) == sorted([repr("queued"), repr(NoSuchDeadLetter(letter_id))])
    assert (await record(letters, replied))["sent"] == "1"


async def test_a_record_that_is_not_failed_is_left_alone(letters: DeadLetters) -> None:
    """Two letters of one message (it failed twice) replayed at once: one resets the record, the other finds it
    no longer failed (a worker may already be resuming it) and leaves it alone; neither deletes it. A delivered
    answer, or one being delivered, is never touched."""
    replied = message()
    await letters._redis.hset(letters._keys.reply(replied.dedup_key), mapping=HALF_DELIVERED)
    first, second = await dead_letter(letters, replied), await dead_letter(letters, replied)
    assert await asyncio.gather(letters.replay(first), letters.replay(second)) == ["queued", "queued"]
    kept = await record(letters, replied)
    assert kept.get("text") == HALF_DELIVERED["text"] and kept["sent"] == "1", "a replay deleted the record"
    assert len(await queued(letters, replied)) == 2  # the second finds the answer done and sends nothing

    for state, said in (("committed", "queued"), ("done", "already delivered: will not be sent again")):
        busy = message(f"m-{state}")
        fields = {**HALF_DELIVERED, "state": state, "sent": "2"}
        await letters._redis.hset(letters._keys.reply(busy.dedup_key), mapping=fields)
        assert await letters.replay(await dead_letter(letters, busy)) == said
        assert await record(letters, busy) == fields, f"a {state} record was changed"


@pytest.mark.parametrize("before", ["0-0", "00-000", "0"])
async def test_a_page_before_the_first_stream_id_is_empty_not_a_redis_error(letters: DeadLetters, before: str) -> None:
    """`(0-0` is a Redis error ("invalid end ID"), and the console's pages answered `?before=0-0` with a 500 (found
    by a review): nothing is older than the first id."""
    newest = await dead_letter(letters, message("m-first"))
    assert [letter.letter_id for letter in await letters.list(10)] == [newest]
    assert await letters.list(10, before) == []
    assert [letter.letter_id for letter in await letters.list(10, "9999999999999-0")] == [newest]


async def test_an_item_botgw_did_not_write_is_an_unreadable_letter_not_a_broken_list(letters: DeadLetters) -> None:
    """No `entry`, not JSON, not an object: `dlq list` and the console's page failed whole on one such item (a
    review). Each is an unreadable letter: listed, shown, purged; never replayed."""
    good = await dead_letter(letters, message())
    stream = letters._keys.dead_letters
    odd = [(await letters._redis.xadd(stream, fields)).decode()
           for fields in ({"other": "x"}, {"entry": "not json"}, {"entry": "[1, 2]"})]  # fmt: skip
    listed = await letters.list()
    assert [letter.letter_id for letter in listed] == [*reversed(odd), good]
    assert all(letter.entry is None for letter in listed[:3]) and listed[3].entry is not None
    assert all("raw" in letter.summary() for letter in listed[:3])
    assert (await letters.get(odd[1])).shown()["entry"]["raw"]
    assert await letters.purge(odd) == 3


async def test_a_shown_letter_hides_where_the_reply_goes(letters: DeadLetters) -> None:
    """A DingTalk sessionWebhook posts into the conversation: `dlq show` hides it, as the console does, unless asked."""
    secret_url = "https://oapi.dingtalk.com/robot/sendBySession?session=s3cr3t"
    webhooked = message().model_copy(update={"reply_to": ReplyTarget(user_id="wm1", webhook_url=secret_url)})
    letter = await letters.get(await dead_letter(letters, webhooked))
    assert "s3cr3t" not in json.dumps(letter.shown())
    assert letter.shown()["entry"]["msg"]["reply_to"]["webhook_url"] == "(hidden)"
    assert letter.shown(with_urls=True)["entry"]["msg"]["reply_to"]["webhook_url"] == secret_url
    odd = (await letters._redis.xadd(letters._keys.dead_letters, {"entry": f'{{"raw": "{secret_url}"}}'})).decode()
    assert "s3cr3t" not in json.dumps((await letters.get(odd)).shown())  # an unreadable letter's text too


async def test_purging_all_drops_the_letters_there_and_counts_them(letters: DeadLetters) -> None:
    ids = [await dead_letter(letters, message(f"m{i}")) for i in range(3)]
    assert await letters.purge([]) == 3
    assert await letters.list() == [] and await letters.purge(ids[:1]) == 0


async def test_a_letter_of_a_reply_the_platform_reported_undelivered_is_not_replayed_as_delivered(
    letters: DeadLetters,
) -> None:
    """微信客服's msg_send_fail: the answer was sent, then reported undelivered. Its replay queued an entry that sent
    nothing and answered "already delivered", and dropped the letter (found by a review): it says why, and stays."""
    of = message()
    letter_id = await dead_letter(letters, of)
    reported = {"text": "答", "state": "done", "sent": "1", "send_failed": "10:0"}
    await letters._redis.hset(letters._keys.reply(of.dedup_key), mapping=reported)
    with pytest.raises(ReportedUndelivered, match="fail_type 10"):
        await letters.replay(letter_id)
    assert [letter.letter_id for letter in await letters.list()] == [letter_id]
    assert await letters._redis.llen(letters._keys.lane(Scope.of(of, "per_user").lane)) == 0
