"""The operator console's test stack: a gateway (with its admin listener, where the console is), a worker and a
stub engine of their own namespace, beside the session's simulator and redis-server; and the browser steps every
console test takes (sign in with the token or through the simulator's WeCom/DingTalk login page, screenshots).

`console_stack(stack, roles=..., extra_bots=..., **overrides)` starts one; tests/browser/test_console_*.py use it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from testkit.configs import write_config
from testkit.processes import Proc, free_port, wait_for
from testkit.services import start_gateway, start_worker
from testkit.stacks import Stack, start_stub_engine

ADMIN_TOKEN = "console-admin-token-" + secrets.token_hex(12)


@dataclass
class ConsoleStack:
    """A gateway whose admin listener serves the console (`console_url`), with its worker and stub engine."""

    config: dict
    path: Path
    gateway_url: str
    admin_url: str
    sim_url: str
    engine_url: str
    namespace: str
    corp_id: str
    dingtalk_corp: str
    stack: Stack
    procs: list[Proc] = field(default_factory=list)
    token: str = ADMIN_TOKEN

    @property
    def console_url(self) -> str:
        return f"{self.admin_url}/console"

    def wecom_identity(self, userid: str) -> str:
        return f"wecom:{self.corp_id}:{userid}"

    def dingtalk_identity(self, userid: str) -> str:
        return f"dingtalk:{self.dingtalk_corp}:{userid}"

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The console (or /admin/…) as a script calls it: with the admin token as Bearer."""
        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        return httpx.request(method, f"{self.admin_url}{path}", headers=headers, timeout=30, **kwargs)

    def as_stack(self) -> Stack:
        """This console's gateway as a `Stack` (post_callback, wait_delivered, texts, dead_letters, fault, …): the
        session's simulator and Redis, this namespace."""
        return Stack(self.config, self.path, self.gateway_url, self.sim_url, self.stack.redis, self.namespace,
                     self.stack.log_dir)

    def gateway_log(self) -> str:
        return self.procs[1].log_path.read_text(encoding="utf-8", errors="replace")

    def sign_in_with_token(self, browser: object, lang: str = "zh") -> object:
        """A fresh browser context signed in with the admin token typed into the sign-in page."""
        context = browser.new_context(locale="zh-CN")  # type: ignore[attr-defined]
        page = context.new_page()
        if lang != "zh":
            page.goto(f"{self.console_url}/lang/{lang}?next=/console/login")
        page.goto(f"{self.console_url}/")
        page.wait_for_selector("#token", timeout=15000)
        page.fill("#token", self.token)
        page.click("#sign-in")
        page.wait_for_selector("#who", timeout=15000)
        return page

    def sign_in_with(self, browser: object, login: str, userid: str) -> object:
        """A fresh browser context signed in as `userid` through the simulator's WeCom or DingTalk login page
        (the console's `login-<wecom|dingtalk>` button). Returns the page where the console sent it."""
        context = browser.new_context(locale="zh-CN")  # type: ignore[attr-defined]
        page = context.new_page()
        page.goto(f"{self.console_url}/login")
        page.click(f"#login-{login}")
        page.wait_for_selector("#userid", timeout=15000)
        page.fill("#userid", userid)
        page.click("#member")
        page.wait_for_load_state("networkidle")
        return page


def screenshot(page: object, name: str) -> Path:
    """A full-page screenshot kept in the test artifacts (test-artifacts/console-<name>.png)."""
    from tests.conftest import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    return path


@contextmanager
def console_stack(stack: Stack, roles: dict[str, str] | None = None, extra_bots: list[dict] | None = None,
                  engine_url: str | None = None, **overrides: Any) -> Iterator[ConsoleStack]:
    """Start a console stack. `roles`: userid-keyed roles, written as `wecom:<userid>` / `dingtalk:<userid>` (the
    config qualifies them); `extra_bots` appended to the session stack's bots; `overrides` replace top-level keys
    of the configuration (a dict is merged into the section)."""
    procs: list[Proc] = []
    if engine_url is None:
        engine, engine_url = start_stub_engine(stack.log_dir, 0.05, "stub-console-" + secrets.token_hex(3))
        procs.append(engine)
    namespace = "c" + secrets.token_hex(4)
    dingtalk_corp = "dingcorp" + secrets.token_hex(4)
    bots = []
    for bot in [*stack.config["bots"], *(extra_bots or [])]:
        bot = {**bot, "corp_id": dingtalk_corp} if bot["id"] == "ding-http" else dict(bot)
        if bot["platform"] in ("wecom", "dingtalk"):
            bot["login_base"] = stack.sim_url
        bots.append(bot)
    config: dict[str, Any] = {
        **stack.config, "namespace": namespace, "bots": bots,
        "engine": {**stack.config["engine"], "base_url": engine_url},
        "admin": {"token": ADMIN_TOKEN},
        "console": {"roles": {_with_corp(who, dingtalk_corp): role for who, role in (roles or {}).items()},
                    "login": {"wecom": {"bot": "app"}, "dingtalk": {"bot": "ding-http"}}},
    }
    for key, value in overrides.items():
        merge = isinstance(value, dict) and isinstance(config.get(key), dict)
        config[key] = {**config[key], **value} if merge else value
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    try:
        port = free_port()
        gateway = start_gateway(path, port, stack.log_dir, f"gw-{namespace}")
        procs.append(gateway)
        worker = start_worker(path, stack.log_dir, f"{namespace}-worker")
        procs.append(worker)
        app = next(bot for bot in bots if bot["id"] == "app")
        ding = next(bot for bot in bots if bot["id"] == "ding-http")
        made = ConsoleStack(config, path, f"http://127.0.0.1:{port}",
                            gateway.admin_url, stack.sim_url, engine_url, namespace, app["corp_id"], dingtalk_corp,
                            stack, procs)  # fmt: skip
        # The platforms' consoles: the console's callback is a 可信域名 of the WeCom app, a 重定向URL of DingTalk's.
        for trust in ({"agentid": app["agent_id"], "redirect_uri": f"{made.console_url}/login/wecom/callback"},
                      {"client_id": ding["app_key"], "redirect_uri": f"{made.console_url}/login/dingtalk/callback"}):
            httpx.post(f"{stack.sim_url}/__sim__/login/trust", json=trust, timeout=5).raise_for_status()
        wait_for(lambda: b"worker started" in worker.log_path.read_bytes(), 60, "the console stack's worker")
        yield made
    finally:
        for proc in reversed(procs):
            proc.stop()


def _with_corp(who: str, dingtalk_corp: str) -> str:
    """`dingtalk:<userid>` with the stack's own DingTalk corporation (several DingTalk bots are configured)."""
    family, _, rest = who.partition(":")
    return f"dingtalk:{dingtalk_corp}:{rest}" if family == "dingtalk" and ":" not in rest else who
