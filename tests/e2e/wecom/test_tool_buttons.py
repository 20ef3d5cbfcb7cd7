"""Confirmation buttons on WeCom (issue 24), end to end: a `confirm` tool's question reaches the person as a template
card with 确认 and 取消 (the app by message/send, the AI bot by the message's response_url), and a tap through the
simulator (which offers one only on a card the person was shown) settles it: only the asker's, once, before it
expires. Real gateway, worker, Redis, MCP server and simulator (tests/e2e/general/test_tools.py's helpers)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bots.wecom.config import WeComAIBotConfig
from gateway import texts
from simulator.wecom.ai_user import WeComAIBotUser
from testkit.processes import BOTGW, ROOT, child_env, wait_for
from testkit.stacks import Cluster, Stack
from tests.e2e.general.test_tools import _lane, ask, calls_made, mcp_server, tools_cluster

__all__ = ["mcp_server"]  # the MCP server fixture, used here by name

BOOKING = 'tool:rooms__book {"room": "泰山厅", "start": "2026-12-03T15:00"}'


def cards(made: Cluster, user: str) -> list[dict[str, Any]]:
    return httpx.get(f"{made.stack.sim_url}/__sim__/wecom/cards", params={"touser": user}, timeout=5).json()


def wait_cards(made: Cluster, user: str, count: int) -> dict[str, str]:
    """Wait for `user`'s `count`-th card; its buttons' keys by label."""
    wait_for(lambda: len(cards(made, user)) >= count, 30, f"card {count} to reach {user}")
    card = cards(made, user)[count - 1]["card"]
    assert card["card_type"] == "button_interaction" and "rooms.book" in card["main_title"]["title"], card
    assert "泰山厅" in card["sub_title_text"], card
    return {button["text"]: button["key"] for button in card["button_list"]}


def sim_tap(made: Cluster, user: str, key: str) -> httpx.Response:
    return httpx.post(f"{made.stack.sim_url}/__sim__/wecom/tap", json={"user": user, "key": key}, timeout=5)


def tap(made: Cluster, user: str, key: str, tapped: dict[str, str] | None = None) -> None:
    """`user` taps `key`: the event the simulator describes (or `tapped`, one it described before), signed with
    the app's secrets and posted."""
    if tapped is None:
        answer = sim_tap(made, user, key)
        assert answer.status_code == 200, answer.text
        tapped = answer.json()["event"]
    answered = made.stack.post_callback(made.stack.signer().card_event(tapped))
    assert answered.status_code == 200 and answered.text == ""


def handled(made: Cluster) -> None:
    """Everything queued was handled: what the worker would send for it is sent."""
    wait_for(lambda: made.stack.queue_depth() == 0 and made.stack.leased() == 0, 30, "the worker to finish")


