"""Sign-in on the web page through WeCom and DingTalk (webchat/oauth.py), in Chromium, through the simulator's
login pages (simulator/web_login.py): each platform signs a member in; a forged state, a wrong code, a code
used before, a declined sign-in and someone outside the organisation are refused with a page that says why; and a
person signed in through WeCom is that WeCom member, with the memory the WeCom app keeps for them.

A stub engine (testkit/fakes/stub_engine.py) answers and records every request, so the test can see what the page's
question reached the engine with; no vLLM is needed."""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from testkit.browser import CHROMIUM, chromium_browser
from testkit.configs import write_config
from testkit.processes import BOTGW, Proc, free_port, wait_for, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import Stack, start_stub_engine, stub_requests
from tests.browser.test_web import send

WEB_KEY = "test-login-key-" + secrets.token_hex(6)
PASSWORD = "login-test-" + secrets.token_hex(8)
REFUSED_STATE = "not started from this browser"
REFUSED_CODE = "its code is not valid"
NOT_A_MEMBER = "not a member of this company"
DECLINED = "declined or cancelled"


@dataclass
class LoginStack:
    page_url: str
    gateway_url: str
    sim_url: str
    engine_url: str
    corp_id: str
    agent_id: int
    dingtalk_corp: str
    stack: Stack
    web_log: Proc

    def callback(self, login: str) -> str:
        return f"{self.page_url}/auth/oauth/{login}/callback"

    def sim_stats(self) -> dict:
        return httpx.get(f"{self.sim_url}/__sim__/login/stats", timeout=5).json()


@pytest.fixture(scope="module")
def logins(stack: Stack) -> Iterator[LoginStack]:
    if not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed: run `make test`, which installs it")
    engine, engine_url = start_stub_engine(stack.log_dir, 0.1, "stub-web-login")
    namespace = "l" + secrets.token_hex(4)
    gateway_port, web_port = free_port(), free_port()
    dingtalk_corp = "dingcorp" + secrets.token_hex(4)
    bots = []
    for bot in stack.config["bots"]:  # the simulator knows these apps' credentials
        bots.append({**bot, "corp_id": dingtalk_corp} if bot["id"] == "ding-http" else bot)
    bots.append({
        "id": "web", "platform": "web", "api_key": WEB_KEY, "gateway_url": f"http://127.0.0.1:{gateway_port}",
        "web_login": {"wecom": {"bot": "app"}, "dingtalk": {"bot": "ding-http"}},
        "users": [{"name": "alice", "password": PASSWORD}],
    })
    for bot in bots:
        if bot["platform"] in ("wecom", "dingtalk"):
            bot["login_base"] = stack.sim_url
    engine_config = {**stack.config["engine"], "base_url": engine_url}
    config = {**stack.config, "namespace": namespace, "engine": engine_config, "bots": bots}
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    procs = [engine, start_gateway(path, gateway_port, stack.log_dir, f"gw-{namespace}"),
             start_worker(path, stack.log_dir, f"{namespace}-worker")]
    web = Proc([*BOTGW, "web", "--config", str(path), "--port", str(web_port),
                "--app-root", str(stack.log_dir / f"chainlit-{namespace}")], stack.log_dir / f"web-{namespace}.log")
    procs.append(web)
    try:
        page_url = f"http://127.0.0.1:{web_port}"
        app = next(bot for bot in bots if bot["id"] == "app")
        ding = next(bot for bot in bots if bot["id"] == "ding-http")
        made = LoginStack(page_url, f"http://127.0.0.1:{gateway_port}", stack.sim_url, engine_url, app["corp_id"],
                          app["agent_id"], dingtalk_corp,
                          Stack(config, path, f"http://127.0.0.1:{gateway_port}", stack.sim_url, stack.redis,
                                namespace, stack.log_dir), web)
        # The admin consoles' part: the page's callback is a 可信域名 of the WeCom app, a 重定向URL of the DingTalk app.
        for trust in ({"agentid": app["agent_id"], "redirect_uri": made.callback("wecom")},
                      {"client_id": ding["app_key"], "redirect_uri": made.callback("dingtalk")}):
            httpx.post(f"{stack.sim_url}/__sim__/login/trust", json=trust, timeout=5).raise_for_status()
        wait_http(f"{page_url}/", 120, web)
        worker = procs[2]
        wait_for(lambda: b"worker started" in worker.log_path.read_bytes(), 60, "the worker to start")
        yield made
    finally:
        for proc in reversed(procs):
            proc.stop()


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium_browser() as instance:
        yield instance


