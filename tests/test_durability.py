"""Nothing lost, nothing doubled: a worker killed mid-message, and messages acked while no worker ran.

Each test runs its own gateway and workers in a namespace of their own (same Redis, engine
and simulator), so that it controls exactly which workers are alive.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack
from tests.procs import free_port, start_gateway, start_worker, wait_for, write_config


@pytest.fixture
def isolated(stack: Stack, live_engine: str) -> Iterator[Stack]:
    namespace = "d" + secrets.token_hex(4)
    config = {**stack.config, "namespace": namespace}
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    port = free_port()
    gateway = start_gateway(path, port, stack.log_dir, name=f"gateway-{namespace}")
    iso = Stack(config, path, f"http://127.0.0.1:{port}", stack.sim_url, stack.redis, namespace, stack.log_dir)
    iso.procs["gateway"] = gateway
    yield iso
    httpx.post(f"{stack.sim_url}/__sim__/wecom/release", timeout=5)
    for proc in iso.procs.values():
        proc.stop()


def test_worker_killed_while_sending_reply_delivered_once(isolated: Stack, user: str) -> None:
    stack = isolated
    stack.procs["worker-a"] = start_worker(stack.config_path, stack.log_dir, f"{stack.namespace}-a")
    held_before = stack.sim_stats()["held"]
    stack.fault(hold=True, times=1)
    assert stack.post_callback(stack.signer().text(user, "Please answer once")).status_code == 200
    wait_for(lambda: stack.sim_stats()["held"] > held_before, 60, "worker A to start sending")

    stack.procs["worker-a"].kill()  # SIGKILL while the send is in flight
    stack.procs["worker-a"].popen.wait(5)
    # WeCom received the request: it completes after the sender is gone.
    httpx.post(f"{stack.sim_url}/__sim__/wecom/release", timeout=5)
    stack.procs["worker-b"] = start_worker(stack.config_path, stack.log_dir, f"{stack.namespace}-b")

    wait_for(lambda: stack.queue_depth() == 0, 30, "worker B to finish the entry")
    delivered = stack.wait_delivered(user, 1, settle=2.0)
    assert len(delivered) == 1
    assert "took over a stalled message" in stack.procs["worker-b"].tail(100)


def test_worker_killed_while_generating_reply_delivered_once(isolated: Stack, user: str) -> None:
    stack = isolated
    # A long answer keeps worker A in the engine for a while.
    config = {**stack.config, "engine": {**stack.config["engine"], "max_tokens": 1500}}
    path = write_config(stack.log_dir / f"{stack.namespace}-long.yaml", config)
    stack.procs["worker-a"] = start_worker(path, stack.log_dir, f"{stack.namespace}-a")
    wait_for(lambda: b"worker started" in stack.procs["worker-a"].log_path.read_bytes(), 30, "worker A up")
    assert stack.post_callback(stack.signer().text(user, "Write a long essay")).status_code == 200
    wait_for(lambda: stack.leased() == 1, 30, "worker A to take the message")
    time.sleep(0.3)
    stack.procs["worker-a"].kill()
    stack.procs["worker-a"].popen.wait(5)
    assert stack.delivered(user) == []
    stack.procs["worker-b"] = start_worker(path, stack.log_dir, f"{stack.namespace}-b")
    delivered = stack.wait_delivered(user, 1, timeout=120, settle=2.0)
    assert len(delivered) >= 1
    assert len({item["content"] for item in delivered}) == len(delivered), "a piece was delivered twice"
    record = stack.redis.hgetall(next(iter(stack.redis.scan_iter(f"{stack.namespace}:reply:wecom:*"))))
    assert record[b"state"] == b"done"
    assert "".join(item["content"] for item in delivered) == record[b"text"].decode()


def test_messages_acked_while_no_worker_runs_are_all_answered_once(isolated: Stack) -> None:
    stack = isolated
    users = [f"r{secrets.token_hex(4)}" for _ in range(10)]
    for user in users:
        assert stack.post_callback(stack.signer().text(user, f"hello from {user}")).status_code == 200
    assert stack.queue_depth() == 10
    stack.procs["worker"] = start_worker(stack.config_path, stack.log_dir, f"{stack.namespace}-late")
    for user in users:
        assert len(stack.wait_delivered(user, 1, timeout=90, settle=0.2)) == 1
    time.sleep(1.5)
    assert all(len(stack.delivered(user)) == 1 for user in users)


def test_one_conversation_is_answered_in_order(isolated: Stack, user: str) -> None:
    stack = isolated
    for name in ("x", "y", "z"):
        stack.procs[f"worker-{name}"] = start_worker(stack.config_path, stack.log_dir, f"{stack.namespace}-{name}")
    signer = stack.signer()
    texts = ["/help", "/reset", "/help", "/reset", "/help", "/reset"]
    for text in texts:
        assert stack.post_callback(signer.text(user, text)).status_code == 200
    delivered = stack.wait_delivered(user, len(texts), timeout=60)
    kinds = ["help" if "/help" in item["content"] and "Commands" in item["content"] else "reset" for item in delivered]
    assert kinds == ["help", "reset", "help", "reset", "help", "reset"]
