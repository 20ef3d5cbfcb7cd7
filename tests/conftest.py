"""Session fixtures: a real redis-server, a real vLLM CPU engine serving the tiny ERNIE-4.5 MoE,
the platform simulator, a gateway and a worker, all separate processes talking HTTP."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from bots.simulator.wecom_callback import SignedCallback, WeComCallbackSigner
from bots.wecom.config import WeComAppConfig
from tests.procs import (
    BOTGW,
    ROOT,
    Proc,
    free_port,
    start_gateway,
    start_simulator,
    start_worker,
    wait_http,
    write_config,
)

ARTIFACTS = ROOT / "test-artifacts"
ENGINE_MODEL = "ernie-tiny"
SYSTEM_PROMPT = "You are a test assistant."


def random_aes_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")


@pytest.fixture(scope="session")
def log_dir() -> Path:
    path = ARTIFACTS / "logs"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="session")
def redis_url(log_dir: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if not binary:
        pytest.fail("redis-server is not installed: run `make test`, which installs it")
    port = free_port()
    proc = Proc([binary, "--port", str(port), "--save", "", "--appendonly", "no"], log_dir / "redis.log")
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start:\n{proc.tail()}")
            time.sleep(0.1)
    yield f"redis://127.0.0.1:{port}/0"
    proc.stop()


@dataclass
class Stack:
    """A running botgw: config, addresses and clients for the tests to talk to it."""

    config: dict
    config_path: Path
    gateway_url: str
    sim_url: str
    redis: redis.Redis
    namespace: str
    log_dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def admin_url(self) -> str:
        """The gateway's admin listener (/readyz, /metrics)."""
        return self.procs["gateway"].admin_url

    @property
    def bot(self) -> WeComAppConfig:
        return WeComAppConfig(**self.config["bots"][0])

    def signer(self) -> WeComCallbackSigner:
        return WeComCallbackSigner(self.bot)

    def post_callback(self, callback: SignedCallback, bot_id: str | None = None) -> httpx.Response:
        return httpx.post(
            f"{self.gateway_url}/callback/{bot_id or self.bot.id}",
            params=callback.params,
            content=callback.body,
            timeout=10,
        )

    def delivered(self, user: str) -> list[dict]:
        return httpx.get(f"{self.sim_url}/__sim__/wecom/messages", params={"touser": user}, timeout=5).json()

    def wait_delivered(self, user: str, count: int = 1, timeout: float = 60, settle: float = 1.0) -> list[dict]:
        """Wait for at least `count` messages to `user`, then a quiet `settle` seconds to catch extras."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            items = self.delivered(user)
            if len(items) >= count:
                time.sleep(settle)
                return self.delivered(user)
            time.sleep(0.1)
        raise AssertionError(f"{user} got {len(self.delivered(user))} messages, expected {count}")

    def sim_stats(self) -> dict:
        return httpx.get(f"{self.sim_url}/__sim__/wecom/stats", timeout=5).json()

    def fault(self, **fault: object) -> None:
        httpx.post(f"{self.sim_url}/__sim__/wecom/faults", json=fault, timeout=5).raise_for_status()

    def entries_added(self) -> int:
        """Entries ever added to the work queue (the scheduler's counter): rises only on enqueue."""
        return int(self.redis.hget(f"{self.namespace}:sched:stats", "enqueued") or 0)

    def queue_depth(self) -> int:
        """Entries enqueued and not yet handled."""
        stats = self.redis.hgetall(f"{self.namespace}:sched:stats")
        return int(stats.get(b"enqueued", 0)) - int(stats.get(b"handled", 0))

    def leased(self) -> int:
        """Messages a worker holds a lease on right now."""
        return int(self.redis.zcard(f"{self.namespace}:sched:leases"))


def dingtalk_bot(bot_id: str, mode: str, sim_url: str) -> dict:
    return {
        "id": bot_id,
        "platform": "dingtalk",
        "mode": mode,
        "app_key": f"ding{secrets.token_hex(6)}",
        "app_secret": secrets.token_urlsafe(24),
        "api_base": sim_url,
        "oapi_base": sim_url,
        "stream_ping_interval_s": 1.0,
        "stream_ping_timeout_s": 1.0,
    }


def stack_config(redis_url: str, engine_url: str, sim_url: str, namespace: str, **overrides: object) -> dict:
    config = {
        "redis_url": redis_url,
        "namespace": namespace,
        "system_prompt": SYSTEM_PROMPT,
        "log_level": "INFO",
        "engine": {"base_url": engine_url, "model": ENGINE_MODEL, "max_tokens": 24, "temperature": 0.0},
        "memory": {"token_budget": 1024},
        "limits": {"per_user": "20/minute"},  # under WeCom's 30 sends a minute per member
        "worker": {"claim_idle_ms": 1500, "backoff_base_s": 0.2, "backoff_max_s": 2.0, "max_send_attempts": 5},
        "bots": [
            {
                "id": "app",
                "platform": "wecom",
                "corp_id": "wwtest" + secrets.token_hex(5),
                "agent_id": 1000002,
                "secret": secrets.token_urlsafe(24),
                "token": secrets.token_hex(8),
                "encoding_aes_key": random_aes_key(),
                "api_base": sim_url,
            },
            {
                "id": "ai",
                "platform": "wecom-ai",
                "token": secrets.token_hex(8),
                "encoding_aes_key": random_aes_key(),
                "welcome_text": "welcome to the test bot",
                "api_base": sim_url,
            },
            {"id": "robot", "platform": "wecom-webhook", "key": secrets.token_hex(12), "api_base": sim_url},
            dingtalk_bot("ding-http", "http", sim_url),
            dingtalk_bot("ding-stream", "stream", sim_url),
            {**dingtalk_bot("ding-card", "http", sim_url), "ai_card": {"enabled": True, "updates_per_second": 3}},
        ],
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


@pytest.fixture(scope="session")
def stack(redis_url: str, log_dir: Path) -> Iterator[Stack]:
    """Gateway + simulator + one worker. The engine address is read lazily: tests that do not
    need the engine (bad input, sending) run without waiting for it."""
    engine_port = int(os.environ.get("BOTGW_TEST_ENGINE_PORT", free_port()))
    os.environ["BOTGW_TEST_ENGINE_PORT"] = str(engine_port)
    sim_port, gw_port = free_port(), free_port()
    namespace = "t" + secrets.token_hex(4)
    sim_url = f"http://127.0.0.1:{sim_port}"
    config = stack_config(redis_url, f"http://127.0.0.1:{engine_port}", sim_url, namespace)
    path = write_config(log_dir / "stack.yaml", config)
    procs = {"simulator": start_simulator(path, sim_port, log_dir)}
    procs["gateway"] = start_gateway(path, gw_port, log_dir)
    procs["worker"] = start_worker(path, log_dir, "worker-1")
    client = redis.Redis.from_url(redis_url)
    yield Stack(config, path, f"http://127.0.0.1:{gw_port}", sim_url, client, namespace, log_dir, procs)
    for proc in procs.values():
        proc.stop()


@pytest.fixture(scope="session")
def live_engine(stack: Stack, log_dir: Path) -> Iterator[str]:
    """The engine at the address the stack's config names, started on first use."""
    port = int(os.environ["BOTGW_TEST_ENGINE_PORT"])
    proc = Proc([*BOTGW, "engine", "serve", "--profile", "tiny", "--port", str(port)], log_dir / "engine.log")
    wait_http(f"http://127.0.0.1:{port}/health", 600, proc)
    # The stack's gateway and worker watch the engine on their own; let them see it warmed up.
    wait_http(f"{stack.admin_url}/readyz", 60)
    time.sleep(1.0)
    yield f"http://127.0.0.1:{port}"
    proc.stop(timeout=30)


@pytest.fixture
def user() -> str:
    """A fresh WeCom user id, so that tests never see each other's messages or limits."""
    return "u" + secrets.token_hex(5)
