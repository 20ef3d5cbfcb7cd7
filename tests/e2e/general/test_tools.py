"""Tools for the assistant (issue 24), end to end: a real MCP server (Streamable HTTP, and stdio started by the worker),
a stub engine that asks for the tool a message names (`tool:<server>__<tool> {json}`, testkit/fakes/stub_engine.py),
gateway and worker, the WeCom app through the simulator. What reaches the server, what the engine is offered and
fed back, what the person sees, and that a call is made once: confirmations, a killed worker, a hanging server.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bots.wecom.config import WeComAIBotConfig
from gateway.pipeline.tool_use import SUPERSEDE_SLACK_S
from simulator.wecom.ai_user import StreamView, WeComAIBotUser
from testkit.configs import write_config
from testkit.processes import ROOT, Proc, free_port, wait_for
from testkit.stacks import Cluster, Stack

TIMEOUT_S = 2.0


@pytest.fixture
def mcp_server(stack: Stack, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The demo MCP server over Streamable HTTP, and the file where it writes down every call it gets."""
    calls = tmp_path / "rooms-calls.jsonl"
    port = free_port()
    args = [sys.executable, "-m", "testkit.fakes.demo_mcp", "--transport", "http", "--port", str(port),
            "--calls", str(calls)]
    proc = Proc(args, stack.log_dir / f"demo-mcp-{port}.log")
    url = f"http://127.0.0.1:{port}/mcp"
    wait_for(lambda: _listening(port), 30, f"the demo MCP server:\n{proc.tail()}")
    yield url, calls
    proc.stop()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def calls_made(path: Path, tool: str | None = None) -> list[dict]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [line for line in lines if tool is None or line["tool"] == tool]


def tools_cluster(cluster: Callable[..., Cluster], url: str, tmp_path: Path, timeout_s: float = TIMEOUT_S,
                  **bot_tools: object) -> Cluster:
    """A gateway and a worker whose WeCom app uses `rooms` (HTTP, `timeout_s`) and `files` (stdio)."""
    stdio_calls = tmp_path / "files-calls.jsonl"
    servers = {
        "rooms": {"url": url, "headers": {"Authorization": "Bearer test-secret-token"}, "timeout_s": timeout_s},
        "files": {"command": [sys.executable, "-m", "testkit.fakes.demo_mcp", "--transport", "stdio",
                              "--calls", str(stdio_calls)], "env": {"PYTHONPATH": str(ROOT)}},
    }
    made = cluster(0.05, tools={"servers": servers})
    for bot in made.config["bots"]:
        if bot["id"] in ("app", "ai"):
            bot["tools"] = {"use": ["rooms", "files"], **bot_tools}
    write_config(made.path, made.config)
    made.add_gateway()
    made.add_worker("w1")
    return made


def person(made: Cluster, user: str) -> str:
    corp = next(b for b in made.config["bots"] if b["id"] == "app")["corp_id"]
    return f"wecom:{corp}:{user}"


def ask(made: Cluster, user: str, text: str, answers: int) -> list[str]:
    """Send `text` as `user` and wait until they have `answers` answers in all; their texts."""
    front = made.stack
    front.post_callback(front.signer().text(user, text))
    front.wait_delivered(user, answers, timeout=40)
    return front.texts(user)


def test_a_tool_call_reaches_the_server_with_the_asker_and_its_result_reaches_the_answer(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path)
    texts = ask(made, user, 'tool:rooms__list_rooms {"start": "2026-12-03T15:00"}', 1)
    made_calls = calls_made(calls, "list_rooms")
    assert len(made_calls) == 1, made_calls
    assert made_calls[0]["arguments"] == {"start": "2026-12-03T15:00"}
    assert made_calls[0]["meta"]["botgw/user"] == person(made, user)
    assert made_calls[0]["meta"]["botgw/bot"] == "app"
    assert made_calls[0]["header_user"] == person(made, user)
    requests = made.engine_requests()
    assert "rooms__list_rooms" in requests[0]["tools"] and "files__list_rooms" in requests[0]["tools"]
    fed_back = requests[-1]["tool_results"]
    assert fed_back and "泰山厅" in fed_back[0], fed_back  # the server's answer, fed to the engine
    assert texts[-1].startswith("tool results:") and "泰山厅" in texts[-1], texts
    # the stdio server, started by the worker itself
    ask(made, user, "tool:files__list_rooms {}", 2)
    assert len(calls_made(tmp_path / "files-calls.jsonl", "list_rooms")) == 1
    secret_seen = [p.name for p in stack.log_dir.glob(f"*{made.namespace}*.log")
                   if "test-secret-token" in p.read_text(errors="replace")]
    assert not secret_seen, f"the server's token is in {secret_seen}"


