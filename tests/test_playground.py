"""The playground across a restart: `make run`'s script, a 微信客服 customer answered, `make stop`, the script again,
the customer answered again, with the platform never refusing the cursor botgw kept in Redis.

It used to go quiet after the restart: Redis kept the gateway's kf/sync_msg cursor in `.run/`, the simulator started
empty and refused it. Slow (the engine is loaded twice), so one test, run after the rest of the suite (the marker
that also puts the secrets check last; this test's logs are under the artifacts folder, so that check reads them
too). It runs scripts/run_local.sh on free ports in a run folder of its own, with deploy/local.yaml moved to those
ports, so it never meets a developer's playground or the suite's processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import yaml

from tests.conftest import ARTIFACTS
from tests.procs import BOTGW, ROOT, child_env, free_port

PORTS = ("REDIS", "ENGINE", "GATEWAY", "ADMIN", "SIM", "WEB")
LOCAL_PORTS = {"REDIS": 6390, "ENGINE": 8000, "GATEWAY": 8080, "ADMIN": 8081, "SIM": 8090, "WEB": 8100}
START_TIMEOUT_S = 1200  # the first start may build the tiny model; then the engine loads (a minute or two here)


def playground_config(folder: Path, ports: dict[str, int]) -> Path:
    """deploy/local.yaml as it is, on this test's ports and with its knowledge store in this test's run folder."""
    text = (ROOT / "deploy/local.yaml").read_text(encoding="utf-8")
    for name, port in LOCAL_PORTS.items():
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{ports[name]}")
    config = yaml.safe_load(text)
    config["admin"]["port"] = ports["ADMIN"]
    config["knowledge"]["store"]["path"] = str(folder / "run" / "knowledge")
    path = folder / "local.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


def run_script(command: str, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        ["bash", "scripts/run_local.sh", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"run_local.sh {command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def ask_kefu(config: Path, gateway: str, customer: str, text: str) -> str:
    argv = [*BOTGW, "sim", "wecom-kf", "--config", str(config), "--bot", "kefu", "--customer", customer]
    done = subprocess.run(
        [*argv, "--gateway", gateway, "--timeout", "120", text],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, f"sim wecom-kf exited {done.returncode}: {done.stderr}"
    assert done.stdout.startswith("[send_msg] "), done.stdout
    return done.stdout


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.after_everything
def test_the_playground_answers_on_wecom_kf_again_after_make_stop_and_make_run() -> None:
    folder = ARTIFACTS / "playground"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ports = {name: free_port() for name in PORTS}
    config = playground_config(folder, ports)
    run = folder / "run"
    env = child_env({f"PLAYGROUND_{name}_PORT": str(port) for name, port in ports.items()})
    env.update(PLAYGROUND_RUN_DIR=str(run), BOTGW_CONFIG=str(config))
    gateway, simulator = f"http://127.0.0.1:{ports['GATEWAY']}", f"http://127.0.0.1:{ports['SIM']}"
    try:
        run_script("start", env, START_TIMEOUT_S)
        ask_kefu(config, gateway, "wmbefore", "你们几点上班？")
        first_logs = (run / "logs" / "latest").resolve()
        pids = {path.stem: int(path.read_text()) for path in run.glob("*.pid")}
        assert set(pids) == {"redis", "engine", "simulator", "gateway", "worker", "dingtalk-stream", "web"}

        stopped = run_script("stop", env, 300)
        assert stopped.rstrip().endswith("botgw: stopped")
        assert [name for name, pid in pids.items() if group_alive(pid)] == [], "a process outlived `stop`"
        assert list((run / "appendonlydir").iterdir()), "Redis keeps its data (and the cursor) in the run folder"

        time.sleep(1.1)  # a new second: the next start's log folder has a name of its own
        run_script("start", env, START_TIMEOUT_S)
        assert (run / "logs" / "latest").resolve() != first_logs and first_logs.is_dir(), "logs kept per start"
        ask_kefu(config, gateway, "wmbefore", "明天呢？")  # the customer of before the restart, and a new one
        ask_kefu(config, gateway, "wmafter", "你好")
        refusals = httpx.get(f"{simulator}/__sim__/kf/stats", timeout=5).json()["refusals"]
        assert "40058" not in refusals, f"the cursor kept in Redis was refused after the restart: {refusals}"

        password = urlsplit(yaml.safe_load(config.read_text(encoding="utf-8"))["redis_url"]).password
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=ports["REDIS"], socket_timeout=5).ping()
        bound = redis.Redis(port=ports["REDIS"], password=password, socket_timeout=5).config_get("bind")["bind"]
        assert bound == "127.0.0.1"
    finally:
        run_script("stop", env, 300)
