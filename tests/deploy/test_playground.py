"""The playground (scripts/run_local.sh, `make run` / `make stop` / `make clean`).

First, what the script does before and around its processes, fast (no engine; Redis played by a stand-in that
exits): a pid file that no longer names a process of ours is never signalled (a stale one used to make `make stop`
TERM, then KILL, whatever process group the pid named after a reboot, and `make run` skip that component); a group
that outlives SIGKILL ends `stop` with one line, exit 1; a bad config or a Redis password redis.conf cannot hold is
one line and exit 2 before anything is made; each start has a log folder of its own, the newest 10 kept;
`make clean` removes PLAYGROUND_RUN_DIR.

Then the playground across a restart: `make run`'s script, a 微信客服 customer answered, `make stop`, the script again,
the customer answered again, with the platform never refusing the cursor botgw kept in Redis.

It used to go quiet after the restart: Redis kept the gateway's kf/sync_msg cursor in `.run/`, the simulator started
empty and refused it. Slow (the engine is loaded twice), so one test; its logs are under the artifacts folder,
so the secrets check, which runs after everything else, reads them too. It runs scripts/run_local.sh on free
ports in a run folder of its own, with deploy/local.yaml moved to those ports, so it never meets a developer's
playground or the suite's processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import yaml

from testkit.processes import BOTGW, ROOT, child_env, free_port
from tests.conftest import ARTIFACTS

PORTS = ("REDIS", "ENGINE", "GATEWAY", "ADMIN", "SIM", "WEB", "MCP")
LOCAL_PORTS = {"REDIS": 6390, "ENGINE": 8000, "GATEWAY": 8080, "ADMIN": 8081, "SIM": 8090, "WEB": 8100, "MCP": 8095}
START_TIMEOUT_S = 1200  # the first start may build the tiny model; then the engine loads (a minute or two here)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


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


def script(command: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/run_local.sh", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_script(command: str, env: dict[str, str], timeout: float) -> str:
    done = script(command, env, timeout)
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


def start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat, as run_local.sh reads it."""
    return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split())[19]


def recorded_pid(path: Path) -> int:
    """The pid of a pid file ("PID START BOOT")."""
    return int(path.read_text().split()[0])


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen[bytes]]:
    """A process group that is not the playground's: what a stale pid file may name after a reboot (`setsid sleep`)."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait(10)


def quick_env(folder: Path, **extra: str) -> dict[str, str]:
    """run_local.sh on a run folder of the test's, with a config on free ports (nothing of it is started)."""
    ports = {name: free_port() for name in PORTS}
    env = child_env({f"PLAYGROUND_{name}_PORT": str(port) for name, port in ports.items()})
    env.update(PLAYGROUND_RUN_DIR=str(folder / "run"), BOTGW_CONFIG=str(playground_config(folder, ports)), **extra)
    return env


