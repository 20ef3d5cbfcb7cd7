"""Engine observability exported by botgw: per-endpoint load, EPLB balancedness, expert usage.

vLLM exports its own gauges per engine; the gateway re-exports them per endpoint so that
one Grafana board shows engines and gateway together. MoE facts vLLM does not export
(EPLB balancedness is only logged; routed experts come back in responses) are turned
into Prometheus series here.
"""

from __future__ import annotations

import base64
import io
import re
from collections import Counter as Tally
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

if TYPE_CHECKING:
    from engine.pool import Endpoint

ENGINE_UP = Gauge("botgw_engine_ready", "1 when the engine is up and warmed up", ["endpoint"])
ENGINE_RUNNING = Gauge("botgw_engine_requests_running", "vllm:num_requests_running per endpoint", ["endpoint"])
ENGINE_WAITING = Gauge("botgw_engine_requests_waiting", "vllm:num_requests_waiting per endpoint", ["endpoint"])
ENGINE_KV = Gauge("botgw_engine_kv_cache_usage", "vllm:kv_cache_usage_perc per endpoint (0-1)", ["endpoint"])
ENGINE_IN_FLIGHT = Gauge("botgw_engine_in_flight", "Requests this process has open on the endpoint", ["endpoint"])
KV_PRESSURE_WARNINGS = Counter(
    "botgw_engine_kv_pressure_warnings_total", "Times the KV cache stayed above the warning threshold", ["endpoint"]
)

EPLB_STEP = Gauge("botgw_eplb_step", "Last EPLB step logged by vLLM", ["model"])
EPLB_AVG_TOKENS = Gauge("botgw_eplb_avg_tokens", "Mean tokens per EP rank at the last EPLB log", ["model"])
EPLB_MAX_TOKENS = Gauge("botgw_eplb_max_tokens", "Max tokens on one EP rank at the last EPLB log", ["model"])
EPLB_BALANCEDNESS = Gauge("botgw_eplb_balancedness", "avg/max tokens per EP rank (1 = perfectly balanced)", ["model"])

EXPERT_TOKENS = Counter(
    "botgw_expert_tokens_total", "Tokens routed to each expert, from routed_experts", ["layer", "expert"]
)

_EPLB_LINE = re.compile(
    r"EPLB step: (?P<step>\d+) for model (?P<model>\S+): avg_tokens=(?P<avg>[\d.]+), "
    r"max_tokens=(?P<max>\d+), balancedness=(?P<bal>[\d.]+)"
)


def export_endpoint(endpoint: Endpoint) -> None:
    """Pool listener: mirror one endpoint's state into the gauges."""
    ENGINE_UP.labels(endpoint.name).set(1 if endpoint.status == "ready" else 0)
    ENGINE_RUNNING.labels(endpoint.name).set(endpoint.load.running)
    ENGINE_WAITING.labels(endpoint.name).set(endpoint.load.waiting)
    ENGINE_KV.labels(endpoint.name).set(endpoint.load.kv_cache_usage)
    ENGINE_IN_FLIGHT.labels(endpoint.name).set(endpoint.in_flight)


@dataclass(frozen=True)
class EplbStats:
    step: int
    model: str
    avg_tokens: float
    max_tokens: int
    balancedness: float


def parse_eplb_line(line: str) -> EplbStats | None:
    """vLLM's `EPLB step: N for model M: avg_tokens=…, max_tokens=…, balancedness=…` line, or None."""
    match = _EPLB_LINE.search(line)
    if not match:
        return None
    return EplbStats(
        int(match["step"]), match["model"], float(match["avg"]), int(match["max"]), float(match["bal"])
    )


def export_eplb(stats: EplbStats) -> None:
    EPLB_STEP.labels(stats.model).set(stats.step)
    EPLB_AVG_TOKENS.labels(stats.model).set(stats.avg_tokens)
    EPLB_MAX_TOKENS.labels(stats.model).set(stats.max_tokens)
    EPLB_BALANCEDNESS.labels(stats.model).set(stats.balancedness)


def expert_usage(routed_experts_b64: str) -> dict[tuple[int, int], int]:
    """Decode vLLM's routed_experts (base64 .npy, shape tokens × layers × top-k) into {(layer, expert): tokens}."""
    import numpy as np

    array = np.load(io.BytesIO(base64.b64decode(routed_experts_b64)), allow_pickle=False)
    if array.ndim != 3:
        raise ValueError(f"routed_experts must be 3-dimensional (tokens, layers, top_k), got shape {array.shape}")
    usage: Tally[tuple[int, int]] = Tally()
    for layer in range(array.shape[1]):
        experts, counts = np.unique(array[:, layer, :], return_counts=True)
        for expert, count in zip(experts.tolist(), counts.tolist(), strict=True):
            usage[(layer, int(expert))] += int(count)
    return dict(usage)


def export_expert_usage(usage: dict[tuple[int, int], int]) -> None:
    for (layer, expert), tokens in usage.items():
        EXPERT_TOKENS.labels(str(layer), str(expert)).inc(tokens)


def format_expert_trace(usage: dict[tuple[int, int], int], top: int = 3) -> str:
    """A short human-readable trace: the busiest experts of each layer."""
    layers: dict[int, list[tuple[int, int]]] = {}
    for (layer, expert), tokens in usage.items():
        layers.setdefault(layer, []).append((tokens, expert))
    parts = []
    for layer in sorted(layers):
        busiest = sorted(layers[layer], reverse=True)[:top]
        parts.append(f"L{layer}: " + ", ".join(f"e{expert}×{tokens}" for tokens, expert in busiest))
    return "[experts] " + "; ".join(parts)
