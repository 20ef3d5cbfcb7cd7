"""Session fixtures: a real redis-server, a real vLLM CPU engine serving the tiny ERNIE-4.5 MoE,
the platform simulator, a gateway and a worker, all separate processes talking HTTP; and `cluster`,
gateways and workers of their own namespace with a stub engine (testkit/fakes/stub_engine.py).

The engine takes a minute or two to load on a CPU. When a collected test needs it, it is started as
the session's stack comes up, so that the tests that do not need it run while it loads; `live_engine`
waits for it. The same goes for the group-robot burst, which WeCom's 20-a-minute pacing makes take a
minute of wall time (and next to no CPU): it is queued at the start and checked when its test runs.

Logs go to test-artifacts/logs, or to $BOTGW_TEST_ARTIFACTS/logs (so that two runs in one tree do
not wipe each other's logs); under pytest-xdist (`make test` runs two processes) to logs/gw0 and logs/gw1, the
whole logs folder emptied once by the controlling process before they start."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from gateway.state.keys import Keys
from testkit.configs import stack_config, write_config
from testkit.processes import ROOT, Proc, free_port, wait_for, wait_http
from testkit.redis_servers import SentinelSetup, start_redis, start_redis_cluster, start_sentinel
from testkit.services import engine_args, start_gateway, start_simulator, start_worker
from testkit.stacks import Cluster, Stack

ARTIFACTS = Path(os.environ.get("BOTGW_TEST_ARTIFACTS") or ROOT / "test-artifacts")


@pytest.fixture(scope="session")
def log_dir() -> Path:
    """One folder per pytest-xdist process (`make test` runs two), so that one never wipes the other's logs."""
    path = ARTIFACTS / "logs" / os.environ.get("PYTEST_XDIST_WORKER", "")
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
    proc = Proc(engine_args(port), log_dir / "engine.log")
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
    made.stop()


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
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # the controller of a pytest-xdist run: each process empties only its own logs/gwN, so an earlier run's
        # logs would stay for the secrets check to read (or to be all it reads)
        shutil.rmtree(ARTIFACTS / "logs", ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that judge the whole run (the logs of every process) go last; the rest keep their order."""
    items.sort(key=lambda item: item.get_closest_marker("after_everything") is not None)


from tests.kf_env import kf  # noqa: E402, F401  (a 微信客服 stack: a fixture for test_kf.py and test_kf_faults.py)
