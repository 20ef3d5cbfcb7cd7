"""The register of 微信客服 customers handed to a human (gateway/state/handoffs.py), against the session's real
redis-server: a handoff enters a customer (pool or agent) and keeps when they were first handed over; the platform's
session_status_change moves them to an agent or out; the bot's take removes them in the round trip that caches the
holder; a stale worker writes nothing; the register is bounded and its entries live as long as a session; an entry
that expired leaves the index when read; Conversations.hand_off writes it only after the platform's move."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis

from bots.base import InboundMessage, PermanentSendError, ReplyTarget
from gateway.state import handoffs as handoffs_module
from gateway.state.conversations import OWNER_CACHE_S, Conversations
from gateway.state.handoffs import ENTRY_TTL_S, Handoffs
from gateway.state.keys import Keys
from gateway.state.memory import Scope
from gateway.state.reply_record import Fence, LeaseLost, ReplyRecords


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.Redis.from_url(redis_url)
    yield made
    await made.aclose()


def customer(bot: str = "kefu", account: str = "wk-a") -> InboundMessage:
    person = "wm" + secrets.token_hex(4)
    return InboundMessage(
        platform="wecom-kf", bot_id=bot, msg_id=secrets.token_hex(6), conversation_id=f"{account}:{person}",
        sender_id=person, text="转人工", reply_to=ReplyTarget(chat_id=account, user_id=person),
    )  # fmt: skip


def status_change(change: int, servicer: str = "") -> dict:
    return {"event_type": "session_status_change", "change_type": change, "new_servicer_userid": servicer}


async def test_a_handoff_enters_the_customer_and_events_move_them(client: aioredis.Redis) -> None:
    keys = Keys("h" + secrets.token_hex(4))
    register = Handoffs(client, keys)
    first, second = customer(), customer()
    await register.handed(first, None, None, now=1000.0)
    await register.handed(second, "agent-li", None, now=1010.0)
    entries, total = await register.page("kefu", 0, 20)
    assert total == 2
    assert [(e.external_userid, e.state, e.servicer, e.since) for e in entries] == [
        (first.sender_id, 2, "", 1000.0), (second.sender_id, 3, "agent-li", 1010.0)]  # fmt: skip

    await register.changed(first, status_change(1, "agent-zhang"), None, now=1100.0)  # an agent took them
    entries, _ = await register.page("kefu", 0, 20)
    assert (entries[0].state, entries[0].servicer, entries[0].since, entries[0].changed) == (3, "agent-zhang", 1000.0,
                                                                                            1100.0)  # fmt: skip
    assert entries[0].via == "event:1", "the wait still counts from the handoff; the change is the event's"

    await register.changed(second, {"event_type": "msg_send_fail", "fail_type": 6}, None)  # not a status change
    await register.changed(second, status_change(3), None)  # the session ended
    entries, total = await register.page("kefu", 0, 20)
    assert total == 1 and [e.external_userid for e in entries] == [first.sender_id]
    assert not await client.exists(f"{keys.kf_handoffs('kefu')}:wk-a/{second.sender_id}")

    # A handoff made in WeCom's own app: the customer appears with the event that says so.
    outside = customer()
    await register.changed(outside, status_change(2, "agent-wang"), None, now=1200.0)
    entries, total = await register.page("kefu", 0, 20)
    assert total == 2 and (entries[1].external_userid, entries[1].servicer) == (outside.sender_id, "agent-wang")
    assert await register.page("other-bot", 0, 20) == ([], 0), "each bot has its own register"


async def test_entries_live_as_a_session_and_the_register_is_bounded(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys("h" + secrets.token_hex(4))
    register = Handoffs(client, keys)
    monkeypatch.setattr(handoffs_module, "MAX_ENTRIES", 3)
    people = [customer() for _ in range(5)]
    for index, person in enumerate(people):
        await register.handed(person, None, None, now=2000.0 + index)
    entries, total = await register.page("kefu", 0, 20)
    assert total == 3 and [e.external_userid for e in entries] == [p.sender_id for p in people[2:]], "oldest go"
    for person in people[:2]:
        assert not await client.exists(f"{keys.kf_handoffs('kefu')}:wk-a/{person.sender_id}"), "its hash went too"
    entry_key = f"{keys.kf_handoffs('kefu')}:wk-a/{people[4].sender_id}"
    assert ENTRY_TTL_S - 60 < await client.ttl(entry_key) <= ENTRY_TTL_S
    assert await client.ttl(keys.kf_handoffs("kefu")) > 0, "the index itself expires when nothing is handed over"

    await client.delete(entry_key)  # expired
    entries, total = await register.page("kefu", 0, 20)
    assert total == 2 and people[4].sender_id not in [e.external_userid for e in entries]
    assert await client.zcard(keys.kf_handoffs("kefu")) == 2, "an expired entry leaves the index when read"
    entries, total = await register.page("kefu", 1, 1)
    assert total == 2 and [e.external_userid for e in entries] == [people[3].sender_id], "a page from an offset"


async def test_forget_only_what_was_read_and_a_stale_worker_writes_nothing(client: aioredis.Redis) -> None:
    keys = Keys("h" + secrets.token_hex(4))
    register = Handoffs(client, keys)
    person = customer()
    await register.handed(person, None, None, now=3000.0)
    assert not await register.forget(person, since="2999.000"), "handed over again since it was read: it stays"
    assert await register.forget(person, since="3000.000")
    assert await register.page("kefu", 0, 20) == ([], 0)

    lease = keys.lease("some-lane")
    await client.hset(lease, "epoch", "7")
    stale = Fence(lease, "6")
    with pytest.raises(LeaseLost):
        await register.handed(person, None, stale)
    with pytest.raises(LeaseLost):
        await register.changed(person, status_change(1, "agent-zhang"), stale)
    assert await register.page("kefu", 0, 20) == ([], 0)
    await register.handed(person, None, Fence(lease, "7"))
    with pytest.raises(LeaseLost):
        await register.forget(person, stale)
    assert (await register.page("kefu", 0, 20))[1] == 1


class Platform:
    """The session moves a 微信客服 platform makes (the adapter's KfSessions' shape); `refuse` fails the move."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.moves: list[tuple[str, str | None]] = []

    async def hand_off(self, target: ReplyTarget, servicer: str | None) -> str:
        if self.refuse:
            raise PermanentSendError("session already ended", code=95013)
        self.moves.append(("hand_off", servicer))
        return ""  # no notice code: nothing more to send

    async def take(self, target: ReplyTarget) -> None:
        self.moves.append(("take", None))


