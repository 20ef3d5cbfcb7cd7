"""The page's confirmation buttons (issue 24) in Chromium against the real stack: a stub engine that asks for the
tool a message names, the demo MCP server (HTTP) whose `book` the web bot lists in `confirm`, gateway, worker,
Redis and the page (`botgw web`). The question shows with two buttons, nothing is called before the click, 确认
calls once and the answer shows, the buttons go; a replayed tap, another person's tap and 取消 call nothing."""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from PIL import Image

from gateway.state.keys import Keys
from testkit.browser import CHROMIUM, chromium_browser
from testkit.configs import stack_config, write_config
from testkit.fakes.demo_mcp import start_demo_mcp
from testkit.processes import BOTGW, Proc, free_port, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import start_stub_engine
from tests.browser.test_web_attach import next_answer, signed_in, steps
from tests.conftest import ARTIFACTS
from tests.e2e.general.test_tools import calls_made
from tests.e2e.web.page_stack import PASSWORD, USERS, PageStack

BOOKING = 'tool:rooms__book {"room": "泰山厅", "start": "2026-12-03T15:00"}'


@dataclass
class ToolsPage:
    stack: PageStack
    calls: Path  # every call the MCP server got, one JSON line each

    def booked(self) -> list[dict]:
        return calls_made(self.calls, "book")

    def tap(self, user: str, key: str) -> tuple[int, list[dict]]:
        """A tap posted as the page posts it for `user` (the page's key and body): the status and the events."""
        body = {"user": user, "login": "password", "button": key}
        with httpx.stream("POST", f"{self.stack.api}/chat", json=body, headers=self.stack.auth, timeout=60) as reply:
            lines = [line for line in reply.iter_lines() if line.startswith("data:")]
            return reply.status_code, [json.loads(line[5:]) for line in lines]

    def question_of(self, user: str) -> str:
        """The id of the question waiting for `user`'s 确认 or 取消 (their conversation's pending call)."""
        keys = [k.decode() for k in self.stack.redis.keys(self.stack.keys.tool_confirmation("*"))]
        mine = [k for k in keys if k.endswith(f":{user}")]
        assert len(mine) == 1, keys
        return json.loads(self.stack.redis.hget(mine[0], "pending"))["id"]


@contextmanager
def tools_page(redis_url: str, log_dir: Path) -> Iterator[ToolsPage]:
    """The page's stack with the demo MCP server as the web bot's `rooms`, `book` waiting for confirmation."""
    namespace = "tb" + secrets.token_hex(4)
    calls = log_dir / f"rooms-calls-{namespace}.jsonl"
    engine, engine_url = start_stub_engine(log_dir, 0.05, f"buttons-engine-{namespace}", chunk_delay_s=0.05)
    mcp, mcp_url = start_demo_mcp(log_dir, calls, f"buttons-mcp-{namespace}")
    gateway_port, page_port = free_port(), free_port()
    gateway, key = f"http://127.0.0.1:{gateway_port}", "buttons-key-" + secrets.token_hex(8)
    web = {"id": "web", "platform": "web", "api_key": key, "gateway_url": gateway,
           "users": [{"name": name, "password": PASSWORD} for name in USERS],
           "tools": {"use": ["rooms"], "confirm": ["rooms.book"]}}
    config = stack_config(redis_url, engine_url, "http://127.0.0.1:9", namespace, bots=[web],
                          tools={"servers": {"rooms": {"url": mcp_url, "timeout_s": 5}}},
                          engine={"max_tokens": 64}, limits={"per_user": "100/minute"})
    path = write_config(log_dir / f"buttons-{namespace}.yaml", config)
    procs = [engine, mcp, start_gateway(path, gateway_port, log_dir, f"gw-{namespace}"),
             start_worker(path, log_dir, f"worker-{namespace}")]
    app_root = log_dir / f"buttons-chainlit-{namespace}"
    procs.append(Proc([*BOTGW, "web", "--config", str(path), "--port", str(page_port), "--app-root", str(app_root)],
                      log_dir / f"buttons-web-{namespace}.log"))
    made = PageStack(gateway, engine_url, key, Keys(namespace), redis.Redis.from_url(redis_url), log_dir,
                     f"http://127.0.0.1:{page_port}", app_root)
    try:
        wait_http(f"{gateway}/healthz", 60, procs[2])
        wait_http(f"{made.page}/health", 120, procs[-1])
        yield ToolsPage(made, calls)
    finally:
        for proc in procs:
            proc.stop()
        made.redis.close()


