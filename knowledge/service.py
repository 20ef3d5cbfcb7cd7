"""One open knowledge store with its embedder and reranker: what `botgw kb …` (and an admin endpoint) works on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpx

from knowledge.config import KnowledgeSettings
from knowledge.embed import Embedder, make_embedder
from knowledge.ingest import Ingestor, Outcome, Progress
from knowledge.rerank import Reranker
from knowledge.search import Hit, Mode, Searcher
from knowledge.store import DocRecord, KnowledgeStore


class Knowledge:
    def __init__(
        self, settings: KnowledgeSettings, store: KnowledgeStore, embedder: Embedder, reranker: Reranker | None
    ) -> None:
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.reranker = reranker
        self.searcher = Searcher(store, embedder, settings.search, reranker, settings.rerank.candidates)
        self.ingestor = Ingestor(store, embedder, settings)

    @classmethod
    async def open(
        cls, settings: KnowledgeSettings, http: httpx.AsyncClient | None = None, wait_s: float = 0.0
    ) -> Knowledge:
        """Open the store (waiting up to `wait_s` for an embedded folder another process holds) and check that
        it was built with the configured embedding model."""
        store = await asyncio.to_thread(KnowledgeStore.open, settings.store, wait_s)
        embedder = make_embedder(settings.embedding, http)
        try:
            await asyncio.to_thread(store.check_model, embedder.identity)
        except BaseException:
            await asyncio.to_thread(store.close)
            raise
        reranker = Reranker(settings.rerank, http) if settings.rerank.base_url else None
        return cls(settings, store, embedder, reranker)

    async def add(self, kb: str, paths: Iterable[str | Path], progress: Progress | None = None) -> list[Outcome]:
        return await self.ingestor.add(kb, paths, progress)

    async def documents(self, kb: str | None = None) -> list[DocRecord]:
        return await asyncio.to_thread(self.store.documents, None if kb is None else [kb])

    async def remove(self, kb: str, doc: str) -> DocRecord | None:
        """Take a document out: its record first (search stops seeing it at once), then its chunks."""

        def remove() -> DocRecord | None:
            record = self.store.document(kb, doc)
            self.store.unpublish(kb, doc)
            self.store.prune(kb, doc, keep=None)
            return record

        return await asyncio.to_thread(remove)

    async def search(self, kbs: Sequence[str], question: str, limit: int = 5, mode: Mode = "hybrid") -> list[Hit]:
        return await self.searcher.search(kbs, question, limit, mode)

    async def aclose(self) -> None:
        await self.embedder.aclose()
        if self.reranker is not None:
            await self.reranker.aclose()
        await asyncio.to_thread(self.store.close)
