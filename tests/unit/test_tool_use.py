"""The tools' pieces on their own: who may call what, reading a reply as a confirmation, the ledger and the waiting
confirmations (against the session's real redis-server), arguments in words, and the configuration's checks."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis

from bots.buttons import ButtonTap, Question, read_button_key
from gateway.config import Settings
from gateway.pipeline.tool_use import arguments_in_words, idempotency_key, parse_arguments
from testkit.configs import wecom_app
from tools.access import may_call
from tools.config import BotTools
from tools.confirmations import Confirmations, PendingCall, reply_verdict
from tools.ledger import CallSlot, ToolLedger
from tools.servers import CallResult, ToolSpec


def test_a_tool_without_an_access_entry_is_open_and_one_with_an_entry_only_to_whom_it_names() -> None:
    tools = BotTools(use=["rooms"], access={"rooms.book": {"users": ["wecom:c:zs"], "groups": ["wecom:c:g1"]}})
    assert may_call(tools, "rooms.list_rooms", "wecom:c:anyone", None)
    assert may_call(tools, "rooms.book", "wecom:c:zs", None)
    assert may_call(tools, "rooms.book", "wecom:c:ls", "wecom:c:g1"), "asked from within a named group"
    assert not may_call(tools, "rooms.book", "wecom:c:ls", None)
    assert not may_call(tools, "rooms.book", "wecom:c:ls", "wecom:c:g2")
    nobody = BotTools(use=["rooms"], access={"rooms.book": {"departments": [2]}})
    assert not may_call(nobody, "rooms.book", "wecom:c:zs", None), "departments unknown: nobody, not everybody"
    assert may_call(nobody, "rooms.book", "wecom:c:zs", None, ("2",))


def test_only_a_confirmation_written_alone_is_one() -> None:
    assert reply_verdict(" 确认。") == "confirmed" and reply_verdict("Yes!") == "confirmed"
    assert reply_verdict("取消") == "cancelled"
    assert reply_verdict("确认一下明天的会议") is None and reply_verdict("") is None


def test_bot_tools_name_server_dot_tool_of_servers_they_use() -> None:
    with pytest.raises(ValueError, match=r"not <server>\.<tool>"):
        BotTools(use=["rooms"], confirm=["book"])
    with pytest.raises(ValueError, match="which `use` does not list"):
        BotTools(use=["rooms"], confirm=["files.delete"])


def test_settings_refuse_an_unknown_server_and_qualify_access_users() -> None:
    app = {**wecom_app("app", "http://127.0.0.1:9"), "tools": {"use": ["rooms"],
                                                                 "access": {"rooms.book": {"users": ["wecom:zs"]}}}}
    with pytest.raises(ValueError, match=r"tools\.use: rooms not in tools\.servers"):
        Settings(bots=[app])
    settings = Settings(tools={"servers": {"rooms": {"url": "http://rooms:8000/mcp"}}}, bots=[app])
    assert settings.bots[0].tools.access["rooms.book"].users == [f"wecom:{app['corp_id']}:zs"]
    with pytest.raises(ValueError, match="either `url`"):
        Settings(tools={"servers": {"rooms": {"url": "http://x/mcp", "command": ["x"]}}})
    with pytest.raises(ValueError, match="tool server name"):
        Settings(tools={"servers": {"a.b": {"url": "http://x/mcp"}}})


def test_arguments_are_shown_in_words_and_bad_ones_are_explained() -> None:
    spec = ToolSpec("rooms", "book", "", {"properties": {"room": {"title": "会议室"}}}, read_only=False)
    assert arguments_in_words({"room": "A", "seats": 4}, spec) == '- 会议室："A"\n- seats：4'
    assert "\n" not in arguments_in_words({"room": "A\n- 金额：0"}, spec), "a value cannot fake a line of its own"
    assert parse_arguments('{"room": "A"}') == ({"room": "A"}, "")
    assert parse_arguments("[1]")[1] and parse_arguments("{")[1].startswith("the arguments are not JSON")
    assert idempotency_key("k", CallSlot(0, 1)) == idempotency_key("k", CallSlot(0, 1)) != idempotency_key(
        "k", CallSlot(1, 0))


async def test_the_ledger_reads_back_what_was_written_before_and_after_each_call(redis: Redis) -> None:
    key = "t:ledger:" + secrets.token_hex(4)
    ledger = await ToolLedger.open(redis, key)
    assert ledger.empty
    await ledger.start([{"role": "user", "content": "订会议室"}], "订会议室")
    slot = CallSlot(0, 0)
    await ledger.record_round(0, {"role": "assistant", "tool_calls": []})
    await ledger.mark_started(slot)
    again = await ToolLedger.open(redis, key)  # a worker taking over
    assert again.base()[0]["content"] == "订会议室" and again.round(0) is not None and again.round(1) is None
    assert again.started(slot) and again.result(slot) is None and not again.confirmed(slot)
    await again.mark_result(slot, CallResult("ok", "booked B-1", 12))
    await again.mark_confirmed(CallSlot(0, 1))
    third = await ToolLedger.open(redis, key)
    assert third.result(slot) == CallResult("ok", "booked B-1", 12) and third.confirmed(CallSlot(0, 1))
    assert await redis.ttl(key) > 0
    # the worker whose lease passed on finds the call started and records "unknown": the real result stays
    # (a review found the real result overwritten, and the person told the outcome was unknown)
    stale = CallResult("error", "error: outcome unknown (interrupted); not repeated", 0)
    assert await ledger.mark_result(slot, stale) == CallResult("ok", "booked B-1", 12)
    assert (await ToolLedger.open(redis, key)).result(slot) == CallResult("ok", "booked B-1", 12)


async def test_a_waiting_call_is_settled_by_its_first_answer_only(redis: Redis) -> None:
    key = "t:confirm:" + secrets.token_hex(4)
    confirmations = Confirmations(redis)
    pending = PendingCall("id1", "wecom:c:zs", "app", "rooms.book", {"room": "A"}, "q1", 0, 0, time.time() + 60)
    await confirmations.ask(key, pending, 60)
    assert await confirmations.get(key) == pending
    first, second = await asyncio.gather(confirmations.settle(key, "m1", "confirmed"),
                                         confirmations.settle(key, "m2", "cancelled"))
    assert [first.first, second.first].count(True) == 1
    assert first.by == second.by and first.verdict == second.verdict
    again = await confirmations.settle(key, first.by, first.verdict)  # the winner's message tried again
    assert again.by == first.by and not again.first
    await confirmations.ask(key, PendingCall(**{**pending.__dict__, "id": "id2"}), 60)
    assert (await confirmations.settle(key, "m3", "cancelled")).first, "a new question waits afresh"


def test_a_button_key_names_its_question_and_choice_and_nothing_else_reads_as_one() -> None:
    question = Question("0123456789abcdef", "确认执行「rooms.book」？", '- 会议室："A"')
    keys = dict((label, key) for key, label in question.buttons())
    assert read_button_key(keys["确认"]) == ButtonTap(question_id=question.id, choice="confirmed")
    assert read_button_key(keys["取消"]) == ButtonTap(question_id=question.id, choice="cancelled")
    for hostile in ("", "botgw:confirmed:", "botgw:deleted:0123456789abcdef", "botgw:confirmed:XYZ12345",
                    "botgw:confirmed:0123456789abcdef:extra", "other-app:confirmed:0123456789abcdef", None, 7):
        assert read_button_key(hostile) is None, hostile  # type: ignore[arg-type]
    assert Question.from_json(question.to_json()) == question
    assert Question.from_json("") is None and Question.from_json("{not json") is None
    assert Question.from_json('{"id": 1}') is None, "a record field that is not a whole question is none"


async def test_a_confirm_or_access_entry_naming_no_listed_tool_keeps_the_servers_tools_from_being_offered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A typo (hr.delete_employe) left the real tool without its confirmation, open to everyone (a review)."""
    from gateway.state.keys import Keys
    from tools.config import ToolsSettings
    from tools.kit import ToolKit

    kit = ToolKit(ToolsSettings(servers={"hr": {"url": "http://hr.internal/mcp"}}), None, Keys("t"))  # type: ignore[arg-type]
    listed = [ToolSpec("hr", "delete_employee", "", {}, read_only=False), ToolSpec("hr", "find", "", {}, True)]

    async def tools(server: str) -> list[ToolSpec]:
        return listed

    kit.servers.tools = tools  # type: ignore[method-assign]
    typo = BotTools(use=["hr"], confirm=["hr.delete_employe"])
    for _ in range(2):
        offer = await kit.offer(typo, "wecom:c:zs", None)
        assert offer.tools == {} and offer.unavailable == ("hr",)
    said = [record for record in caplog.records if "does not list" in record.getMessage()]
    assert len(said) == 1 and said[0].unknown == ["hr.delete_employe"]  # type: ignore[attr-defined]
    right = await kit.offer(BotTools(use=["hr"], confirm=["hr.delete_employee"]), "wecom:c:zs", None)
    assert sorted(spec.qualified for spec in right.tools.values()) == ["hr.delete_employee", "hr.find"]