@pytest.fixture(scope="module")
def tools(redis_url: str, log_dir: Path) -> Iterator[ToolsPage]:
    if not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed: run `make test`, which installs it")
    with tools_page(redis_url, log_dir) as made:
        yield made


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with chromium_browser() as browser:
        yield browser


def type_message(page: object, text: str) -> None:
    page.click("#chat-input")  # type: ignore[attr-defined]
    page.keyboard.insert_text(text)  # type: ignore[attr-defined]
    page.keyboard.press("Enter")  # type: ignore[attr-defined]


def buttons(page: object, label: str) -> object:
    return page.get_by_role("button", name=label, exact=True)  # type: ignore[attr-defined]


def test_a_confirm_tool_runs_once_after_its_asker_clicks_confirm(tools: ToolsPage, chromium: object) -> None:
    page = signed_in(chromium, tools.stack, "alice")
    before = len(steps(page, "assistant_message"))
    type_message(page, BOOKING)
    question = next_answer(page, before, "将要执行")
    assert "rooms.book" in question and "泰山厅" in question, question
    buttons(page, "确认").wait_for(timeout=10000)  # type: ignore[attr-defined]
    assert buttons(page, "确认").count() == 1 and buttons(page, "取消").count() == 1  # type: ignore[attr-defined]
    assert tools.booked() == [], "nothing is called before the click"
    asked = tools.question_of("alice")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-tool-question.png"), full_page=True)  # type: ignore[attr-defined]

    # Another signed-in person's tap of alice's question (bob's page posting its key) does nothing.
    status, events = tools.tap("bob", f"botgw:confirmed:{asked}")
    assert status == 200 and events[-1].get("done"), events
    assert "失效" in events[-1]["text"], events[-1]  # bob has no question waiting: the short stale note
    assert tools.booked() == []
    assert tools.question_of("alice") == asked, "alice's question still waits"

    before = len(steps(page, "assistant_message"))
    buttons(page, "确认").click()  # type: ignore[attr-defined]
    answer = next_answer(page, before, "tool results:")
    assert "正在调用 rooms.book" in answer and "泰山厅" in answer, answer
    booked = tools.booked()
    assert len(booked) == 1 and booked[0]["arguments"]["room"] == "泰山厅", booked
    assert booked[0]["meta"]["botgw/user"] == "web:web:alice", "called as the signed-in asker"
    assert buttons(page, "确认").count() == 0 and buttons(page, "取消").count() == 0, (  # type: ignore[attr-defined]
        "the buttons go after the click")
    shot = ARTIFACTS / "web-tool-buttons.png"
    page.screenshot(path=str(shot), full_page=True)  # type: ignore[attr-defined]
    assert Image.open(shot).size[0] >= 1000

    # The same tap posted again is the same delivery: its answer again, no second call.
    status, events = tools.tap("alice", f"botgw:confirmed:{asked}")
    assert status == 200 and "tool results:" in events[-1]["text"], events
    # 取消 of the settled question does nothing: the page's wait ends with nothing to show.
    status, events = tools.tap("alice", f"botgw:cancelled:{asked}")
    assert status == 200 and events[-1] == {"done": True, "text": "", "experts": "", "sources": [],
                                            "no_answer": False}, events
    # Both were answered to the end (the replay queued nothing; the 取消's record is done): nothing more to wait for.
    assert len(tools.booked()) == 1, "a replayed or late tap calls nothing more"
    page.close()  # type: ignore[attr-defined]


def test_cancel_calls_nothing(tools: ToolsPage, chromium: object) -> None:
    page = signed_in(chromium, tools.stack, "carol")
    booked = len(tools.booked())
    before = len(steps(page, "assistant_message"))
    type_message(page, BOOKING)
    next_answer(page, before, "将要执行")
    before = len(steps(page, "assistant_message"))
    buttons(page, "取消").click()  # type: ignore[attr-defined]
    answer = next_answer(page, before, "已取消")
    assert "rooms.book" in answer
    assert buttons(page, "确认").count() == 0  # type: ignore[attr-defined]
    assert len(tools.booked()) == booked, "取消 calls nothing"
    page.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("key", ["botgw:maybe:0123456789abcdef", "card:confirmed:0123456789abcdef", "", 42])
def test_a_tap_that_is_not_a_button_is_refused_and_nothing_queued(tools: ToolsPage, key: object) -> None:
    user = "tapper-" + secrets.token_hex(4)  # a name nothing else uses: any key of theirs would be this post's
    body = {"user": user, "login": "password", "button": key}
    reply = httpx.post(f"{tools.stack.api}/chat", json=body, headers=tools.stack.auth, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"] == "unknown_button", reply.text
    assert tools.stack.redis.keys(f"*{user}*") == [], "nothing opened, counted or queued for the refused tap"
