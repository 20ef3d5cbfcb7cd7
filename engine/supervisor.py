"""Runs vLLM as a child process, relays its output, and turns what it only logs into Prometheus series.

vLLM logs EPLB balancedness (`EPLB step: N for model M: avg_tokens=…, balancedness=…`) but
exports no metric for it; the supervisor reads vLLM's output line by line, keeps
`botgw_eplb_*` gauges current on its own metrics port, and passes the output on, less the
access-log lines of the probes (`GET /metrics`, `GET /health` answered 200: Prometheus and
the pool ask every few seconds, and they were most of engine.log). While the model loads it
also prints short `botgw: engine …` lines to stderr (the loading steps vLLM logs), which is
what `botgw engine serve` shows and scripts/run_local.sh picks out of engine.log.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import TextIO

from engine.observability import export_eplb, parse_eplb_line

# Uvicorn's access line, as vLLM's API server logs it: `INFO:     127.0.0.1:51234 - "GET /metrics HTTP/1.1" 200 OK`
# (possibly after vLLM's `(APIServer pid=N)` prefix). Only successful probes are dropped: a 503 from /health says
# something.
_PROBE_ACCESS = re.compile(r'"GET /(?:metrics|health)(?:\?[^" ]*)? HTTP/[\d.]+" 200\b')

# vLLM's loading steps, in the wording of vLLM 0.32's own log calls (vllm/v1/worker/*model_runner.py,
# model_executor/model_loader/, v1/engine/core.py, entrypoints/launchers/api_server/entry.py), and the short status
# each becomes.
_LOADING: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"Starting to load model (\S+?)(?:\.\.\.)?$"), lambda m: f"loading the model {m.group(1)}"),
    (re.compile(r"Loading (safetensors|pt|np_cache) checkpoint shards:\s*(\d+)% Completed \| (\d+)/(\d+)"),
     lambda m: f"loading weights: shard {m.group(3)}/{m.group(4)} ({m.group(2)}%)"),
    (re.compile(r"Loading weights took ([\d.]+) seconds"), lambda m: f"weights loaded in {m.group(1)} s"),
    (re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds"),
     lambda m: f"model loaded ({m.group(1)} GiB, {float(m.group(2)):.1f} s)"),
    (re.compile(r"Warming up model"), lambda m: "warming up"),
    (re.compile(r"Graph capturing finished in ([\d.]+) secs?"), lambda m: f"graphs captured in {m.group(1)} s"),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
     lambda m: f"initialised in {m.group(1)} s (KV cache, warm-up)"),
    (re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (\S+)"),
     lambda m: f"starting the API server on {m.group(1)}"),
    (re.compile(r"Application startup complete"), lambda m: "ready"),
)


def is_probe_access_line(line: str) -> bool:
    """A successful `GET /metrics` or `GET /health` access line: noise, dropped from the relayed output."""
    return _PROBE_ACCESS.search(line) is not None


def loading_status(line: str) -> str | None:
    """The short status a vLLM loading line stands for, or None. A progress bar rewritten with carriage returns
    counts by its last state."""
    text = line.rstrip("\r\n").rsplit("\r", 1)[-1]
    for pattern, status in _LOADING:
        match = pattern.search(text)
        if match:
            return status(match)
    return None


class Relay:
    """Relays vLLM's lines to `out` less the probes' access lines, and loading steps to `status` as `botgw: engine
    …` (each distinct step once: a progress bar repeats itself)."""

    def __init__(self, out: TextIO, status: TextIO) -> None:
        self.out, self.status = out, status
        self._last: str | None = None

    def __call__(self, line: str) -> None:
        if not is_probe_access_line(line):
            self.out.write(line)
            self.out.flush()
        step = loading_status(line)
        if step is not None and step != self._last:
            self._last = step
            self.status.write(f"botgw: engine {step}\n")
            self.status.flush()


def pump_lines(stream: object, on_line: Callable[[str], None]) -> None:
    """Decode `stream` line by line and hand each line to on_line."""
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        on_line(raw.decode("utf-8", errors="replace"))


def watch_line(line: str) -> None:
    stats = parse_eplb_line(line)
    if stats is not None:
        export_eplb(stats)


def supervise(argv: list[str], env: dict[str, str], metrics_port: int | None) -> int:
    """Start vLLM, forward SIGTERM/SIGINT to it, relay and watch its output; return its exit code."""
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    relay = Relay(sys.stdout, sys.stderr)

    def on_line(line: str) -> None:
        relay(line)
        watch_line(line)

    assert child.stdout is not None
    pump_lines(child.stdout, on_line)
    return child.wait()
