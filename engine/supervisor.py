"""Runs vLLM as a child process and turns what it only logs into Prometheus series.

vLLM logs EPLB balancedness (`EPLB step: N for model M: avg_tokens=…, balancedness=…`) but
exports no metric for it; the supervisor reads vLLM's output line by line, passes it
through unchanged, and keeps `botgw_eplb_*` gauges current on its own metrics port.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable

from engine.observability import export_eplb, parse_eplb_line


def pump_lines(stream: object, on_line: Callable[[str], None], out: object = sys.stdout) -> None:
    """Copy `stream` to `out` line by line, calling on_line for each."""
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        line = raw.decode("utf-8", errors="replace")
        out.write(line)  # type: ignore[attr-defined]
        out.flush()  # type: ignore[attr-defined]
        on_line(line)


def watch_line(line: str) -> None:
    stats = parse_eplb_line(line)
    if stats is not None:
        export_eplb(stats)


def supervise(argv: list[str], env: dict[str, str], metrics_port: int | None) -> int:
    """Start vLLM, forward SIGTERM/SIGINT to it, export its EPLB lines; return its exit code."""
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    assert child.stdout is not None
    pump_lines(child.stdout, watch_line)
    return child.wait()
