"""Redis answers as text: redis-py gives bytes (botgw's clients do not set decode_responses)."""

from __future__ import annotations

import re


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def is_stream_id(text: str) -> bool:
    """A Redis stream id as an operator may write one (`1712345678901-0`, or the time alone): ASCII digits, each
    number within the 64 bits Redis reads (a larger one, or `１-0`, is a Redis error, not an empty answer)."""
    if not re.fullmatch(r"[0-9]{1,20}(-[0-9]{1,20})?", text):
        return False
    return all(int(part) < 2**64 for part in text.split("-"))


def older_than(before: str) -> str | None:
    """XREVRANGE's upper bound for the entries older than stream id `before` ("+": no `before`, all of them); None
    when none can be: `0-0` is the first id, and Redis answers `(0-0` with an error, not an empty range."""
    if not before:
        return "+"
    if re.fullmatch(r"0+-0+", before):
        return None
    return f"({before}"