def to_platform(browser: object, logins: LoginStack, login: str) -> object:
    """A fresh browser on the platform's login page, reached from the page's "Continue with …" button."""
    page = browser.new_context().new_page()  # type: ignore[attr-defined]
    page.goto(logins.page_url, wait_until="networkidle")
    page.click(f"button:has-text('{'Wecom' if login == 'wecom' else 'Dingtalk'}')")
    page.wait_for_selector("#userid", timeout=15000)
    assert page.url.startswith(logins.sim_url), f"not on the platform's login page: {page.url}"
    return page


def sign_in(browser: object, logins: LoginStack, login: str, userid: str, action: str = "member") -> tuple:
    """Sign in as `userid` on the platform's page: (the browser page, the callback URL the platform sent it to)."""
    page = to_platform(browser, logins, login)
    page.fill("#userid", userid)
    with page.expect_request(lambda request: request.url.startswith(logins.callback(login))) as sent:
        page.click(f"#{action}")
    page.wait_for_load_state("networkidle")
    return page, sent.value.url


def refusal(page: object) -> str:
    page.wait_for_selector("#reason", timeout=15000)  # type: ignore[attr-defined]
    return page.inner_text("#reason")  # type: ignore[attr-defined]


def signed_in(page: object) -> bool:
    cookies = page.context.cookies()  # type: ignore[attr-defined]
    return any(cookie["name"].startswith("access_token") for cookie in cookies)


def state_of(page: object) -> str:
    """The state Chainlit sent the platform (decoded: it may hold '%', '&' or '+', so a URL takes it encoded)."""
    return parse_qs(urlsplit(page.url).query)["state"][0]  # type: ignore[attr-defined]


def test_wecom_sign_in_and_its_refusals(logins: LoginStack, browser: object) -> None:
    member = "m" + secrets.token_hex(4)
    page, callback = sign_in(browser, logins, "wecom", member)
    page.wait_for_selector("#chat-input", timeout=30000)
    assert signed_in(page)
    code = parse_qs(urlsplit(callback).query)["code"][0]

    # The same callback again in the same browser: the state was spent with the sign-in.
    replay = page.context.new_page()
    replay.goto(callback)
    assert REFUSED_STATE in refusal(replay)

    # A forged state, in a browser that never started a sign-in.
    stranger = browser.new_context().new_page()  # type: ignore[attr-defined]
    stranger.goto(f"{logins.callback('wecom')}?code={code}&state=forged")
    assert REFUSED_STATE in refusal(stranger)
    assert not signed_in(stranger)

    # A code WeCom never issued, with this browser's own state: WeCom refuses it (40029).
    refused_before = logins.sim_stats()["refused"]
    fresh = to_platform(browser, logins, "wecom")
    wrong = {"code": f"not-a-code-{secrets.token_hex(4)}", "state": state_of(fresh)}
    fresh.goto(f"{logins.callback('wecom')}?{urlencode(wrong)}")
    assert REFUSED_CODE in refusal(fresh)
    assert not signed_in(fresh)
    assert logins.sim_stats()["refused"] == refused_before + 1, "WeCom was not asked about the wrong code"

    # The code already used, with a fresh state of another browser: refused.
    again = to_platform(browser, logins, "wecom")
    again.goto(f"{logins.callback('wecom')}?{urlencode({'code': code, 'state': state_of(again)})}")
    assert REFUSED_CODE in refusal(again)
    assert not signed_in(again)
    # and WeCom itself refuses a used code (the page never asked twice: it remembered the code)
    token = httpx.get(f"{logins.sim_url}/cgi-bin/gettoken", timeout=5,
                      params={"corpid": logins.corp_id, "corpsecret": logins.stack.bot.secret.get_secret_value()})
    used = httpx.get(f"{logins.sim_url}/cgi-bin/auth/getuserinfo", timeout=5,
                     params={"access_token": token.json()["access_token"], "code": code})
    assert used.json()["errcode"] == 40029

    # Declined on WeCom's page: no code comes back.
    declined, _ = sign_in(browser, logins, "wecom", member, action="cancel")
    assert DECLINED in refusal(declined)
    # Someone outside the company: WeCom answers an openid, no userid.
    outsider, _ = sign_in(browser, logins, "wecom", "x", action="outsider")
    assert NOT_A_MEMBER in refusal(outsider)
    assert not signed_in(outsider)
    back = outsider.get_attribute("#back", "href")
    assert back and back.endswith("/login")
    log = logins.web_log.log_path.read_text(encoding="utf-8", errors="replace")
    assert code not in log, "a sign-in code in the page's log"
    assert "access_token=" not in log, "an access token in the page's log"
    assert "Traceback" not in log, "a traceback in the page's log"


