"""Every `botgw` command ends a failure in one line (what, where, what to do) with an exit code that means
something: 2 usage or configuration, 3 a dependency down or refusing. Never a traceback, never a Python
exception line, never a password: tried with a bad argument, a Redis that is not there and a wrong password."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

from gateway.cli import build_parser, main
from testkit.configs import write_config
from testkit.processes import ROOT, child_env, free_port

PASSWORD = "right-pw-cli-errors"
WRONG = "wrong-pw-cli-errors"
AES = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR"
BOTS = [
    {"id": "app", "platform": "wecom", "corp_id": "ww1", "agent_id": 1000002, "secret": "app-secret-cli",
     "token": "tok", "encoding_aes_key": AES, "api_base": "http://127.0.0.1:9"},
    {"id": "robot", "platform": "wecom-webhook", "key": "robot-key-cli", "api_base": "http://127.0.0.1:9"},
    {"id": "kefu", "platform": "wecom-kf", "corp_id": "ww1", "secret": "kefu-secret-cli", "token": "kftok",
     "encoding_aes_key": AES, "open_kfids": ["wk1"], "api_base": "http://127.0.0.1:9"},
    {"id": "ding", "platform": "dingtalk", "mode": "http", "app_key": "dk", "app_secret": "ding-secret-cli",
     "api_base": "http://127.0.0.1:9", "oapi_base": "http://127.0.0.1:9"},
    {"id": "ding-stream", "platform": "dingtalk", "mode": "stream", "app_key": "dks",
     "app_secret": "ding-stream-secret-cli", "api_base": "http://127.0.0.1:9", "oapi_base": "http://127.0.0.1:9"},
]  # fmt: skip

# Each command and the rest of a call that would be valid, with {config} where the configuration goes.
CALLS: dict[str, list[str]] = {
    "serve": ["--config", "{config}", "--port", "0", "--admin-port", "0"],
    "worker": ["--config", "{config}"],
    "web": ["--config", "{config}", "--bot", "web"],
    "web-password": [],
    "dingtalk-stream": ["--config", "{config}"],
    "push": ["--config", "{config}", "--bot", "robot", "hello"],
    "kf handoff": ["--config", "{config}", "--bot", "kefu", "--customer", "wmcarol"],
    "limits show": ["--config", "{config}", "wecom:ww1:alice"],
    "limits reset": ["--config", "{config}", "wecom:ww1:alice"],
    "migrate-keys": ["--config", "{config}"],
    "dlq list": ["--config", "{config}"],
    "dlq show": ["--config", "{config}", "1712345678901-0"],
    "dlq replay": ["--config", "{config}", "1712345678901-0"],
    "dlq purge": ["--config", "{config}", "--all"],
    "tools audit": ["--config", "{config}"],
    "config check": ["--config", "{config}"],
    "kb add": ["--config", "{config}", "support", "README.md"],
    "kb list": ["--config", "{config}"],
    "kb remove": ["--config", "{config}", "support", "README.md"],
    "kb search": ["--config", "{config}", "support", "退货"],
    "engine serve": ["--profile", "tiny"],
    "engine plan": ["--profile", "tiny"],
    "sim serve": ["--config", "{config}", "--port", "0"],
    "sim wecom": ["--config", "{config}", "--bot", "app", "--user", "alice", "hi"],
    "sim dingtalk": ["--config", "{config}", "--bot", "ding", "--user", "bob", "hi"],
    "sim wecom-kf": ["--config", "{config}", "--bot", "kefu", "--customer", "wmcarol", "hi"],
    "sim wecom-ai": ["--config", "{config}", "--bot", "ai", "--user", "alice", "hi"],
}
# What uses Redis at once (the three long-running ones are tried in subprocesses: they would wait 30 s for a
# Redis that is not there, so they are tried with the wrong password only).
REDIS_COMMANDS = ["push", "limits show", "limits reset", "migrate-keys", "dlq list", "dlq show", "dlq replay",
                  "dlq purge", "tools audit"]  # fmt: skip
PROCESSES = ["serve", "worker", "dingtalk-stream"]
PYTHON_EXCEPTION_LINE = re.compile(r"^\s*[\w.]+(Error|Exception|Interrupt|Exit)\b(:|$)", re.MULTILINE)


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*prefix, name))
            return
    yield " ".join(prefix)


def test_every_command_is_tried_here() -> None:
    assert sorted(_leaves(build_parser())) == sorted(CALLS), "a command was added or removed: try its failures here"


def _clean(text: str, *secrets: str) -> None:
    assert "Traceback" not in text, text
    assert not PYTHON_EXCEPTION_LINE.search(text), f"a Python exception line:\n{text}"
    for secret in (PASSWORD, WRONG, *secrets):
        assert secret not in text, f"{secret!r} shown:\n{text}"


def _run(capfd: pytest.CaptureFixture[str], command: str, config: Path | str, *extra: str) -> tuple[int, str]:
    argv = [*command.split(), *(word.format(config=config) for word in CALLS[command]), *extra]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capfd.readouterr()
    return code, out + err


def _config(tmp_path: Path, redis_url: str, **extra: object) -> Path:
    data = {"redis_url": redis_url, "bots": BOTS, "knowledge": {"store": {"path": str(tmp_path / "store")}}, **extra}
    return write_config(tmp_path / f"botgw-{time.monotonic_ns()}.yaml", data)


@pytest.mark.parametrize("command", sorted(CALLS))
def test_a_bad_argument_is_one_line_and_exit_2(
    command: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if "{config}" in CALLS[command]:
        code, text = _run(capfd, command, tmp_path / "missing.yaml")
        assert code == 2 and "missing.yaml does not exist" in text, text
    else:
        code, text = _run(capfd, command, "", "--no-such-flag")
        assert code == 2 and "unrecognized arguments: --no-such-flag" in text, text
    _clean(text)


def test_ids_and_bots_of_the_wrong_kind_are_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    for command in ("dlq show", "dlq replay", "dlq purge"):
        argv = [*command.split(), "--config", str(config), "nope"]
        with pytest.raises(SystemExit) as exited:
            main(argv)
        text = "".join(capfd.readouterr())
        assert exited.value.code == 2 and "'nope' is not a dead-letter id" in text, text
    code, text = _run(capfd, "push", config, "--bot", "app")
    assert code == 2 and "not a wecom-webhook group robot (group robots: robot)" in text, text
    code, text = _run(capfd, "push", config, "--bot", "nosuch")
    assert code == 2 and "no bot with id 'nosuch'" in text and "app, robot, kefu, ding, ding-stream" in text, text


@pytest.mark.parametrize("command", REDIS_COMMANDS)
def test_a_redis_that_is_not_there_is_one_line_with_its_address_and_exit_3(
    command: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    code, text = _run(capfd, command, _config(tmp_path, f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    assert code == 3, text
    assert f"Redis at 127.0.0.1:{port} did not answer (connection refused)" in text, text
    assert len(text.strip().splitlines()) == 1, text
    _clean(text)


@pytest.fixture(scope="module")
def guarded_redis() -> Iterator[int]:
    port = free_port()
    binary = shutil.which("redis-server") or "redis-server"
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--requirepass",
                               PASSWORD], stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(200):
            try:
                redis_py.Redis(port=port, password=PASSWORD).ping()
                break
            except redis_py.ConnectionError:
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.parametrize("command", REDIS_COMMANDS)
def test_a_wrong_redis_password_is_one_line_and_exit_3(
    command: str, guarded_redis: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, text = _run(capfd, command, _config(tmp_path, f"redis://:{WRONG}@127.0.0.1:{guarded_redis}/0"))
    assert code == 3 and f"Redis at 127.0.0.1:{guarded_redis} refused the credentials" in text, text
    _clean(text)


@pytest.mark.parametrize("command", PROCESSES)
def test_a_process_refused_by_redis_says_so_in_one_line(command: str, guarded_redis: int, tmp_path: Path) -> None:
    config = _config(tmp_path, f"redis://:{WRONG}@127.0.0.1:{guarded_redis}/0", log_level="WARNING")
    argv = [sys.executable, "-m", "gateway.cli", *command.split(),
            *(word.format(config=config) for word in CALLS[command])]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr[-2000:]
    assert f"Redis at 127.0.0.1:{guarded_redis} refused the credentials" in done.stderr.splitlines()[-1], done.stderr
    _clean(done.stdout + done.stderr)


def test_debug_adds_the_traceback(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    code, text = _run(capfd, "dlq list", config, "--debug")
    assert code == 3 and "Traceback" in text and "did not answer" in text, text


def test_a_knowledge_server_that_is_not_there_is_one_line_and_exit_3(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, "redis://127.0.0.1:6379/0",
                     knowledge={"store": {"qdrant_url": f"http://127.0.0.1:{free_port()}", "timeout_s": 2}})
    code, text = _run(capfd, "kb list", config)
    assert code == 3 and "127.0.0.1" in text, text
    _clean(text)


def test_an_engine_that_cannot_start_here_is_one_line_and_exit_3(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, text = _run(capfd, "engine serve", "", "--python", str(tmp_path / "no-python"), "--port", str(free_port()))
    assert code == 3 and "the engine's python" in text and "make install" in text, text
    assert len(text.strip().splitlines()) == 1, text
    _clean(text)
    code, text = _run(capfd, "engine plan", "")
    assert code == 0 and text.split("vllm serve ", 1)[1].startswith(str(Path.home())), text


def test_a_second_gateway_on_the_same_admin_port_is_told_about_admin_port(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        port = busy.getsockname()[1]
        config = _config(tmp_path, "redis://127.0.0.1:6379/0")
        code, text = _run(capfd, "serve", config, "--admin-port", str(port))  # the last one given counts
        assert code == 2, text
        assert f"cannot listen on 127.0.0.1:{port}" in text and "--admin-port PORT (or 0 for none)" in text, text
        _clean(text)
    finally:
        busy.close()


def test_a_reader_that_goes_away_is_no_error(capfd: pytest.CaptureFixture[str]) -> None:
    """`botgw sim … | head -c 100`: the pipe closes before the command has written all; Unix tools end quietly."""
    from gateway.cli import outcome

    def run(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    code, line, error = outcome(argparse.Namespace(run=run), "sim wecom")  # fd 1 is capfd's, restored after
    assert (code, line, error) == (141, "", None)


def test_dead_letter_ids_are_each_tried_and_any_failure_is_exit_1(
    guarded_redis: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`dlq replay A B C` stopped at the first id that named no letter, after acting on those before it, and said
    only that (found by a review): every id is tried, each result printed, exit 1 when one failed. A purge of no
    letter is exit 1 too, an empty push text exit 2."""
    import json as json_

    from bots.base import InboundMessage, ReplyTarget
    from gateway.queue.entry import QueueEntry
    from gateway.state.keys import Keys

    config = _config(tmp_path, f"redis://:{PASSWORD}@127.0.0.1:{guarded_redis}/0")
    client = redis_py.Redis(port=guarded_redis, password=PASSWORD)
    message = InboundMessage(platform="wecom", bot_id="app", msg_id="m-cli", conversation_id="zs", sender_id="zs",
                             text="hi", reply_to=ReplyTarget(user_id="zs"))  # fmt: skip
    letter = json_.dumps({"reason": "test", "entry": QueueEntry(owner="zs", message=message).wire()})
    good = client.xadd(Keys("botgw").dead_letters, {"entry": letter}).decode()
    code, text = _run(capfd, "dlq replay", config, good)  # the call's own id, which names nothing, comes first
    assert code == 1 and f'"{good}": "queued"' in text and '"1712345678901-0": "no such dead letter"' in text, text
    code, text = _run(capfd, "dlq replay", config, good)
    assert code == 1 and f'"{good}": "no such dead letter"' in text, text
    assert main(["dlq", "purge", "--config", str(config), "--all", good]) == 2
    assert "not both" in "".join(capfd.readouterr())
    assert main(["dlq", "purge", "--config", str(config), good]) == 1
    assert main(["push", "--config", str(config), "--bot", "robot", "   "]) == 2
    _clean("".join(capfd.readouterr()))


def test_a_cluster_that_is_not_there_is_exit_3(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The cluster client's errors are no RedisError: an unreachable Redis Cluster was "failed unexpectedly, report
    it", exit 1, and a worker started beside a cluster still coming up exited at once (found by a review)."""
    port = free_port()
    code, text = _run(capfd, "dlq list", _config(tmp_path, f"redis+cluster://:{PASSWORD}@127.0.0.1:{port}"))
    assert code == 3 and "did not answer" in text and "unexpectedly" not in text, text
    _clean(text)