async def test_conversations_write_the_register_after_the_move_and_the_take_clears_it(client: aioredis.Redis) -> None:
    keys = Keys("h" + secrets.token_hex(4))
    conversations = Conversations(client, keys, "per_user")
    records = ReplyRecords(client, keys, 3600)
    person = customer()
    with pytest.raises(PermanentSendError):
        await conversations.hand_off(Platform(refuse=True), None, person, records.open(person.dedup_key))
    assert await conversations.handoffs.page("kefu", 0, 20) == ([], 0), "no move, no entry"

    platform = Platform()
    await conversations.hand_off(platform, None, person, records.open(person.dedup_key), "agent-zhao")
    entries, _ = await conversations.handoffs.page("kefu", 0, 20)
    assert platform.moves == [("hand_off", "agent-zhao")]
    assert [(e.external_userid, e.state, e.servicer, e.via) for e in entries] == [
        (person.sender_id, 3, "agent-zhao", "handoff")]  # fmt: skip

    await conversations.take(platform, person)
    assert await conversations.handoffs.page("kefu", 0, 20) == ([], 0), "the bot holds them again"
    holder = keys.conversation_owner(Scope.of(person, "per_user").lane)
    assert await client.get(holder) == b"bot"
    assert OWNER_CACHE_S - 5 < await client.ttl(holder) <= OWNER_CACHE_S
    assert await conversations.owner(SimpleNamespace(), person) == "bot"
