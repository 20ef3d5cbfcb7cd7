"""Hybrid search: dense (meaning) and lexical (words), fused by reciprocal rank, optionally reranked.

RRF needs only each list's ranks, so a cosine and a BM25 score never have to be put on one scale. The score a
hit reports, and that the answer threshold is applied to, is its dense cosine with the question (computed for
lexical-only hits too), or the reranker's score when one ran: a rank fusion score says nothing about whether
the documents answer the question at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from knowledge.config import SearchSettings
from knowledge.embed import Embedder
from knowledge.lexical import query_vector
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
    rrf: float = 0.0
    dense_rank: int | None = None
    lexical_rank: int | None = None
    bm25: float | None = None
    rerank: float | None = None
    scale: Literal["cosine", "rerank"] = "cosine"
    question_similarity: float | None = None  # a Q&A row: how close the question is to its question

    @property
    def section_path(self) -> str:
        return SECTION_SEP.join(self.section)

    @property
    def display(self) -> str:
        return f"问：{self.question}\n答：{self.text}" if self.question else self.text

    def as_json(self) -> dict:
        """The fields of `botgw kb search --json`."""
        return {
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
            "rrf": round(self.rrf, 5),
            "question_similarity": None if self.question_similarity is None else round(self.question_similarity, 4),
            "chunk": self.id,
        }


def embedding_text(title: str, section: Sequence[str], text: str, question: str | None = None) -> str:
    """What is embedded and indexed for a chunk: its title and headings name what a bare paragraph leaves out."""
    body = f"问：{question}\n答：{text}" if question else text
    heading = " ".join([title, *section]).strip()
    return f"{heading}\n{body}" if heading else body


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
        documents = await asyncio.to_thread(self._store.documents, kbs)
        versions = [record.version for record in documents]
        if not versions or not question.strip():
            return []
        vector = await self._embedder.query(question)
        # a served model swapped for one of another size under the same name: a clear error, not garbage scores
        await asyncio.to_thread(self._store.check_model, self._embedder.identity, int(vector.shape[0]))
        wanted = max(limit, self._settings.candidates)
        dense: list[Found] = []
        lexical: list[Found] = []
        if mode != "lexical":
            dense = await asyncio.to_thread(self._store.dense, vector, versions, wanted)
        if mode != "dense":
            lexical = await asyncio.to_thread(self._store.lexical, query_vector(question), versions, wanted)
        hits = self._fuse(vector, dense, lexical)
        if self._reranker is not None and hits:
            hits = await self._rerank(question, hits)
        return hits[:limit]

    def _fuse(self, vector: np.ndarray, dense: list[Found], lexical: list[Found]) -> list[Hit]:
        k = self._settings.rrf_k
        hits: dict[str, Hit] = {}
        for ranked, kind, weight in ((dense, "dense", 1.0), (lexical, "lexical", self._settings.lexical_weight)):
            for rank, found in enumerate(ranked, start=1):
                hit = hits.get(found.id)
                if hit is None:
                    payload = found.payload
                    cosine = float(np.dot(vector, found.dense))
                    hit = hits[found.id] = Hit(
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
                hit.rrf += weight / (k + rank)
                if kind == "dense":
                    hit.dense_rank = rank
                else:
                    hit.lexical_rank, hit.bm25 = rank, found.score
        return sorted(hits.values(), key=lambda hit: (-hit.rrf, -hit.cosine, hit.kb, hit.doc, hit.id))

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
