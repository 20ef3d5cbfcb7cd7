"""The console's guards against a crafted request (gateway/console/web.py): where a sign-in may send the browser
however the path is written, and which cursors and ids reach Redis."""

from __future__ import annotations

import pytest

from gateway.console.web import safe_next
from gateway.state.redis_text import is_stream_id as stream_id


@pytest.mark.parametrize("target", [
    "/console/../admin/kb", "/console/%2e%2e/admin", "/console/.%2E/admin", "/console/./x/../../admin",
    "/console/%2F..%2F..%2Fadmin", "/console/\t/../admin", "/console/\n//evil.example", "/console/%5C..%5Cadmin",
    "/console/" + "a" * 5000,
])
def test_a_path_a_browser_resolves_out_of_the_console_is_refused(target: str) -> None:
    assert safe_next(target) == "/console/"


@pytest.mark.parametrize("target", ["/console/knowledge?kb=a.b", "/console/dead-letters?before=1-0",
                                    "/console/limits?who=wecom%3Azhangsan", "/console/x..y/"])
def test_console_pages_are_kept(target: str) -> None:
    assert safe_next(target) == target


def test_only_ids_redis_reads_are_cursors() -> None:
    assert stream_id("1712345678901-0") and stream_id("1712345678901") and stream_id("18446744073709551615-0")
    for junk in ("", "-", "1-2-3", "18446744073709551616-0", "1-18446744073709551616", "99999999999999999999-0",
                 "1-0 ", "１-0", "+", "(1-0"):
        assert not stream_id(junk), junk
