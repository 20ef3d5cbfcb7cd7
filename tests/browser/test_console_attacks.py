"""The operator console as an attacker tries it, against a real gateway, worker, redis-server and the simulator:
another scheme's Authorization header (a proxy's Basic auth) never hides the session; a session opened with the
admin token ends when the token is changed; the session cookie is Secure behind an https console; a sign-in never
sends the browser out of the console (`..`, encoded dots, `//`); every answer under /console carries the security
headers (redirects, 404s, static files, errors); junk cursors and ids are refused, never a crash; every change
refuses a lesser role and a forged request (cookie alone, another origin, text/plain or multipart bodies) and audits
nothing then; what users and platforms wrote is never markup in any page; no secret in a page, JSON or the log."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import time
from collections.abc import Iterator
from urllib.parse import unquote

import httpx
import pytest

from gateway.state.keys import Keys
from testkit.configs import write_config
from testkit.console import ConsoleStack, console_stack
from testkit.processes import free_port, wait_for
from testkit.services import start_gateway
from testkit.stacks import Stack

VIEWER = "viewer" + secrets.token_hex(3)
EDITOR = "editor" + secrets.token_hex(3)
SECURITY = ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy")
XSS = '<img src=x id=pwned onerror="window.pwned=1">"\'><script>window.pwned=2</script>'


@pytest.fixture(scope="module")
def console(stack: Stack) -> Iterator[ConsoleStack]:
    roles = {f"wecom:{VIEWER}": "viewer", f"wecom:{EDITOR}": "editor"}
    with console_stack(stack, roles=roles) as made:
        yield made


def token_session(console: ConsoleStack, admin_url: str | None = None, token: str | None = None) -> httpx.Response:
    """The admin token typed into the sign-in form (what the page posts): the answer, with its Set-Cookie."""
    return httpx.post(f"{admin_url or console.admin_url}/console/login", timeout=10,
                      data={"token": token or console.token, "next": "/console/audit"})  # fmt: skip


def session_of(console: ConsoleStack, who: str, via: str = "wecom") -> tuple[str, str]:
    """A signed-in session of `who` as the sign-in leaves it in Redis: (cookie, CSRF token)."""
    cookie, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    key = Keys(console.namespace).console_session(hashlib.sha256(cookie.encode()).hexdigest())
    console.stack.redis.hset(key, mapping={"who": who, "via": via, "csrf": csrf})
    console.stack.redis.expire(key, 600)
    return cookie, csrf


def admin_session(console: ConsoleStack) -> tuple[str, str]:
    """The admin token typed in: (cookie, the CSRF token its pages carry)."""
    cookie = token_session(console).cookies["botgw_console"]
    page = get(console, "/console/audit", cookie, Accept="text/html")
    found = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert found, page.text[:300]
    return cookie, found.group(1)


def wrong(token: str) -> str:
    """The token with its last character changed: never the token itself (ending it in a fixed "xx" was the same
    token once in 4,096, and a CI run failed on it)."""
    return token[:-1] + ("a" if token[-1] != "a" else "b")


def get(console: ConsoleStack, path: str, cookie: str = "", **headers: str) -> httpx.Response:
    return httpx.get(f"{console.admin_url}{path}", headers=headers, timeout=10,
                     cookies={"botgw_console": cookie} if cookie else None)  # fmt: skip


def changes(console: ConsoleStack) -> list[dict]:
    """The audit stream's changes, sign-ins left out (the tests sign in as they go)."""
    every = console.api("GET", "/console/audit?format=json&limit=200").json()["changes"]
    return [change for change in every if change["action"] != "sign-in"]


def test_another_scheme_of_authorization_does_not_hide_the_session(console: ConsoleStack) -> None:
    """A proxy in front of the admin listener asking for Basic auth makes the browser send `Authorization: Basic`
    with every request: the console's own session must still count (it was refused with 401)."""
    cookie, _ = session_of(console, console.wecom_identity(VIEWER))
    basic = get(console, "/console/audit?format=json", cookie, Authorization="Basic b3BzOnNlY3JldA==")
    assert basic.status_code == 200, basic.text
    # A script's Bearer credential that is wrong stays refused, cookie or not: it said who it is, wrongly.
    wrong = get(console, "/console/audit?format=json", cookie, Authorization="Bearer not-the-token")
    assert wrong.status_code == 401
    # Basic alone is no credential.
    assert get(console, "/console/audit?format=json", Authorization="Basic b3BzOnNlY3JldA==").status_code == 401


