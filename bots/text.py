"""Splitting answers to a platform's byte cap without breaking a character.

The pieces concatenate back to exactly the original text: nothing is trimmed or added,
so a reader who joins them sees the answer the engine wrote.
"""

from __future__ import annotations

_PREFERRED_BREAKS = ("\n\n", "\n", "。", "！", "？", ". ", "，", ", ", " ")


def utf8_len(text: str) -> int:
    """Length of `text` in UTF-8 bytes, the unit every platform's cap is written in."""
    return len(text.encode("utf-8"))


def utf8_prefix(text: str, max_bytes: int) -> str:
    """Longest prefix of `text` whose UTF-8 encoding fits in `max_bytes`."""
    encoded = text.encode("utf-8")[:max_bytes]
    return encoded.decode("utf-8", errors="ignore")


def split_utf8(text: str, max_bytes: int) -> list[str]:
    """Cut `text` into pieces of at most `max_bytes` UTF-8 bytes.

    A cut falls after a paragraph, line or sentence end when one lies in the second half
    of the piece, so that messages read naturally; otherwise at the last whole character.
    """
    if max_bytes < 4:
        raise ValueError("max_bytes must hold at least one UTF-8 character (4 bytes)")
    pieces: list[str] = []
    rest = text
    while utf8_len(rest) > max_bytes:
        head = utf8_prefix(rest, max_bytes)
        cut = len(head)
        for mark in _PREFERRED_BREAKS:
            at = head.rfind(mark)
            if at >= 0 and utf8_len(head[: at + len(mark)]) >= max_bytes // 2:
                cut = at + len(mark)
                break
        pieces.append(rest[:cut])
        rest = rest[cut:]
    if rest or not pieces:
        pieces.append(rest)
    return pieces
