"""A running botgw for the tests: `Stack`, its config, addresses and the clients to talk to it (the session's stack is
gateway + simulator + one worker, tests/conftest.py); `Cluster`, gateways and workers of a namespace of their own
on the same Redis and simulator, with stub engines (testkit/fakes/stub_engine.py) whose answers a test knows."""

from __future__ import annotations

import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from bots.wecom.config import WeComAppConfig
from gateway.state.keys import Keys
from simulator.replies import wecom_messages
from simulator.wecom.signer import SignedCallback, WeComCallbackSigner
from testkit.configs import stack_config, write_config
from testkit.probes import wait_replies
from testkit.processes import ROOT, Broken, Proc, free_port, wait_for, wait_http
from testkit.redis_servers import redis_args, sync_client, wait_redis
from testkit.services import engine_args, start_gateway, start_worker


@dataclass
class Stack:
    """A running botgw: its processes, config, addresses and clients for the tests to talk to it.

    A benchmark starts with `Stack(log_dir=...)` and fills it: `start` runs a child of the stack (from the tree at
    `root`, with `env` added to its environment: another revision's botgw, a counting hook), `stop` stops them
    all, `check_alive` fails once one has died; `procs` are what its CPU meters sample."""

    config: dict = field(default_factory=dict)
    config_path: Path = Path()
    gateway_url: str = ""
    sim_url: str = ""
    redis: redis.Redis = None  # type: ignore[assignment]  # set by every test's stack; a benchmark has its own
    namespace: str = ""
    log_dir: Path = Path()
    procs: dict[str, Proc] = field(default_factory=dict)
    engine_url: str = ""
    robot_burst_at: float = 0.0
    member_burst_at: float = 0.0
    member_burst_user: str = ""
    root: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)

    def start(
        self, name: str, args: list[str], env: dict[str, str] | None = None, cores: str = "", cwd: Path | None = None
    ) -> Proc:
        """Start `procs[name]`, its log `<log_dir>/<name>.log`, from `cwd` (default `root`), with `env` added to
        the stack's; with `cores`, pinned to them (`taskset -c`). It dies with this process."""
        pinned = ["taskset", "-c", cores] if cores else []
        extra = {**self.env, **(env or {})}
        log_path = self.log_dir / f"{name}.log"
        proc = Proc([*pinned, *args], log_path, extra, name=name, cwd=cwd or self.root, die_with_parent=True)
        self.procs[name] = proc
        return proc

    def start_redis(self, port: int, *extra: str) -> Proc:
        """`procs["redis"]`: redis-server on `port` without persistence (but for `extra`), once it answers."""
        proc = self.start("redis", redis_args(port, *extra), cwd=ROOT)
        wait_redis(proc, port)
        return proc

    def start_engine(self, port: int, name: str = "engine", cores: str = "", vllm_args: tuple[str, ...] = ()) -> Proc:
        """`procs[name]`: the tiny model on vLLM (this tree's launcher whatever `root` is: the same engine for every
        revision measured). Wait for `/health` yourself: a CPU engine takes a minute or two."""
        return self.start(name, engine_args(port, "tiny", *vllm_args), cores=cores, cwd=ROOT)

    def write_config(self, config: dict, name: str = "botgw.yaml") -> Path:
        """The stack's config, as YAML in the log directory (kept with the logs of a failed run)."""
        self.config, self.config_path = config, write_config(self.log_dir / name, config)
        return self.config_path

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to every child at once (the last started first), then SIGKILL what is still up after `timeout`."""
        procs = list(reversed(self.procs.values()))
        for proc in procs:
            proc.kill(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(max(0.5, deadline - time.monotonic()))

    def check_alive(self) -> None:
        """Raise Broken if a child has exited: numbers taken, or a test run, without it would mean nothing."""
        for name, proc in self.procs.items():
            if not proc.alive():
                raise Broken(f"{name} exited with {proc.popen.returncode}:\n{proc.tail()}")

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

    def sim_stats(self, touser: str = "") -> dict:
        """The WeCom simulator's counters; with `touser`, `send_calls_to` counts the sends to that member."""
        return httpx.get(f"{self.sim_url}/__sim__/wecom/stats", params={"touser": touser}, timeout=5).json()

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


def start_stub_engine(log_dir: Path, delay_s: float, name: str, chunk_delay_s: float = 0.0) -> tuple[Proc, str]:
    """testkit/fakes/stub_engine.py on a free port, once it answers /health."""
    port = free_port()
    args = [sys.executable, "-m", "testkit.fakes.stub_engine", "--port", str(port), "--delay", str(delay_s)]
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