def test_a_token_session_ends_when_the_token_changes_and_is_secure_behind_https(console: ConsoleStack) -> None:
    """Sign in with the admin token, then the token is changed (a leaked one rotated): the sessions opened with the
    old token must end, on every gateway; a console reached through https sets its cookie Secure."""
    signed = token_session(console)
    assert signed.status_code == 303
    old_cookie = signed.cookies["botgw_console"]
    assert get(console, "/console/audit?format=json", old_cookie).status_code == 200

    rotated = "rotated-" + secrets.token_urlsafe(24)
    config = {**console.config, "admin": {"token": rotated},
              "console": {**console.config["console"], "public_url": "https://ops.example.com"}}  # fmt: skip
    path = write_config(console.stack.log_dir / f"{console.namespace}-rotated.yaml", config)
    gateway = start_gateway(path, free_port(), console.stack.log_dir, f"gw-{console.namespace}-rotated")
    try:
        after = httpx.get(f"{gateway.admin_url}/console/audit?format=json", cookies={"botgw_console": old_cookie},
                          timeout=10)  # fmt: skip
        assert after.status_code == 401, "a session of the old admin token still works after the token changed"
        assert token_session(console, gateway.admin_url).status_code == 401  # the old token typed in: refused
        fresh = token_session(console, gateway.admin_url, rotated)
        assert fresh.status_code == 303
        set_cookie = fresh.headers["set-cookie"].lower()
        assert "httponly" in set_cookie and "samesite=lax" in set_cookie
        assert "secure" in set_cookie, "the session cookie of an https console is not Secure"
        cookie = fresh.cookies["botgw_console"]
        assert httpx.get(f"{gateway.admin_url}/console/audit?format=json", cookies={"botgw_console": cookie},
                         timeout=10).status_code == 200  # fmt: skip
    finally:
        gateway.stop()


@pytest.mark.parametrize("target", [
    "/console/../admin/kb", "/console/%2e%2e/admin/kb", "/console/.%2E/admin/kb", "/console/./../admin/kb",
    "//evil.example/", "/console/\t/../../admin", "https://evil.example/console/", "%2F%2Fevil.example",
    "/console/%2F..%2F..%2Fadmin",
])
def test_a_sign_in_never_leaves_the_console(console: ConsoleStack, target: str) -> None:
    """`next` of the token form, of the sign-in page, of the language switch and of the platform's state cookie
    is a console page, however written: never a path a browser resolves out of /console/."""
    def inside(location: str) -> None:
        resolved = str(httpx.URL(f"{console.admin_url}/console/login").join(location))
        assert resolved.startswith(f"{console.admin_url}/console/"), (target, location, resolved)
        assert ".." not in unquote(location) and "%2e" not in location.lower(), (target, location)

    signed = httpx.post(f"{console.console_url}/login", data={"token": console.token, "next": target}, timeout=10)
    assert signed.status_code == 303
    inside(signed.headers["location"])
    cookie = signed.cookies["botgw_console"]
    again = httpx.get(f"{console.console_url}/login", params={"next": target}, cookies={"botgw_console": cookie},
                      timeout=10)  # fmt: skip
    inside(again.headers["location"])
    inside(httpx.get(f"{console.console_url}/lang/en", params={"next": target}, timeout=10).headers["location"])
    away = httpx.get(f"{console.console_url}/login/wecom", params={"next": target}, timeout=10)
    assert away.status_code == 303
    state = unquote(away.cookies["botgw_console_state"].strip('"'))
    inside(state.partition("|")[2])


def test_every_answer_under_the_console_carries_the_security_headers(console: ConsoleStack) -> None:
    cookie, csrf = session_of(console, console.wecom_identity(VIEWER))
    admin, admin_csrf = admin_session(console)
    answers = {
        "static": get(console, "/console/static/console.js"),
        "static 404": get(console, "/console/static/nope.js"),
        "unknown page": get(console, "/console/nope", cookie),
        "root redirect": httpx.get(console.console_url, timeout=10),
        "signed-in login redirect": get(console, "/console/login", cookie),
        "language": get(console, "/console/lang/en?next=/console/"),
        "platform sign-in": get(console, "/console/login/wecom"),
        "wrong method": get(console, "/console/logout", cookie),
        "sign-out": httpx.post(f"{console.console_url}/logout", data={"csrf": csrf}, timeout=10,
                               cookies={"botgw_console": cookie}),
        "purge-all redirect": httpx.post(f"{console.console_url}/dead-letters/purge", timeout=10,
                                         data={"all": "1", "csrf": admin_csrf}, cookies={"botgw_console": admin}),
    }
    for name, answer in answers.items():
        missing = [header for header in SECURITY if header not in answer.headers]
        assert not missing, (name, answer.status_code, missing)
        assert "frame-ancestors 'self'" in answer.headers["content-security-policy"], name


