"""Splitting answers to byte caps: never a broken character, nothing lost."""

from __future__ import annotations

import random

import pytest

from bots.text import split_utf8, utf8_len

SAMPLES = [
    "企业微信机器人回答问题。" * 420,  # ~5,000 bytes of Chinese
    "mixed 中文 and emoji 😀🎉 text, with punctuation。\n" * 150,
    "x" * 9000,
    "",
    "短",
]


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("cap", [2048, 4096, 7])
def test_pieces_fit_and_rejoin(text: str, cap: int) -> None:
    pieces = split_utf8(text, cap)
    assert "".join(pieces) == text
    assert all(utf8_len(piece) <= cap for piece in pieces)
    assert all(piece for piece in pieces) or text == ""


def test_five_thousand_bytes_of_chinese_make_several_messages() -> None:
    text = "".join(random.Random(7).choice("中文回答测试企业微信钉钉，。") for _ in range(1700))
    assert utf8_len(text) > 5000
    pieces = split_utf8(text, 2048)
    assert len(pieces) == 3
    assert "".join(pieces) == text


def test_prefers_a_line_break() -> None:
    text = "a" * 1500 + "\n" + "b" * 1000
    assert split_utf8(text, 2048)[0] == "a" * 1500 + "\n"


def test_cap_too_small_is_an_error() -> None:
    with pytest.raises(ValueError):
        split_utf8("abc", 3)
