"""Answers grounded in the knowledge base, through the real worker: the passage reaches the engine's prompt,
the source reaches the user, and a question the documents do not cover gets `no_answer_text` (flagged).

The engine is a stub that records its prompts (what is checked is what botgw sent it); the store and the
embedder are the real embedded ones, filled by `botgw kb add` as an operator would."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path

from knowledge.config import DEFAULT_NO_ANSWER
from tests.conftest import Cluster, Stack, stub_requests
from tests.procs import BOTGW, ROOT, child_env

KB_DOCS = ROOT / "tests" / "fixtures" / "kb"


def kb(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BOTGW, "kb", *args, "--config", str(config)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_a_wecom_answer_is_grounded_and_cited_and_an_uncovered_question_gets_no_answer(
    stack: Stack, cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    app = {**next(bot for bot in stack.config["bots"] if bot["id"] == "app"), "knowledge": {"bases": ["support"]}}
    c = cluster(delay_s=0.1, knowledge={"store": {"path": str(store), "idle_release_s": 0.5}}, bots=[app])
    added = kb(c.path, "add", "support", str(KB_DOCS / "售后服务政策.md"), str(KB_DOCS / "常见问题.csv"))
    assert added.returncode == 0, added.stderr
    c.add_gateway()
    c.add_worker(f"{c.namespace}-w")
    user = "u" + secrets.token_hex(4)

    c.stack.post_callback(c.stack.signer().text(user, "东西买回来不想要了，几天内还能退？"))
    answer = c.stack.wait_delivered(user, 1)[0]["content"]
    prompt = next(r for r in stub_requests(c.engine_url) if "还能退" in r["user"])
    assert "不影响二次销售" in prompt["system"], "the answer-bearing passage is not in the engine's prompt"
    assert "来源：《售后服务政策.md》" in answer, answer

    c.stack.post_callback(c.stack.signer().text(user, "火星上的天气怎么样？"))
    uncovered = c.stack.wait_delivered(user, 2)[1]["content"]
    assert uncovered == DEFAULT_NO_ANSWER
    assert not any("火星" in r["user"] for r in stub_requests(c.engine_url)), "the engine was asked anyway"
    records = [c.stack.redis.hgetall(key) for key in c.stack.redis.scan_iter(c.stack.keys.reply("*"))]
    flagged = [r for r in records if r.get(b"no_answer") == b"1"]
    assert len(flagged) == 1 and json.loads(flagged[0][b"knowledge"])["no_answer"] is True
    used = [json.loads(r[b"knowledge"]) for r in records if r.get(b"knowledge") and not r.get(b"no_answer")]
    assert used and used[0]["passages"][0]["doc"] == "售后服务政策.md", "the record says which chunks were used"
