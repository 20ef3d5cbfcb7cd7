"""botgw's own processes for a test, each once it answers: gateway, worker, simulator."""

from __future__ import annotations

from pathlib import Path

from testkit.processes import BOTGW, Proc, free_port, wait_http


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
