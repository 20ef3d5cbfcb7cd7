"""Redis answers as text: redis-py gives bytes (botgw's clients do not set decode_responses)."""

from __future__ import annotations


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
