"""Folding (knowledge/folding.py) before words are cut and text is embedded: a PDF's text layer with radicals for
characters (⽤户⼿册), compatibility ideographs, and the dashes a word processor puts into a product code lost
their terms or never matched their plain forms (found by a review)."""

from __future__ import annotations

import pytest

from knowledge.folding import fold
from knowledge.lexical import LEXICAL_SCHEME, query_vector, terms


def test_kangxi_radicals_are_the_characters_they_look_like() -> None:
    found = terms("⽤户⼿册")  # U+2F64 户 U+2F3F 册, as a PDF's text layer has them
    assert "用户" in found and "手册" in found
    assert terms("⽤户⼿册") == terms("用户手册")


def test_radicals_supplement_and_compatibility_ideographs_are_unified() -> None:
    assert fold("⻚面⻛格") == "页面风格"  # U+2EDA U+2EDB: NFKC leaves them
    assert fold("\uf90a") == "金"  # CJK COMPATIBILITY IDEOGRAPH-F90A
    assert terms("\uf9b2件") == terms("零件")  # CJK COMPATIBILITY IDEOGRAPH-F9B2, as some PDF fonts map 零


@pytest.mark.parametrize("dash", ["\u2010", "\u2011", "\u2012", "\u2013", "\u2212", "\ufe63", "\uff0d"])
def test_a_code_written_with_another_dash_matches_the_hyphen(dash: str) -> None:
    assert terms(f"KX{dash}300 的滤网") == terms("KX-300 的滤网")
    assert "kx-300" in terms(f"KX{dash}300")
    assert query_vector(f"kx{dash}300") == query_vector("KX-300")  # a question folds as a document does


def test_the_lexical_scheme_names_the_folding() -> None:
    """Stored chunks keep the words of the folding they were indexed with: a store of another scheme is re-indexed
    from its stored text when it is opened (knowledge/service.py)."""
    assert "nfkc" in LEXICAL_SCHEME
