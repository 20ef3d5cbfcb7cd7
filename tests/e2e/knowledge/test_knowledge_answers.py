"""Answers grounded in the knowledge base, through the real worker: the passage reaches the engine's prompt,
the source reaches the user, and a question the documents do not cover gets `no_answer_text` (flagged).

The engine is a stub that records its prompts (what is checked is what botgw sent it), and once the real vLLM
CPU engine behind a recording proxy; the store and the embedder are the real embedded ones, filled by
`botgw kb add` as an operator would."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.state.keys import Keys
from knowledge.config import DEFAULT_NO_ANSWER
from testkit.configs import ENGINE_MODEL, stack_config, write_config
from testkit.fakes.holding_proxy import HoldingProxy
from testkit.processes import BOTGW, ROOT, Proc, child_env, free_port, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import Cluster, Stack, start_stub_engine, stub_requests
from tests.browser import test_web
from tests.browser.test_web import send, sign_in
from tests.conftest import ARTIFACTS

browser = test_web.browser  # the fixture: Debian's Chromium under Playwright

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


WEB_KEY = "kb-web-" + secrets.token_hex(4)
WEB_PASSWORD = "correct horse battery staple"


@dataclass
class _Page:
    page_url: str


SHOWN = """() => {
    const step = [...document.querySelectorAll('[data-step-type=assistant_message]')].pop();
    const sources = step.querySelector('.inline-text');
    const answer = [...step.querySelectorAll('[role=article]')].find(a => !a.closest('.inline-text'));
    const below = !!(sources && answer) && sources.getBoundingClientRect().top >= answer.getBoundingClientRect().bottom;
    return {answer: answer ? answer.innerText.trim() : '', sources: sources ? sources.innerText : '', below};
}"""


def test_a_web_page_answer_shows_its_sources_under_it(
    stack: Stack, log_dir: Path, tmp_path: Path, browser: object
) -> None:
    """Through the page in Chromium: a grounded answer shows 来源：《…》 and the section in its own element under
    the answer (not inside the answer's text), and the engine's prompt held the passage; a question the
    documents do not cover gets no_answer_text, no sources, and the record's no_answer flag."""
    engine, engine_url = start_stub_engine(log_dir, 0.1, f"stub-kbweb-{secrets.token_hex(3)}", chunk_delay_s=0.05)
    namespace = "kw" + secrets.token_hex(4)
    gateway_port, web_port = free_port(), free_port()
    web_bot = {"id": "web", "platform": "web", "api_key": WEB_KEY, "gateway_url": f"http://127.0.0.1:{gateway_port}",
               "users": [{"name": "alice", "password": WEB_PASSWORD}], "knowledge": {"bases": ["support"]}}
    config = stack_config(stack.config["redis_url"], engine_url, stack.sim_url, namespace, bots=[web_bot],
                          knowledge={"store": {"path": str(tmp_path / "store"), "idle_release_s": 0.5}})
    path = write_config(log_dir / f"{namespace}.yaml", config)
    added = kb(path, "add", "support", str(KB_DOCS / "售后服务政策.md"), str(KB_DOCS / "常见问题.csv"))
    assert added.returncode == 0, added.stderr
    procs = [engine, start_gateway(path, gateway_port, log_dir, f"gw-{namespace}"),
             start_worker(path, log_dir, namespace)]
    procs.append(Proc([*BOTGW, "web", "--config", str(path), "--port", str(web_port), "--app-root",
                       str(tmp_path / "chainlit")], log_dir / f"web-{namespace}.log"))
    try:
        wait_http(f"http://127.0.0.1:{web_port}/", 120, procs[-1])
        page = sign_in(browser, _Page(f"http://127.0.0.1:{web_port}"), "alice", WEB_PASSWORD)
        page.wait_for_selector("text=Engine ready", timeout=30000)

        send(page, "东西买回来不想要了，几天内还能退？")
        shown = page.evaluate(SHOWN)
        assert shown["answer"].startswith("answer to: 东西买回来不想要了") and "来源" not in shown["answer"], shown
        assert shown["sources"].count("来源：") == 1, shown
        assert "来源：《售后服务政策.md》退货与换货 › 七天无理由退货" in shown["sources"], shown
        assert shown["below"], "the sources are not under the answer"
        prompt = next(r for r in stub_requests(engine_url) if "还能退" in r["user"])
        assert "不影响二次销售" in prompt["system"], "the answer-bearing passage is not in the engine's prompt"
        page.screenshot(path=str(ARTIFACTS / "web-kb-sources.png"), full_page=True)

        send(page, "火星上的天气怎么样？")
        shown = page.evaluate(SHOWN)
        assert shown["answer"] == DEFAULT_NO_ANSWER and shown["sources"] == "", shown
        assert not any("火星" in r["user"] for r in stub_requests(engine_url)), "the engine was asked anyway"
        records = [stack.redis.hgetall(key) for key in stack.redis.scan_iter(Keys(namespace).reply("*"))]
        flagged = [r for r in records if r.get(b"no_answer") == b"1"]
        assert len(flagged) == 1 and json.loads(flagged[0][b"knowledge"])["no_answer"] is True
    finally:
        for proc in procs:
            proc.stop()


def test_a_grounded_answer_through_the_real_vllm_engine(
    stack: Stack, live_engine: str, cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """The same path with the real vLLM CPU engine (the tiny ERNIE-4.5 MoE) behind a proxy that records what it
    was sent: the passage is in the prompt vLLM received, and the reply the user reads ends with the source."""
    with HoldingProxy(live_engine) as proxy:
        proxy.release.set()
        app = {**next(bot for bot in stack.config["bots"] if bot["id"] == "app"), "knowledge": {"bases": ["support"]}}
        c = cluster(
            delay_s=0.1,
            knowledge={"store": {"path": str(tmp_path / "store"), "idle_release_s": 0.5}},
            bots=[app],
            engine={"base_url": proxy.url, "model": ENGINE_MODEL},
        )
        added = kb(c.path, "add", "support", str(KB_DOCS / "售后服务政策.md"), str(KB_DOCS / "常见问题.csv"))
        assert added.returncode == 0, added.stderr
        c.add_gateway()
        c.add_worker(f"{c.namespace}-real")
        user = "u" + secrets.token_hex(4)
        c.stack.post_callback(c.stack.signer().text(user, "东西买回来不想要了，几天内还能退？"))
        reply = "".join(item["content"] for item in c.stack.wait_delivered(user, 1, timeout=180, settle=2.0))
        asked = [b for b in proxy.chat_bodies if any("还能退" in str(m.get("content")) for m in b["messages"])]
        assert asked, "the question never reached vLLM"
        system = next(m["content"] for m in asked[-1]["messages"] if m["role"] == "system")
        assert "不影响二次销售" in system, "the answer-bearing passage is not in the prompt vLLM received"
        assert "来源：《售后服务政策.md》" in reply, reply
