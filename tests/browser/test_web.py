"""The web chat page (Chainlit) in a real browser (Debian's Chromium driven by Playwright): sign-in,
a streamed answer through the real engine, presets reaching the engine, /reset, shared limits."""

from __future__ import annotations

import itertools
import json
import re
import secrets
import shutil
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from testkit.browser import CHROMIUM, chromium_browser
from testkit.configs import ENGINE_MODEL, SYSTEM_PROMPT, write_config
from testkit.fakes.holding_proxy import HoldingProxy
from testkit.processes import BOTGW, Proc, free_port, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import Stack
from tests.conftest import ARTIFACTS

WEB_KEY = "test-web-key-" + secrets.token_hex(4)
PASSWORD = "correct horse battery staple"


@dataclass
class WebStack:
    page_url: str
    api_url: str
    proxy: HoldingProxy
    stack: Stack


@pytest.fixture(scope="module")
def web(stack: Stack, live_engine: str) -> Iterator[WebStack]:
    if not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed: run `make test`, which installs it")
    with HoldingProxy(live_engine, chunk_delay_s=0.02) as proxy:
        proxy.release.set()
        namespace = "w" + secrets.token_hex(4)
        gateway_port, web_port = free_port(), free_port()
        bots = [
            *stack.config["bots"],
            {"id": "web", "platform": "web", "api_key": WEB_KEY, "gateway_url": f"http://127.0.0.1:{gateway_port}",
             "users": [{"name": "alice", "password": PASSWORD}, {"name": "bob", "password": PASSWORD}]},
        ]
        engine = {**stack.config["engine"], "base_url": proxy.url, "max_tokens": 96}
        config = {**stack.config, "namespace": namespace, "engine": engine, "bots": bots,
                  "limits": {"per_user": "6/minute"}}
        path = write_config(stack.log_dir / f"{namespace}.yaml", config)
        procs = [start_gateway(path, gateway_port, stack.log_dir, f"gw-{namespace}"),
                 start_worker(path, stack.log_dir, namespace)]
        app_root = stack.log_dir / "chainlit"
        procs.append(Proc([*BOTGW, "web", "--config", str(path), "--port", str(web_port), "--app-root", str(app_root)],
                          stack.log_dir / "web.log"))
        try:
            wait_http(f"http://127.0.0.1:{web_port}/", 120, procs[-1])
            web_stack = Stack(config, path, f"http://127.0.0.1:{gateway_port}", stack.sim_url, stack.redis,
                              namespace, stack.log_dir)
            yield WebStack(f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{gateway_port}/web/web", proxy,
                           web_stack)
        finally:
            for proc in procs:
                proc.stop()


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium_browser() as instance:
        yield instance


def sign_in(browser: object, web: WebStack, user: str, password: str) -> object:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(web.page_url, wait_until="networkidle")
    page.fill("input:not([type=password])", user)
    page.fill("input[type=password]", password)
    page.click("button:has-text('Sign In')")
    return page


def last_answer(page: object) -> str:
    return page.evaluate(  # type: ignore[attr-defined]
        """() => { const s = [...document.querySelectorAll('[data-step-type=assistant_message] .message-content')];
                   return s.length ? s[s.length - 1].innerText : ''; }"""
    )


def answers_count(page: object) -> int:
    return page.evaluate("() => document.querySelectorAll('[data-step-type=assistant_message]').length")  # type: ignore[attr-defined]


def send(page: object, text: str) -> tuple[list[str], float]:
    """Type a message, then watch the newest answer until it stops changing: (every state seen, time to first text)."""
    before = answers_count(page)
    page.click("#chat-input")  # type: ignore[attr-defined]
    page.keyboard.type(text)  # type: ignore[attr-defined]
    sent = time.monotonic()
    page.keyboard.press("Enter")  # type: ignore[attr-defined]
    states: list[str] = []
    first_text_s = 0.0
    quiet_since = time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        current = last_answer(page) if answers_count(page) > before else ""
        if current and (not states or current != states[-1]):
            states.append(current)
            first_text_s = first_text_s or time.monotonic() - sent
            quiet_since = time.monotonic()
        elif states and time.monotonic() - quiet_since > 2.5:
            break
        time.sleep(0.03)
    return states, first_text_s