def test_the_apps_card_confirms_by_its_askers_tap_once_and_cancels_and_expires(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, confirm=["rooms.book"])
    said = ask(made, user, BOOKING, 1)
    assert "确认" in said[-1], "the question in words too: a card that cannot be tapped leaves a reply"
    keys = wait_cards(made, user, 1)
    assert list(keys) == ["确认", "取消"]
    assert calls_made(calls, "book") == [], "nothing is called before a tap"

    other = user + "-other"
    assert sim_tap(made, other, keys["确认"]).status_code == 409, "WeCom sends no event for a card never received"
    event = sim_tap(made, user, keys["确认"]).json()["event"]  # as if the card had reached the other person too
    made.stack.post_callback(made.stack.signer().card_event({**event, "FromUserName": other}))
    handled(made)
    assert calls_made(calls, "book") == [], "someone else's tap calls nothing"
    assert len(made.stack.delivered(user)) == 1 and cards(made, other) == [], "nothing reaches the asker"
    # the tap lands in the tapper's own lane (an app's conversations are one-to-one), where no question waits:
    # at most they are told that nothing was done
    assert [m["content"] for m in made.stack.delivered(other)] in ([], [texts.TOOL_BUTTON_STALE_TEXT])

    event_of_first = sim_tap(made, user, keys["确认"]).json()["event"]
    tap(made, user, keys["确认"], tapped=event_of_first)
    made.stack.wait_delivered(user, 2, timeout=40)
    assert made.stack.texts(user)[-1].startswith("tool results:"), made.stack.texts(user)
    assert len(calls_made(calls, "book")) == 1
    wait_for(lambda: cards(made, user)[0]["replaced"] == "已确认", 10, "the tapped card to say it was confirmed")
    assert sim_tap(made, user, keys["确认"]).status_code == 409, "its buttons are gone: nothing left to tap"
    second = {**event_of_first, "CreateTime": str(int(event_of_first["CreateTime"]) + 1)}  # tapped before the update
    tap(made, user, keys["确认"], tapped=second)
    handled(made)
    assert len(calls_made(calls, "book")) == 1 and len(made.stack.delivered(user)) == 2, "a second tap does nothing"

    ask(made, user, BOOKING, 3)
    tap(made, user, wait_cards(made, user, 2)["取消"])
    made.stack.wait_delivered(user, 4, timeout=40)
    assert "已取消" in made.stack.texts(user)[-1]
    wait_for(lambda: cards(made, user)[1]["replaced"] == "已取消", 10, "the cancelled card to say so")

    ask(made, user, BOOKING, 5)
    keys = wait_cards(made, user, 3)
    key = made.stack.keys.tool_confirmation(_lane(made, user))
    pending = json.loads(made.stack.redis.hget(key, "pending"))
    made.stack.redis.hset(key, "pending", json.dumps({**pending, "expires_at": time.time() - 1}))  # time passes
    tap(made, user, keys["确认"])
    made.stack.wait_delivered(user, 6, timeout=40)
    assert "过期" in made.stack.texts(user)[-1], made.stack.texts(user)[-1]
    assert len(calls_made(calls, "book")) == 1, "cancelled and expired questions call nothing"


def test_the_ai_bots_card_goes_by_response_url_and_its_tap_answers_through_the_events(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, confirm=["rooms.book"])
    config = WeComAIBotConfig(**next(b for b in made.config["bots"] if b["id"] == "ai"))

    async def go() -> tuple[str, dict[str, Any], float]:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(config, made.gateways, made.stack.sim_url, http)
            view = await sim.ask(user, BOOKING, interval_s=0.1)
            assert view.finished and "确认" in view.text, view.shown
            deadline = time.monotonic() + 30
            while not (shown := await sim.cards(user)) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert shown, "the card reaches the person through the message's response_url"
            keys = {button["text"]: button["key"] for button in shown[0]["card"]["button_list"]}
            assert calls_made(calls, "book") == []
            started = time.monotonic()
            event, answered = await sim.tap(user, keys["确认"])
            return answered.text, event, time.monotonic() - started

    body, event, took_s = asyncio.run(go())
    assert body == "" and took_s < 5, "the card event is answered at once, with an empty body (no stream)"
    token = event["response_url"].rsplit("/", 1)[-1]

    def posted() -> dict[str, Any]:
        return httpx.get(f"{made.stack.sim_url}/__sim__/wecom-ai/responses", timeout=5).json().get(token, {})

    wait_for(lambda: bool(posted()), 40, "the answer through the tap's response_url")
    assert posted()["msgtype"] == "markdown" and posted()["content"].startswith("tool results:"), posted()
    assert "泰山厅" in posted()["content"]
    assert len(calls_made(calls, "book")) == 1


def test_botgw_sim_wecom_shows_the_card_and_taps_it(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    """The playground's way: `botgw sim wecom` prints the card it got, and `--tap 确认` taps it."""
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, confirm=["rooms.book"])

    def sim(*args: str) -> subprocess.CompletedProcess[str]:
        command = [*BOTGW, "sim", "wecom", "--config", str(made.path), "--bot", "app", "--user", user,
                   "--gateway", made.stack.gateway_url, "--timeout", "40", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=ROOT, env=child_env())

    asked = sim(BOOKING)
    assert asked.returncode == 0, asked.stderr
    assert "[卡片 card]" in asked.stdout and "确认 | 取消" in asked.stdout, asked.stdout
    assert calls_made(calls, "book") == []
    confirmed = sim("--tap", "确认")
    assert confirmed.returncode == 0, confirmed.stderr
    assert "tool results:" in confirmed.stdout, confirmed.stdout
    assert len(calls_made(calls, "book")) == 1
    refused = sim("--tap", "确认", "more text")
    assert refused.returncode == 2 and "--tap is a tap" in refused.stderr
