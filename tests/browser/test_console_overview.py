"""The console's overview (/console/) in Chromium against the real stack (gateway, worker, stub engine,
redis-server, simulator): a viewer sees a WeCom callback counted and its answer's time appear without reloading
the page (the live fragment); the queue and the dead letters as Redis holds them; every live process; a DingTalk
Stream bot red while no `botgw dingtalk-stream` runs, green once one holds its connection and back to red when it
stops; a WeCom app whose gettoken WeCom refuses with 60020 red with the 可信IP hint, in Chinese and English, and on
a phone; the JSON for scripts; nothing without credentials."""

from __future__ import annotations

import re
import secrets
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bots.wecom.config import WeComAppConfig
from simulator.wecom.signer import WeComCallbackSigner
from testkit.configs import wecom_app
from testkit.console import ConsoleStack, console_stack, screenshot
from testkit.processes import BOTGW, Proc, wait_for
from testkit.stacks import Stack

VIEWER = "viewer" + secrets.token_hex(3)
IP_BOT = "app-ip"
REFUSAL = ("not allow to access from your ip, hint: [1717000000_12_3f1e0c], from ip: 203.0.113.7, more info at "
           "https://open.work.weixin.qq.com/devtool/query?e=60020")  # fmt: skip
LIVE_S = 25  # a flush (5 s) and a refresh of the page (5 s), with room on a busy machine


@pytest.fixture(scope="module")
def console(stack: Stack) -> Iterator[ConsoleStack]:
    corp = next(bot for bot in stack.config["bots"] if bot["id"] == "app")["corp_id"]
    ip_app = {**wecom_app(IP_BOT, stack.sim_url), "corp_id": corp, "agent_id": 1000003}  # another app, same company
    with console_stack(stack, roles={f"wecom:{VIEWER}": "viewer"}, extra_bots=[ip_app]) as made:
        yield made



def _overview(console: ConsoleStack) -> dict:
    answer = console.api("GET", "/console/overview.json")
    assert answer.status_code == 200, answer.text
    return answer.json()


def _bot(data: dict, bot_id: str) -> dict:
    return next(bot for bot in data["bots"] if bot["id"] == bot_id)


def _field(page: object, bot_id: str, name: str) -> str:
    return page.inner_text(f'#bot-{bot_id} [data-field="{name}"]')  # type: ignore[attr-defined]


def test_a_callback_and_its_answer_appear_live(console: ConsoleStack, browser: object) -> None:
    stack = console.as_stack()
    page = console.sign_in_with(browser, "wecom", VIEWER)
    page.wait_for_selector("#bots", timeout=15000)  # type: ignore[attr-defined]
    assert page.inner_text("#role") == "viewer"  # type: ignore[attr-defined]
    before = int(_field(page, "app", "callbacks-15m"))
    answered_before = int(_field(page, "app", "answers-15m"))
    page.evaluate("() => { window.notReloaded = true; }")  # type: ignore[attr-defined]
    user = "ov" + secrets.token_hex(3)
    assert stack.post_callback(stack.signer().text(user, "你好，概览")).status_code == 200
    assert stack.wait_delivered(user, 1, settle=0.2), "the stub engine's answer did not arrive"
    page.wait_for_function(  # type: ignore[attr-defined]
        """([before, answered]) => {
            const q = (f) => document.querySelector(`#bot-app [data-field="${f}"]`);
            return q("callbacks-15m") && Number(q("callbacks-15m").innerText) >= before + 1
                && Number(q("answers-15m").innerText) >= answered + 1 && !q("last-answer").innerText.includes("—");
        }""",
        arg=[before, answered_before], timeout=LIVE_S * 1000,
    )
    assert page.evaluate("() => window.notReloaded === true"), "the page was reloaded, not refreshed in place"  # type: ignore[attr-defined]
    assert page.get_attribute("#live", "data-updated"), "the live part was never refreshed"  # type: ignore[attr-defined]
    assert re.fullmatch(r"\d+s 前", _field(page, "app", "last-answer")), _field(page, "app", "last-answer")
    assert page.get_attribute("#bot-app", "data-state") == "ok"  # type: ignore[attr-defined]
    assert int(page.inner_text("#answers-15m")) >= 1  # type: ignore[attr-defined]
    assert float(page.inner_text("#answers-per-minute")) >= 0.2  # type: ignore[attr-defined]
    assert page.locator("#answers svg.spark rect[height]:not([height='0.0'])").count() >= 1  # type: ignore[attr-defined]
    # The queue and the dead letters as Redis holds them; the processes that report.
    assert page.inner_text("#queue-depth") == str(stack.queue_depth())  # type: ignore[attr-defined]
    assert re.fullmatch(r"\d+s", page.inner_text("#queue-oldest"))  # type: ignore[attr-defined]
    assert page.inner_text("#dead-letter-count") == str(stack.dead_letters())  # type: ignore[attr-defined]
    assert int(page.inner_text("#workers")) >= 1 and int(page.inner_text("#gateways")) >= 1  # type: ignore[attr-defined]
    assert page.locator('#processes tr[data-role="worker"]').count() >= 1  # type: ignore[attr-defined]
    # The engine, as the gateway's pool sees it: the stub engine, ready.
    assert "就绪" in page.inner_text("#engines")  # type: ignore[attr-defined]
    data = _overview(console)
    app = _bot(data, "app")
    assert app["callbacks_15m"] >= before + 1 and app["last_answer"] and app["platform"] == "wecom"
    assert data["queue"]["depth"] == stack.queue_depth() and data["dead_letters"] == stack.dead_letters()
    assert data["engines"][0]["status"] == "ready" and data["process_counts"]["worker"] >= 1


