"""Real processes for the tests: redis-server, vLLM, the gateway, workers, the simulator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import redis
import yaml

from simulator.replies import wait_until_quiet

ROOT = Path(__file__).resolve().parent.parent
BOTGW = [sys.executable, "-m", "gateway.cli"]


# Where the engine and its model live: machine facts, not configuration, so children keep them.
INHERITED_BOTGW_VARS = {"BOTGW_ENGINE_VENV", "BOTGW_ENGINE_PYTHON", "BOTGW_TINY_MODEL_DIR", "BOTGW_VLLM_PACKAGE"}


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without its BOTGW_* settings (a developer's BOTGW_REDIS_URL must not point a
    test's gateway at their Redis), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTGW_") or k in INHERITED_BOTGW_VARS}
    return {**env, **(extra or {})}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    """A child process in its own session, with its output in a log file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.admin_url = ""  # a gateway's admin listener, set by start_gateway
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=child_env(env),
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (vLLM has children)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 20.0) -> None:
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.popen.wait(5)
        self._log.close()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_http(url: str, timeout: float, proc: Proc | None = None, expect: int = 200) -> None:
    """Wait until `url` answers `expect`; fail early with the log if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.popen.returncode}:\n{proc.tail()}")
        try:
            if httpx.get(url, timeout=2.0).status_code == expect:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} not up after {timeout}s\n{proc.tail() if proc else ''}")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait until `predicate()` is true; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def start_gateway(config: Path, port: int, log_dir: Path, name: str = "gateway") -> Proc:
    """A gateway on `port`, with its admin listener (/readyz, /metrics) on a free port: `proc.admin_url`."""
    admin_port = free_port()
    args = [*BOTGW, "serve", "--config", str(config), "--port", str(port), "--admin-port", str(admin_port)]
    proc = Proc(args, log_dir / f"{name}.log")
    proc.admin_url = f"http://127.0.0.1:{admin_port}"
    wait_http(f"http://127.0.0.1:{port}/healthz", 30, proc)
    return proc


def start_worker(config: Path, log_dir: Path, name: str) -> Proc:
    return Proc([*BOTGW, "worker", "--config", str(config), "--name", name], log_dir / f"{name}.log")


def start_simulator(config: Path, port: int, log_dir: Path) -> Proc:
    args = [*BOTGW, "sim", "serve", "--config", str(config), "--port", str(port), "--stream-keepalive-s", "1"]
    proc = Proc(args, log_dir / "simulator.log")
    wait_http(f"http://127.0.0.1:{port}/__sim__/healthz", 30, proc)
    return proc


class Listener:
    """A plain HTTP server standing for an address inside the company's network: it records what reaches it."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"errcode": 0}')

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus exposition at `url` (/metrics): the sum over series whose labels include
    `labels` (0 when there is none)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        series, value = line.rsplit(" ", 1)
        if all(f'{key}="{wanted}"' in series for key, wanted in labels.items()):
            total += float(value)
    return total


def start_redis(log_dir: Path, name: str = "model-redis") -> tuple[Proc, str]:
    """A redis-server of our own on a free port (the tests' session fixture, bench/model_test.py)."""
    binary = shutil.which("redis-server")
    if not binary:
        raise RuntimeError("redis-server is not installed: run `make install`")
    port = free_port()
    proc = Proc([binary, "--port", str(port), "--save", "", "--appendonly", "no"], log_dir / f"{name}.log")
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{proc.tail()}") from None
            time.sleep(0.1)


def wait_replies(
    fetch: Callable[[httpx.AsyncClient], Awaitable[list[dict]]], count: int, timeout: float, settle: float, what: str
) -> list[dict]:
    """At least `count` replies, then `settle` quiet seconds to catch extras (simulator/replies.py's loop, for the
    tests' synchronous helpers); AssertionError naming `what` when fewer came within `timeout`."""

    async def wait() -> list[dict]:
        async with httpx.AsyncClient(timeout=5) as http:
            return await wait_until_quiet(lambda: fetch(http), timeout, quiet_s=settle, at_least=count)

    items = asyncio.run(wait())
    if len(items) < count:
        raise AssertionError(f"{what} got {len(items)} messages, expected {count}")
    return items
