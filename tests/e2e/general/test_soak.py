"""The soak, short: bench/soak.py's `short` profile (64 messages over 42 s, every kind of fault once or twice).

Two gateways, three workers, redis-server with AOF, two tiny vLLM CPU engines, the simulator and a
`botgw dingtalk-stream` process, under WeCom app, WeCom AI bot, DingTalk HTTP and DingTalk Stream traffic with
platform retries, while workers are SIGKILLed and SIGTERMed mid-answer, a gateway is SIGKILLed, Redis and an engine
are restarted, WeCom and DingTalk answer 42001/45009/130101/5xx and slowly, and the Stream connection is dropped.
Every message must be accepted, and answered exactly once: the benchmark checks it (nothing answered twice or lost,
but for the one repeat the README allows: a DingTalk answer posted again after a worker SIGKILL between its post and
its sent-mark, at most one per kill; all accepted, no delivery that is nobody's answer, every fault carried out) and
exits 1 otherwise, its table and each failed message's story on stdout. Run as the benchmark runs (a process of its
own: the tests do not import bench/); the processes' logs stay in test-artifacts/logs/soak/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testkit.processes import ROOT, child_env

TIME_LIMIT_S = 240  # the short profile's own --time-limit; about 2.5 minutes on 2 cores, mostly the engines starting


def test_short_soak_answers_every_message_once(log_dir: Path) -> None:
    argv = [sys.executable, "bench/soak.py", "--profile", "short", "--log-dir", str(log_dir / "soak")]
    done = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=TIME_LIMIT_S + 60)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "-> OK" in done.stdout, done.stdout