def test_max_calls_bounds_the_calls_and_the_engine_still_answers_from_the_results(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, max_calls=1)
    texts = ask(made, user, 'tool:rooms__list_rooms {"start": "9:00"}\ntool:rooms__list_rooms {"start": "10:00"}', 1)
    assert len(calls_made(calls, "list_rooms")) == 1, "one call allowed, the second not made"
    last = made.engine_requests()[-1]
    assert last["tools"] == [], "the last round offers no tools: the engine answers from what it has"
    assert "泰山厅" in texts[-1] and "limit of 1 tool calls" in texts[-1], texts[-1]


def test_a_person_without_access_is_not_offered_the_tool(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, access={"rooms.book": {"users": ["wecom:someone-else"]}})
    texts = ask(made, user, 'tool:rooms__book {"room": "A"}', 1)
    offered = made.engine_requests()[0]["tools"]
    assert "rooms__book" not in offered and "rooms__list_rooms" in offered, offered
    assert calls_made(calls, "book") == []
    assert texts[-1].startswith("answer to:"), "the engine, offered no such tool, answers in words"


def test_a_confirm_tool_runs_only_after_its_asker_confirms_once(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, confirm=["rooms.book"])
    booking = 'tool:rooms__book {"room": "泰山厅", "start": "2026-12-03T15:00"}'
    texts = ask(made, user, booking, 1)
    assert "确认" in texts[-1] and "泰山厅" in texts[-1] and "rooms.book" in texts[-1], texts[-1]
    time.sleep(1.0)
    assert calls_made(calls, "book") == [], "nothing is called before the asker confirms"
    other = user + "-other"
    ask(made, other, "确认", 1)  # someone else's 确认 is their own message, in their own conversation
    time.sleep(0.5)
    assert calls_made(calls, "book") == []

    texts = ask(made, user, "确认", 2)
    assert len(calls_made(calls, "book")) == 1
    assert texts[-1].startswith("tool results:"), texts[-1]
    texts = ask(made, user, "确认", 3)  # a second tap
    assert "不会重复" in texts[-1], texts[-1]
    time.sleep(0.5)
    assert len(calls_made(calls, "book")) == 1, "a second confirmation calls nothing"

    texts = ask(made, user, booking, 4)
    assert "确认" in texts[-1]
    texts = ask(made, user, "取消", 5)
    assert "已取消" in texts[-1]
    ask(made, user, booking, 6)
    key = made.stack.keys.tool_confirmation(_lane(made, user))
    pending = json.loads(made.stack.redis.hget(key, "pending"))
    made.stack.redis.hset(key, "pending", json.dumps({**pending, "expires_at": time.time() - 1}))  # time passes
    texts = ask(made, user, "确认", 7)
    assert "过期" in texts[-1], texts[-1]
    time.sleep(0.5)
    assert len(calls_made(calls, "book")) == 1, "cancelled and expired confirmations call nothing"

    audit = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "tools", "audit", "--config", str(made.path),
         "--user", person(made, user), "--json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert audit.returncode == 0, audit.stderr
    records = [json.loads(line) for line in audit.stdout.splitlines() if line.strip()]
    kinds = [(record["kind"], record["outcome"]) for record in records]
    assert kinds == [
        ("confirm_asked", ""), ("confirmed", ""), ("call", "ok"),
        ("confirm_asked", ""), ("cancelled", ""),
        ("confirm_asked", ""), ("cancelled", "timeout"),
    ], kinds
    assert all(record["tool"] == "rooms.book" for record in records)