def test_the_stream_connection_shows_whether_a_process_holds_it(console: ConsoleStack, browser: object) -> None:
    from tests.e2e.dingtalk.test_dingtalk import send

    stream_bot = _bot(_overview(console), "ding-stream")
    assert stream_bot["state"] == "bad" and stream_bot["stream"]["processes"] == 0
    assert [p["kind"] for p in stream_bot["problems"]] == ["no_stream"]
    page = console.sign_in_with(browser, "wecom", VIEWER)
    page.wait_for_selector("#bot-ding-stream", timeout=15000)  # type: ignore[attr-defined]
    assert page.get_attribute("#bot-ding-stream", "data-state") == "bad"  # type: ignore[attr-defined]
    assert "没有 Stream 连接" in page.inner_text("#bot-ding-stream .problem.bad")  # type: ignore[attr-defined]
    proc = Proc([*BOTGW, "dingtalk-stream", "--config", str(console.path)], console.stack.log_dir / "ov-stream.log")
    try:
        wait_for(lambda: "dingtalk stream connected" in proc.tail(20), 30, "the Stream connection")
        with ThreadPoolExecutor(1) as pool:  # its own event loop, beside Playwright's
            pool.submit(send, console.as_stack(), "ding-stream", "ov" + secrets.token_hex(3), "你好").result()
        page.wait_for_function(  # type: ignore[attr-defined]
            """() => { const b = document.querySelector("#bot-ding-stream");
                       const q = (f) => b.querySelector(`[data-field="${f}"]`).innerText;
                       return b.dataset.state === "ok" && q("stream").includes("已连接")
                              && Number(q("callbacks-15m")) >= 1 && !q("last-answer").includes("—"); }""",
            timeout=LIVE_S * 1000,
        )
        assert int(page.inner_text("#streams")) == 1  # type: ignore[attr-defined]
        held = _bot(_overview(console), "ding-stream")
        assert held["stream"] == {"processes": 1, "connected": 1, "since": held["stream"]["since"]}
        proc.kill(signal.SIGTERM)
        proc.popen.wait(15)
    finally:
        proc.stop()
    # A process that stops takes itself out at once: the bot is red again at the next refresh.
    page.wait_for_function(  # type: ignore[attr-defined]
        """() => document.querySelector("#bot-ding-stream").dataset.state === "bad" """, timeout=LIVE_S * 1000,
    )
    assert "无进程" in _field(page, "ding-stream", "stream")


