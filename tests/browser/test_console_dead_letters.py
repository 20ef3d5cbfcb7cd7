"""The console's dead letters, in Chromium against a real gateway, worker, redis-server and the simulator: a message
whose answer WeCom refused (60020, the 可信IP refusal, never retried) is listed with why and opens with its message
and reply record; a viewer sees no replay button and is refused (403) when they post one with their own CSRF
token; an admin replays it from the page and the simulator delivers the answer once, however often the same letter
is replayed again (a second click on a stale page); purge by ticking boxes, and purge all; every change in the
audit stream with who did it; bad ids refuse the whole request."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from testkit.console import ConsoleStack, console_stack, screenshot
from testkit.processes import wait_for
from testkit.stacks import Stack

VIEWER = "viewer" + secrets.token_hex(3)
UNTRUSTED_IP = {"errcode": 60020, "errmsg": "not allow to access from your ip"}


@pytest.fixture(scope="module")
def console(stack: Stack) -> Iterator[ConsoleStack]:
    with console_stack(stack, roles={f"wecom:{VIEWER}": "viewer"}) as made:
        yield made



def letters_of(console: ConsoleStack, user: str) -> list[dict]:
    answer = console.api("GET", "/console/dead-letters?format=json&limit=200")
    assert answer.status_code == 200, answer.text
    return [letter for letter in answer.json()["letters"] if letter.get("user") == user]


def dead_letter(console: ConsoleStack, user: str, text: str) -> str:
    """A real dead letter: `user` writes `text`, the stub engine answers, WeCom refuses the send with 60020."""
    stack = console.as_stack()
    stack.fault(**UNTRUSTED_IP, times=1, touser=user)
    assert stack.post_callback(stack.signer().text(user, text)).status_code == 200
    wait_for(lambda: letters_of(console, user), 60, f"{user}'s message to be dead-lettered")
    (letter,) = letters_of(console, user)
    return letter["id"]


def test_a_dead_letter_is_shown_replayed_once_by_an_admin_and_never_by_a_viewer(
    console: ConsoleStack, browser: object
) -> None:
    stack = console.as_stack()
    user = "u" + secrets.token_hex(5)
    letter = dead_letter(console, user, "退货政策是什么？")
    assert stack.delivered(user) == []

    admin = console.sign_in_with_token(browser)
    admin.goto(f"{console.console_url}/dead-letters")
    row = admin.locator(f"tr.letter[data-id='{letter}']")
    assert "可信IP" in row.locator(".reason").inner_text()
    assert "退货政策是什么？" in row.inner_text() and user in row.inner_text()
    assert row.locator("button.replay-one").count() == 1
    screenshot(admin, "dead-letters")

    row.locator("a.show").click()
    admin.wait_for_selector("#letter-id")
    assert "可信IP" in admin.inner_text("#reason")
    assert admin.inner_text("#m-user").startswith(user) and admin.inner_text("#m-text") == "退货政策是什么？"
    assert admin.inner_text("#m-bot").startswith("app")
    # The reply record: the answer was composed (the stub engine's), its delivery failed.
    assert admin.inner_text("#reply [data-field='state'] td") == "failed"
    assert "answer to: 退货政策是什么？" in admin.inner_text("#reply [data-field='text'] td")
    screenshot(admin, "dead-letter-detail")

    # A viewer sees the letter but nothing to replay it with; the route refuses them with their own CSRF token.
    viewer = console.sign_in_with(browser, "wecom", VIEWER)
    viewer.goto(f"{console.console_url}/dead-letters")
    assert viewer.locator(f"tr.letter[data-id='{letter}']").count() == 1
    assert viewer.locator("button.replay-one, #replay-selected, #purge-selected, #purge-all, input.pick").count() == 0
    viewer.goto(f"{console.console_url}/dead-letters/{letter}")
    assert viewer.locator("#replay, #purge").count() == 0 and "可信IP" in viewer.inner_text("#reason")
    csrf = viewer.get_attribute("meta[name=csrf-token]", "content")
    assert csrf
    for route in ("replay", "purge"):
        refused = viewer.request.post(f"{console.console_url}/dead-letters/{route}", form={"csrf": csrf, "one": letter})
        assert refused.status == 403, (route, refused.status)
    assert [item["id"] for item in letters_of(console, user)] == [letter]
    time.sleep(1.0)
    assert stack.delivered(user) == [], "a viewer's refused replay sent something"

    # The fault was for one send: nothing of it is left. An admin replays from the list; a second tab still shows
    # the letter (a stale page).
    assert stack.sim_stats()["pending_faults"] == 0
    stale = admin.context.new_page()
    stale.goto(f"{console.console_url}/dead-letters")
    admin.goto(f"{console.console_url}/dead-letters")
    admin.locator(f"tr.letter[data-id='{letter}'] button.replay-one").click()
    admin.wait_for_selector(f"#results li[data-id='{letter}'][data-outcome='queued']")
    assert admin.locator(f"tr.letter[data-id='{letter}']").count() == 0
    stack.wait_delivered(user, 1, timeout=60, settle=1.0)
    stale.locator(f"tr.letter[data-id='{letter}'] button.replay-one").click()
    stale.wait_for_selector(f"#results li[data-id='{letter}'][data-outcome='missing']")
    assert "没有这封死信" in stale.inner_text("#results")
    again = console.api("POST", "/console/dead-letters/replay", json={"ids": [letter]})
    assert again.status_code == 200 and again.json() == {"results": {letter: "missing"}}
    time.sleep(4.0)  # room for a second delivery to show
    assert stack.texts(user) == ["answer to: 退货政策是什么？"], "the replayed answer did not arrive exactly once"
    assert letters_of(console, user) == []

    changes = console.api("GET", "/console/audit?format=json").json()["changes"]
    replays = [change for change in changes if change["action"] == "dead-letter.replay" and letter in change["target"]]
    assert {change["who"] for change in replays} == {"admin-token"}
    assert any('"queued"' in change["detail"] for change in replays)
    assert any('"missing"' in change["detail"] for change in replays)


def test_purge_a_selection_then_all_and_bad_ids_change_nothing(console: ConsoleStack, browser: object) -> None:
    first, second = ("u" + secrets.token_hex(5) for _ in range(2))
    kept = dead_letter(console, first, "第一封")
    dropped = dead_letter(console, second, "第二封")

    # Bad ids refuse the whole request: nothing changes, not even the good id beside them.
    for body in ({"ids": [dropped, "*"]}, {"ids": ["1-2-3"]}, {"ids": []}, {"ids": "all"}):
        refused = console.api("POST", "/console/dead-letters/purge", json=body)
        assert refused.status_code == 400, (body, refused.text)
    assert console.api("GET", "/console/dead-letters/not-an-id?format=json").status_code == 400
    assert [item["id"] for item in letters_of(console, second)] == [dropped]
    unknown = console.api("POST", "/console/dead-letters/purge", json={"ids": ["1-0"]})
    assert unknown.json() == {"results": {"1-0": "missing"}}
    assert len(letters_of(console, first)) == len(letters_of(console, second)) == 1

    admin = console.sign_in_with_token(browser, lang="en")
    admin.on("dialog", lambda dialog: dialog.accept())  # type: ignore[attr-defined]
    admin.goto(f"{console.console_url}/dead-letters")
    admin.check(f"tr.letter[data-id='{dropped}'] input.pick")
    admin.click("#purge-selected")
    admin.wait_for_selector(f"#results li[data-id='{dropped}'][data-outcome='purged']")
    assert "purged" in admin.inner_text("#results")
    assert letters_of(console, second) == [] and [item["id"] for item in letters_of(console, first)] == [kept]

    admin.click("#purge-all")
    admin.wait_for_selector("#purged")
    assert int(admin.get_attribute("#purged", "data-count") or 0) >= 1
    assert admin.locator("#empty").count() == 1 and letters_of(console, first) == []
    assert console.as_stack().dead_letters() == 0
    actions = [change["action"] for change in console.api("GET", "/console/audit?format=json").json()["changes"]]
    assert "dead-letter.purge" in actions and "dead-letter.purge-all" in actions
