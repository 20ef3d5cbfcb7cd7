"""botgw's own processes: their command lines (gateway, worker, simulator, engine), and for a test each started once
it answers."""

from __future__ import annotations

from pathlib import Path

from testkit.processes import BOTGW, Proc, free_port, wait_http


def gateway_args(config: Path, port: int) -> tuple[list[str], str]:
    """`botgw serve` on `port` with its admin listener (/readyz, /metrics) on a free port: (args, admin URL)."""
    admin_port = free_port()
    args = [*BOTGW, "serve", "--config", str(config), "--port", str(port), "--admin-port", str(admin_port)]
    return args, f"http://127.0.0.1:{admin_port}"


def worker_args(config: Path, name: str) -> list[str]:
    return [*BOTGW, "worker", "--config", str(config), "--name", name]


def simulator_args(config: Path, port: int, *extra: str) -> list[str]:
    return [*BOTGW, "sim", "serve", "--config", str(config), "--port", str(port), *extra]


def engine_args(port: int, profile: str = "tiny", *vllm_args: str) -> list[str]:
    """`botgw engine serve` (vLLM; the tiny model by default), extra flags passed on to vLLM. It takes a minute or
    two on a CPU to answer `/health`."""
    return [
        *BOTGW,
        "engine",
        "serve",
        "--profile",
        profile,
        "--port",
        str(port),
        *(["--", *vllm_args] if vllm_args else []),
    ]


def start_gateway(config: Path, port: int, log_dir: Path, name: str = "gateway") -> Proc:
    """A gateway on `port`, with its admin listener (/readyz, /metrics) on a free port: `proc.admin_url`."""
    args, admin_url = gateway_args(config, port)
    proc = Proc(args, log_dir / f"{name}.log")
    proc.admin_url = admin_url
    wait_http(f"http://127.0.0.1:{port}/healthz", 30, proc)
    return proc


def start_worker(config: Path, log_dir: Path, name: str) -> Proc:
    return Proc(worker_args(config, name), log_dir / f"{name}.log")


def start_simulator(config: Path, port: int, log_dir: Path) -> Proc:
    proc = Proc(simulator_args(config, port, "--stream-keepalive-s", "1"), log_dir / "simulator.log")
    wait_http(f"http://127.0.0.1:{port}/__sim__/healthz", 30, proc)
    return proc
