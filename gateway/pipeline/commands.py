"""Chat commands a user can type instead of a question."""

from __future__ import annotations


def parse_command(text: str) -> str | None:
    """'/reset' → 'reset'; a question → None. Unknown slash words are questions, not errors."""
    word = text.strip().split(maxsplit=1)[0].lower() if text.strip() else ""
    if word in ("/reset", "/help"):
        return word[1:]
    return None
