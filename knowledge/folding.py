"""One written form for matching: Traditional Chinese folded to Simplified, full-width forms to ASCII.

Taiwan and Hong Kong customers write Traditional, mainland documents are Simplified, and a company's own files
often mix both. jieba's dictionary is Simplified and the embedding model has seen far more Simplified text, so a
question in one script and its answer in the other share no words and only part of their meaning. Both sides are
folded before they are embedded and before they are cut into terms; what is stored, shown and cited stays as it
was written.

OpenCC's `tw2sp` is used, not plain `t2s`: it also maps Taiwan's words to the mainland's (網路 → 网络, 軟體 → 软件,
印表機 → 打印机), which `t2s` leaves as 网路, 软体, 印表机 and so still unmatched. Simplified text passes through
unchanged. Full-width letters, digits and the marks that join a code (ＫＸ－３００) become the ASCII a product code
is indexed as; full-width punctuation (，？！) is left as Chinese writes it.
"""

from __future__ import annotations

from functools import cache

FOLDING_SCHEME = "fullwidth-alnum+opencc-tw2sp"  # part of the lexical scheme in the store: a change re-indexes


@cache
def _converter():  # opencc has no types
    import opencc

    return opencc.OpenCC("tw2sp")


_FULL_WIDTH = {
    code: code - 0xFEE0
    for start, end in ((0xFF10, 0xFF19), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A))  # ０-９ Ａ-Ｚ ａ-ｚ
    for code in range(start, end + 1)
} | {ord(mark): ord(mark) - 0xFEE0 for mark in "－．／：＿"}


def fold(text: str) -> str:
    """`text` in the one form search compares: full-width codes to ASCII, Traditional (and Taiwan's words) to
    Simplified."""
    return _converter().convert(text.translate(_FULL_WIDTH))
