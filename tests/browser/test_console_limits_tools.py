"""The console's limits and tool audit pages, in Chromium against a real gateway, worker, redis-server and the
simulator: a user who used up their per-user window (real callbacks) is looked up by what an operator types
(`wecom:<userid>`), their usage shown; a viewer cannot reset it (no button, 403); an admin resets it, the usage is
back to 0 and the user is answered again; a bare id shows the qualified forms it could mean. The tools' trail,
written by the real `ToolAudit` writer, filtered on the server by user, tool, kind, outcome and age."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.console import ConsoleStack, console_stack, screenshot
from testkit.stacks import Stack

VIEWER = "viewer" + secrets.token_hex(3)


@pytest.fixture(scope="module")
def console(stack: Stack) -> Iterator[ConsoleStack]:
    with console_stack(stack, roles={f"wecom:{VIEWER}": "viewer"}, limits={"per_user": "2/minute"}) as made:
        yield made



def window_used(page: object) -> int:
    return int(page.get_attribute("section.party[data-party^='user:'] tr.window", "data-used") or -1)  # type: ignore[attr-defined]


def test_look_up_a_user_over_the_limit_and_reset(console: ConsoleStack, browser: object) -> None:
    stack = console.as_stack()
    user = "u" + secrets.token_hex(5)
    for n in range(3):
        assert stack.post_callback(stack.signer().text(user, f"问题{n}")).status_code == 200
        stack.wait_delivered(user, n + 1, timeout=60, settle=0.3)
    texts = stack.texts(user)
    assert texts[:2] == ["answer to: 问题0", "answer to: 问题1"] and "消息太频繁了" in texts[2], texts

    viewer = console.sign_in_with(browser, "wecom", VIEWER)
    viewer.goto(f"{console.console_url}/limits")
    viewer.fill("#who-input", f"wecom:{user}")
    viewer.click("#look-up")
    viewer.wait_for_selector("#identity")
    assert viewer.inner_text("#identity") == console.wecom_identity(user)
    assert window_used(viewer) == 2
    assert viewer.locator("#reset").count() == 0
    csrf = viewer.get_attribute("meta[name=csrf-token]", "content")
    refused = viewer.request.post(f"{console.console_url}/limits/reset", form={"csrf": csrf, "who": f"wecom:{user}"})
    assert refused.status == 403
    viewer.reload()
    assert window_used(viewer) == 2, "a viewer's refused reset cleared the window"

    admin = console.sign_in_with_token(browser)
    admin.goto(f"{console.console_url}/limits?who=wecom:{user}")
    row = admin.locator("section.party[data-party^='user:'] tr.window")
    assert row.get_attribute("data-limit") == "2" and window_used(admin) == 2
    screenshot(admin, "limits")
    admin.on("dialog", lambda dialog: dialog.accept())  # type: ignore[attr-defined]
    admin.click("#reset")
    admin.wait_for_selector("#cleared")
    assert window_used(admin) == 0 and admin.inner_text("#identity") == console.wecom_identity(user)
    assert stack.post_callback(stack.signer().text(user, "问题3")).status_code == 200
    stack.wait_delivered(user, 4, timeout=60, settle=0.5)
    assert stack.texts(user)[3] == "answer to: 问题3", "the reset user was not answered again"
    changes = console.api("GET", "/console/audit?format=json").json()["changes"]
    assert any(change["action"] == "limits.reset" and change["target"] == console.wecom_identity(user)
               and change["who"] == "admin-token" for change in changes)  # fmt: skip

    # What operators type wrong: a bare id (the forms it could mean), a pattern (never SCANned with).
    admin.goto(f"{console.console_url}/limits")
    admin.fill("#who-input", user)
    admin.click("#look-up")
    admin.wait_for_selector("#error")
    assert "names no platform" in admin.inner_text("#error") and console.wecom_identity(user) in admin.inner_text(
        "#error")
    assert admin.locator("#reset").count() == 0
    pattern = console.api("POST", "/console/limits/reset", json={"who": "wecom:*"})
    assert pattern.status_code == 400


def write_trail(console: ConsoleStack, records: list[dict]) -> None:
    """Records through the trail's own writer (tools/audit.py ToolAudit.record), into the console's namespace."""
    from redis.asyncio import Redis

    from gateway.state.keys import Keys
    from tools.audit import AuditRecord, ToolAudit
    from tools.config import ToolsSettings

    async def write() -> None:
        redis = Redis.from_url(console.config["redis_url"])
        audit = ToolAudit(redis, Keys(console.namespace), ToolsSettings())
        for fields in records:
            await audit.record(AuditRecord(**fields))
        await redis.aclose()

    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API runs an event loop in this thread
        pool.submit(asyncio.run, write()).result()


def test_the_tool_trail_filtered(console: ConsoleStack, browser: object) -> None:
    alice, bob = ("u" + secrets.token_hex(4) for _ in range(2))
    page = console.sign_in_with(browser, "wecom", VIEWER)  # a viewer reads the trail
    now = time.time()
    write_trail(console, [
        {"ts": now - 6, "bot": "app", "user": console.wecom_identity(alice), "tool": "crm.lookup", "kind": "call",
         "arguments": {"order": "old"}, "outcome": "ok", "duration_ms": 40},
        {"ts": now - 5, "bot": "app", "user": console.wecom_identity(alice), "tool": "crm.refund",
         "kind": "confirm_asked", "arguments": {"order": "A-1", "password": "hunter2"}},
        {"ts": now - 4, "bot": "app", "user": console.wecom_identity(alice), "tool": "crm.refund", "kind": "call",
         "arguments": {"order": "A-1"}, "outcome": "error", "duration_ms": 1200},
    ])  # fmt: skip
    time.sleep(3.0)  # `since` counts from when a record was written (its stream id)
    write_trail(console, [{"ts": time.time(), "bot": "app", "user": console.wecom_identity(bob), "tool": "crm.lookup",
                           "kind": "call", "arguments": {"order": "B-7"}, "outcome": "ok", "duration_ms": 80}])
    page.goto(f"{console.console_url}/tools?tool=crm.lookup&since=2s")
    assert [row.get_attribute("data-user") for row in page.locator("tr.record").all()] == [console.wecom_identity(bob)]
    page.goto(f"{console.console_url}/tools")
    shown = page.locator("tr.record")
    assert shown.count() == 4
    assert "hunter2" not in page.content() and "***" in page.inner_text("#trail")
    assert [row.get_attribute("data-tool") for row in shown.all()] == [
        "crm.lookup", "crm.refund", "crm.refund", "crm.lookup"], "newest first"
    assert shown.first.get_attribute("data-user") == console.wecom_identity(bob)

    page.fill("#f-user", f"wecom:{alice}")
    page.select_option("#f-outcome", "error")
    page.click("#filter")
    page.wait_for_url("**outcome=error**")
    assert [(row.get_attribute("data-tool"), row.get_attribute("data-outcome"))
            for row in page.locator("tr.record").all()] == [("crm.refund", "error")]  # fmt: skip

    page.goto(f"{console.console_url}/tools?tool=crm.lookup")
    assert {row.get_attribute("data-user") for row in page.locator("tr.record").all()} == {
        console.wecom_identity(alice), console.wecom_identity(bob)}
    page.goto(f"{console.console_url}/tools?user=wecom:{alice}&kind=confirm_asked")
    assert page.locator("tr.record").count() == 1
    page.goto(f"{console.console_url}/tools?limit=2")
    assert page.locator("tr.record").count() == 2 and page.locator("#bounded").count() == 1
    screenshot(page, "tools")

    # Filters the server cannot take are said, not ignored.
    page.goto(f"{console.console_url}/tools?since=yesterday&outcome=maybe&user={alice}")
    errors = page.inner_text("body")
    assert "yesterday" in errors and "maybe" not in page.locator("tr.record").all_inner_texts()
    assert page.locator(".filter-error").count() == 3 and page.locator("tr.record").count() == 0
    answer = console.api("GET", f"/console/tools?tool=crm.refund&user=wecom:{alice}")
    assert answer.status_code == 200 and [r["kind"] for r in answer.json()["records"]] == ["call", "confirm_asked"]
