"""The console's small guards (gateway/console/web.py): where a sign-in may send the browser, which origins may
change anything, and the bounded page sizes."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from gateway.console.web import _same_origin, bounded, safe_next


@pytest.mark.parametrize("target", [
    "//evil.example/console/", "/\\evil.example", "https://evil.example/console/", "/admin/kb", "", None,
    "/console", "javascript:alert(1)", "/console/\\\\evil.example",
])
def test_sign_in_never_sends_the_browser_elsewhere(target: str | None) -> None:
    assert safe_next(target) == "/console/"


def test_sign_in_returns_to_the_console_page_asked_for() -> None:
    assert safe_next("/console/dead-letters?before=1-0") == "/console/dead-letters?before=1-0"


def _request(headers: dict[str, str]) -> Request:
    raw = [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/console/logout", "headers": raw})


def test_a_change_from_another_origin_is_not_the_console_s() -> None:
    assert _same_origin(_request({"host": "127.0.0.1:8081", "origin": "http://127.0.0.1:8081"}))
    assert _same_origin(_request({"host": "127.0.0.1:8081"}))  # no Origin, no Referer: the CSRF token decides
    assert not _same_origin(_request({"host": "127.0.0.1:8081", "origin": "http://evil.example"}))
    assert not _same_origin(_request({"host": "127.0.0.1:8081", "origin": "null"}))  # a sandboxed frame, a file
    assert not _same_origin(_request({"host": "127.0.0.1:8081", "referer": "http://evil.example/x"}))


def test_page_sizes_are_bounded() -> None:
    assert bounded("50", 20, 200) == 50
    assert bounded("5000", 20, 200) == 200
    assert bounded("-1", 20, 200) == 20
    assert bounded("²", 20, 200) == 20
    assert bounded(None, 20, 200) == 20


@pytest.mark.parametrize(("written", "kept"), [
    ("https://ops.example.com", "https://ops.example.com"),
    ("https://ops.example.com/", "https://ops.example.com"),
    ("https://ops.example.com/console/", "https://ops.example.com"),
    ("http://10.0.0.5:8081/botgw/console", "http://10.0.0.5:8081/botgw"),
])
def test_the_console_address_is_taken_as_written(written: str, kept: str) -> None:
    from gateway.console.settings import ConsoleSettings

    assert ConsoleSettings(public_url=written).public_url == kept


@pytest.mark.parametrize("written", ["ops.example.com", "ftp://ops.example.com", "https://ops.example.com/?a=1"])
def test_a_console_address_that_cannot_work_is_refused_at_start(written: str) -> None:
    from pydantic import ValidationError

    from gateway.console.settings import ConsoleSettings

    with pytest.raises(ValidationError, match=r"console\.public_url"):
        ConsoleSettings(public_url=written)
