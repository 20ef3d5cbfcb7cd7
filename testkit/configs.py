"""botgw configurations for the tests and benchmarks: bots with fresh random credentials, the tests' stack, and a
configuration as production has it but with limits that never bite (the benchmarks').

Only the standard library at module level (see testkit/processes.py)."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path
from typing import Any

from testkit.processes import free_port

ENGINE_MODEL = "ernie-tiny"
SYSTEM_PROMPT = "You are a test assistant."


def random_aes_key() -> str:
    """A fresh WeCom EncodingAESKey (43 characters of base64): no run depends on a key in the repository."""
    return base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def wecom_app(bot_id: str, api_base: str) -> dict[str, Any]:
    """A WeCom self-built app with fresh random credentials; its API at `api_base` (the simulator, or nothing)."""
    return {
        "id": bot_id,
        "platform": "wecom",
        "corp_id": "ww" + secrets.token_hex(6),
        "agent_id": 1000002,
        "secret": secrets.token_urlsafe(24),
        "token": secrets.token_hex(8),
        "encoding_aes_key": random_aes_key(),
        "api_base": api_base,
    }


def dingtalk_robot(bot_id: str, mode: str, api_base: str) -> dict[str, Any]:
    """A DingTalk robot (`mode` http or stream) with fresh random credentials; both its APIs at `api_base`."""
    return {
        "id": bot_id,
        "platform": "dingtalk",
        "mode": mode,
        "app_key": "ding" + secrets.token_hex(6),
        "app_secret": secrets.token_urlsafe(24),
        "api_base": api_base,
        "oapi_base": api_base,
    }


def dingtalk_bot(bot_id: str, mode: str, sim_url: str) -> dict:
    """The tests' DingTalk robot: a Stream connection that notices a silent peer within a second or two."""
    return {**dingtalk_robot(bot_id, mode, sim_url), "stream_ping_interval_s": 1.0, "stream_ping_timeout_s": 1.0}


def stack_config(redis_url: str, engine_url: str, sim_url: str, namespace: str, **overrides: object) -> dict:
    """The tests' stack: one bot of each platform but the page, on the simulator at `sim_url`; `overrides` merged
    into the sections they name (replacing other keys)."""
    config = {
        "redis_url": redis_url,
        "namespace": namespace,
        "system_prompt": SYSTEM_PROMPT,
        "log_level": "INFO",
        "engine": {"base_url": engine_url, "model": ENGINE_MODEL, "max_tokens": 24, "temperature": 0.0},
        "memory": {"token_budget": 1024},
        "limits": {"per_user": "20/minute"},  # under WeCom's 30 sends a minute per member
        "worker": {"claim_idle_ms": 1500, "backoff_base_s": 0.2, "backoff_max_s": 2.0, "max_send_attempts": 5},
        "bots": [
            wecom_app("app", sim_url),
            {
                "id": "ai",
                "platform": "wecom-ai",
                "token": secrets.token_hex(8),
                "encoding_aes_key": random_aes_key(),
                "welcome_text": "welcome to the test bot",
                "api_base": sim_url,
            },
            {"id": "robot", "platform": "wecom-webhook", "key": secrets.token_hex(12), "api_base": sim_url},
            dingtalk_bot("ding-http", "http", sim_url),
            dingtalk_bot("ding-stream", "stream", sim_url),
            {**dingtalk_bot("ding-card", "http", sim_url), "ai_card": {"enabled": True, "updates_per_second": 3}},
        ],
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def botgw_config(
    redis_url: str, namespace: str, bots: list[dict[str, Any]], engine: dict[str, Any] | None = None, **settings: Any
) -> dict[str, Any]:
    """A botgw config as in production (WARNING logs) but for limits that never bite: the load is the point.

    Without `engine`, one at a port nobody listens on, for the benchmarks of intake alone (no worker runs).
    """
    return {
        "redis_url": redis_url,
        "namespace": namespace,
        "log_level": "WARNING",
        "engine": engine or {"base_url": f"http://127.0.0.1:{free_port()}", "model": "unused"},
        "limits": {"per_user": "1000000/minute", "http_per_source": "1000000/second"},
        "bots": bots,
        **settings,
    }


def write_config(path: Path, data: dict) -> Path:
    """`data` as YAML at `path` (kept with a run's logs, where a failed run's reason is).

    A config that names no knowledge store gets its own folder beside the file, not the user's default
    (~/.cache/botgw/knowledge): a test must not write there, and two test processes (`make test` runs two) would
    hold one embedded store between them."""
    import yaml  # not at module level: see the module docstring

    knowledge = data.get("knowledge", {})
    store = knowledge.get("store", {}) if isinstance(knowledge, dict) else None
    if isinstance(store, dict) and not {"path", "qdrant_url"} & store.keys():  # a broken one is left as written
        folder = path.resolve().parent / f"{path.stem}-kb"
        data = {**data, "knowledge": {**knowledge, "store": {**store, "path": str(folder)}}}
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path
