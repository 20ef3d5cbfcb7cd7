"""Hybrid search: dense (meaning) and lexical (words), fused, optionally reranked.

Two fusions, chosen by `knowledge.search.fusion` and measured on three labelled Chinese sets (bench/kb_quality.py):
- `weighted` (the default): each candidate's cosine, scaled 0..1 over the candidates (min-max: e5's cosines crowd
  into a narrow band), and its BM25 divided by the best one's (zero means "no word in common"), mixed with
  `lexical_weight` (0.3: the lexical part counts 0.3/1.3 of the whole). It reads how far apart the scores are, so
  shared words (a product code, an error number) decide between chunks that are about equally close in meaning,
  and do not overrule a large difference in meaning. On the three sets it put the answer first 4–5 points more
  often than dense search alone, and 1.5–4 points more often than RRF.
- `rrf`: reciprocal rank fusion, sum of weight / (k + rank); it sees only ranks, not how far apart they are.
A candidate found by the dense list only is given its real BM25 (asked of the store), not a zero.

The score a hit reports, and that the answer threshold is applied to, is its dense cosine with the question, or the
reranker's score when one ran: a fused score says how two lists agree, not whether the chunk answers the question.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from knowledge.config import SearchSettings
from knowledge.embed import Embedder
from knowledge.folding import fold
from knowledge.lexical import document_vector, query_vector
from knowledge.rerank import Reranker, RerankUnavailable
from knowledge.store import Found, KnowledgeStore

log = logging.getLogger("botgw.knowledge")
Mode = Literal["hybrid", "dense", "lexical"]
SECTION_SEP = " › "


@dataclass
class Hit:
    """A chunk found for a question, with why it was found."""

    id: str
    kb: str
    doc: str
    title: str
    section: tuple[str, ...]
    text: str
    question: str | None
    score: float  # what the threshold applies to: `cosine`, or `rerank` when reranked
    cosine: float
    fused: float = 0.0  # the fusion's score: what hybrid ranks by before a reranker
    dense_rank: int | None = None
    lexical_rank: int | None = None
    bm25: float | None = None
    rerank: float | None = None
    scale: Literal["cosine", "rerank"] = "cosine"
    question_similarity: float | None = None  # a Q&A row: how close the question is to its question
    also: tuple[Hit, ...] = ()  # --per-doc: the document's other chunks that were found, best first

    @property
    def section_path(self) -> str:
        return SECTION_SEP.join(self.section)

    @property
    def display(self) -> str:
        return f"问：{self.question}\n答：{self.text}" if self.question else self.text

    def as_json(self) -> dict:
        """The fields of `botgw kb search --json`."""
        fields = {
            "doc": self.doc,
            "title": self.title,
            "section": self.section_path,
            "score": round(self.score, 4),
            "text": self.display,
            "kb": self.kb,
            "scale": self.scale,
            "cosine": round(self.cosine, 4),
            "dense_rank": self.dense_rank,
            "lexical_rank": self.lexical_rank,
            "bm25": None if self.bm25 is None else round(self.bm25, 4),
            "fused": round(self.fused, 5),
            "rrf": round(self.fused, 5),  # the name of `fused` before `weighted` fusion existed
            "question_similarity": None if self.question_similarity is None else round(self.question_similarity, 4),
            "chunk": self.id,
        }
        if self.also:
            fields["also"] = [
                {"chunk": hit.id, "section": hit.section_path, "score": round(hit.score, 4)} for hit in self.also
            ]
        return fields


def embedding_text(title: str, section: Sequence[str], text: str, question: str | None = None) -> str:
    """What is embedded and indexed for a chunk: its title and headings name what a bare paragraph leaves out. A
    document without a heading has no title here (its file name is the source shown, not words of its text)."""
    body = f"问：{question}\n答：{text}" if question else text
    heading = " ".join([title, *section]).strip()
    return f"{heading}\n{body}" if heading else body


def stored_chunk_lexical(payload: dict) -> tuple[list[int], list[float]]:
    """A stored chunk's lexical vector made again from its payload (an upgrade re-indexes words this way)."""
    section = payload.get("section") or ()
    return document_vector(embedding_text(payload.get("title", ""), section, payload["text"], payload.get("question")))


def per_document(hits: Sequence[Hit]) -> list[Hit]:
    """One hit per document, at the rank of its best chunk; the document's other chunks listed under it."""
    best: dict[tuple[str, str], Hit] = {}
    others: dict[tuple[str, str], list[Hit]] = {}
    for hit in hits:
        key = (hit.kb, hit.doc)
        if key in best:
            others[key].append(hit)
        else:
            best[key], others[key] = hit, []
    return [replace(hit, also=tuple(others[key])) for key, hit in best.items()]


