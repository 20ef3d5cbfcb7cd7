"""Knowledge search quality on labelled Chinese sets: R@1/3/10 and MRR@10 for every mode and fusion, next to plain
BM25 over jieba; the ingestion rate of `kb add`; search latency.

Why: the fusion, the folding of scripts and the reranker are chosen by what they do to the right answer's rank on
questions nobody tuned them on. Three sets, each written for this project (bench/data/kb_quality/*/README.md):
- `zh_hans`: a company's handbook and product support pages (Simplified, one Markdown file a document, near-miss
  distractors), 136 questions; the unit of an answer is the document.
- `zh_hant`: a bank's customer-service FAQ (Traditional, one CSV of 150 Q&A rows with a title column),
  110 questions, a fifth of them asked in Simplified; the unit is the row.
- `fixtures`: the sample company of tests/fixtures/kb (every format), 44 questions; the unit is the chunk that holds
  the labelled phrase.

Each set goes into a store of its own through the same `Knowledge.add` that `botgw kb add` runs, then every
question's dense and lexical candidates are taken once (as `botgw kb search` takes them) and ranked by each mode and
fusion. `hybrid − best single` is given with a 95% bootstrap interval (paired over questions, 2,000 resamples).

Run: `.venv/bin/python bench/kb_quality.py [--sets zh_hans,zh_hant,fixtures] [--rerank-url URL]`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from knowledge.config import KnowledgeSettings, SearchSettings  # noqa: E402
from knowledge.search import Hit, fuse, per_document  # noqa: E402
from knowledge.service import Knowledge  # noqa: E402

DATA = ROOT / "bench" / "data" / "kb_quality"
FIXTURES = ROOT / "tests" / "fixtures" / "kb"
CUTOFFS = (1, 3, 10)


@dataclass(frozen=True)
class Question:
    query: str
    relevant: Callable[[Hit], bool]  # whether a hit is (part of) the answer
    unit: str  # "doc": hits are collapsed to documents before ranking; "chunk": each hit counts
    bm25_answer: str  # the unit's key in the plain BM25 baseline


@dataclass(frozen=True)
class LabelledSet:
    name: str
    files: list[Path]
    questions: list[Question]
    units: dict[str, str]  # the plain BM25 baseline's corpus: key -> text


def zh_hans() -> LabelledSet:
    folder = DATA / "zh_hans"
    files = sorted((folder / "docs").glob("*.md"))
    questions = []
    for line in (folder / "questions.jsonl").read_text(encoding="utf-8").splitlines():
        label = json.loads(line)
        doc = label["doc"]
        questions.append(Question(label["query"], lambda hit, doc=doc: hit.doc == doc, "doc", doc))
    return LabelledSet("zh_hans", files, questions, {f.name: f.read_text(encoding="utf-8") for f in files})


def zh_hant() -> LabelledSet:
    folder = DATA / "zh_hant"
    with (folder / "faq.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    questions = []
    for line in (folder / "questions.jsonl").read_text(encoding="utf-8").splitlines():
        label = json.loads(line)
        asked = rows[label["row"] - 1]["question"]
        questions.append(Question(label["query"], lambda hit, asked=asked: hit.question == asked, "chunk", asked))
    units = {row["question"]: f"{row['title']} {row['question']} {row['answer']}" for row in rows}
    return LabelledSet("zh_hant", [folder / "faq.csv"], questions, units)


def fixtures() -> LabelledSet:
    from knowledge.chunking import chunk_document
    from knowledge.formats import parse
    from knowledge.search import embedding_text

    files = sorted(p for p in FIXTURES.iterdir() if p.suffix not in (".py", ".yaml"))
    units = {}
    for file in files:
        for chunk in chunk_document(parse(file.name, file.read_bytes()), 400, 60):
            units[f"{file.name}#{chunk.index}"] = embedding_text("", chunk.section, chunk.text, chunk.question)
    questions = []
    for label in yaml.safe_load((FIXTURES / "labels.yaml").read_text(encoding="utf-8")):
        doc, phrase = label["doc"], label["passage"]
        answer = next(key for key, text in units.items() if key.startswith(f"{doc}#") and phrase in text)
        questions.append(
            Question(
                label["q"],
                lambda hit, doc=doc, phrase=phrase: hit.doc == doc and phrase in hit.display,
                "chunk",
                answer,
            )
        )
    return LabelledSet("fixtures", files, questions, units)


SETS = {"zh_hans": zh_hans, "zh_hant": zh_hant, "fixtures": fixtures}


# --- ranking measures


def first_relevant(question: Question, hits: Sequence[Hit]) -> int | None:
    """The 1-based rank of the answer among the units the hits make, or None within the list."""
    units = per_document(hits) if question.unit == "doc" else list(hits)
    for rank, hit in enumerate(units, start=1):
        if question.relevant(hit) or any(question.relevant(other) for other in hit.also):
            return rank
    return None


def measures(ranks: Sequence[int | None]) -> dict[str, float]:
    out = {f"R@{k}": sum(1 for r in ranks if r is not None and r <= k) / len(ranks) for k in CUTOFFS}
    out["MRR@10"] = sum(1 / r for r in ranks if r is not None and r <= 10) / len(ranks)
    return out


def bootstrap_gain(better: Sequence[int | None], worse: Sequence[int | None], rounds: int = 2000) -> tuple[float, ...]:
    """R@1 of `better` minus R@1 of `worse`, with a paired 95% bootstrap interval."""
    diffs = [int(b == 1) - int(w == 1) for b, w in zip(better, worse, strict=True)]
    rng = random.Random(20)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(rounds))
    return statistics.fmean(diffs), means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1]


def _words(text: str) -> list[str]:
    """jieba's search-mode words, punctuation left out: the plain baseline's terms (no characters, no folding)."""
    import jieba

    return [
        w for w in jieba.lcut_for_search(text) if w.strip() and not all(c in "，。？！、：；（）,.?!:;()" for c in w)
    ]


class PlainBM25:
    """The baseline: BM25 (k1 1.2, b 0.75) over each unit's whole text, indexed once per set."""

    def __init__(self, units: dict[str, str]) -> None:
        self.docs = {name: Counter(_words(text)) for name, text in units.items()}
        self.lengths = {name: sum(counts.values()) for name, counts in self.docs.items()}
        self.average = statistics.fmean(self.lengths.values())
        self.frequency: Counter[str] = Counter()
        for counts in self.docs.values():
            self.frequency.update(counts.keys())

    def ranking(self, query: str) -> list[str]:
        """The units that share a word with `query`, best first."""
        n, asked = len(self.docs), set(_words(query))
        scores = {}
        for name, counts in self.docs.items():
            norm = 1.2 * (1 - 0.75 + 0.75 * self.lengths[name] / self.average)
            score = 0.0
            for word in asked & counts.keys():
                df = self.frequency[word]
                score += math.log(1 + (n - df + 0.5) / (df + 0.5)) * counts[word] * 2.2 / (counts[word] + norm)
            scores[name] = score
        return sorted((name for name in scores if scores[name] > 0), key=lambda name: -scores[name])