@pytest.mark.parametrize("path", [
    "/console/audit?before=1-2-3", "/console/audit?before=-", "/console/audit?before=99999999999999999999999-0",
    "/console/dead-letters?before=99999999999999999999-0", "/console/dead-letters/99999999999999999999-0",
    "/console/dead-letters?limit=99999999999999999999999&before=1-0", "/console/kf?offset=-5&limit=%00",
    "/console/knowledge?offset=99999999999999999999&limit=abc", "/console/tools?limit=1e9&since=999999999999d",
    "/console/limits?who=" + "x" * 5000, "/console/audit?before=１-0", "/console/dead-letters?before=１-0",
    "/console/dead-letters/１-0",
])
def test_junk_cursors_and_page_sizes_are_refused_not_a_crash(console: ConsoleStack, path: str) -> None:
    answer = console.api("GET", path)
    assert answer.status_code < 500, (path, answer.status_code, answer.text[:300])
    assert answer.status_code in (200, 400), (path, answer.status_code)


def test_a_purge_of_an_id_redis_cannot_read_is_refused(console: ConsoleStack) -> None:
    for route in ("purge", "replay"):
        answer = console.api("POST", f"/console/dead-letters/{route}", json={"ids": ["99999999999999999999-0"]})
        assert answer.status_code == 400, (route, answer.status_code, answer.text[:200])


