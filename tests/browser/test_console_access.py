"""Who gets into the operator console (gateway/console), in Chromium against a real gateway, worker, redis-server
and the simulator's WeCom and DingTalk login pages: the admin token typed in, a WeCom member with the viewer role,
a DingTalk staff member with the editor role, a member with no role refused; no data without credentials; a change
without the CSRF token refused; the public port never serves the console; every sign-in in the audit stream."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from testkit.console import ConsoleStack, console_stack, screenshot
from testkit.stacks import Stack

VIEWER = "viewer" + secrets.token_hex(3)
EDITOR = "editor" + secrets.token_hex(3)
ADMIN = "admin" + secrets.token_hex(3)
NOBODY = "nobody" + secrets.token_hex(3)


@pytest.fixture(scope="module")
def console(stack: Stack) -> Iterator[ConsoleStack]:
    roles = {f"wecom:{VIEWER}": "viewer", f"dingtalk:{EDITOR}": "editor", f"wecom:{ADMIN}": "admin"}
    with console_stack(stack, roles=roles) as made:
        yield made



def test_no_credentials_no_data(console: ConsoleStack) -> None:
    page = httpx.get(f"{console.console_url}/", headers={"Accept": "text/html"}, timeout=10)
    assert page.status_code == 303 and page.headers["location"].startswith("/console/login")
    for path in ("/", "/audit?format=json", "/dead-letters", "/kf", "/limits", "/tools", "/knowledge"):
        answer = httpx.get(f"{console.console_url}{path}", timeout=10)
        assert answer.status_code == 401, (path, answer.status_code)
        assert console.token not in answer.text
    wrong = httpx.get(f"{console.console_url}/audit?format=json", headers={"Authorization": "Bearer not-it"},
                      timeout=10)  # fmt: skip
    assert wrong.status_code == 401
    assert console.api("GET", "/console/audit?format=json").status_code == 200
    # The public port never serves the console, with the token or without.
    public = httpx.get(f"{console.gateway_url}/console/login", timeout=10)
    assert public.status_code == 404
    public = httpx.get(f"{console.gateway_url}/console/audit?format=json", timeout=10,
                       headers={"Authorization": f"Bearer {console.token}"})  # fmt: skip
    assert public.status_code == 404


def test_sign_in_with_the_token_and_sign_out(console: ConsoleStack, browser: object) -> None:
    page = browser.new_context().new_page()  # type: ignore[attr-defined]
    page.goto(f"{console.console_url}/login")
    assert "登录控制台" in page.inner_text("h1")
    csp = page.evaluate("() => 1") and httpx.get(f"{console.console_url}/login", timeout=10).headers
    assert "default-src 'self'" in csp["content-security-policy"]
    page.fill("#token", "wrong-token-" + secrets.token_hex(4))
    page.click("#sign-in")
    assert "令牌不对" in page.inner_text("#error")
    screenshot(page, "login")
    page = console.sign_in_with_token(browser)
    assert page.inner_text("#role") == "admin"
    assert page.inner_text("#who") == "admin-token"
    page.click("#logout")
    page.wait_for_selector("#token")
    page.goto(f"{console.console_url}/audit")
    assert "/console/login" in page.url, "signed out, yet the console still opened"


def test_company_sign_in_gets_the_configured_role(console: ConsoleStack, browser: object) -> None:
    page = console.sign_in_with(browser, "wecom", VIEWER)
    page.wait_for_selector("#who", timeout=15000)
    assert page.inner_text("#who") == console.wecom_identity(VIEWER)
    assert page.inner_text("#role") == "viewer"
    page = console.sign_in_with(browser, "dingtalk", EDITOR)
    page.wait_for_selector("#who", timeout=15000)
    assert page.inner_text("#who") == console.dingtalk_identity(EDITOR)
    assert page.inner_text("#role") == "editor"
    # A member of the organisation whom no role names: refused, with why.
    page = console.sign_in_with(browser, "wecom", NOBODY)
    page.wait_for_selector("#error", timeout=15000)
    assert "没有控制台角色" in page.inner_text("#error")
    assert not any(cookie["name"] == "botgw_console" for cookie in page.context.cookies())
    changes = console.api("GET", "/console/audit?format=json").json()["changes"]
    signed = {(change["who"], change["action"]) for change in changes}
    assert (console.wecom_identity(VIEWER), "sign-in") in signed
    assert (console.dingtalk_identity(EDITOR), "sign-in") in signed
    assert not any(change["who"] == console.wecom_identity(NOBODY) for change in changes)
    # The viewer reads the same on the 操作记录 page.
    page = console.sign_in_with(browser, "wecom", VIEWER)
    page.goto(f"{console.console_url}/audit")
    table = page.inner_text("#audit")
    assert console.dingtalk_identity(EDITOR) in table and "sign-in" in table
    screenshot(page, "audit")


def test_a_change_without_the_csrf_token_is_refused(console: ConsoleStack, browser: object) -> None:
    page = console.sign_in_with(browser, "wecom", ADMIN)
    page.wait_for_selector("#who", timeout=15000)
    cookies = {cookie["name"]: cookie["value"] for cookie in page.context.cookies()}
    assert "botgw_console" in cookies
    # The session's cookie alone (what another site's form would carry) cannot sign out, or change anything.
    forged = httpx.post(f"{console.console_url}/logout", cookies={"botgw_console": cookies["botgw_console"]},
                        timeout=10)  # fmt: skip
    assert forged.status_code == 403
    page.goto(f"{console.console_url}/audit")
    assert page.inner_text("#who") == console.wecom_identity(ADMIN), "the forged sign-out ended the session"
    # With the token but from another origin: refused as well.
    csrf = page.get_attribute('meta[name="csrf-token"]', "content")
    crossed = httpx.post(f"{console.console_url}/logout", timeout=10,
                         cookies={"botgw_console": cookies["botgw_console"]},
                         headers={"X-CSRF-Token": csrf, "Origin": "http://evil.example"})  # fmt: skip
    assert crossed.status_code == 403


def test_the_configuration_is_shown_with_every_secret_masked(console: ConsoleStack, browser: object) -> None:
    page = console.sign_in_with(browser, "wecom", VIEWER)
    page.goto(f"{console.console_url}/config")
    text = page.inner_text("#config")
    assert "**********" in text and "corp_id" in text
    secrets_in_config = [console.token, console.config["bots"][0]["secret"], console.config["bots"][0]["token"],
                         console.config["bots"][0]["encoding_aes_key"]]
    for secret in secrets_in_config:
        assert secret not in text and secret not in page.content()
    shown = console.api("GET", "/console/config?format=json").text
    assert not any(secret in shown for secret in secrets_in_config)
    screenshot(page, "config")
