"""One open knowledge store with its embedder and reranker: what `botgw kb …` (and an admin endpoint) works on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from knowledge.config import KnowledgeSettings
from knowledge.embed import Embedder, make_embedder
from knowledge.ingest import Ingestor, Outcome, Progress, Upload
from knowledge.rerank import Reranker
from knowledge.search import Hit, Mode, Searcher, per_document, stored_chunk_lexical
from knowledge.store import DocRecord, KnowledgeStore

log = logging.getLogger("botgw.knowledge")
PER_DOC_DEPTH = 5  # --per-doc: chunks looked at per document asked for (a Q&A table's rows all share one document)


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
            if await asyncio.to_thread(store.lexical_outdated):
                rewritten = await asyncio.to_thread(store.relex, stored_chunk_lexical)
                log.warning("knowledge: re-indexed the words of %d chunks in %s for this botgw", rewritten, store.where)
            await asyncio.to_thread(store.check_model, embedder.identity)
        except BaseException:
            await asyncio.to_thread(store.close)
            raise
        reranker = Reranker(settings.rerank, http) if settings.rerank.base_url else None
        return cls(settings, store, embedder, reranker)

    async def add(self, kb: str, paths: Iterable[str | Path], progress: Progress | None = None, **options: Any
                  ) -> list[Outcome]:
        """Ingestor.add: files and folders into `kb` (its options: `embedding`, `skip_unsupported`, `added_by`)."""
        return await self.ingestor.add(kb, paths, progress, **options)

    async def add_uploads(self, kb: str, uploads: Sequence[Upload], added_by: str = "") -> list[Outcome]:
        """Add files sent over HTTP (held in memory, never written to disk): all are read and cut first, and if
        any of them cannot be, nothing is written (`FileRejected` says which and why). `added_by`: who sent them
        (kept in each document's record)."""
        return await self.ingestor.add_uploads(kb, uploads, added_by)

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

    async def search(
        self, kbs: Sequence[str], question: str, limit: int = 5, mode: Mode = "hybrid", per_doc: bool = False
    ) -> list[Hit]:
        """The best `limit` chunks; with `per_doc`, the best `limit` documents (each with its other chunks)."""
        if not per_doc:
            return await self.searcher.search(kbs, question, limit, mode)
        hits = await self.searcher.search(
            kbs, question, max(limit * PER_DOC_DEPTH, self.settings.search.candidates), mode
        )
        return per_document(hits)[:limit]

    async def aclose(self) -> None:
        await self.embedder.aclose()
        if self.reranker is not None:
            await self.reranker.aclose()
        await asyncio.to_thread(self.store.close)


class SharedKnowledge:
    """One `Knowledge` for a long-running process (a worker, a gateway's admin API), opened when it is used and,
    for the embedded store, closed again after `store.idle_release_s` unused: Qdrant's local mode lets one
    process hold the folder, and this is how a worker, a gateway and `botgw kb` take turns with it. Opening
    waits up to `wait_s` for whoever holds it, then raises `StoreLocked`. Safe to use concurrently."""

    def __init__(self, settings: KnowledgeSettings, http: httpx.AsyncClient | None = None, wait_s: float = 5.0) -> None:
        self._settings = settings
        self._http = http
        self._wait_s = wait_s
        self._knowledge: Knowledge | None = None
        self._lock = asyncio.Lock()
        self._in_flight = 0
        self._release: asyncio.TimerHandle | None = None
        self._closing: asyncio.Task | None = None

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Knowledge]:
        knowledge = await self._acquire()
        try:
            yield knowledge
        finally:
            self._done()

    async def _acquire(self) -> Knowledge:
        async with self._lock:
            if self._release is not None:
                self._release.cancel()
                self._release = None
            if self._knowledge is None:
                self._knowledge = await Knowledge.open(self._settings, self._http, wait_s=self._wait_s)
            self._in_flight += 1
            return self._knowledge

    def _done(self) -> None:
        self._in_flight -= 1
        idle = self._settings.store.idle_release_s
        if self._in_flight == 0 and idle > 0 and self._settings.store.qdrant_url is None:
            loop = asyncio.get_running_loop()
            self._release = loop.call_later(idle, self._start_closing)

    def _start_closing(self) -> None:
        self._closing = asyncio.ensure_future(self._close_if_idle())

    async def _close_if_idle(self) -> None:
        async with self._lock:
            if self._in_flight == 0 and self._knowledge is not None:
                knowledge, self._knowledge = self._knowledge, None
                await knowledge.aclose()

    async def aclose(self) -> None:
        async with self._lock:
            if self._release is not None:
                self._release.cancel()
            if self._knowledge is not None:
                knowledge, self._knowledge = self._knowledge, None
                await knowledge.aclose()