def test_a_json_body_nested_too_deeply_or_not_an_object_is_a_400(console: ConsoleStack) -> None:
    """json.loads raises RecursionError (not a ValueError) on deep nesting: it was answered 500."""
    bodies = {"deep": b"[" * 30_000 + b"]" * 30_000, "a list": b'["1-0"]', "not JSON": b"{"}
    for route in ("/console/dead-letters/replay", "/console/limits/reset"):
        for name, body in bodies.items():
            answer = console.api("POST", route, content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, (route, name, answer.status_code, answer.text[:200])
    assert console.api("GET", "/healthz").status_code == 200


CHANGES = [  # (route, the role it needs, a body that would change something)
    ("/console/dead-letters/replay", "admin", {"one": "1-0"}),
    ("/console/dead-letters/purge", "admin", {"all": "1"}),
    ("/console/limits/reset", "admin", {"who": "wecom:someone"}),
    ("/console/kf/handoff", "editor", {"bot": "kf", "customer": "wmcustomer", "to": "queue"}),
    ("/console/knowledge/kb1/remove", "editor", {"doc": "a.md"}),
    ("/console/knowledge/kb1/documents", "editor", {}),
    ("/console/logout", "viewer", {}),
]


def test_every_change_refuses_a_lesser_role_and_a_forged_request_and_audits_nothing(console: ConsoleStack) -> None:
    before = len(changes(console))
    viewer, viewer_csrf = session_of(console, console.wecom_identity(VIEWER))
    editor, editor_csrf = session_of(console, console.wecom_identity(EDITOR))
    origin = console.admin_url
    for route, role, body in CHANGES:
        url = f"{console.admin_url}{route}"
        lesser = [(viewer, viewer_csrf)] if role == "editor" else [(viewer, viewer_csrf), (editor, editor_csrf)]
        if role != "viewer":
            for cookie, csrf in lesser:  # with their own valid CSRF token, as a form and as a script's JSON
                jar = {"botgw_console": cookie}
                form = httpx.post(url, data={**body, "csrf": csrf}, cookies=jar, timeout=10, headers={"Origin": origin})
                assert form.status_code == 403, (route, form.status_code)
                sent = httpx.post(url, json=body, cookies=jar, timeout=10,
                                  headers={"X-CSRF-Token": csrf, "Origin": origin, "Accept": "application/json"})
                assert sent.status_code == 403, (route, sent.status_code)
        admin, admin_csrf = admin_session(console)
        jar = {"botgw_console": admin}
        forged = {
            "cookie alone": httpx.post(url, data=body, cookies=jar, timeout=10),
            "another origin": httpx.post(url, data={**body, "csrf": admin_csrf}, cookies=jar, timeout=10,
                                         headers={"Origin": "http://evil.example"}),
            "origin null": httpx.post(url, data={**body, "csrf": admin_csrf}, cookies=jar, timeout=10,
                                      headers={"Origin": "null"}),
            "referer elsewhere": httpx.post(url, data={**body, "csrf": admin_csrf}, cookies=jar, timeout=10,
                                            headers={"Referer": "http://evil.example/x"}),
            "text/plain": httpx.post(url, content=f"csrf={admin_csrf}&one=1-0", cookies=jar, timeout=10,
                                     headers={"Content-Type": "text/plain"}),
            "multipart": httpx.post(url, data={**body, "csrf": admin_csrf}, files={"files": ("a.md", b"# a")},
                                    cookies=jar, timeout=10),
            "wrong token": httpx.post(url, data={**body, "csrf": wrong(admin_csrf)}, cookies=jar, timeout=10),
        }
        for name, answer in forged.items():
            assert answer.status_code == 403, (route, name, answer.status_code)
        # the admin's session was not ended by a forged sign-out
        assert get(console, "/console/audit?format=json", admin).status_code == 200
    assert len(changes(console)) == before, "a refused change was written to the audit stream"


def test_no_get_changes_anything(console: ConsoleStack) -> None:
    cookie, _ = admin_session(console)
    before = len(changes(console))
    for path in ("/console/dead-letters/replay", "/console/dead-letters/purge?all=1", "/console/limits/reset?who=x",
                 "/console/kf/handoff?bot=kf&customer=c&to=queue", "/console/logout", "/console/knowledge/k/remove"):
        assert get(console, path, cookie).status_code in (400, 404, 405), path
    assert get(console, "/console/audit?format=json", cookie).status_code == 200
    assert len(changes(console)) == before


def test_what_users_wrote_is_never_markup(console: ConsoleStack, browser: object) -> None:
    """A message's text (the dead letter and its reply record), a document's name and a refused identity come from
    users and platforms: each page shows them as text."""
    stack = console.as_stack()
    user = "u" + secrets.token_hex(5)
    stack.fault(errcode=60020, errmsg="not allow to access from your ip " + XSS, times=1, touser=user)
    assert stack.post_callback(stack.signer().text(user, XSS)).status_code == 200

    def letter() -> str:
        letters = console.api("GET", "/console/dead-letters?format=json&limit=200").json()["letters"]
        return next((item["id"] for item in letters if item.get("user") == user), "")

    wait_for(letter, 60, "the message to be dead-lettered")
    found = letter()
    upload = console.api("POST", "/console/knowledge/xss/documents",
                         files={"files": ('<img src=x onerror="window.pwned=3">.md', b"# t\n\nbody text")})
    assert upload.status_code in (200, 400, 415), upload.text
    page = console.sign_in_with_token(browser)
    for path in (f"/dead-letters/{found}", "/dead-letters", "/knowledge?kb=xss&q=" + XSS, "/limits?who=" + XSS,
                 "/tools?user=" + XSS + "&since=" + XSS[:20], "/audit", f"/knowledge?kb=xss&removed={XSS}"):
        page.goto(f"{console.console_url}{path}")
        page.wait_for_load_state("load")
        assert page.evaluate("() => window.pwned") is None, path
        assert page.locator("#pwned, main script").count() == 0, path
    page.goto(f"{console.console_url}/dead-letters/{found}")
    assert page.inner_text("#m-text") == XSS


def test_no_secret_in_any_page_json_or_the_log(console: ConsoleStack, browser: object) -> None:
    page = console.sign_in_with_token(browser)
    csrf = page.get_attribute("meta[name=csrf-token]", "content")
    cookie = next(c["value"] for c in page.context.cookies() if c["name"] == "botgw_console")
    bot = console.config["bots"][0]
    secret_values = [console.token, cookie, bot["secret"], bot["token"], bot["encoding_aes_key"]]
    for path in ("/", "/dead-letters", "/knowledge", "/kf", "/limits", "/tools", "/audit", "/config"):
        page.goto(f"{console.console_url}{path}")
        html = page.content()
        assert not [value for value in secret_values if value in html], path
        shown = console.api("GET", f"/console{path}?format=json").text
        assert not [value for value in secret_values if value in shown], path
    time.sleep(0.5)
    log = console.gateway_log()
    assert not [value for value in [*secret_values, csrf] if value in log]


def test_a_platform_sign_in_needs_this_browser_s_state_and_a_new_code(console: ConsoleStack) -> None:
    """The WeCom sign-in's way back: a forged state, a state cookie of another attempt, and a code used once
    (replayed on this gateway or another of the deployment) are refused, and open no session."""
    away = httpx.get(f"{console.console_url}/login/wecom", params={"next": "/console/audit"}, timeout=10)
    state_cookie = away.cookies["botgw_console_state"]
    login_page = httpx.URL(away.headers["location"])
    form = {**dict(login_page.params), "action": "member", "userid": VIEWER}
    back = httpx.post(str(login_page.copy_with(query=None)), data=form, timeout=10)
    assert back.status_code == 302, back.text[:300]
    callback = httpx.URL(back.headers["location"])
    assert callback.params["state"] and callback.params["code"]

    def arrive(url: httpx.URL, cookie: str, admin_url: str | None = None) -> httpx.Response:
        base = admin_url or console.admin_url
        return httpx.get(f"{base}{url.raw_path.decode()}", cookies={"botgw_console_state": cookie}, timeout=10)

    forged = arrive(callback.copy_merge_params({"state": "forged"}), state_cookie)
    assert forged.status_code == 403 and "botgw_console" not in forged.cookies
    other = httpx.get(f"{console.console_url}/login/wecom", timeout=10).cookies["botgw_console_state"]
    assert arrive(callback, other).status_code == 403  # another attempt's state cookie
    assert arrive(callback, "").status_code == 403
    signed = arrive(callback, state_cookie)
    assert signed.status_code == 303 and signed.headers["location"] == "/console/audit"
    assert "botgw_console" in signed.cookies
    replayed = arrive(callback, state_cookie)
    assert replayed.status_code == 403 and "botgw_console" not in replayed.cookies
    config = {**console.config, "admin": {"token": console.token}}
    path = write_config(console.stack.log_dir / f"{console.namespace}-second.yaml", config)
    second = start_gateway(path, free_port(), console.stack.log_dir, f"gw-{console.namespace}-second")
    try:
        elsewhere = arrive(callback, state_cookie, second.admin_url)
        assert elsewhere.status_code == 403 and "botgw_console" not in elsewhere.cookies
    finally:
        second.stop()


def test_the_token_form_with_no_token_configured_an_empty_token_or_a_huge_form(console: ConsoleStack) -> None:
    huge = httpx.post(f"{console.console_url}/login", data={"token": "x" * 1_000_000}, timeout=30)
    assert huge.status_code == 413 and "botgw_console" not in huge.cookies
    for typed in ("", " ", console.token[:-1], console.token + "x"):
        wrong = httpx.post(f"{console.console_url}/login", data={"token": typed}, timeout=10)
        assert wrong.status_code == 401 and "botgw_console" not in wrong.cookies, typed
    config = {key: value for key, value in console.config.items() if key != "admin"}
    path = write_config(console.stack.log_dir / f"{console.namespace}-no-token.yaml", config)
    bare = start_gateway(path, free_port(), console.stack.log_dir, f"gw-{console.namespace}-no-token")
    try:
        for typed in ("", "None", "null"):
            refused = httpx.post(f"{bare.admin_url}/console/login", data={"token": typed}, timeout=10)
            assert refused.status_code == 401 and "botgw_console" not in refused.cookies, typed
        for header in ("Bearer None", "Bearer", "Bearer x"):
            answer = httpx.get(f"{bare.admin_url}/console/audit?format=json", headers={"Authorization": header},
                               timeout=10)  # fmt: skip
            assert answer.status_code == 401, header
        assert "id=\"token\"" not in httpx.get(f"{bare.admin_url}/console/login", timeout=10).text
    finally:
        bare.stop()


def test_guessing_the_admin_token_is_throttled(console: ConsoleStack) -> None:
    """Wrong tokens typed in from one address: after 10 in a minute, 429 with Retry-After (the right token too,
    until the minute is over); a script's Bearer and the other addresses' sign-ins are not affected. On a gateway
    of its own namespace, so that the module's other sign-ins are not throttled."""
    config = {**console.config, "namespace": console.namespace + "g"}
    path = write_config(console.stack.log_dir / f"{console.namespace}-guess.yaml", config)
    gateway = start_gateway(path, free_port(), console.stack.log_dir, f"gw-{console.namespace}-guess")
    try:
        url = f"{gateway.admin_url}/console/login"

        async def guess_at_once(count: int) -> list[int]:  # in parallel: read-compare-count let 13 of 60 past 10
            async with httpx.AsyncClient(timeout=20) as http:
                answers = await asyncio.gather(*(http.post(url, data={"token": secrets.token_urlsafe(24)})
                                                 for _ in range(count)))  # fmt: skip
            return [answer.status_code for answer in answers]

        codes = asyncio.run(guess_at_once(30))
        assert sorted(codes) == [401] * 10 + [429] * 20, codes
        guessed = httpx.post(url, data={"token": console.token}, timeout=10)
        assert guessed.status_code == 429 and "botgw_console" not in guessed.cookies
        assert int(guessed.headers["retry-after"]) > 0
        script = httpx.get(f"{gateway.admin_url}/console/audit?format=json", timeout=10,
                           headers={"Authorization": f"Bearer {console.token}"})
        assert script.status_code == 200
    finally:
        gateway.stop()