def fuse(hits: Sequence[Hit], settings: SearchSettings) -> list[Hit]:
    """Score each candidate by `settings.fusion` (see the module's docstring) and order them, best first."""
    if settings.fusion == "rrf":
        for hit in hits:
            hit.fused = sum(
                weight / (settings.rrf_k + rank)
                for rank, weight in ((hit.dense_rank, 1.0), (hit.lexical_rank, settings.lexical_weight))
                if rank is not None
            )
    elif hits:
        low = min(hit.cosine for hit in hits)
        spread = max(hit.cosine for hit in hits) - low
        top_bm25 = max((hit.bm25 or 0.0) for hit in hits)
        share = settings.lexical_weight / (1 + settings.lexical_weight)
        for hit in hits:
            dense = (hit.cosine - low) / spread if spread > 0 else 1.0
            lexical = (hit.bm25 or 0.0) / top_bm25 if top_bm25 > 0 else 0.0
            hit.fused = (1 - share) * dense + share * lexical
    return sorted(hits, key=lambda hit: (-hit.fused, -hit.cosine, hit.kb, hit.doc, hit.id))


class Searcher:
    def __init__(
        self,
        store: KnowledgeStore,
        embedder: Embedder,
        settings: SearchSettings,
        reranker: Reranker | None = None,
        rerank_candidates: int = 20,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._settings = settings
        self._reranker = reranker
        self._rerank_candidates = rerank_candidates

    async def search(self, kbs: Sequence[str], question: str, limit: int, mode: Mode = "hybrid") -> list[Hit]:
        """The best `limit` chunks of the current versions of `kbs`' documents, best first."""
        candidates = await self.candidates(kbs, question, max(limit, self._settings.candidates), mode)
        hits = self.rank(candidates, mode)
        if self._reranker is not None and hits:
            hits = await self._rerank(question, hits)
        return hits[:limit]

    async def candidates(self, kbs: Sequence[str], question: str, wanted: int, mode: Mode = "hybrid") -> list[Hit]:
        """The union of the dense and the lexical lists (as `mode` asks), each hit with both scores, unranked."""
        documents = await asyncio.to_thread(self._store.documents, kbs)
        versions = [record.version for record in documents]
        if not versions or not question.strip():
            return []
        vector = await self._embedder.query(fold(question))
        # a served model swapped for one of another size under the same name: a clear error, not garbage scores
        await asyncio.to_thread(self._store.check_model, self._embedder.identity, int(vector.shape[0]))
        words = query_vector(question)
        dense: list[Found] = []
        lexical: list[Found] = []
        if mode != "lexical":
            dense = await asyncio.to_thread(self._store.dense, vector, versions, wanted)
        if mode != "dense":
            lexical = await asyncio.to_thread(self._store.lexical, words, documents, wanted)
        hits: dict[str, Hit] = {}
        for kind, ranked in (("dense", dense), ("lexical", lexical)):
            for rank, found in enumerate(ranked, start=1):
                hit = hits.get(found.id) or hits.setdefault(found.id, _hit(found, vector))
                if kind == "dense":
                    hit.dense_rank = rank
                else:
                    hit.lexical_rank, hit.bm25 = rank, found.score
        if mode == "hybrid":  # the dense list's hits that the lexical list left out: their own BM25, not zero
            unscored = [hit.id for hit in hits.values() if hit.bm25 is None]
            scores = await asyncio.to_thread(self._store.lexical_scores, words, documents, unscored)
            for hit_id in unscored:
                hits[hit_id].bm25 = scores.get(hit_id, 0.0)
        return list(hits.values())

    def rank(self, candidates: Sequence[Hit], mode: Mode) -> list[Hit]:
        """Candidates in the order `mode` ranks them: by one list's rank, or fused."""
        if mode == "dense":
            return sorted((hit for hit in candidates if hit.dense_rank), key=lambda hit: hit.dense_rank or 0)
        if mode == "lexical":
            return sorted((hit for hit in candidates if hit.lexical_rank), key=lambda hit: hit.lexical_rank or 0)
        return fuse(candidates, self._settings)

    async def _rerank(self, question: str, hits: list[Hit]) -> list[Hit]:
        assert self._reranker is not None
        head, tail = hits[: self._rerank_candidates], hits[self._rerank_candidates :]
        try:
            scores = await self._reranker.scores(question, [hit.display for hit in head])
        except RerankUnavailable as exc:
            log.warning("knowledge: rerank failed, keeping the fused order: %s", exc)
            return hits
        for hit, score in zip(head, scores, strict=True):
            hit.rerank = hit.score = score
            hit.scale = "rerank"
        return sorted(head, key=lambda hit: -hit.score) + tail


def _hit(found: Found, vector: np.ndarray) -> Hit:
    payload = found.payload
    cosine = float(np.dot(vector, found.dense))
    return Hit(
        id=found.id,
        kb=payload["kb"],
        doc=payload["doc"],
        title=payload.get("title", ""),
        section=tuple(payload.get("section") or ()),
        text=payload["text"],
        question=payload.get("question"),
        score=cosine,
        cosine=cosine,
        question_similarity=None if found.question is None else float(np.dot(vector, found.question)),
    )
