"""A page's stack for the attachment tests: a stub engine that sees images, a real gateway and worker on the
session's Redis, one web bot, and the page process (`botgw web`) when a browser needs it."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from gateway.state.keys import Keys
from testkit.configs import stack_config, write_config
from testkit.processes import BOTGW, Proc, free_port, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import start_stub_engine, stub_requests

PASSWORD = "attach-test-" + secrets.token_hex(4)
USERS = ("alice", "bob", "carol", "dave", "erin")


@dataclass
class PageStack:
    gateway: str
    engine: str
    key: str
    keys: Keys
    redis: redis.Redis
    log_dir: Path
    page: str = ""
    app_root: Path | None = None

    @property
    def api(self) -> str:
        return f"{self.gateway}/web/web"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def upload(self, user: str, name: str, data: bytes, mime: str, **params: str) -> httpx.Response:
        return httpx.post(f"{self.api}/uploads", content=data, params={"user": user, "name": name, **params},
                          headers={**self.auth, "Content-Type": mime}, timeout=30)

    def chat(self, user: str, text: str, attachments: list[dict] | None = None) -> httpx.Response:
        """One message through the page's API, read to its end (the events, or the refusal)."""
        body: dict = {"user": user, "text": text}
        if attachments is not None:
            body["attachments"] = attachments
        with httpx.stream("POST", f"{self.api}/chat", json=body, headers=self.auth, timeout=60) as response:
            response.read()
        return response

    def uploads_kept(self) -> int:
        return sum(1 for _ in self.redis.scan_iter(self.keys.web_upload("web", "*", "*")))

    def engine_requests(self) -> list[dict]:
        return stub_requests(self.engine)


@contextmanager
def page_stack(redis_url: str, log_dir: Path, *, page: bool = False, **bot: object) -> Iterator[PageStack]:
    """The stack, closed after; `bot` overrides the web bot's settings (max_media_bytes, uploads_per_user…)."""
    engine, engine_url = start_stub_engine(log_dir, 0.05, "attach-engine", chunk_delay_s=0.05)
    gateway_port = free_port()
    gateway = f"http://127.0.0.1:{gateway_port}"
    key = "attach-key-" + secrets.token_hex(8)
    web = {"id": "web", "platform": "web", "api_key": key, "gateway_url": gateway,
           "users": [{"name": name, "password": PASSWORD} for name in USERS], **bot}
    namespace = "a" + secrets.token_hex(4)
    config = stack_config(redis_url, engine_url, "http://127.0.0.1:9", namespace, bots=[web],
                          engine={"vision": True, "max_tokens": 64}, limits={"per_user": "100/minute"})
    path = write_config(log_dir / f"attach-{namespace}.yaml", config)
    procs = [engine, start_gateway(path, gateway_port, log_dir, f"gw-{namespace}"),
             start_worker(path, log_dir, f"worker-{namespace}")]
    made = PageStack(gateway, engine_url, key, Keys(namespace), redis.Redis.from_url(redis_url), log_dir)
    try:
        wait_http(f"{gateway}/healthz", 60, procs[1])
        if page:
            port = free_port()
            made.app_root = log_dir / f"attach-chainlit-{namespace}"
            procs.append(Proc([*BOTGW, "web", "--config", str(path), "--port", str(port),
                               "--app-root", str(made.app_root)], log_dir / f"attach-web-{namespace}.log"))
            wait_http(f"http://127.0.0.1:{port}/health", 120, procs[-1])
            made.page = f"http://127.0.0.1:{port}"
        yield made
    finally:
        for proc in procs:
            proc.stop()
        made.redis.close()
