"""The console's 微信客服 page (gateway/console/pages/kf.py) in Chromium against the real stack: a gateway, a worker,
redis-server and the simulator's 微信客服 API. A customer asks for a human; the editor, signed in through WeCom, sees
them waiting in the pool with the wait and the reply allowance left, hands them to an agent on duty from the page;
the simulator's session is then with that agent and the page says so. The general form hands a customer the bot
holds to the pool, and refuses (409) one with no session; a viewer sees no form and is refused (403); when WeCom
does not answer, the page shows botgw's record, marked."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from bots.wecom_kf.config import WeComKfConfig
from simulator.wecom_kf.signer import WeComKfCallbackSigner
from testkit.console import ConsoleStack, console_stack, screenshot
from testkit.processes import wait_for
from testkit.stacks import Stack

EDITOR = "editor" + secrets.token_hex(3)
VIEWER = "viewer" + secrets.token_hex(3)
KFID = "wk-console-" + secrets.token_hex(4)
AGENT = "agent-" + secrets.token_hex(3)


@pytest.fixture(scope="module")
def console(stack: Stack) -> Iterator[ConsoleStack]:
    app = next(bot for bot in stack.config["bots"] if bot["id"] == "app")
    # One self-built app serves the employees and 微信客服 (as tests/kf_env.py): the session simulator knows its
    # secret; the account is added to the simulator under the app's corporation.
    kefu = {"id": "kefu", "platform": "wecom-kf", "api_base": stack.sim_url, "open_kfids": [KFID], "app": "app",
            **{key: app[key] for key in ("corp_id", "secret", "token", "encoding_aes_key")}}  # fmt: skip
    httpx.post(f"{stack.sim_url}/__sim__/kf/account", json={"open_kfid": KFID, "corp_id": app["corp_id"]},
               timeout=10).raise_for_status()  # fmt: skip
    roles = {f"wecom:{EDITOR}": "editor", f"wecom:{VIEWER}": "viewer"}
    with console_stack(stack, roles=roles, extra_bots=[kefu]) as made:
        yield made



def sim(console: ConsoleStack, method: str, path: str, **kwargs: object) -> dict:
    response = httpx.request(method, f"{console.sim_url}{path}", timeout=30, **kwargs)  # type: ignore[arg-type]
    response.raise_for_status()
    return response.json()


def write(console: ConsoleStack, person: str, text: str) -> None:
    """The customer writes; WeCom calls the Kefu bot back to pull."""
    token = sim(console, "POST", "/__sim__/kf/customer", json={"open_kfid": KFID, "external_userid": person,
                                                              "text": text})["token"]  # fmt: skip
    bot = WeComKfConfig(**next(b for b in console.config["bots"] if b["id"] == "kefu"))
    signed = WeComKfCallbackSigner(bot).kf_msg_or_event(token, KFID)
    answer = httpx.post(f"{console.gateway_url}/callback/kefu", params=signed.params, content=signed.body, timeout=10)
    assert answer.status_code == 200, answer.text


def session(console: ConsoleStack, person: str) -> dict:
    return sim(console, "GET", "/__sim__/kf/session", params={"open_kfid": KFID, "external_userid": person})


def listed(console: ConsoleStack) -> dict[str, dict]:
    """The page's customers as a script reads them (Bearer): external_userid → row."""
    answer = console.api("GET", "/console/kf?format=json&bot=kefu")
    assert answer.status_code == 200, answer.text
    return {row["external_userid"]: row for row in answer.json()["customers"]}


def row(page: object, person: str) -> object:
    return page.locator(f'tr.customer[data-customer="{person}"]')  # type: ignore[attr-defined]


