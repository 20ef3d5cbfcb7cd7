"""A tool call's confirmation on DingTalk with buttons, end to end: a Stream-mode robot (botgw dingtalk-stream), a
worker with the demo MCP server's confirm tool (rooms.book), the stub engine, the simulator's interactive cards and
their callbacks (simulator/dingtalk/card_taps.py). The question arrives with a card of two buttons; nothing runs
before the asker taps 确认; anyone else's tap does nothing; a second tap, a 取消 and an expired question call nothing.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bots.dingtalk.buttons import BUTTON_CARD_TEMPLATE
from bots.dingtalk.config import DingTalkBotConfig
from simulator.dingtalk.user import DingTalkUser
from testkit.configs import write_config
from testkit.processes import BOTGW, Proc, wait_for
from testkit.stacks import Cluster, Stack
from tests.e2e.general.test_tools import calls_made, mcp_server  # noqa: F401  (a fixture)

BOOKING = 'tool:rooms__book {"room": "泰山厅", "start": "2026-12-03T15:00"}'
BOT = "ding-stream"


class Robot:
    """The Stream-mode robot of a cluster whose worker may call rooms.book once its asker confirms."""

    def __init__(self, made: Cluster, stream: Proc) -> None:
        self.made = made
        self.stream = stream
        self.config = DingTalkBotConfig(**next(b for b in made.config["bots"] if b["id"] == BOT))
        self.sim = made.stack.sim_url

    def _user(self, call: Callable[[DingTalkUser], Any]) -> Any:
        async def go() -> Any:
            async with httpx.AsyncClient(timeout=10) as http:
                return await call(DingTalkUser(self.config, "", self.sim, http))

        return asyncio.run(go())

    def send(self, user: str, text: str, group: str = "") -> None:
        self._user(lambda person: person.send(user, text, group=group))

    def replies(self, *, group: str = "", user: str = "") -> list[dict]:
        params = {"conversation": group} if group else {"user": user}
        return httpx.get(f"{self.sim}/__sim__/dingtalk/messages", params=params, timeout=5).json()

    def wait_replies(self, count: int, *, group: str = "", user: str = "") -> list[dict]:
        wait_for(lambda: len(self.replies(group=group, user=user)) >= count, 40, f"{count} replies")
        return self.replies(group=group, user=user)

    def cards(self, *, group: str = "", user: str = "") -> list[dict]:
        return self._user(lambda person: person.cards(user, group=group))

    def wait_cards(self, count: int, *, group: str = "", user: str = "") -> list[dict]:
        wait_for(lambda: len(self.cards(group=group, user=user)) >= count, 40, f"{count} cards")
        return self.cards(group=group, user=user)

    def tap(self, user: str, card: dict, choice: str, group: str = "", stale_view: bool = False,
            queued: bool = True) -> None:
        """Tap a card's button; wait until the robot acked the callback and, when it is `queued`, until the worker
        has handled it."""
        handled, acked = self.handled(), self.acked()
        response = self._user(lambda person: person.tap(user, card["track"], button(card, choice), group=group,
                                                        stale_view=stale_view))
        assert response.status_code == 200, response.text
        wait_for(lambda: self.acked() > acked, 20, "the card callback to be acked")
        if queued:
            wait_for(lambda: self.handled() > handled, 40, "the tap to be handled")
        else:
            assert self.handled() == handled and self.made.stack.queue_depth() == 0, "the tap was not queued"

    def handled(self) -> int:
        return int(self.made.stack.redis.hget(self.made.stack.keys.scheduler_stats, "handled") or 0)

    def acked(self) -> int:
        return int(httpx.get(f"{self.sim}/__sim__/dingtalk/stream/stats", timeout=5).json()["acked"])


def button(card: dict, choice: str) -> str:
    """The id of the card's button for `choice` (confirmed / cancelled)."""
    shown = buttons(card)
    return next(b["id"] for b in shown if b["id"].split("_")[1] == choice)


def buttons(card: dict) -> list[dict]:
    return json.loads(card["params"].get("sys_full_json_obj") or "{}").get("msgButtons", [])


@pytest.fixture
def robot(stack: Stack, cluster: Callable[..., Cluster], mcp_server: tuple[str, Path]) -> Iterator[Robot]:  # noqa: F811
    url, _ = mcp_server
    made = cluster(0.05, tools={"servers": {"rooms": {"url": url, "timeout_s": 2.0}}})
    for bot in made.config["bots"]:
        if bot["id"] == BOT:
            bot["tools"] = {"use": ["rooms"], "confirm": ["rooms.book"]}
    write_config(made.path, made.config)
    made.add_worker("w1")
    stream = Proc([*BOTGW, "dingtalk-stream", "--config", str(made.path)],
                  stack.log_dir / f"dingtalk-stream-{made.namespace}.log")
    wait_for(lambda: "dingtalk stream connected" in stream.tail(20), 30, f"the stream connection:\n{stream.tail()}")
    yield Robot(made, stream)
    stream.stop()