def test_dingtalk_sign_in_and_its_refusals(logins: LoginStack, browser: object) -> None:
    staff = "s" + secrets.token_hex(4)
    page, callback = sign_in(browser, logins, "dingtalk", staff)
    assert "authCode=" in callback, "DingTalk sends the code as authCode"
    page.wait_for_selector("#chat-input", timeout=30000)
    assert signed_in(page)
    states, _ = send(page, "/help")
    assert "/reset" in states[-1]

    used = parse_qs(urlsplit(callback).query)["authCode"][0]
    again = to_platform(browser, logins, "dingtalk")
    again.goto(f"{logins.callback('dingtalk')}?{urlencode({'authCode': used, 'state': state_of(again)})}")
    assert REFUSED_CODE in refusal(again)

    outsider, _ = sign_in(browser, logins, "dingtalk", "x", action="outsider")
    assert NOT_A_MEMBER in refusal(outsider)  # getbyunionid: 60121
    denied, _ = sign_in(browser, logins, "dingtalk", staff, action="deny")
    assert DECLINED in refusal(denied)
    assert not signed_in(outsider) and not signed_in(denied)


def test_signed_in_through_wecom_the_page_has_the_members_wecom_memory(logins: LoginStack, browser: object) -> None:
    """What member X told the WeCom app reaches the engine with X's question on the page. This needs the gateway
    to make the page's {"login": "wecom", "user": X} the WeCom member wecom:<corp_id>:X (issue 19)."""
    member = "m" + secrets.token_hex(4)
    remembered = f"my parrot is called Zorblax-{secrets.token_hex(3)}"
    signer = logins.stack.signer()
    response = logins.stack.post_callback(signer.text(member, remembered))
    assert response.status_code == 200
    logins.stack.wait_delivered(member, 1, timeout=30)  # answered in WeCom: the turn is in the member's memory

    page, _ = sign_in(browser, logins, "wecom", member)
    page.wait_for_selector("#chat-input", timeout=30000)
    page.wait_for_selector("text=Engine ready", timeout=30000)
    question = f"what is my parrot called? {secrets.token_hex(3)}"
    states, _ = send(page, question)
    assert states and question in states[-1], f"the page's question was not answered: {states[-1:]}"
    deadline = time.monotonic() + 10
    asked = []
    while not asked and time.monotonic() < deadline:
        asked = [r for r in stub_requests(logins.engine_url) if r["user"] == question]
        time.sleep(0.1)
    assert asked, "the page's question never reached the engine"
    assert any(remembered in str(turn) for turn in asked[-1]["history"]), (
        "the page's question reached the engine without what the member told the WeCom app: the page is not "
        f"answering as the WeCom member (history: {asked[-1]['history']})"
    )


def test_passwords_still_sign_in_beside_the_company_logins(logins: LoginStack, browser: object) -> None:
    page = browser.new_context().new_page()  # type: ignore[attr-defined]
    page.goto(logins.page_url, wait_until="networkidle")
    page.wait_for_selector("button:has-text('Wecom')", timeout=30000)  # the form renders after the settings load
    assert page.query_selector("button:has-text('Dingtalk')")
    page.fill("input:not([type=password])", "alice")
    page.fill("input[type=password]", PASSWORD)
    page.click("button:has-text('Sign In')")
    page.wait_for_selector("#chat-input", timeout=30000)
    states, _ = send(page, "/help")
    assert "/reset" in states[-1]