def test_a_waiting_call_is_cancelled_when_its_asker_writes_something_else(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    """Left waiting, a casual 是 to some later question of the bot's would have run it (found by a review)."""
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, confirm=["rooms.book"])
    texts = ask(made, user, 'tool:rooms__book {"room": "泰山厅", "start": "2026-12-03T15:00"}', 1)
    assert "确认" in texts[-1], texts[-1]
    time.sleep(SUPERSEDE_SLACK_S + 1.0)  # what was written before the question was asked cannot move on from it
    texts = ask(made, user, "你们几点上班？", 2)
    assert "已取消" in texts[-1] and "rooms.book" in texts[-1], f"the asker was not told: {texts[-1]}"
    texts = ask(made, user, "是", 3)
    time.sleep(0.5)
    assert calls_made(calls, "book") == [], "a later 是 ran the call its asker had moved on from"
    assert "rooms.book" in texts[-1] and "已取消" in texts[-1], f"the late yes was not told: {texts[-1]}"
    audit = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "tools", "audit", "--config", str(made.path),
         "--user", person(made, user), "--json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert audit.returncode == 0, audit.stderr
    kinds = [(record["kind"], record["outcome"]) for record in map(json.loads, audit.stdout.splitlines())]
    assert kinds == [("confirm_asked", ""), ("cancelled", "superseded")], kinds


def _lane(made: Cluster, user: str) -> str:
    """The WeCom app's one-to-one conversation of `user` (the reply record of their first message names it)."""
    keys = made.stack.redis.keys(made.stack.keys.tool_confirmation("*"))
    assert len(keys) == 1, keys
    return keys[0].decode().removeprefix(made.stack.keys.tool_confirmation(""))


def test_a_worker_killed_after_the_call_was_sent_does_not_call_again(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path, timeout_s=60, confirm=["rooms.hang"])
    ask(made, user, 'tool:rooms__hang {"seconds": 30}', 1)
    made.stack.post_callback(made.stack.signer().text(user, "确认"))
    wait_for(lambda: len(calls_made(calls, "hang")) == 1, 30, "the call to reach the server")
    made.procs["w1"].kill()  # SIGKILL: the call was sent, its outcome never recorded
    made.add_worker("w2")
    made.stack.wait_delivered(user, 2, timeout=60)
    said = made.stack.texts(user)[-1]
    assert "结果未知" in said, said
    time.sleep(1.0)
    assert len(calls_made(calls, "hang")) == 1, "the call whose outcome is unknown is not made again"


def test_a_hanging_server_gets_a_timeout_and_the_lane_moves_on(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path)
    started = time.monotonic()
    texts = ask(made, user, 'tool:rooms__hang {"seconds": 60}', 1)
    assert time.monotonic() - started < TIMEOUT_S + 15
    assert "did not answer within 2 s" in texts[-1], texts[-1]
    assert len(calls_made(calls, "hang")) == 1, "a timed-out call is not repeated in the answer's rounds"
    texts = ask(made, user, "and now?", 2)
    assert texts[-1] == "answer to: and now?"


def test_the_worker_refuses_to_start_on_a_bot_naming_an_unknown_server(stack: Stack, tmp_path: Path) -> None:
    config = dict(stack.config)
    config["bots"] = [{**b, "tools": {"use": ["nowhere"]}} if b["id"] == "app" else b for b in config["bots"]]
    path = write_config(tmp_path / "bad.yaml", config)
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "worker", "--config", str(path), "--name", "x"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode != 0
    assert "tools.use" in run.stderr and "nowhere" in run.stderr, run.stderr



def test_the_ai_bots_stream_shows_the_tool_running_then_the_answer(
    stack: Stack, cluster: Callable[..., Cluster], user: str, mcp_server: tuple[str, Path], tmp_path: Path
) -> None:
    """Where a reply grows (the AI bot's stream) the person sees which tool runs; the answer extends it."""
    url, calls = mcp_server
    made = tools_cluster(cluster, url, tmp_path)
    config = WeComAIBotConfig(**next(b for b in made.config["bots"] if b["id"] == "ai"))

    async def go() -> tuple[StreamView, StreamView]:
        async with httpx.AsyncClient(timeout=30) as http:
            sim = WeComAIBotUser(config, made.gateways, made.stack.sim_url, http)
            plain = await sim.ask(user, "no tool needed", interval_s=0.1)
            used = await sim.ask(user, 'tool:rooms__list_rooms {"start": "15:00"}', interval_s=0.1)
            return plain, used

    plain, used = asyncio.run(go())
    assert plain.finished and plain.text == "answer to: no tool needed", plain.shown
    assert used.finished and used.text.startswith("正在调用 rooms.list_rooms…"), used.shown
    assert "tool results:" in used.text and "泰山厅" in used.text, used.text
    assert len(calls_made(calls, "list_rooms")) == 1
