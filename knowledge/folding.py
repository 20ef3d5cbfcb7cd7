"""One written form for matching: Unicode compatibility forms to their plain ones, Traditional Chinese folded to
Simplified.

Taiwan and Hong Kong customers write Traditional, mainland documents are Simplified, and a company's own files
often mix both. jieba's dictionary is Simplified and the embedding model has seen far more Simplified text, so a
question in one script and its answer in the other share no words and only part of their meaning. Both sides are
folded before they are embedded and before they are cut into terms (the same `fold`, at index and at query time);
what is stored, shown and cited stays as it was written.

NFKC's mappings, for the characters that are letters of a word: full-width letters and digits and the marks that join
a code (ＫＸ－３００) become ASCII, the compatibility ideographs (U+F900–FAFF, U+2F800–2FA1F) and the Kangxi radicals
(U+2F00–2FDF) their unified characters. Not NFKC whole: Chinese punctuation (，？！：) stays as Chinese writes it, for
the embedding model as for the reader. A PDF's text layer often holds radicals
where the page shows characters (⽤户⼿册 for 用户手册: found by a review), and a term that is not the word's is never
found. NFKC leaves the CJK Radicals Supplement (U+2E80–2EFF) alone; the ones that stand for a whole character
(Unicode's EquivalentUnifiedIdeograph.txt) are mapped here (⻚ → 页). The dashes a word processor writes into a code
(KX‐300, KX–300, KX−300) become the hyphen it is indexed with.

OpenCC's `tw2sp` is used, not plain `t2s`: it also maps Taiwan's words to the mainland's (網路 → 网络, 軟體 → 软件,
印表機 → 打印机), which `t2s` leaves as 网路, 软体, 印表机 and so still unmatched. Simplified text passes through
unchanged.
"""

from __future__ import annotations

import unicodedata
from functools import cache

# part of the lexical scheme in the store: a change re-indexes every chunk's words from its stored text when the store
# is next opened (knowledge/service.py)
FOLDING_SCHEME = "nfkc-letters+radicals+dashes+opencc-tw2sp"


@cache
def _converter():  # opencc has no types
    import opencc

    return opencc.OpenCC("tw2sp")


# CJK Radicals Supplement characters that are a whole character's shape, and that character
_RADICALS = (
    "⺠民 ⺩王 ⻄西 ⻅见 ⻆角 ⻉贝 ⻋车 ⻑長 ⻓长 ⻔门 ⻗雨 ⻘青 ⻙韦 ⻚页 ⻛风 "
    "⻜飞 ⻝食 ⻢马 ⻣骨 ⻤鬼 ⻥鱼 ⻦鸟 ⻧卤 ⻨麦 ⻩黄 ⻪黾 ⻬齐 ⻮齿 ⻰龙 ⻱龜"
)
# hyphen, non-breaking hyphen, figure dash, en dash, minus sign, small and full-width hyphen-minus (not the em dash:
# Chinese writes —— as punctuation)
_DASHES = "\u2010\u2011\u2012\u2013\u2212\ufe63\uff0d"
_COMPATIBLE = [
    (0xFF10, 0xFF19), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A),  # ０-９ Ａ-Ｚ ａ-ｚ
    (0xF900, 0xFAFF), (0x2F800, 0x2FA1F), (0x2F00, 0x2FDF),  # compatibility ideographs, Kangxi radicals
]
_NFKC = {
    code: unicodedata.normalize("NFKC", chr(code))
    for start, end in _COMPATIBLE
    for code in range(start, end + 1)
    if unicodedata.normalize("NFKC", chr(code)) != chr(code)
} | {ord(mark): unicodedata.normalize("NFKC", mark) for mark in "．／：＿"}
_PLAIN = str.maketrans(
    _NFKC | {ord(pair[0]): pair[1] for pair in _RADICALS.split()} | dict.fromkeys(map(ord, _DASHES), "-")
)


def fold(text: str) -> str:
    """`text` in the one form search compares: compatibility forms, radicals and dashes to the characters they
    stand for, Traditional (and Taiwan's words) to Simplified."""
    return _converter().convert(text.translate(_PLAIN))