def test_web_login_names_a_bot_of_the_right_kind() -> None:
    """Before the page offers a login: the named bot exists, WeCom sign-in needs a self-built app (an AI bot has
    no secret), DingTalk sign-in needs the bot's corp_id; every problem is named, none of the secrets."""
    from bots.dingtalk.config import DingTalkBotConfig
    from bots.web.config import WebBotConfig
    from bots.wecom.config import WeComAIBotConfig, WeComAppConfig
    from testkit.configs import random_aes_key
    from webchat.sso import web_login_problems

    secret = secrets.token_urlsafe(24)
    app = WeComAppConfig(id="app", corp_id="wwcorp", agent_id=1000002, secret=secret, token="t0ken-x",
                         encoding_aes_key=random_aes_key())
    ai = WeComAIBotConfig(id="ai", token="t0ken-y", encoding_aes_key=random_aes_key())
    ding = DingTalkBotConfig(id="ding", app_key="dingkey", app_secret=secret)

    def web(**login: object) -> WebBotConfig:
        return WebBotConfig(id="web", api_key=WEB_KEY, web_login=login)

    bots: list[object] = [app, ai, ding]
    assert web_login_problems(web(wecom={"bot": "app"}), bots) == []
    assert "a wecom-ai bot" in web_login_problems(web(wecom={"bot": "ai"}), bots)[0]
    assert "no bot 'nobody'" in web_login_problems(web(wecom={"bot": "nobody"}), bots)[0]
    assert "sign-in needs a wecom bot" in web_login_problems(web(wecom={"bot": "ding"}), bots)[0]
    assert "has no corp_id" in web_login_problems(web(dingtalk={"bot": "ding"}), bots)[0]
    both = web_login_problems(web(wecom={"bot": "ai"}, dingtalk={"bot": "ding"}), bots)
    assert len(both) == 2 and "web_login.wecom.bot" in both[0] and "web_login.dingtalk.bot" in both[1]
    assert secret not in " ".join(both)
    ding_with_corp = DingTalkBotConfig(id="ding", app_key="dingkey", app_secret=secret, corp_id="dingcorp")
    assert web_login_problems(web(dingtalk={"bot": "ding"}), [app, ding_with_corp]) == []


def test_an_office_signing_in_from_one_address_is_never_refused(logins: LoginStack) -> None:
    """Sign-ins that work do not spend the address's budget: more people than FAILED_CALLS_PER_NETWORK sign in
    from one address within the minute (an office behind one NAT address at nine o'clock), and every one gets in.
    Each goes through the platform's login form and the page's callback, as a browser would, without one."""
    from webchat.call_budget import FAILED_CALLS_PER_NETWORK

    exchanged_before = logins.sim_stats()["exchanged"]
    people = FAILED_CALLS_PER_NETWORK + 5
    for n in range(people):
        state = secrets.token_urlsafe(12)
        form = {"login_type": "CorpApp", "appid": logins.corp_id, "agentid": str(logins.agent_id),
                "redirect_uri": logins.callback("wecom"), "state": state, "userid": f"staff{n}", "action": "member"}
        to_page = httpx.post(f"{logins.sim_url}/wwlogin/sso/login", data=form, timeout=10)
        assert to_page.status_code == 302, to_page.text
        answer = httpx.get(to_page.headers["location"], cookies={"oauth_state": state}, timeout=10)
        assert answer.status_code < 400, (n, answer.status_code, answer.text[:300])
        assert any(name.startswith("access_token") for name in answer.cookies), (n, answer.headers)
    assert logins.sim_stats()["exchanged"] - exchanged_before == people


def test_a_flood_of_forged_callbacks_reaches_the_platform_only_so_often(logins: LoginStack) -> None:
    """The state check compares the query with a cookie the client chose, so a script can send the callback any
    code: each used to cost a platform call (and the corporation's API quota). Past FAILED_CALLS_PER_NETWORK the
    page answers 429 itself. Last in this module: it spends this address's minute."""
    from webchat.call_budget import FAILED_CALLS_PER_NETWORK

    allowed = FAILED_CALLS_PER_NETWORK
    refused_before = logins.sim_stats()["refused"]
    statuses = []
    with httpx.Client(timeout=10, headers={"Cookie": "oauth_state=s"}) as client:  # the jar would drop it
        for _ in range(allowed + 10):
            answer = client.get(logins.callback("wecom"), params={"code": secrets.token_hex(8), "state": "s"})
            statuses.append(answer.status_code)
    asked = logins.sim_stats()["refused"] - refused_before
    assert allowed - 10 <= asked <= allowed, (asked, statuses)  # the module's own refused sign-ins spent a few
    assert statuses[-10:] == [429] * 10, statuses
    assert set(statuses) <= {403, 429}, statuses