async def test_a_waiting_call_is_superseded_only_by_a_later_message_of_its_asker(redis: Redis) -> None:
    """Not by the asking message's own retry, by what the asker wrote before the question, or by someone else; a
    retry of the superseding message is told again (a review of the first version found each)."""
    from types import SimpleNamespace

    from bots.base import InboundMessage, ReplyTarget
    from gateway.pipeline.tool_use import SUPERSEDE_SLACK_S, ToolConfirmations
    from gateway.state.keys import Keys

    keys, audited = Keys("t" + secrets.token_hex(3)), []
    kit = SimpleNamespace(confirmations=Confirmations(redis), audit=SimpleNamespace(record=_append_to(audited)))
    stage = ToolConfirmations(SimpleNamespace(tools=kit, keys=keys))  # type: ignore[arg-type]
    asked_at = time.time()

    def job(msg_id: str, sender: str = "zs", after_s: float = 10.0) -> SimpleNamespace:
        message = InboundMessage(platform="wecom", bot_id="app", msg_id=msg_id, conversation_id=sender,
                                 sender_id=sender, text="几点上班", received_at=asked_at + after_s,
                                 reply_to=ReplyTarget(user_id=sender))  # fmt: skip
        return SimpleNamespace(message=message, scope=SimpleNamespace(lane="lane-zs"), notices=[])

    asking = job("m-ask", after_s=-1.0)
    pending = PendingCall("q1", asking.message.person, "app", "hr.delete_employee", {"id": "E1"}, "set", 0, 0,
                          asked_at + 300, asking.message.received_at, asking.message.dedup_key, asked_at)  # fmt: skip
    await kit.confirmations.ask(keys.tool_confirmation("lane-zs"), pending, 300)
    for bystander in (asking, job("m-before", after_s=SUPERSEDE_SLACK_S / 2), job("m-other", sender="ls")):
        await stage._supersede(bystander)  # type: ignore[arg-type]
        assert bystander.notices == [] and audited == []
    later = job("m-later")
    for _ in range(2):  # the same message again (a retry after a crash)
        later.notices = []
        await stage._supersede(later)  # type: ignore[arg-type]
        assert len(later.notices) == 1 and "hr.delete_employee" in later.notices[0]
    assert audited == ["superseded"]
    _, settled = await kit.confirmations.waiting(keys.tool_confirmation("lane-zs"))
    assert settled is not None and settled.verdict == "cancelled" and settled.by == later.message.dedup_key