def test_an_editor_hands_a_waiting_customer_to_an_agent_and_the_session_is_theirs(
    console: ConsoleStack, browser: object
) -> None:
    person, waiting = ("wm" + secrets.token_hex(6) for _ in range(2))
    write(console, person, "转人工")
    write(console, waiting, "我要人工客服")  # stays in the pool: the screenshot shows both
    wait_for(lambda: session(console, person)["service_state"] == 2, 60, "the keyword's handoff to the pool")
    wait_for(lambda: {person, waiting} <= set(listed(console)), 30, "the customers in the register")
    seen = listed(console)[person]
    assert (seen["state"], seen["servicer"], seen["live"]) == (2, "", True), seen
    assert seen["quota_left"] == 3, "5 a window, 1 kept back, 1 used by the handoff notice"

    page = console.sign_in_with(browser, "wecom", EDITOR)
    page.goto(f"{console.console_url}/kf")  # type: ignore[attr-defined]
    mine = row(page, person)
    assert mine.get_attribute("data-state") == "2" and mine.get_attribute("data-live") == "1"
    assert "排队等待人工" in mine.locator(".state").inner_text()
    assert "排队中" in mine.locator(".holder").inner_text()
    assert "等待中" in mine.locator(".waited").inner_text()
    assert int(mine.locator(".waited").get_attribute("data-waited")) >= 0
    assert mine.locator(".quota").inner_text().startswith("3")
    assert "session_status_change" in page.inner_text("#kf-scope"), "the page says what the list holds"  # type: ignore[attr-defined]

    sim(console, "POST", "/__sim__/kf/servicer", json={"servicer_userid": AGENT, "on_duty": True})
    mine.locator('input[name="servicer"]').fill(AGENT)
    mine.locator("button.to-agent").click()
    page.wait_for_selector("#kf-done", timeout=15000)  # type: ignore[attr-defined]
    assert AGENT in page.inner_text("#kf-done")  # type: ignore[attr-defined]
    wait_for(lambda: session(console, person)["service_state"] == 3, 60, "the worker's move to the agent")
    assert session(console, person)["servicer_userid"] == AGENT

    def holder_shown() -> bool:
        page.goto(f"{console.console_url}/kf")  # type: ignore[attr-defined]
        return row(page, person).get_attribute("data-state") == "3"

    wait_for(holder_shown, 30, "the page to show the agent")
    assert AGENT in row(page, person).locator(".holder").inner_text()
    assert "人工接待中" in row(page, person).locator(".state").inner_text()
    assert row(page, waiting).get_attribute("data-state") == "2", "the other customer still waits"
    screenshot(page, "kf")
    changes = console.api("GET", "/console/audit?format=json").json()["changes"]
    audited = [c for c in changes if c["action"] == "kf.handoff" and person in c["target"]]
    assert audited and audited[0]["who"] == console.wecom_identity(EDITOR) and AGENT in audited[0]["detail"]

    # WeCom does not answer: the row shows botgw's record (the agent, from its own move), marked as such.
    rows_shown = len(listed(console))
    sim(console, "POST", "/__sim__/kf/faults", json={"endpoint": "service_state_get", "errcode": -1,
                                                    "times": rows_shown})  # fmt: skip
    page.goto(f"{console.console_url}/kf")  # type: ignore[attr-defined]
    stale = row(page, person)
    assert stale.get_attribute("data-live") == "0" and AGENT in stale.locator(".holder").inner_text()
    assert "未能向企业微信确认" in stale.locator(".stale").inner_text()


def test_any_customer_to_the_pool_and_one_with_no_session_refused(console: ConsoleStack, browser: object) -> None:
    person = "wm" + secrets.token_hex(6)
    write(console, person, "你好")
    wait_for(lambda: session(console, person)["service_state"] == 1, 60, "the bot to take the conversation")
    assert person not in listed(console), "nobody handed them over"

    page = console.sign_in_with(browser, "wecom", EDITOR)
    page.goto(f"{console.console_url}/kf")  # type: ignore[attr-defined]
    nobody = "wm" + secrets.token_hex(6)
    page.fill("#handoff-customer", nobody)  # type: ignore[attr-defined]
    page.click("#handoff-to-queue")  # type: ignore[attr-defined]
    page.wait_for_selector("#kf-error", timeout=15000)  # type: ignore[attr-defined]
    assert "has no open session" in page.inner_text("#kf-error")  # type: ignore[attr-defined]
    assert page.input_value("#handoff-customer") == nobody, "the form keeps what was typed"  # type: ignore[attr-defined]

    page.fill("#handoff-customer", person)  # type: ignore[attr-defined]
    page.click("#handoff-to-queue")  # type: ignore[attr-defined]
    page.wait_for_selector("#kf-done", timeout=15000)  # type: ignore[attr-defined]
    wait_for(lambda: session(console, person)["service_state"] == 2, 60, "the worker's move to the pool")
    wait_for(lambda: person in listed(console), 30, "the customer in the register")
    assert listed(console)[person]["state"] == 2
    # JSON for a script: the same path, the same refusal.
    refused = console.api("POST", "/console/kf/handoff", json={"bot": "kefu", "customer": nobody, "to": "queue"})
    assert refused.status_code == 409, refused.text
    unknown = console.api("POST", "/console/kf/handoff", json={"bot": "nosuch", "customer": person, "to": "queue"})
    assert unknown.status_code == 404, unknown.text


def test_a_viewer_sees_the_list_but_no_handoff_and_is_refused(console: ConsoleStack, browser: object) -> None:
    person = "wm" + secrets.token_hex(6)
    write(console, person, "人工客服")
    wait_for(lambda: person in listed(console), 60, "the keyword's handoff in the register")
    page = console.sign_in_with(browser, "wecom", VIEWER)
    page.goto(f"{console.console_url}/kf")  # type: ignore[attr-defined]
    assert row(page, person).count() == 1
    assert page.locator("form.handoff").count() == 0 and page.locator("#handoff-any").count() == 0  # type: ignore[attr-defined]
    status = page.evaluate(  # type: ignore[attr-defined]
        """async (person) => (await fetch('/console/kf/handoff', {method: 'POST', credentials: 'same-origin',
             headers: {'Content-Type': 'application/json',
                       'X-CSRF-Token': document.querySelector('meta[name="csrf-token"]').content},
             body: JSON.stringify({bot: 'kefu', customer: person, servicer: 'someone', to: 'agent'})})).status""",
        person,
    )
    assert status == 403
    time.sleep(1.0)
    assert session(console, person)["service_state"] == 2, "nothing moved"
    assert not [c for c in console.api("GET", "/console/audit?format=json").json()["changes"]
                if c["action"] == "kf.handoff" and person in c["target"]]  # fmt: skip
