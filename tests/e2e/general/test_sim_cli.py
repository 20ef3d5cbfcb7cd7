"""`botgw sim <platform> --bot ID` with a bot that is missing or of another platform: one line naming the bots of
that platform, exit 2, nothing posted anywhere and no traceback (it used to be an AttributeError from the wrong
signer). Run as real processes against a listener that records every request. And what `sim wecom-kf` reads from
the simulator while it waits: an answer it cannot use (a reset or older simulator's 404) is "not yet", never a crash."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from testkit.configs import random_aes_key, stack_config, write_config
from testkit.processes import BOTGW, ROOT, child_env


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def _record(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST = _record

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def listener() -> Iterator[str]:
    """Stands for the gateway and the simulator at once: whatever the command would post lands here."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def config(listener: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = stack_config("redis://127.0.0.1:9/0", "http://127.0.0.1:9", listener, "simcli")
    data["bots"].append({
        "id": "kefu", "platform": "wecom-kf", "corp_id": data["bots"][0]["corp_id"], "secret": "kf-cli-secret-value",
        "token": "kfclitoken", "encoding_aes_key": random_aes_key(), "api_base": listener, "open_kfids": ["wkcli"],
    })  # fmt: skip
    return write_config(tmp_path_factory.mktemp("sim-cli") / "config.yaml", data)


WHO = {"wecom": ["--user", "u1"], "wecom-ai": ["--user", "u1"], "dingtalk": ["--user", "u1"]}
WHO["wecom-kf"] = ["--customer", "c1"]
CASES = [
    ("wecom", "ai", "is a wecom-ai bot; its wecom bots: app"),  # the reported crash
    ("wecom-ai", "app", "is a wecom bot; its wecom-ai bots: ai"),
    ("dingtalk", "kefu", "is a wecom-kf bot; its dingtalk bots: ding-http, ding-stream, ding-card"),
    ("wecom-kf", "robot", "is a wecom-webhook bot; its wecom-kf bots: kefu"),
    ("wecom", "nosuch", "is not in the configuration; its wecom bots: app"),
]


@pytest.mark.parametrize(("platform", "bot", "said"), CASES)
def test_a_bot_of_another_platform_is_one_line_and_exit_2_before_anything_is_posted(
    platform: str, bot: str, said: str, config: Path, listener: str
) -> None:
    _Recorder.seen.clear()
    places = ["--gateway", listener] + (["--simulator", listener] if platform in ("wecom-ai", "dingtalk") else [])
    argv = [*BOTGW, "sim", platform, "--config", str(config), "--bot", bot, *WHO[platform], *places, "--timeout", "5"]
    if platform == "wecom-ai":
        argv.remove("--timeout"), argv.remove("5")  # wecom-ai has no --timeout
    done = subprocess.run([*argv, "你好"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=child_env())
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"botgw sim {platform}: bot {bot!r} {said}"]
    assert done.stdout == ""
    assert _Recorder.seen == [], "something was posted before the bot was checked"


def test_a_simulator_that_cannot_say_reads_as_not_yet_never_as_a_crash() -> None:
    """`sim wecom-kf` asks the simulator whether botgw pulled the customer's message and what the session's state is.
    A simulator reset since (the message gone from its log) or an older one (no such route) answers 404 with another
    body: that used to be a KeyError (exit 1); it is "not yet" / "unknown", and the command waits out --timeout."""
    from gateway.cli.sim import kf_pulled, kf_state

    answers = {
        "/__sim__/kf/pulled": [httpx.Response(404, json={"error": "no log item 'm1'"}),
                               httpx.Response(404, json={"detail": "Not Found"}), httpx.Response(404, text="gone"),
                               httpx.Response(200, json={"pulled": True})],
        "/__sim__/kf/session": [httpx.Response(404, json={"detail": "Not Found"}), httpx.Response(502, text="<html>"),
                                httpx.Response(200, json={"service_state": 3})],
    }  # fmt: skip

    def simulator(request: httpx.Request) -> httpx.Response:
        return answers[request.url.path].pop(0)

    with httpx.Client(transport=httpx.MockTransport(simulator)) as http:
        assert [kf_pulled(http, "http://sim", ["m1"]) for _ in range(4)] == [False, False, False, True]
        assert kf_pulled(http, "http://sim", []) is False
        assert [kf_state(http, "http://sim", "wk1", "c1") for _ in range(3)] == [None, None, 3]
