"""Child processes for the tests and benchmarks: where the repository is, how botgw is run, the environment a child
gets, a free port, a child in its own session with its output in a log file, and waiting for one to come up.

Only the standard library at module level: bench/ingest.py's bare server imports bench/common.py, which imports this
module, and should carry nothing it does not need."""

from __future__ import annotations

import contextlib
import ctypes
import math
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


class Broken(RuntimeError):
    """Something failed that makes a run meaningless: a child that should be running has exited, too many errors."""


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


PR_SET_PDEATHSIG = 1
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:
    """The child gets SIGKILL when the thread that started it dies (a benchmark killed hard leaves no engine)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line after the command name (which may hold spaces and parentheses).

    Index 1 is the parent, 3 the session, 11 and 12 are utime and stime in clock ticks, 13 and 14 those of reaped
    children."""
    return stat[stat.rindex(")") + 2 :].split()


class Proc:
    """A child process in its own session (so that its whole tree is signalled and measured), its output in a log
    file. `env` is added to `child_env()` and kept with `args`, so that the same process can be started again;
    `cwd` is the tree it runs botgw from (`python -m gateway.cli` imports from there); `die_with_parent` for a
    benchmark's children (only from a thread that lives as long as they do)."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        name: str = "",
        cwd: Path = ROOT,
        die_with_parent: bool = False,
    ) -> None:
        self.args = args
        self.env = env
        self.name = name or log_path.stem
        self.admin_url = ""  # a gateway's admin listener, set by start_gateway
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=child_env(env),
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (vLLM has children)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def wait(self, timeout: float) -> None:
        """Wait for the exit (after a SIGTERM); SIGKILL the group if it takes longer, and its stragglers (vLLM's
        engine core) in any case."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._log.close()

    def stop(self, timeout: float = 20.0) -> None:
        self.kill(signal.SIGTERM)
        self.wait(timeout)

    def tail(self, lines: int = 40) -> str:
        """The end of the log, for error messages: why did it not start, why did it die."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """utime + stime of this process alone so far, from /proc (Linux); nan once it is gone."""
        try:
            fields = stat_fields(Path(f"/proc/{self.pid}/stat").read_text())
        except OSError:
            return math.nan
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


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