def fake_redis(folder: Path) -> str:
    """A PATH whose redis-server exits at once: start gets as far as starting Redis, then stops there (exit 1)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "redis-server").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "redis-server").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def log_folders(run: Path) -> list[str]:
    return sorted(path.name for path in (run / "logs").iterdir() if path.is_dir() and not path.is_symlink())


def test_stop_never_signals_a_process_group_a_stale_pid_file_names(
    tmp_path: Path, unrelated: subprocess.Popen[bytes]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    pid = unrelated.pid
    (run / "worker.pid").write_text(f"{pid}\n")  # the format of before: a bare pid, nothing to check it by
    (run / "gateway.pid").write_text(f"{pid} {start_time(pid)} 00000000-0000-0000-0000-000000000000\n")  # a reboot
    (run / "web.pid").write_text(f"{pid} 1 {BOOT_ID}\n")  # this boot, but the pid now names another process
    done = script("stop", child_env({"PLAYGROUND_RUN_DIR": str(run)}))
    assert done.returncode == 0, done.stderr
    assert unrelated.poll() is None and group_alive(pid), "stop signalled a process group that is not ours"
    assert sorted(done.stdout.splitlines()) == sorted([
        *(f"  {name}: {run}/{name}.pid names pid {pid}, which is not ours any more (a reboot or a reused pid): "
          "not signalled; file removed" for name in ("web", "gateway", "worker")),
        "botgw: stopped",
    ])  # fmt: skip
    assert list(run.glob("*.pid")) == []
    # What makes a group ours is a file that names it with its start time in this boot (the last test's stop ends
    # such groups).
    (run / "worker.pid").write_text(f"{pid} {start_time(pid)} {BOOT_ID}\n")
    assert script("status", child_env({"PLAYGROUND_RUN_DIR": str(run)})).stdout == f"worker: up (pid {pid})\n"


def test_start_starts_its_own_over_a_stale_pid_file_and_keeps_a_log_folder_per_start(
    tmp_path: Path, unrelated: subprocess.Popen[bytes]
) -> None:
    env = quick_env(tmp_path, PATH=fake_redis(tmp_path))
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    for index in range(12):  # older starts' logs
        (run / "logs" / f"20000101-0000{index:02d}").mkdir()
    (run / "redis.pid").write_text(f"{unrelated.pid} 1 {BOOT_ID}\n")
    made = []
    for _ in range(2):  # within the same second, as likely as not
        done = script("start", env)
        assert done.returncode == 1 and "botgw: redis did not start" in done.stderr, done.stdout + done.stderr
        assert "already running" not in done.stdout
        started = recorded_pid(run / "redis.pid")
        assert f"  redis started (pid {started})" in done.stdout and started != unrelated.pid
        made.append((run / "logs" / "latest").resolve().name)
    assert unrelated.poll() is None, "start signalled the process the stale pid file named"
    assert made[0] != made[1], "two starts shared a log folder"
    assert log_folders(run) == sorted([*(f"20000101-0000{index:02d}" for index in range(4, 12)), *made])


def test_a_group_that_outlives_sigkill_ends_stop_with_one_line_and_exit_1(tmp_path: Path) -> None:
    """A zombie leader (its parent never reaps it) reads as a live group for ever: stop used to wait for ever."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time\npid = os.fork()\nif pid == 0:\n    os.setsid(); os._exit(0)\n"
         "print(pid, flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        run = tmp_path / "run"
        run.mkdir()
        (run / "worker.pid").write_text(f"{zombie} {start_time(zombie)} {BOOT_ID}\n")
        env = child_env({"PLAYGROUND_RUN_DIR": str(run), "PLAYGROUND_STOP_WAIT_S": "1", "PLAYGROUND_KILL_WAIT_S": "1"})
        done = script("stop", env)
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"botgw: worker (process group {zombie}) did not end 1 s after SIGKILL (a zombie, or stuck in the kernel: "
            f"see ps -o pid,stat,wchan,cmd -g {zombie}); {run}/worker.pid kept"
        ]
        assert "botgw: stopped" not in done.stdout, "Redis and the rest are left to what may still use them"
    finally:
        parent.kill()
        parent.wait(10)


def test_a_bad_config_is_one_line_and_exit_2_before_anything_is_made(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("engine: {max_token: 1}\n", encoding="utf-8")
    run = tmp_path / "run"
    done = script("start", child_env({"PLAYGROUND_RUN_DIR": str(run), "BOTGW_CONFIG": str(config)}))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        "botgw: configuration error: invalid configuration: engine.max_token: unknown key; did you mean max_tokens?"
    ]
    assert done.stdout == "" and not run.exists(), "no run folder, no log folder"