def _append_to(seen: list[str]) -> Callable[[object], Awaitable[None]]:
    async def record(entry: object) -> None:
        seen.append(entry.outcome)  # type: ignore[attr-defined]

    return record


def test_a_verdict_is_never_merged_into_a_burst() -> None:
    """"确认\n谢谢" is no verdict: merged, the call its 确认 confirmed would have been cancelled (a review)."""
    from types import SimpleNamespace

    from gateway.worker.loop import Worker

    alone = Worker._answered_alone(SimpleNamespace(sessions=None))  # type: ignore[arg-type]
    assert alone("确认") and alone("取消") and alone("/help") and not alone("谢谢")


async def test_a_worker_that_lost_the_message_replaces_no_waiting_call(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale worker's question (other arguments, never shown: its sends are fenced) replaced its successor's
    waiting call, which the asker's 确认 would then have run (found by a review): the lease is checked first."""
    from types import SimpleNamespace

    from gateway.pipeline.tool_use import ToolRounds
    from gateway.state.keys import Keys
    from gateway.state.reply_record import Fence, LeaseLost, ReplyRecords

    keys = Keys("t" + secrets.token_hex(3))
    kit = SimpleNamespace(confirmations=Confirmations(redis))
    successor = PendingCall("q-new", "wecom:ww1:zs", "app", "hr.delete_employee", {"id": "E1"}, "set", 0, 0,
                            time.time() + 300)  # fmt: skip
    await kit.confirmations.ask(keys.tool_confirmation("lane-zs"), successor, 300)
    await redis.hset(keys.lease("lane-zs"), "epoch", "2")  # the successor's lease; the stale worker held epoch 1
    stale = ReplyRecords(redis, keys, 3600).open("wecom:app:m1", Fence(keys.lease("lane-zs"), "1"))
    message = SimpleNamespace(person="wecom:ww1:zs", bot_id="app", received_at=time.time(), dedup_key="wecom:app:m1")
    job = SimpleNamespace(message=message, scope=SimpleNamespace(lane="lane-zs"), record=stale)
    tools = BotTools(use=["hr"], confirm=["hr.delete_employee"])
    rounds = ToolRounds(SimpleNamespace(keys=keys), kit, tools)  # type: ignore[arg-type]
    spec = ToolSpec("hr", "delete_employee", "", {}, read_only=False)
    with pytest.raises(LeaseLost):
        await rounds._ask_confirmation(job, None, CallSlot(0, 0), spec, {"id": "E2"})  # type: ignore[arg-type]
    waiting = await kit.confirmations.get(keys.tool_confirmation("lane-zs"))
    assert waiting is not None and waiting.id == "q-new" and waiting.arguments == {"id": "E1"}

    # Had it written anyway (it passed the check, then stalled), a typed 确认 does not run what nobody was shown:
    # the asking message's record names the call its holder asked.
    from bots.base import InboundMessage, ReplyTarget
    from gateway.pipeline.tool_use import ToolConfirmations

    unseen = dataclasses.replace(successor, id="q-stale", arguments={"id": "E2"}, asked_by="wecom:app:m1")
    await kit.confirmations.ask(keys.tool_confirmation("lane-zs"), unseen, 300)
    await redis.hset(keys.reply("wecom:app:m1"), "question_id", "q-new")  # what the holder asked, fenced
    stage = ToolConfirmations(SimpleNamespace(tools=kit, keys=keys, redis=redis, settings=None))  # type: ignore[arg-type]
    yes = InboundMessage(platform="wecom", bot_id="app", msg_id="m2", conversation_id="zs", sender_id="zs",
                         text="确认", reply_to=ReplyTarget(user_id="zs"), family="wecom", tenant="ww1")  # fmt: skip
    passed: list[object] = []

    async def next_stage(job: object) -> None:
        passed.append(job)

    stage_job = SimpleNamespace(message=yes, scope=SimpleNamespace(lane="lane-zs"), images=[], tool_resume=None)
    monkeypatch.setattr("gateway.pipeline.tool_use.bot_tools", lambda services, job: tools)
    await stage(stage_job, next_stage)  # type: ignore[arg-type]
    assert passed == [stage_job] and stage_job.tool_resume is None, "the unseen call was confirmed"
    _, settled = await kit.confirmations.waiting(keys.tool_confirmation("lane-zs"))
    assert settled is None