# --- one set


VARIANTS: dict[str, SearchSettings | None] = {
    "dense": None,
    "lexical": None,
    "rrf k=10 w=0.5 (before)": SearchSettings(fusion="rrf", rrf_k=10, lexical_weight=0.5),
    "rrf k=60 w=1": SearchSettings(fusion="rrf", rrf_k=60, lexical_weight=1.0),
    "weighted w=0.2": SearchSettings(fusion="weighted", lexical_weight=0.2),
    "weighted w=0.3": SearchSettings(fusion="weighted", lexical_weight=0.3),
    "weighted w=0.5": SearchSettings(fusion="weighted", lexical_weight=0.5),
    "weighted w=1": SearchSettings(fusion="weighted", lexical_weight=1.0),
}


async def run_set(labelled: LabelledSet, folder: Path, rerank_url: str | None) -> dict[str, list[int | None]]:
    settings = KnowledgeSettings.model_validate({"store": {"path": str(folder)}})
    default = settings.search
    knowledge = await Knowledge.open(settings)
    try:
        started = time.perf_counter()
        outcomes = await knowledge.add(labelled.name, labelled.files)
        seconds = time.perf_counter() - started
        chunks = sum(o.chunks for o in outcomes)
        assert all(o.status == "added" for o in outcomes), [(o.doc, o.reason) for o in outcomes if o.status != "added"]
        print(
            f"\n## {labelled.name}: {len(labelled.files)} files, {chunks} chunks, {len(labelled.questions)} questions"
        )
        print(f"ingestion (kb add): {seconds:.1f} s = {chunks / seconds:.1f} chunks/s")
        ranks: dict[str, list[int | None]] = {name: [] for name in VARIANTS}
        ranks["plain BM25 (baseline)"] = []
        bm25 = PlainBM25(labelled.units)
        wanted = max(10, default.candidates)
        for question in labelled.questions:
            candidates = await knowledge.searcher.candidates([labelled.name], question.query, wanted)
            for name, variant in VARIANTS.items():
                copies = [replace(hit) for hit in candidates]
                ranked = knowledge.searcher.rank(copies, name) if variant is None else fuse(copies, variant)  # type: ignore[arg-type]
                ranks[name].append(first_relevant(question, ranked[:wanted]))
            baseline = bm25.ranking(question.query)
            ranks["plain BM25 (baseline)"].append(
                baseline.index(question.bm25_answer) + 1 if question.bm25_answer in baseline else None
            )
        default_name = f"hybrid ({default.fusion} w={default.lexical_weight:g}, the default)"
        ranks[default_name] = []
        latencies = []
        for question in labelled.questions:
            started = time.perf_counter()
            hits = await knowledge.search([labelled.name], question.query, wanted)
            latencies.append((time.perf_counter() - started) * 1000)
            ranks[default_name].append(first_relevant(question, hits))
        latencies.sort()
        p50, p95 = latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(f"search latency (hybrid, query embedding included): p50 {p50:.0f} ms, p95 {p95:.0f} ms")
        if rerank_url:
            await rerank_variant(labelled, settings, rerank_url, ranks, wanted)
        print(f"{'':34s}" + "".join(f"{m:>8s}" for m in ("R@1", "R@3", "R@10", "MRR@10")))
        for name, found in ranks.items():
            print(f"{name:34s}" + "".join(f"{value:8.3f}" for value in measures(found).values()))
        best_single = max(("dense", "lexical"), key=lambda name: measures(ranks[name])["R@1"])
        gain, low, high = bootstrap_gain(ranks[default_name], ranks[best_single])
        interval = f"95% CI {low:+.3f} to {high:+.3f}"
        print(f"hybrid (default) − {best_single} (the better single mode), R@1: {gain:+.3f} ({interval})")
        return ranks
    finally:
        await knowledge.aclose()


async def rerank_variant(
    labelled: LabelledSet, settings: KnowledgeSettings, url: str, ranks: dict, wanted: int
) -> None:
    reranked = settings.model_copy(update={"rerank": settings.rerank.model_copy(update={"base_url": url})})
    knowledge = await Knowledge.open(reranked)
    try:
        ranks["hybrid + rerank"] = [
            first_relevant(question, await knowledge.search([labelled.name], question.query, wanted))
            for question in labelled.questions
        ]
    finally:
        await knowledge.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help=f"which of {', '.join(SETS)}")
    parser.add_argument("--rerank-url", help="a vLLM serving a reranker (/rerank): adds 'hybrid + rerank'")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="botgw-kb-quality-") as tmp:
        for name in args.sets.split(","):
            await run_set(SETS[name](), Path(tmp) / name, args.rerank_url)


if __name__ == "__main__":
    asyncio.run(main())
