"""Session fixtures: a real redis-server, a real vLLM CPU engine serving the tiny ERNIE-4.5 MoE,
the platform simulator, a gateway and a worker, all separate processes talking HTTP; and `cluster`,
gateways and workers of their own namespace with a stub engine (tests/stub_engine.py).

The engine takes a minute or two to load on a CPU. When a collected test needs it, it is started as
the session's stack comes up, so that the tests that do not need it run while it loads; `live_engine`
waits for it. The same goes for the group-robot burst, which WeCom's 20-a-minute pacing makes take a
minute of wall time (and next to no CPU): it is queued at the start and checked when its test runs.

Logs go to test-artifacts/logs, or to $BOTGW_TEST_ARTIFACTS/logs (so that two runs in one tree do
not wipe each other's logs)."""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from bots.wecom.config import WeComAppConfig
from gateway.state.keys import Keys
from simulator.replies import wecom_messages
from simulator.wecom_callback import SignedCallback, WeComCallbackSigner
from tests.procs import (
    BOTGW,
    ROOT,
    Proc,
    free_port,
    start_gateway,
    start_redis,
    start_simulator,
    start_worker,
    wait_for,
    wait_http,
    wait_replies,
    write_config,
)
from tests.redis_cluster import SentinelSetup, start_redis_cluster, start_sentinel, sync_client

ARTIFACTS = Path(os.environ.get("BOTGW_TEST_ARTIFACTS") or ROOT / "test-artifacts")
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
    try:
        proc, url = start_redis(log_dir, "redis")
    except RuntimeError as exc:
        pytest.fail(f"{exc} (`make test` installs it)")
    yield url
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
    engine_url: str = ""
    robot_burst_at: float = 0.0
    member_burst_at: float = 0.0
    member_burst_user: str = ""

    @property
    def keys(self) -> Keys:
        return Keys(self.namespace)

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
        return wait_replies(lambda http: wecom_messages(http, self.sim_url, user), count, timeout, settle, user)

    def texts(self, user: str) -> list[str]:
        """What `user` read, in order: the invisible marks that keep repeated pieces unique removed."""
        return [item["content"].replace("\u200b", "") for item in self.delivered(user)]

    def dead_letters(self) -> int:
        return int(self.redis.xlen(self.keys.dead_letters))

    def sim_stats(self) -> dict:
        return httpx.get(f"{self.sim_url}/__sim__/wecom/stats", timeout=5).json()

    def fault(self, **fault: object) -> None:
        httpx.post(f"{self.sim_url}/__sim__/wecom/faults", json=fault, timeout=5).raise_for_status()

    def entries_added(self) -> int:
        """Entries ever added to the work queue (the scheduler's counter): rises only on enqueue."""
        return int(self.redis.hget(self.keys.scheduler_stats, "enqueued") or 0)

    def queue_depth(self) -> int:
        """Entries enqueued and not yet handled."""
        stats = self.redis.hgetall(self.keys.scheduler_stats)
        return int(stats.get(b"enqueued", 0)) - int(stats.get(b"handled", 0))

    def leased(self) -> int:
        """Messages a worker holds a lease on right now."""
        return int(self.redis.zcard(self.keys.scheduler_leases))


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


