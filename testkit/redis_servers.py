"""Real Redis on loopback for the tests: a redis-server of a test's own, a Redis Cluster (three masters in cluster
mode, joined with `redis-cli --cluster create`), a primary with a replica watched by Sentinel, and a synchronous
client for every kind of `redis_url`."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis
import redis.sentinel

from testkit.processes import Proc, free_port


def redis_args(port: int, *extra: str) -> list[str]:
    """redis-server on 127.0.0.1:`port` without persistence (runs measure and test botgw, not the disk)."""
    binary = shutil.which("redis-server")
    if not binary:
        raise RuntimeError("redis-server is not installed: run `make install`")
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *extra]


def wait_redis(proc: Proc, port: int, timeout: float = 20) -> str:
    """Wait until the redis-server `proc` on `port` answers PING; its URL."""
    client = redis.Redis(port=port)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            if time.monotonic() > deadline or not proc.alive():
                raise RuntimeError(f"redis-server did not start:\n{proc.tail()}") from None
            time.sleep(0.1)
        finally:
            client.close()


def start_redis(log_dir: Path, name: str = "model-redis") -> tuple[Proc, str]:
    """A redis-server of our own on a free port (the tests' session fixture, bench/model_test.py)."""
    port = free_port()
    proc = Proc(redis_args(port), log_dir / f"{name}.log")
    return proc, wait_redis(proc, port)


def sync_client(url: str) -> redis.Redis:
    """The tests' own (synchronous) client for a botgw `redis_url`, cluster or not."""
    if url.startswith("redis+cluster://"):
        password = urlsplit(url).password
        seeds = url.removeprefix("redis+cluster://").split("/")[0].rpartition("@")[2].split(",")
        host, _, port = seeds[0].rpartition(":")
        return redis.RedisCluster(host=host, port=int(port), password=password)  # type: ignore[return-value]
    if url.startswith("redis+sentinel://"):
        hosts, service = url.removeprefix("redis+sentinel://").split("/")[:2]
        sentinels = [(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in hosts.split(",")]
        return redis.sentinel.Sentinel(sentinels).master_for(service)
    return redis.Redis.from_url(url)


@dataclass
class SentinelSetup:
    """A primary, its replica and one sentinel (quorum 1) that moves the primary role on a failover."""

    procs: list[Proc]
    url: str
    sentinel_port: int
    service: str = "botgw-primary"

    def primary_port(self) -> int:
        return int(redis.Redis(port=self.sentinel_port).sentinel_get_master_addr_by_name(self.service)[1])

    def fail_over(self, timeout: float = 30) -> int:
        """`SENTINEL FAILOVER`: the replica becomes the primary; returns its port once the old one follows it."""
        before = self.primary_port()
        redis.Redis(port=self.sentinel_port).execute_command("SENTINEL", "FAILOVER", self.service)
        _wait(lambda: self.primary_port() != before, "sentinel to promote the replica", timeout)
        after = self.primary_port()
        _wait(lambda: redis.Redis(port=after).info("replication")["role"] == "master", "the new primary", timeout)
        # Until the old primary has become a replica it still takes writes, which its resync then drops (Redis
        # replicates asynchronously): the failover is over when it follows the new one.
        _wait(lambda: redis.Redis(port=before).info("replication")["role"] == "slave", "the old primary to follow",
              timeout)  # fmt: skip
        return after


def start_sentinel(workdir: Path, log_dir: Path) -> SentinelSetup:
    binary = shutil.which("redis-server")
    if not binary:
        raise RuntimeError("redis-server is not installed: run `make test`, which installs it")
    primary, replica, sentinel = free_port(), free_port(), free_port()
    procs = []
    for port, extra in ((primary, []), (replica, ["--replicaof", "127.0.0.1", str(primary)])):
        node_dir = workdir / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir), "--appendonly", "yes"]
        procs.append(Proc([*args, *extra], log_dir / f"redis-sentinel-node-{port}.log"))
    for port in (primary, replica):
        _wait(lambda p=port: redis.Redis(port=p).ping(), f"redis {port} to start")
    _wait(lambda: redis.Redis(port=replica).info("replication")["master_link_status"] == "up", "the replica to sync")
    setup = SentinelSetup(procs, "", sentinel)
    conf = workdir / "sentinel.conf"
    conf.write_text(
        f"port {sentinel}\nbind 127.0.0.1\ndir {workdir}\n"
        f"sentinel monitor {setup.service} 127.0.0.1 {primary} 1\n"
        f"sentinel down-after-milliseconds {setup.service} 2000\nsentinel failover-timeout {setup.service} 10000\n"
    )
    procs.append(Proc([binary, str(conf), "--sentinel"], log_dir / "redis-sentinel.log"))
    _wait(lambda: setup.primary_port() == primary, "sentinel to watch the primary")
    setup.url = f"redis+sentinel://127.0.0.1:{sentinel}/{setup.service}/0"
    return setup


def start_redis_cluster(workdir: Path, log_dir: Path, masters: int = 3) -> tuple[list[Proc], str]:
    """Start `masters` cluster-mode redis-servers (AOF everysec, noeviction, as botgw asks; a password, as a
    production cluster has, which the secrets-in-logs check then looks for) and join them; returns the
    processes and the `redis+cluster://:password@…` URL naming every node."""
    password = "cluster-" + secrets.token_hex(8)
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not binary or not cli:
        raise RuntimeError("redis-server and redis-cli are not installed: run `make test`, which installs them")
    procs, ports = [], [free_port() for _ in range(masters)]
    for port in ports:
        node_dir = workdir / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir)]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"]
        # The bus port is port + 10000 unless named: a free port above 55535 would leave it nowhere to go.
        args += ["--cluster-port", str(free_port())]
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction"]
        args += ["--requirepass", password, "--masterauth", password]
        procs.append(Proc(args, log_dir / f"redis-cluster-{port}.log"))
    for port in ports:
        _wait(lambda p=port: redis.Redis(port=p, password=password).ping(), f"cluster node {port} to start")
    nodes = [f"127.0.0.1:{port}" for port in ports]
    create = [cli, "-a", password, "--no-auth-warning", "--cluster", "create", *nodes, "--cluster-replicas", "0"]
    created = subprocess.run([*create, "--cluster-yes"], capture_output=True, text=True, timeout=60)
    if created.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
    for port in ports:
        node = redis.Redis(port=port, password=password)
        _wait(lambda node=node: node.cluster("info")["cluster_state"] == "ok", f"node {port} to join")
    return procs, f"redis+cluster://:{password}@" + ",".join(nodes)


def _wait(check, what: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)
