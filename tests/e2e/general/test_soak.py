"""The soak, short: bench/soak.py's `short` profile (64 messages over 42 s, every kind of fault once or twice).

Two gateways, three workers, redis-server with AOF, two tiny vLLM CPU engines, the simulator and a
`botgw dingtalk-stream` process, under WeCom app, WeCom AI bot, DingTalk HTTP and DingTalk Stream traffic with
platform retries, while workers are SIGKILLed and SIGTERMed mid-answer, a gateway is SIGKILLed, Redis and an engine
are restarted, WeCom and DingTalk answer 42001/45009/130101/5xx and slowly, and the Stream connection is dropped.
Every message must be accepted, and answered exactly once. The processes' logs stay in test-artifacts/logs/soak/.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench import soak
from bench.common import Stack


def test_short_soak_answers_every_message_once(log_dir: Path) -> None:
    args = soak.parse_args(["--profile", "short"])
    stack = Stack(log_dir / "soak")
    stack.log_dir.mkdir(parents=True, exist_ok=True)
    try:  # about 2.5 minutes on 2 cores, most of it the two engines starting; args.time_limit stops it regardless
        results = asyncio.run(asyncio.wait_for(soak.run_soak(args, stack), args.time_limit))
    finally:
        stack.stop()
    soak.report(args, results)  # the table and each failed message's story, shown by pytest on failure
    total = soak.totals(results)
    stories = [soak.describe(m) for m in results.messages if m.outcome != "once"]
    assert total.outcomes["twice"] == 0, f"answered twice: {stories}"
    assert total.outcomes["lost"] == 0, f"lost: {stories}"
    assert total.accepted == total.sent, f"not accepted: {stories}"
    assert not results.strangers, f"deliveries that are no message's answer: {results.strangers[:5]}"
    assert not [record for record in results.faults if record.failed], "a fault could not be carried out"
