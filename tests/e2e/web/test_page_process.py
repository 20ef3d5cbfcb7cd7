"""`botgw web` checks and hands the page only its own bots: a configuration whose other bots name `${VAR}`s that
are set where the gateway and workers run, not where the page runs, starts the page, which serves."""

from __future__ import annotations

from pathlib import Path

import httpx

from bots.web.config import hash_password
from testkit.processes import BOTGW, Proc, child_env, free_port, wait_http
from tests.unit.test_page_settings import UNSET, page_config


def test_the_page_starts_without_the_other_bots_variables(tmp_path: Path) -> None:
    users = [{"name": "alice", "password_hash": hash_password("page-process-test")}]
    path = page_config(tmp_path / "botgw.yaml", users=users)
    port = free_port()
    env = child_env({"PAGE_TEST_API_KEY": "page-api-key", "HOME": str(tmp_path)})
    env.pop(UNSET, None)
    argv = [*BOTGW, "web", "--config", str(path), "--port", str(port), "--app-root", str(tmp_path / "root")]
    proc = Proc(argv, tmp_path / "web.log", env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/", 120, proc)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
        assert "configuration error" not in proc.tail()
    finally:
        proc.stop()
