"""The tools' audit trail as operators read it: `botgw tools audit` run as a process (a table, or JSON lines for
their scripts; --user in the forms `botgw limits` takes, --since as a duration) and `GET /admin/tools/audit` on a
running gateway, behind the admin token. Against the real Redis of the session."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from gateway.state.keys import Keys
from testkit.configs import wecom_app, write_config
from testkit.processes import BOTGW, ROOT, Proc, child_env, free_port
from testkit.services import start_gateway
from tools.audit import AuditRecord, ToolAudit, encode
from tools.config import ToolsSettings

ADMIN_TOKEN = "adm-" + secrets.token_hex(12)
NOWHERE = "http://127.0.0.1:9"  # no platform is called: the trail is only read


@dataclass
class Trail:
    config: Path
    corp: str
    gateway: Proc
    url: str

    @property
    def alice(self) -> str:
        return f"wecom:{self.corp}:alice"

    @property
    def bob(self) -> str:
        return f"wecom:{self.corp}:bob"


def _write_records(redis_url: str, keys: Keys, alice: str, bob: str) -> None:
    """Alice's call three hours ago (the stream id of then), then her confirmation asked, Bob's call, her
    confirmation given: what a worker writes, by the same ToolAudit."""

    async def write() -> None:
        redis = Redis.from_url(redis_url)
        audit = ToolAudit(redis, keys, ToolsSettings())
        then = time.time() - 3 * 3600
        early = AuditRecord(ts=then, bot="app", user=alice, tool="rooms.list", kind="call",
                            arguments={"day": "monday"}, outcome="ok", duration_ms=12)
        await redis.xadd(keys.tools_audit, encode(early), id=f"{int(then * 1000)}-0")
        booking = {"room": "A-301", "at": "15:00", "token": "tok-never-shown"}
        for user, kind, outcome in ((alice, "confirm_asked", ""), (bob, "call", "timeout"),
                                    (alice, "confirmed", "")):
            await audit.record(AuditRecord(ts=time.time(), bot="app", user=user, tool="rooms.book", kind=kind,
                                           arguments=booking, outcome=outcome, duration_ms=0))
        await redis.aclose()

    asyncio.run(write())


@pytest.fixture(scope="module")
def trail(redis_url: str, log_dir: Path) -> Iterator[Trail]:
    """A namespace with four records, a config naming it (one WeCom corporation, so `wecom:alice` is enough), and a
    gateway serving its admin API."""
    namespace = "ta" + secrets.token_hex(4)
    app = wecom_app("app", NOWHERE)
    config = {"redis_url": redis_url, "namespace": namespace, "admin": {"token": ADMIN_TOKEN},
              "engine": {"base_url": f"http://127.0.0.1:{free_port()}", "model": "unused"}, "bots": [app]}
    path = write_config(log_dir / f"{namespace}.yaml", config)
    corp = app["corp_id"]
    _write_records(redis_url, Keys(namespace), f"wecom:{corp}:alice", f"wecom:{corp}:bob")
    port = free_port()
    gateway = start_gateway(path, port, log_dir, name=f"gw-{namespace}")
    yield Trail(path, corp, gateway, f"http://127.0.0.1:{port}")
    gateway.stop()


def botgw_audit(trail: Trail, *args: str, tz: str = "UTC") -> subprocess.CompletedProcess[str]:
    command = [*BOTGW, "tools", "audit", "--config", str(trail.config), *args]
    return subprocess.run(command, cwd=ROOT, env=child_env({"TZ": tz}), capture_output=True, text=True, timeout=60,
                          check=False)


def json_lines(done: subprocess.CompletedProcess[str]) -> list[dict]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_json_lines_newest_last_with_secrets_masked(trail: Trail) -> None:
    records = json_lines(botgw_audit(trail, "--json"))
    assert [(r["user"], r["tool"], r["kind"], r["outcome"]) for r in records] == [
        (trail.alice, "rooms.list", "call", "ok"),
        (trail.alice, "rooms.book", "confirm_asked", ""),
        (trail.bob, "rooms.book", "call", "timeout"),
        (trail.alice, "rooms.book", "confirmed", ""),
    ]
    assert [r["ts"] for r in records] == sorted(r["ts"] for r in records)
    assert all(set(r) == {"ts", "bot", "user", "tool", "kind", "arguments", "outcome", "duration_ms"}
               for r in records)
    assert records[1]["arguments"] == {"room": "A-301", "at": "15:00", "token": "***"}


def test_user_in_the_short_or_the_full_form_and_since(trail: Trail) -> None:
    short = json_lines(botgw_audit(trail, "--user", "wecom:alice", "--json"))
    assert [r["kind"] for r in short] == ["call", "confirm_asked", "confirmed"]
    assert {r["user"] for r in short} == {trail.alice}
    recent = json_lines(botgw_audit(trail, "--user", trail.alice, "--since", "1h", "--json"))
    assert [r["kind"] for r in recent] == ["confirm_asked", "confirmed"]
    for since in ("4h", "240m", "14400"):
        assert len(json_lines(botgw_audit(trail, "--since", since, "--json"))) == 4, since
    assert [r["user"] for r in json_lines(botgw_audit(trail, "--since", "90s", "--json"))] == [
        trail.alice, trail.bob, trail.alice]
    assert [r["kind"] for r in json_lines(botgw_audit(trail, "--limit", "1", "--json"))] == ["confirmed"]


def test_a_table_in_local_time_and_a_line_when_there_is_nothing(trail: Trail) -> None:
    done = botgw_audit(trail, "--user", "wecom:bob", tz="Asia/Shanghai")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split() == ["time", "user", "tool", "kind", "outcome", "duration", "arguments"]
    at, user, tool, kind, outcome = row.split()[:5]
    assert (user, tool, kind, outcome) == (trail.bob, "rooms.book", "call", "timeout")
    shown = datetime.fromisoformat(at)
    assert shown.utcoffset() is not None and shown.utcoffset().total_seconds() == 8 * 3600, at
    assert abs(shown.timestamp() - time.time()) < 600 and '"token": "***"' in row

    nobody = botgw_audit(trail, "--user", "wecom:nobody")
    assert nobody.returncode == 0 and nobody.stdout.strip() == f"no tool audit records for wecom:{trail.corp}:nobody"


@pytest.mark.parametrize(("args", "said"), [
    (("--since", "2x"), "'2x' is not a duration: write 90s, 30m, 12h, 7d or bare seconds"),
    (("--since", "0"), "'0' is not a duration"),
    (("--user", "alice"), "'alice' names no platform: write <family>:<tenant>:<user>, here one of: wecom:"),
    (("--user", "dingtalk:alice"), "no bot of family 'dingtalk' is configured"),
    (("--limit", "10001"), "--limit 10001: at most 10000"),
])
def test_what_operators_mistype_is_one_line_and_exit_2(trail: Trail, args: tuple[str, ...], said: str) -> None:
    done = botgw_audit(trail, *args, "--json")
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("botgw tools audit: ") and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_admin_route_behind_its_token(trail: Trail) -> None:
    url = f"{trail.url}/admin/tools/audit"
    bearer = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    for base in (trail.url, trail.gateway.admin_url):
        assert httpx.get(f"{base}/admin/tools/audit", timeout=5).status_code == 401, base
    wrong = httpx.get(url, headers={"authorization": f"Bearer {ADMIN_TOKEN}x"}, timeout=5)
    assert wrong.status_code == 401 and "rooms" not in wrong.text

    everything = httpx.get(url, headers=bearer, timeout=5)
    assert everything.status_code == 200, everything.text
    cli = json_lines(botgw_audit(trail, "--json"))
    assert everything.json() == {"records": cli}, "the route and the command show the same records"

    def kinds(**params: str) -> list[str]:
        answer = httpx.get(url, params=params, headers=bearer, timeout=5)
        assert answer.status_code == 200, answer.text
        return [r["kind"] for r in answer.json()["records"]]

    assert kinds(user="wecom:alice", since="1h") == ["confirm_asked", "confirmed"]
    assert kinds(user=f"wecom:{trail.corp}:bob") == ["call"]
    assert kinds(limit="2") == ["call", "confirmed"]
    assert kinds(user="wecom:nobody") == []

    for params, said in (({"since": "soon"}, "90s, 30m, 12h, 7d"), ({"limit": "0"}, "from 1 to 10000"),
                         ({"limit": "10001"}, "from 1 to 10000"), ({"limit": "x"}, "from 1 to 10000"),
                         ({"user": "alice"}, "names no platform")):
        answer = httpx.get(url, params=params, headers=bearer, timeout=5)
        assert answer.status_code == 400 and said in answer.json()["message"], (params, answer.text)
