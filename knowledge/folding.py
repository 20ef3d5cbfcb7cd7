"""One written form for matching: Traditional Chinese folded to Simplified, full-width forms to ASCII.

Taiwan and Hong Kong customers write Traditional, mainland documents are Simplified, and a company's own files
often mix both. jieba's dictionary is Simplified and the embedding model has seen far more Simplified text, so a
question in one script and its answer in the other share no words and only part of their meaning. Both sides are
folded before they are embedded and before they are cut into terms; what is stored, shown and cited stays as it
was written.

OpenCC's `tw2sp` is used, not plain `t2s`: it also maps Taiwan's words to the mainland's (網路 → 网络, 軟體 → 软件,
印表機 → 打印机), which `t2s` leaves as 网路, 软体, 印表机 and so still unmatched. Simplified text passes through
unchanged. NFKC first turns full-width letters and digits (ＫＸ－３００) into the ASCII a product code is indexed as.
"""

from __future__ import annotations

import unicodedata
from functools import cache

FOLDING_SCHEME = "nfkc+opencc-tw2sp"  # part of the lexical scheme recorded in the store: a change means re-indexing


@cache
def _converter():  # opencc has no types
    import opencc

    return opencc.OpenCC("tw2sp")


def fold(text: str) -> str:
    """`text` in the one form search compares: NFKC, then Traditional (and Taiwan's words) to Simplified."""
    return _converter().convert(unicodedata.normalize("NFKC", text))
