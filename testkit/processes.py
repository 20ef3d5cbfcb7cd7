"""Child processes for the tests and benchmarks: where the repository is, how botgw is run, the environment a child
gets, a free port, a child in its own session with its output in a log file, and waiting for one to come up.

Only the standard library at module level: bench/ingest.py's bare server imports bench/common.py, which imports this
module, and should carry nothing it does not need."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOTGW = [sys.executable, "-m", "gateway.cli"]

# Where the engine and its model live: machine facts, not configuration, so children keep them.
MACHINE_VARS = frozenset({"BOTGW_ENGINE_VENV", "BOTGW_ENGINE_PYTHON", "BOTGW_TINY_MODEL_DIR", "BOTGW_VLLM_PACKAGE"})


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without its BOTGW_* settings (a developer's BOTGW_REDIS_URL must not point a
    test's gateway at their Redis; the caller's shell would override the config file), but for MACHINE_VARS; plus
    `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTGW_") or k in MACHINE_VARS}
    return {**env, **(extra or {})}


def free_port() -> int:
    """A port free on 127.0.0.1 right now, for a server of this run (each run gets its own, so runs never clash)."""
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
    import httpx

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
