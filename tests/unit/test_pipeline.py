"""The answer pipeline's pure parts: prompt planning and token arithmetic, the stage chain, the stage list per
adapter, and queue entries as a model (no Redis, no processes)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bots.base import InboundMessage
from bots.channels import check_channel
from gateway.pipeline.build import answer_stages
from gateway.pipeline.gate import HumanGate
from gateway.pipeline.job import Composed, PromptPlan
from gateway.pipeline.prompt_plan import (
    MIN_ANSWER_TOKENS,
    TEMPLATE_TOKENS,
    TOKENS_PER_TURN,
    Room,
    plan_prompt,
    user_turn_tokens,
)
from gateway.pipeline.stage import chain
from gateway.queue.entry import EntryKind, QueueEntry
from gateway.state.limits import Refusal
from gateway.state.memory import Turn

WHO = "user:wecom:corp:zhangsan"


def turns(*sizes: int) -> list[Turn]:
    """Alternating user/assistant turns of these token sizes, oldest first."""
    return [Turn("user" if i % 2 == 0 else "assistant", f"t{i}", size) for i, size in enumerate(sizes)]


# -- prompt planning ----------------------------------------------------------------------------------------------


def test_everything_fits_when_there_is_room() -> None:
    history = turns(10, 20, 10, 20)
    plan = plan_prompt(Room(context=4096, max_prompt=None, max_tokens=512), 100, 30, history, 2000, WHO)
    assert isinstance(plan, PromptPlan)
    assert plan.history == history and plan.max_tokens == 512
    assert plan.prompt_bound == 100 + 30 + TEMPLATE_TOKENS + sum(t.tokens + TOKENS_PER_TURN for t in history)


def test_the_history_budget_keeps_the_newest_turns_starting_with_a_user_turn() -> None:
    history = turns(50, 50, 50, 50)  # each 56 with the template's tokens
    plan = plan_prompt(Room(None, None, 512), 10, 10, history, 3 * 56, WHO)
    assert isinstance(plan, PromptPlan)
    assert plan.history == history[2:], "an assistant turn without its question leads the history"


def test_the_context_window_bounds_the_history_and_the_answer() -> None:
    context, system, message = 600, 100, 50
    fixed = system + message + TEMPLATE_TOKENS
    plan = plan_prompt(Room(context, None, 512), system, message, turns(40, 40), 10_000, WHO)
    assert isinstance(plan, PromptPlan)
    assert plan.max_tokens == context - fixed, "a long prompt leaves the answer what is left of the window"
    assert plan.history == [], "history squeezed past the window"
    assert plan.prompt_bound + plan.max_tokens <= context


def test_a_message_that_leaves_no_room_for_an_answer_is_refused() -> None:
    context = 1000
    too_long = context - MIN_ANSWER_TOKENS - TEMPLATE_TOKENS - 100 + 1
    refused = plan_prompt(Room(context, None, 512), 100, too_long, [], 2000, WHO)
    assert isinstance(refused, Refusal) and refused.kind == "prompt" and refused.who == WHO
    assert refused.limit == str(context - MIN_ANSWER_TOKENS) and refused.size == too_long
    fits = plan_prompt(Room(context, None, 512), 100, too_long - 1, [], 2000, WHO)
    assert isinstance(fits, PromptPlan) and fits.max_tokens == MIN_ANSWER_TOKENS


def test_the_senders_prompt_limit_refuses_and_bounds_the_history() -> None:
    refused = plan_prompt(Room(None, 200, 512), 100, 100, [], 2000, WHO)
    assert isinstance(refused, Refusal) and refused.limit == "200"
    plan = plan_prompt(Room(None, 300, 512), 100, 50, turns(60, 60, 60, 60), 2000, WHO)
    assert isinstance(plan, PromptPlan)
    assert plan.prompt_bound <= 300 and plan.history == turns(60, 60, 60, 60)[2:]


def test_the_message_is_counted_exactly_only_when_its_bytes_do_not_settle_it() -> None:
    room = Room(context=4096, max_prompt=None, max_tokens=512)
    assert room.prompt_room == 4096 - 512
    assert not room.needs_exact_count(100, 4096 - 512 - 100 - TEMPLATE_TOKENS)
    assert room.needs_exact_count(100, 4096 - 512 - 100 - TEMPLATE_TOKENS + 1)
    assert not Room(None, None, 512).needs_exact_count(10**6, 10**6), "no limit: nothing to count for"
    assert Room(8192, 1000, 512).prompt_room == 1000


def test_the_remembered_size_of_a_message() -> None:
    plan = PromptPlan(turns(30, 40), 512, 0, None)
    assert user_turn_tokens(plan, prompt_tokens=200, system_tokens=100) == 200 - 70 - 100
    assert user_turn_tokens(plan, prompt_tokens=50, system_tokens=100) == 1, "never a turn of no tokens"
    assert user_turn_tokens(PromptPlan([], 512, 0, 77), 200, 100) == 77, "an exact count wins"


# -- the chain and the stages per adapter -------------------------------------------------------------------------


async def test_stages_run_in_order_around_what_follows_and_may_answer_early() -> None:
    seen: list[str] = []

    def stage(name: str, answer: str | None = None):  # type: ignore[no-untyped-def]
        async def run(job, next):  # type: ignore[no-untyped-def]
            seen.append(f"{name}>")
            result = Composed(answer) if answer is not None else await next(job)
            seen.append(f"<{name}")
            return result

        return run

    assert (await chain([stage("a"), stage("b"), stage("c", "done")])(object())).text == "done"  # type: ignore[arg-type]
    assert seen == ["a>", "b>", "c>", "<c", "<b", "<a"]
    seen.clear()
    assert (await chain([stage("a", "early"), stage("b")])(object())).text == "early"  # type: ignore[arg-type]
    assert seen == ["a>", "<a"], "a stage that answers stops the rest"
    with pytest.raises(RuntimeError, match="last stage"):
        await chain([stage("a")])(object())  # type: ignore[arg-type]


def test_only_a_platform_with_human_agents_gets_the_gate() -> None:
    services = SimpleNamespace()
    without = [type(s).__name__ for s in answer_stages(SimpleNamespace(sessions=None), services)]  # type: ignore[arg-type]
    with_humans = answer_stages(SimpleNamespace(sessions=object()), services)  # type: ignore[arg-type]
    assert "HumanGate" not in without and without[0] == "ReadyNotice" and without[-1] == "Generate"
    assert isinstance(with_humans[1], HumanGate) and len(with_humans) == len(without) + 1


def test_an_adapter_that_lacks_what_its_reply_style_needs_is_refused_at_start() -> None:
    class Half:
        platform, bot_id, reply_style, max_answer_bytes = "x", "x", "stream", None
        merge_window_s, reply_quota, sessions = 0.0, None, None

        def system_prompt_for(self, message): ...  # type: ignore[no-untyped-def]

        def knowledge_for(self, message): ...  # type: ignore[no-untyped-def]

    with pytest.raises(TypeError, match=r"lacks .*send_overflow"):
        check_channel(Half())
    Half.reply_style = "shout"  # type: ignore[assignment]
    with pytest.raises(TypeError, match="unknown reply_style 'shout'"):
        check_channel(Half())


def test_every_entry_kind_has_a_handler() -> None:
    from gateway.worker.dispatch import ANSWERED, OTHER_KINDS

    assert set(ANSWERED) | set(OTHER_KINDS) == set(EntryKind) and not set(ANSWERED) & set(OTHER_KINDS)


# -- queue entries ------------------------------------------------------------------------------------------------


def message(text: str = "你好") -> InboundMessage:
    return InboundMessage(platform="wecom", bot_id="app", msg_id="m1", conversation_id="c", sender_id="u", text=text)


def test_an_entry_keeps_the_wire_names_the_scheduler_scripts_read() -> None:
    entry = QueueEntry(owner="wecom:corp:u", kind=EntryKind.NOTICE, message=message(), notice="hi", request_id="r1")
    wire = json.loads(entry.to_json())
    assert {"id", "t", "u", "kind", "rid", "notice", "msg"} == set(wire), "unset optional fields are left out"
    assert wire["u"] == "wecom:corp:u" and wire["kind"] == "notice" and wire["msg"]["text"] == "你好"
    assert isinstance(wire["t"], int) and QueueEntry.from_json(entry.to_json()) == entry


def test_an_entry_written_by_the_release_before_the_model_is_read() -> None:
    old = (
        '{"id": "18b-ab", "t": 1712345678901, "u": "x", "kind": "event", "event": "{\\"Event\\": \\"x\\"}", '
        f'"msg": {message().model_dump_json()}}}'
    )
    entry = QueueEntry.from_json(old)
    assert entry.kind is EntryKind.EVENT and entry.entry_id == "18b-ab" and entry.enqueued_at == 1712345678.901
    assert entry.event_fields() == {"Event": "x"} and entry.merged is None


def test_an_entry_of_an_unknown_kind_is_not_read() -> None:
    with pytest.raises(ValueError):
        QueueEntry.from_json(json.dumps({"u": "x", "kind": "dance", "msg": message().model_dump(mode="json")}))