def engine_ttft(engine_url: str, text: str) -> float:
    """Time to first token from vLLM directly, same prompt."""
    body = {"model": ENGINE_MODEL, "stream": True, "max_tokens": 96, "temperature": 0.1,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]}
    started = time.monotonic()
    with httpx.stream("POST", f"{engine_url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and '"content":"' in line.replace(" ", "") and '"content":""' not in line:
                return time.monotonic() - started
    return time.monotonic() - started


def test_wrong_password_gets_no_access(web: WebStack, browser: object) -> None:
    page = sign_in(browser, web, "alice", "not the password")
    page.wait_for_timeout(2500)
    assert page.query_selector("#chat-input") is None
    assert page.query_selector("input[type=password]") is not None


def visible_text(text: str) -> str:
    """What a reader sees: control characters dropped (one side keeps a NUL the other strips), and runs of
    U+FFFD and spaces counted as one."""
    text = "".join(char for char in text if char in "\n\t" or unicodedata.category(char) != "Cc")
    return re.sub(r"[\ufffd\s]+", " ", text).strip()


def test_chat_page_streams_presets_reset_and_screenshot(web: WebStack, browser: object, live_engine: str) -> None:
    page = sign_in(browser, web, "alice", PASSWORD)
    page.wait_for_selector("text=Engine ready", timeout=30000)

    text = "Tell me about the sea"
    states, first_text_s = send(page, text)
    assert len(states) >= 3, f"the answer should grow on the page, saw {len(states)} states"
    assert all(b.startswith(a[: len(a) - 2]) for a, b in itertools.pairwise(states))
    record = next(iter(web.stack.redis.scan_iter(web.stack.keys.reply("web:*"))))
    # The tiny model can emit bytes that are not UTF-8 and control characters: compare what a reader sees.
    assert visible_text(states[-1]) == visible_text(web.stack.redis.hget(record, "text").decode())
    assert web.proxy.chat_bodies[-1]["temperature"] == 0.1  # the default preset: code and documents
    direct_ttft = engine_ttft(live_engine, text)
    print(f"\nTTFT shown in the page: {first_text_s * 1000:.0f} ms; from vLLM directly: {direct_ttft * 1000:.0f} ms")

    page.click("#chat-settings-open-modal")
    page.click("#preset")
    page.click("[role=option]:has-text('creative writing')")
    page.click("#confirm")
    send(page, "Write a poem")
    assert web.proxy.chat_bodies[-1]["temperature"] == 0.7

    memory = web.stack.keys.memory("web:web:alice:alice")
    assert web.stack.redis.llen(memory) == 4
    states, _ = send(page, "/reset")
    assert "forgotten" in states[-1]
    assert web.stack.redis.llen(memory) == 0

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-chat.png"), full_page=True)
    assert (ARTIFACTS / "web-chat.png").stat().st_size > 10_000


def api_chat(web: WebStack, user: str, text: str) -> str:
    """One message through the web API as `user`; the answer's text (the `done` event's)."""
    headers = {"Authorization": f"Bearer {WEB_KEY}"}
    with httpx.stream("POST", f"{web.api_url}/chat", json={"user": user, "text": text}, headers=headers,
                      timeout=60) as response:
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    assert events[-1].get("done"), f"not answered: {events[-1]}"
    return events[-1]["text"]


def test_page_and_api_count_against_one_users_limit(web: WebStack, browser: object) -> None:
    """Bob's six messages a minute are spent half through the API and half on the page, in both orders: the
    seventh is refused wherever it comes from; Alice, signed in at the same time, is not."""
    for _ in range(3):  # the limit is 6 a minute
        assert "/reset" in api_chat(web, "bob", "/help")
    page = sign_in(browser, web, "bob", PASSWORD)
    page.wait_for_selector("text=Engine ready", timeout=30000)
    for _ in range(2):
        states, _ = send(page, "/help")
        assert "/reset" in states[-1] and "try again in" not in states[-1]
    assert "/reset" in api_chat(web, "bob", "/help")  # the sixth, through the API again
    states, _ = send(page, "one more question")
    assert "try again in" in states[-1], "the page's seventh message was answered"
    assert "try again in" in api_chat(web, "bob", "and another"), "the API's eighth message was answered"
    other = sign_in(browser, web, "alice", PASSWORD)
    other.wait_for_selector("text=Engine ready", timeout=30000)
    states, _ = send(other, "/help")
    assert "/reset" in states[-1], "another user's limit was spent too"


def test_api_refuses_a_wrong_key(web: WebStack) -> None:
    response = httpx.post(f"{web.api_url}/chat", json={"user": "eve", "text": "hi"},
                          headers={"Authorization": "Bearer wrong"}, timeout=10)
    assert response.status_code == 401
    assert httpx.get(f"{web.api_url}/status", timeout=10).status_code == 401, "engine status needs the key too"
    assert httpx.get(f"{web.api_url}/status", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
