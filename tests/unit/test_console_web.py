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


@pytest.mark.parametrize(("text", "valid"), [
    ("1712345678901-0", True), ("1712345678901", True), ("18446744073709551615-0", True),
    ("18446744073709551616-0", False), ("１-0", False), ("1-2-3", False), ("-", False), ("", False),
])
def test_a_stream_id_is_one_redis_can_read(text: str, valid: bool) -> None:
    import argparse

    from gateway.cli.common import letter_id
    from gateway.state.redis_text import is_stream_id

    assert is_stream_id(text) is valid
    if valid:
        assert letter_id(text) == text
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            letter_id(text)


def test_an_unreadable_letter_shows_no_url_that_could_post_into_a_conversation() -> None:
    from gateway.console.pages.dead_letters import _without_urls

    raw = '{"reply_to": {"webhook": "https://oapi.dingtalk.com/robot/sendBySession?session=abc"}}'
    assert "dingtalk.com" not in _without_urls(raw) and "[URL]" in _without_urls(raw)