def _wanted(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a collected test of this session uses `fixture`."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
def redis_cluster_url(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real three-master Redis Cluster on loopback (cluster mode, joined by `redis-cli --cluster create`)."""
    try:
        procs, url = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"), log_dir)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield url
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="session")
def redis_sentinel(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSetup]:
    """A real primary and replica watched by a real sentinel, which a test may make fail over."""
    try:
        setup = start_sentinel(tmp_path_factory.mktemp("redis-sentinel"), log_dir)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield setup
    for proc in setup.procs:
        proc.stop()


@pytest.fixture(scope="session")
def engine_proc(log_dir: Path) -> Iterator[tuple[Proc, int]]:
    """The vLLM engine process, started (not waited for) on first use."""
    port = free_port()
    proc = Proc([*BOTGW, "engine", "serve", "--profile", "tiny", "--port", str(port)], log_dir / "engine.log")
    yield proc, port
    proc.stop(timeout=30)


@pytest.fixture(scope="session")
def stack(redis_url: str, log_dir: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """Gateway + simulator + one worker. The engine is started now if any collected test needs it, and
    waited for only by `live_engine`: tests that do not need it run while it loads."""
    engine_port = free_port()
    if _wanted(request, "live_engine"):
        _, engine_port = request.getfixturevalue("engine_proc")
    sim_port, gw_port = free_port(), free_port()
    namespace = "t" + secrets.token_hex(4)
    sim_url = f"http://127.0.0.1:{sim_port}"
    config = stack_config(redis_url, f"http://127.0.0.1:{engine_port}", sim_url, namespace)
    path = write_config(log_dir / "stack.yaml", config)
    procs = {"simulator": start_simulator(path, sim_port, log_dir)}
    procs["gateway"] = start_gateway(path, gw_port, log_dir)
    procs["worker"] = start_worker(path, log_dir, "worker-1")
    client = redis.Redis.from_url(redis_url)
    made = Stack(config, path, f"http://127.0.0.1:{gw_port}", sim_url, client, namespace, log_dir, procs)
    made.engine_url = f"http://127.0.0.1:{engine_port}"
    if _wanted(request, "robot_burst"):
        start_robot_burst(made)
    if _wanted(request, "member_burst"):
        start_member_burst(made)
    yield made
    for proc in procs.values():
        proc.stop()


@pytest.fixture(scope="session")
def live_engine(stack: Stack, engine_proc: tuple[Proc, int]) -> str:
    """The engine at the address the stack's config names, once the stack's gateway and worker see it ready."""
    proc, port = engine_proc
    url = f"http://127.0.0.1:{port}"
    assert stack.engine_url == url
    wait_http(f"{url}/health", 600, proc)
    wait_http(f"{stack.admin_url}/readyz", 60)
    worker = stack.procs["worker"]
    wait_for(lambda: b'"engine ready"' in worker.log_path.read_bytes(), 60, "the stack's worker to see the engine")
    return url


ROBOT_BURST = 25


def start_robot_burst(stack: Stack) -> None:
    """Queue ROBOT_BURST pushes for the stack's group robot, alternately markdown and text."""
    from redis.asyncio import Redis

    from gateway.queue.push import enqueue_push
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys

    async def burst() -> None:
        client = Redis.from_url(stack.config["redis_url"])
        scheduler = Scheduler(client, Keys(stack.namespace))
        for i in range(ROBOT_BURST):
            await enqueue_push(scheduler, "robot", f"**alert {i}**", markdown=i % 2 == 0)
        await client.aclose()

    asyncio.run(burst())
    stack.robot_burst_at = time.time()


MEMBER_BURST = 35


def start_member_burst(stack: Stack) -> None:
    """Queue MEMBER_BURST answers (as notices: no engine) for one WeCom member: more than the 30 a minute WeCom
    lets an app send one member."""
    from redis.asyncio import Redis

    from bots.base import InboundMessage, ReplyTarget
    from gateway.queue.push import enqueue_notice
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys

    user = "burst" + secrets.token_hex(4)

    async def burst() -> None:
        client = Redis.from_url(stack.config["redis_url"])
        scheduler = Scheduler(client, Keys(stack.namespace))
        for i in range(MEMBER_BURST):
            message = InboundMessage(
                platform="wecom",
                bot_id="app",
                msg_id=f"burst-{user}-{i}",
                conversation_id=user,
                sender_id=user,
                text="",
                reply_to=ReplyTarget(user_id=user),
            )
            await enqueue_notice(scheduler, message, f"notice {i} of the burst", rid="test")
        await client.aclose()

    stack.member_burst_user = user
    asyncio.run(burst())
    stack.member_burst_at = time.time()


@pytest.fixture(scope="session")
def member_burst(stack: Stack) -> tuple[str, float]:
    """(the member, when the burst was queued): at the stack's start when a collected test asks for it."""
    if not stack.member_burst_at:
        start_member_burst(stack)
    return stack.member_burst_user, stack.member_burst_at


@pytest.fixture(scope="session")
def robot_burst(stack: Stack) -> float:
    """When the group-robot burst was queued (at the stack's start, when a collected test asks for it)."""
    if not stack.robot_burst_at:
        start_robot_burst(stack)
    return stack.robot_burst_at


@pytest.fixture
def user() -> str:
    """A fresh WeCom user id, so that tests never see each other's messages or limits."""
    return "u" + secrets.token_hex(5)


def start_stub_engine(log_dir: Path, delay_s: float, name: str, chunk_delay_s: float = 0.0) -> tuple[Proc, str]:
    """tests/stub_engine.py on a free port, once it answers /health."""
    port = free_port()
    args = [sys.executable, "-m", "tests.stub_engine", "--port", str(port), "--delay", str(delay_s)]
    proc = Proc([*args, "--chunk-delay", str(chunk_delay_s)], log_dir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 30, proc)
    return proc, url


def stub_requests(engine_url: str) -> list[dict]:
    """The chat requests a stub engine received, warm-ups left out."""
    return [r for r in httpx.get(f"{engine_url}/__stub__/requests", timeout=5).json() if not r["warmup"]]


class Cluster:
    """Gateways and workers of one namespace, on the shared Redis and simulator, with stub engines of their own.

    `engines` stub engines (1 by default) answer after `delay_s`; with more than one, the config lists them all
    as `engine.endpoints`. Overrides are merged into the config like `stack_config`'s."""

    def __init__(
        self,
        stack: Stack,
        delay_s: float,
        engines: int = 1,
        chunk_delay_s: float = 0.0,
        redis_url: str = "",
        **overrides: object,
    ) -> None:
        self.namespace = "w" + secrets.token_hex(4)
        self.log_dir = stack.log_dir
        self.engines: list[Proc] = []
        self.engine_urls: list[str] = []
        for i in range(engines):
            proc, url = start_stub_engine(stack.log_dir, delay_s, f"stub-{self.namespace}-{i}", chunk_delay_s)
            self.engines.append(proc)
            self.engine_urls.append(url)
        self.engine, self.engine_url = self.engines[0], self.engine_urls[0]
        if engines > 1:
            engine = {**dict(overrides.get("engine") or {}), "endpoints": self.engine_urls}  # type: ignore[arg-type]
            overrides = {**overrides, "engine": engine}
        redis_url = redis_url or stack.config["redis_url"]
        config = stack_config(redis_url, self.engine_url, stack.sim_url, self.namespace, **overrides)
        for bot in config["bots"]:  # the simulator knows the stack's apps: reuse their credentials
            if bot["platform"] != "wecom-webhook":  # a group robot's key of its own: its own 20 a minute
                bot.update(next(b for b in stack.config["bots"] if b["id"] == bot["id"]))
        self.config = config
        self.path = write_config(stack.log_dir / f"{self.namespace}.yaml", config)
        client = stack.redis if redis_url == stack.config["redis_url"] else sync_client(redis_url)
        self.stack = Stack(config, self.path, "", stack.sim_url, client, self.namespace, stack.log_dir)
        self.gateways: list[str] = []
        self.procs: dict[str, Proc] = {}

    def add_gateway(self) -> str:
        port = free_port()
        name = f"gw-{self.namespace}-{len(self.gateways)}"
        self.procs[name] = start_gateway(self.path, port, self.log_dir, name=name)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{self.procs[name].admin_url}/readyz", 30)
        self.gateways.append(url)
        if not self.stack.gateway_url:
            self.stack.gateway_url = url
            self.stack.procs["gateway"] = self.procs[name]
        return url

    def add_worker(self, name: str, path: Path | None = None) -> Proc:
        """A worker, once it has started and sees every engine ready (so that routing starts from a known state)."""
        proc = start_worker(path or self.path, self.log_dir, f"{self.namespace}-{name}")
        self.procs[name] = proc
        wait_for(
            lambda: proc.log_path.read_bytes().count(b'"engine ready"') >= len(self.engines),
            30,
            f"worker {name} to start and see its engines ready:\n{proc.tail()}",
        )
        wait_for(lambda: b"worker started" in proc.log_path.read_bytes(), 30, f"worker {name} to start")
        return proc

    def engine_requests(self, index: int | None = None) -> list[dict]:
        """Chat requests (warm-ups left out) that reached the stub engines, or the one at `index`."""
        urls = self.engine_urls if index is None else [self.engine_urls[index]]
        return [r for url in urls for r in stub_requests(url)]

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill(signal.SIGCONT)
            proc.stop()
        for engine in self.engines:
            engine.stop()


@pytest.fixture
def cluster(stack: Stack) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(delay_s: float = 0.5, **overrides: object) -> Cluster:
        made.append(Cluster(stack, delay_s, **overrides))
        return made[-1]

    yield make
    for item in made:
        item.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "after_everything: run after every other test of the session")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that judge the whole run (the logs of every process) go last; the rest keep their order."""
    items.sort(key=lambda item: item.get_closest_marker("after_everything") is not None)


from tests.kf_env import kf  # noqa: E402, F401  (a 微信客服 stack: a fixture for test_kf.py and test_kf_faults.py)