def test_a_refused_token_is_shown_with_the_trusted_ip_hint(console: ConsoleStack, browser: object) -> None:
    stack = console.as_stack()
    page = console.sign_in_with(browser, "wecom", VIEWER)  # the sign-in has the "app" bot's token cached by now
    page.wait_for_selector("#bots", timeout=15000)  # type: ignore[attr-defined]
    assert page.get_attribute(f"#bot-{IP_BOT}", "data-state") == "idle"  # type: ignore[attr-defined]
    dead_before = stack.dead_letters()
    # WeCom refuses the first gettoken of the new app: its server's IP is not among the app's 企业可信IP.
    stack.fault(endpoint="gettoken", errcode=60020, errmsg=REFUSAL, times=1)
    bot = WeComAppConfig(**next(b for b in console.config["bots"] if b["id"] == IP_BOT))
    user = "ip" + secrets.token_hex(3)
    assert stack.post_callback(WeComCallbackSigner(bot).text(user, "在吗"), IP_BOT).status_code == 200
    wait_for(lambda: stack.dead_letters() > dead_before, 30, "the refused answer to become a dead letter")
    page.wait_for_function(  # type: ignore[attr-defined]
        f"""() => document.querySelector("#bot-{IP_BOT}").dataset.state === "bad" """, timeout=LIVE_S * 1000,
    )
    problem = page.inner_text(f'#bot-{IP_BOT} .problem.bad[data-kind="token"]')  # type: ignore[attr-defined]
    assert "企业可信IP" in problem and "60020" in problem and "出口 IP" in problem
    assert "203.0.113.7" in page.inner_text(f"#bot-{IP_BOT} .said")  # type: ignore[attr-defined]
    assert page.inner_text("#dead-letter-count") == str(stack.dead_letters())  # type: ignore[attr-defined]
    assert "死信等待处理" in page.inner_text("#problems")  # type: ignore[attr-defined]
    html = page.content()  # type: ignore[attr-defined]
    assert bot.secret.get_secret_value() not in html and console.token not in html
    screenshot(page, "overview")
    data = _overview(console)
    refused = _bot(data, IP_BOT)
    assert refused["state"] == "bad" and refused["token_error"]["code"] == "60020"
    assert refused["problems"][0]["hint"] == "trusted_ip" and "企业可信IP" in refused["problems"][0]["zh"]
    assert not _bot(data, "app")["problems"], "the other WeCom app is not to blame"
    # In English, the same hint.
    page.goto(f"{console.console_url}/lang/en?next=/console/")  # type: ignore[attr-defined]
    page.wait_for_selector(f"#bot-{IP_BOT}", timeout=15000)  # type: ignore[attr-defined]
    problem = page.inner_text(f'#bot-{IP_BOT} .problem.bad[data-kind="token"]')  # type: ignore[attr-defined]
    assert "WeCom refused the server's IP (60020)" in problem and "企业可信IP" in problem
    assert "Dead letters waiting" in page.inner_text("#dead-letters")  # type: ignore[attr-defined]
    screenshot(page, "overview-en")
    # On a phone: one column, nothing wider than the screen, the red bot and its hint still there.
    page.goto(f"{console.console_url}/lang/zh?next=/console/")  # type: ignore[attr-defined]
    page.set_viewport_size({"width": 390, "height": 844})  # type: ignore[attr-defined]
    page.wait_for_selector(f"#bot-{IP_BOT} .problem.bad", timeout=15000)  # type: ignore[attr-defined]
    wide = page.evaluate("""() => [...document.querySelectorAll('header.top *, #live *')]
        .filter(e => !e.closest('.scroll') && e.getBoundingClientRect().right > 390)
        .map(e => e.tagName + '.' + e.className)""")  # type: ignore[attr-defined]
    assert wide == [], f"wider than the phone: {wide}"
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390  # type: ignore[attr-defined]
    assert page.is_visible(f'#bot-{IP_BOT} .problem[data-kind="token"]')  # type: ignore[attr-defined]
    screenshot(page, "overview-phone")


def test_no_overview_without_credentials(console: ConsoleStack) -> None:
    for path in ("/", "/overview.json", "/overview/fragment", "/?format=json"):
        answer = httpx.get(f"{console.console_url}{path}", timeout=10)
        assert answer.status_code == 401, (path, answer.status_code)
        assert "callbacks_15m" not in answer.text and "bot-app" not in answer.text
    fragment = console.api("GET", "/console/overview/fragment")
    assert fragment.status_code == 200 and 'id="bot-app"' in fragment.text and "<html" not in fragment.text
    assert "default-src 'self'" in fragment.headers["content-security-policy"]
    assert console.api("GET", "/console/?format=json").json()["bots"]
