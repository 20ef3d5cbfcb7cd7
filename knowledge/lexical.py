"""Lexical search: jieba segmentation and BM25 weights, as a sparse vector on each chunk in Qdrant.

Where the lexical index lives, and why: in the same Qdrant point as the chunk's dense vector, as a sparse vector
whose collection applies the IDF modifier. The query's terms are multiplied by their inverse document frequency,
so the dot product with our stored term weights (BM25's saturated term frequency) is the BM25 score. The embedded
store counts that frequency per knowledge base (local_index.py); a Qdrant server counts it over its collection.
One point per chunk carries both representations, so:
- a document's new version, its removal and the flip between them change both at once (a separate index file
  could fall out of step with the vectors: the stale-index complaint users of Dify have);
- the same code serves the embedded store and a Qdrant server shared by several workers, with no second file
  to lock, copy or rebuild;
- the corpus statistics (IDF) follow the points as they come and go.
Qdrant's own tokenizer does not segment Chinese, so segmentation happens here, on both sides, after both are folded
to one script (folding.py: a Traditional question finds a Simplified document and the reverse).

Terms: Chinese runs go through jieba's search mode (words and their sub-words: 空气净化器 → 空气, 净化,
净化器, 空气净化器), and each of their characters is a term too (stop characters aside): a question and a document
often cut the same idea into different words (挂失了 / 挂失, 年假 / 年休假, Cantonese 点算 / 怎么办), and the shared
characters still match, weighted by IDF like any term. Measured on three labelled sets (bench/kb_quality.py),
characters took lexical R@1 from 0.68 to 0.79 (Simplified handbook), 0.54 to 0.65 (Traditional bank FAQ) and
0.71 to 0.80 (sample company); character bigrams helped less than single characters. Latin letters and digits
stay whole words, joined across - _ . / :, lower-cased, so that a product model KX-300 or an error code 60020
matches itself and not KX-3000 or 600201; such a word also gives its parts and its joined form (KX-300 → kx300, kx,
300), so KX300 and KX 300 find it (KX-3000 shares only kx with it, and ranks below), and a short number gives a
term with the Chinese character it touches (7天), so 7天无理由 and 15天无理由 differ (lexical R@1 0.794 → 0.816,
0.636 → 0.636, 0.804 → 0.824 on the three sets).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from functools import cache

from knowledge.folding import FOLDING_SCHEME, fold

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:[-_./:][A-Za-z0-9]+)*|[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_PARTS = re.compile(r"[a-z]+|[0-9]+")  # a lower-cased word's runs of letters and of digits
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
K1, B = 1.2, 0.75
AVERAGE_TERMS = 120  # a typical chunk's term count: BM25's length normalisation without corpus-wide statistics
# recorded in the store; a change re-indexes
LEXICAL_SCHEME = f"jieba-search+chars+ascii-parts+num-unit+bm25-blake2b32/2+{FOLDING_SCHEME}"

# Words that carry no meaning in a question (written here, not taken from a list); IDF would shrink them anyway,
# but a short question has few terms and these would add noise matches. The last line: characters that are only
# ever part of a question word (怎么, 什么, 怎样) or a Cantonese particle, now that characters are terms too.
_STOPWORD_TEXT = """
的 了 吗 呢 吧 啊 呀 哦 嘛 么 是 在 和 与 或 及 而 就 都 也 还 又 很 把 被 给 让 对 从 向 为 以 于 之 其 该 此 个 些
我 你 您 他 她 它 我们 你们 他们 咱们 自己 这 那 这个 那个 这些 那些 这样 那样 这么 那么 怎么 怎样 怎么样 如何
什么 哪 哪个 哪些 哪里 哪儿 为什么 为何 多少 几 可以 能 能否 能不能 可不可以 会 要 想 请问 请 一下 有没有 是否
没有 有 啥 咋 嗯 好 的话 一个 一些 现在 还是 然后 就是 已经 应该 需要
怎 样 什 们 嘅 咗 喺 咩 啦
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@cache
def _jieba():  # jieba has no types
    import jieba

    jieba.setLogLevel(logging.WARNING)  # it announces its dictionary on every start otherwise
    jieba.initialize()
    return jieba


def _ascii_terms(token: str, after: str) -> list[str]:
    """A Latin/digit word's terms: itself, lower-cased; where it is written several ways (KX-300, KX300, KX 300;
    400-800-1234, 4008001234; iPhone15, iPhone 15) also its parts and its joined form, so that each way finds
    the others (a review found them missing each other), while KX-300 still does not match KX-3000. A short
    number says little alone ("3 天"), but with a Chinese unit it touches (7天, 3年) it is a term of its own, so
    7天无理由 and 15天无理由 differ."""
    word = token.lower()
    unit = _CJK.fullmatch(after) is not None
    if word.isdigit() and len(word) < 3:
        return [f"{word}{after}"] if unit else []
    runs = _PARTS.findall(word)
    found = [word]
    if (joined := "".join(runs)) != word:
        found.append(joined)
    if len(runs) > 1:  # a part alone only where it says something: two letters or more, three digits or more
        found += [run for run in runs if len(run) >= (3 if run.isdigit() else 2) and run not in found]
    if unit and runs[-1].isdigit():
        found.append(f"{runs[-1]}{after}")
    return found


def terms(text: str) -> list[str]:
    """The searchable terms of `text` (folded to one script), in order, with repeats."""
    out: list[str] = []
    folded = fold(text)
    for match in _TOKEN.finditer(folded):
        token = match.group()
        if token[0].isascii():
            out += _ascii_terms(token, folded[match.end() : match.end() + 1])
            continue
        # words of one character are left to the characters below (one term each, not two)
        out += [word for word in _jieba().lcut_for_search(token) if len(word) > 1 and word not in STOPWORDS]
        out += [char for char in token if char not in STOPWORDS]
    return out


def term_id(term: str) -> int:
    """A stable 32-bit id (Qdrant's sparse indices are u32): no vocabulary to share between processes; a
    collision merges two terms, about once per 90,000 distinct terms."""
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "little")


def _vector(weights: dict[int, float]) -> tuple[list[int], list[float]]:
    indices = sorted(weights)
    return indices, [weights[i] for i in indices]


def document_vector(text: str) -> tuple[list[int], list[float]]:
    """BM25's term-frequency part for each term of a chunk; Qdrant supplies the IDF part at query time."""
    found = terms(text)
    counts: Counter[int] = Counter(term_id(term) for term in found)
    norm = K1 * (1 - B + B * len(found) / AVERAGE_TERMS)
    return _vector({i: tf * (K1 + 1) / (tf + norm) for i, tf in counts.items()})


def query_vector(text: str) -> tuple[list[int], list[float]]:
    """Each distinct term of a question once: its score is then the sum of the matched terms' BM25 weights."""
    return _vector(dict.fromkeys((term_id(term) for term in terms(text)), 1.0))