@pytest.mark.parametrize("password", ['Sekr3t"x', "Sekr3t%22x", "Sekr3t%5Cx", "Sekr3t%0Abind%200.0.0.0", "Sekr3t%20x"])
def test_a_redis_password_redis_conf_cannot_hold_is_refused(tmp_path: Path, password: str) -> None:
    env = quick_env(tmp_path)
    config = Path(env["BOTGW_CONFIG"])
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["redis_url"] = data["redis_url"].replace(urlsplit(data["redis_url"]).netloc.split("@")[0], f":{password}")
    config.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    done = script("start", env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"botgw: {config}'s redis_url password has characters the playground's redis.conf cannot hold; use only "
        "letters, digits and . _ ~ - (e.g. openssl rand -hex 24)"
    )
    assert "Sekr3t" not in done.stdout + done.stderr, "the password is never shown"
    assert not (tmp_path / "run" / "redis.conf").exists() and not (tmp_path / "run" / "logs").exists()


def test_make_clean_removes_the_run_folder_it_is_given(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "logs" / "20000101-000000").mkdir(parents=True)
    before = (ROOT / ".run").exists()
    done = subprocess.run(["make", "-s", "clean"], cwd=ROOT, env=child_env({"PLAYGROUND_RUN_DIR": str(run)}),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not run.exists()
    assert (ROOT / ".run").exists() == before, "make clean touched ./.run rather than PLAYGROUND_RUN_DIR"


def check_console(config: Path, console: str) -> None:
    """The playground's operator console: the admin token signs in, and 企业微信登录 reaches the simulator's login
    page (run_local.sh made the console's callback a 可信域名 of the demo app)."""
    token = yaml.safe_load(config.read_text(encoding="utf-8"))["admin"]["token"]
    with httpx.Client(timeout=10) as client:
        signed = client.post(f"{console}/login", data={"token": token, "next": "/console/"})
        assert signed.status_code == 303 and "botgw_console" in signed.cookies
        overview = client.get(f"{console}/", headers={"Accept": "text/html"})
        assert overview.status_code == 200 and "概览" in overview.text
        away = client.get(f"{console}/login/wecom")
        assert away.status_code == 303
        login_page = client.get(away.headers["location"])
        assert login_page.status_code == 200 and "id='userid'" in login_page.text, login_page.text[:500]


def test_the_playground_answers_on_wecom_kf_again_after_make_stop_and_make_run(
    unrelated: subprocess.Popen[bytes],
) -> None:
    folder = ARTIFACTS / "playground"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ports = {name: free_port() for name in PORTS}
    config = playground_config(folder, ports)
    run = folder / "run"
    env = child_env({f"PLAYGROUND_{name}_PORT": str(port) for name, port in ports.items()})
    env.update(PLAYGROUND_RUN_DIR=str(run), BOTGW_CONFIG=str(config))
    gateway, simulator = f"http://127.0.0.1:{ports['GATEWAY']}", f"http://127.0.0.1:{ports['SIM']}"
    run.mkdir()
    (run / "worker.pid").write_text(f"{unrelated.pid}\n")  # left from before a reboot: names someone else's group
    try:
        run_script("start", env, START_TIMEOUT_S)
        assert recorded_pid(run / "worker.pid") != unrelated.pid, "the worker was not started"
        ask_kefu(config, gateway, "wmbefore", "你们几点上班？")
        check_console(config, f"http://127.0.0.1:{ports['ADMIN']}/console")
        first_logs = (run / "logs" / "latest").resolve()
        pids = {path.stem: recorded_pid(path) for path in run.glob("*.pid")}
        assert set(pids) == {"redis", "engine", "simulator", "gateway", "worker", "dingtalk-stream", "web",
                             "tools-demo"}

        stopped = run_script("stop", env, 300)
        assert stopped.rstrip().endswith("botgw: stopped")
        assert [name for name, pid in pids.items() if group_alive(pid)] == [], "a process outlived `stop`"
        assert unrelated.poll() is None, "stop signalled the group the stale pid file named"
        assert list((run / "appendonlydir").iterdir()), "Redis keeps its data (and the cursor) in the run folder"

        run_script("start", env, START_TIMEOUT_S)  # within the same second or not, a log folder of its own
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