def test_in_a_group_only_the_askers_tap_confirms_and_a_call_is_made_once(
    robot: Robot, mcp_server: tuple[str, Path]  # noqa: F811
) -> None:
    _, calls = mcp_server
    group = "cid-group-" + secrets.token_hex(4)
    asker, other = "u" + secrets.token_hex(4), "u" + secrets.token_hex(4)
    robot.send(asker, BOOKING, group=group)
    question = robot.wait_replies(1, group=group)[-1]
    assert "确认" in question["content"] and "rooms.book" in question["content"], question
    (card,) = robot.wait_cards(1, group=group)
    assert card["template"] == BUTTON_CARD_TEMPLATE
    assert [b["text"] for b in buttons(card)] == ["确认", "取消"]
    assert "泰山厅" in card["params"]["markdown"] and "rooms.book" in card["params"]["title"]
    assert calls_made(calls, "book") == [], "nothing is called before the asker confirms"

    robot.tap(other, card, "confirmed", group=group, queued=False)  # someone else's: nothing runs, nothing said
    assert calls_made(calls, "book") == []
    assert len(robot.replies(group=group)) == 1
    assert buttons(robot.cards(group=group)[0]), "the card still asks: the asker has not answered"

    robot.tap(asker, card, "confirmed", group=group)
    answer = robot.wait_replies(2, group=group)[-1]
    assert answer["content"].startswith("tool results:") and answer["via"] == "openapi", answer
    made = calls_made(calls, "book")
    assert len(made) == 1 and made[0]["arguments"]["room"] == "泰山厅", made
    shown = robot.cards(group=group)[0]
    assert buttons(shown) == [] and "确认" in shown["params"]["tips"], "the card shows the choice, buttons gone"

    robot.tap(asker, card, "confirmed", group=group, stale_view=True)  # a second tap (a client not yet updated)
    assert len(calls_made(calls, "book")) == 1, "a second tap calls nothing"
    assert len(robot.replies(group=group)) == 2, "and says nothing"

    robot.send(asker, BOOKING, group=group)
    robot.wait_replies(3, group=group)
    card = robot.wait_cards(2, group=group)[-1]
    robot.tap(asker, card, "cancelled", group=group)
    assert "已取消" in robot.wait_replies(4, group=group)[-1]["content"]
    assert len(calls_made(calls, "book")) == 1, "取消 calls nothing"

    robot.send(asker, BOOKING, group=group)
    robot.wait_replies(5, group=group)
    card = robot.wait_cards(3, group=group)[-1]
    expire_question(robot, group)
    robot.tap(asker, card, "confirmed", group=group)
    assert "过期" in robot.wait_replies(6, group=group)[-1]["content"]
    assert len(calls_made(calls, "book")) == 1, "an expired question's tap calls nothing"


def expire_question(robot: Robot, conversation: str) -> None:
    """Time passes: the pending question of the lane in `conversation` expires."""
    stack = robot.made.stack
    keys = [k for k in stack.redis.keys(stack.keys.tool_confirmation("*")) if conversation in k.decode()]
    assert len(keys) == 1, keys
    pending = json.loads(stack.redis.hget(keys[0], "pending"))
    stack.redis.hset(keys[0], "pending", json.dumps({**pending, "expires_at": time.time() - 1}))


def test_one_to_one_the_tap_confirms_and_the_answer_reaches_the_person(
    robot: Robot, mcp_server: tuple[str, Path]  # noqa: F811
) -> None:
    _, calls = mcp_server
    person = "u" + secrets.token_hex(4)
    robot.send(person, BOOKING)
    robot.wait_replies(1, user=person)
    (card,) = robot.wait_cards(1, user=person)
    refused = robot._user(lambda p: p.tap("u-stranger", card["track"], button(card, "confirmed")))
    assert refused.status_code == 409, "a card shown in one person's chat cannot be tapped by another"
    robot.tap(person, card, "confirmed")
    answer = robot.wait_replies(2, user=person)[-1]
    assert answer["content"].startswith("tool results:") and answer["via"] == "openapi", answer
    assert len(calls_made(calls, "book")) == 1
