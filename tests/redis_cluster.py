"""A real Redis Cluster on loopback for the tests: three masters in cluster mode, joined with
`redis-cli --cluster create`, and a synchronous client for either kind of `redis_url`."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.procs import Proc, free_port


def sync_client(url: str) -> redis.Redis:
    """The tests' own (synchronous) client for a botgw `redis_url`, cluster or not."""
    if url.startswith("redis+cluster://"):
        seeds = url.removeprefix("redis+cluster://").split("/")[0].split(",")
        host, _, port = seeds[0].rpartition(":")
        return redis.RedisCluster(host=host, port=int(port))  # type: ignore[return-value]
    return redis.Redis.from_url(url)


def start_redis_cluster(workdir: Path, log_dir: Path, masters: int = 3) -> tuple[list[Proc], str]:
    """Start `masters` cluster-mode redis-servers (AOF everysec, noeviction, as botgw asks) and join them;
    returns the processes and the `redis+cluster://` URL naming every node."""
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not binary or not cli:
        raise RuntimeError("redis-server and redis-cli are not installed: run `make test`, which installs them")
    procs, ports = [], [free_port() for _ in range(masters)]
    for port in ports:
        node_dir = workdir / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir)]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"]
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction"]
        procs.append(Proc(args, log_dir / f"redis-cluster-{port}.log"))
    for port in ports:
        _wait(lambda p=port: redis.Redis(port=p).ping(), f"cluster node {port} to start")
    nodes = [f"127.0.0.1:{port}" for port in ports]
    created = subprocess.run(
        [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if created.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
    for port in ports:
        _wait(lambda p=port: redis.Redis(port=p).cluster("info")["cluster_state"] == "ok", f"node {port} to join")
    return procs, "redis+cluster://" + ",".join(nodes)


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
