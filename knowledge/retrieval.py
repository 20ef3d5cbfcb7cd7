"""What the worker calls: `Retriever.retrieve(use, question)` → `Retrieval`, the passages above the threshold
with what to put in the prompt and the reply.

The embedded store's folder can be open in one process only. The worker's Retriever opens it when a question
needs it and closes it after `knowledge.store.idle_release_s` without questions, so that `botgw kb …` works while
a worker runs (between questions) and the worker then reads what the command changed. A question that comes
while a command holds the folder raises `StoreLocked` after a short wait: hand the message back and retry,
as when no engine is ready. With `knowledge.store.qdrant_url` nothing is released and any number of workers
and commands share the server.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from knowledge import metrics
from knowledge.config import KnowledgeSettings, KnowledgeUse, ThresholdSettings
from knowledge.prompt import grounding_prompt, sources_line, with_sources
from knowledge.search import Hit
from knowledge.service import SharedKnowledge

log = logging.getLogger("botgw.knowledge")
RETRIEVER_LOCK_WAIT_S = 5.0  # a worker waits this long for a `botgw kb` command to let go of the folder


@dataclass(frozen=True)
class Passage:
    """A passage that goes into the prompt."""

    kb: str
    doc: str
    title: str
    section: str
    text: str
    score: float
    chunk: str

    @classmethod
    def of(cls, hit: Hit) -> Passage:
        return cls(hit.kb, hit.doc, hit.title, hit.section_path, hit.display, hit.score, hit.id)


@dataclass(frozen=True)
class Retrieval:
    """The outcome of one question. `no_answer`: nothing cleared the threshold; reply `no_answer_text` (in
    微信客服, hand the customer to a human). `direct_answer`: a Q&A row matched so closely that its answer is
    the reply (followed by `sources_line()`), no engine needed."""

    question: str
    passages: tuple[Passage, ...]
    no_answer_text: str
    direct_answer: str | None = None
    seconds: float = 0.0
    considered: tuple[Hit, ...] = field(default=(), repr=False)

    @property
    def no_answer(self) -> bool:
        return not self.passages

    def system_prompt(self, ask_citation: bool = True) -> str:
        """The grounded part of the system prompt (empty when there is no answer)."""
        return grounding_prompt(self.passages, ask_citation)

    def sources_line(self) -> str:
        return sources_line(self.passages[:1] if self.direct_answer else self.passages)

    def with_sources(self, answer: str) -> str:
        """The engine's answer with the sources line appended, unless it already cites (来源：)."""
        return with_sources(answer, self.passages[:1] if self.direct_answer else self.passages)

    def reply(self) -> str | None:
        """The reply that needs no engine: the no-answer text, or a direct answer with its source."""
        if self.no_answer:
            return self.no_answer_text
        if self.direct_answer:
            return self.with_sources(self.direct_answer)
        return None

    def record(self) -> dict:
        """Which chunks the answer used, for the reply record and logs (no passage text)."""
        return {
            "no_answer": self.no_answer,
            "direct": self.direct_answer is not None,
            "seconds": round(self.seconds, 4),
            "passages": [
                {"kb": p.kb, "doc": p.doc, "section": p.section, "chunk": p.chunk, "score": round(p.score, 4)}
                for p in self.passages
            ],
        }


def answer_floor(thresholds: ThresholdSettings, min_score: float | None, scale: str) -> float:
    """The score a hit must reach to be answered from: a bot's own `knowledge.min_score`, else the deployment's
    threshold for the hit's scale (cosine, or the reranker's). The console's search draws its line here too."""
    if min_score is not None:
        return min_score
    return thresholds.rerank_min_score if scale == "rerank" else thresholds.min_score


class Retriever:
    """One per worker process; safe to call concurrently."""

    def __init__(self, settings: KnowledgeSettings, http: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._shared = SharedKnowledge(settings, http, wait_s=RETRIEVER_LOCK_WAIT_S)

    async def retrieve(self, use: KnowledgeUse, question: str, bot: str = "") -> Retrieval:
        """The passages of `use.bases` that answer `question`, best first, at most `use.top_k`."""
        started = time.perf_counter()
        async with self._shared.use() as knowledge:
            hits = await knowledge.search(use.bases, question, limit=max(use.top_k * 2, 8))
        thresholds = self._settings.thresholds
        kept = [hit for hit in hits if hit.score >= answer_floor(thresholds, use.min_score, hit.scale)][: use.top_k]
        direct = None
        if use.direct_answers and kept and kept[0].question is not None:
            similarity = kept[0].question_similarity
            if similarity is not None and similarity >= thresholds.direct_answer:
                direct = kept[0].text
        seconds = time.perf_counter() - started
        retrieval = Retrieval(
            question, tuple(Passage.of(hit) for hit in kept), use.no_answer_text, direct, seconds, tuple(hits)
        )
        outcome = "no_answer" if retrieval.no_answer else "direct" if direct else "grounded"
        metrics.RETRIEVAL_SECONDS.labels(bot).observe(seconds)
        metrics.PASSAGES.labels(bot).observe(len(kept))
        metrics.ANSWERS.labels(bot, outcome).inc()
        log.debug("knowledge: %s for bot %s in %.3f s: %s", outcome, bot, seconds, [p.doc for p in retrieval.passages])
        return retrieval

    async def aclose(self) -> None:
        await self._shared.aclose()
