"""Adding files to a knowledge base: read, fingerprint, parse, chunk, embed, write, flip, prune.

A file is the unit of work: everything up to the embeddings happens in memory, so a file that fails (empty,
too large, unreadable) writes nothing, and the others go on. A file whose content (and chunking) is unchanged
is skipped by its fingerprint, which is also how an interrupted folder resumes: run the same command again and
the files already added are skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from knowledge.chunking import CHUNKER_VERSION, Chunk, chunk_document
from knowledge.config import KnowledgeSettings
from knowledge.embed import Embedder
from knowledge.errors import FileRejected
from knowledge.folding import fold
from knowledge.formats import PARSERS, ParsedDocument, parse
from knowledge.lexical import document_vector
from knowledge.search import embedding_text
from knowledge.store import ChunkPoint, DocRecord, KnowledgeStore

log = logging.getLogger("botgw.knowledge")
Status = Literal["added", "replaced", "unchanged", "failed", "skipped"]


@dataclass(frozen=True)
class Outcome:
    """What became of one file."""

    path: str
    doc: str
    status: Status
    chunks: int = 0
    reason: str = ""
    seconds: float = 0.0


Progress = Callable[[int, int, Outcome], None]
# While a file is embedded: (its document name, chunks embedded so far, its chunks in all). Long files take
# minutes on a CPU; this is what lets a command show how far it is.
Embedding = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Upload:
    """A file sent to the admin API: its document name (a bare file name, already checked) and its bytes."""

    doc: str
    data: bytes


@dataclass(frozen=True)
class _Cut:
    """A file read and cut in memory, not yet embedded (`chunks` None: unchanged, nothing to do)."""

    doc: str
    fingerprint: str
    size: int
    title: str
    chunks: list[Chunk] | None
    existing: DocRecord | None


@dataclass(frozen=True)
class Found:
    """A file to add: its path, its document name, and whether it was named itself (not found in a folder)."""

    path: Path
    doc: str
    named: bool


def collect(paths: Iterable[str | Path]) -> list[Found]:
    """Each file given and each file under each folder given. A file's name is its file name; under a folder,
    its path relative to that folder (so that two folders' 说明.md stay apart)."""
    found: list[Found] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            for file in sorted(path.rglob("*")):
                relative = file.relative_to(path)
                if file.is_file() and not any(part.startswith(".") for part in relative.parts):
                    found.append(Found(file, relative.as_posix(), named=False))
        else:
            found.append(Found(path, path.name, named=True))
    return found


REACQUIRE_WAIT_S = 120.0  # a worker holds the embedded store for store.idle_release_s after its last question
PUBLISH_ROUNDS = 10  # times _publish reads its record again after another add or a removal changed it


class Ingestor:
    def __init__(self, store: KnowledgeStore, embedder: Embedder, settings: KnowledgeSettings) -> None:
        self._store = store
        self._embedder = embedder
        self._settings = settings
        # A command (`botgw kb add`) is the store's only user in its process, so it may let go of an embedded
        # folder while it embeds and a worker answer from it meanwhile; a gateway's shared store may not.
        self.release_while_embedding = False

    def fingerprint(self, data: bytes) -> str:
        """The content and how it is cut: changing the chunking re-adds a file that did not change."""
        chunking = self._settings.chunking
        digest = hashlib.sha256(data)
        digest.update(f"\0chunker{CHUNKER_VERSION}:{chunking.size}:{chunking.overlap}".encode())
        return digest.hexdigest()

    async def add(
        self,
        kb: str,
        paths: Iterable[str | Path],
        progress: Progress | None = None,
        embedding: Embedding | None = None,
        skip_unsupported: bool = False,
        added_by: str = "",
    ) -> list[Outcome]:
        """Add files and folders to `kb`, one file at a time; return what became of each. A file of a format
        that cannot be read fails when it was named (as an upload of it does), unless `skip_unsupported`; one
        found in a folder is skipped. `added_by` is kept in each added document's record (who added it)."""
        files = collect(paths)
        first: dict[str, Path] = {}
        outcomes: list[Outcome] = []
        for number, found in enumerate(files, start=1):
            earlier = first.setdefault(found.doc, found.path)
            if earlier != found.path:  # one document name, two files: the second would silently replace the first
                outcome = Outcome(str(found.path), found.doc, "failed", reason=f"{earlier} has the same document "
                                  "name: give their folder instead (its files are named by their path in it), or "
                                  "rename one")
            else:
                outcome = await self._add_file(kb, found, skip_unsupported or not found.named, embedding, added_by)
            outcomes.append(outcome)
            if progress is not None:
                progress(number, len(files), outcome)
        return outcomes

    async def _add_file(
        self, kb: str, found: Found, skip_unsupported: bool, embedding: Embedding | None, added_by: str
    ) -> Outcome:
        started = time.monotonic()
        file, doc = found.path, found.doc

        def done(status: Status, chunks: int = 0, reason: str = "") -> Outcome:
            return Outcome(str(file), doc, status, chunks, reason, time.monotonic() - started)

        if file.is_dir() or not file.exists():
            return done("failed", reason="no such file or folder")
        if file.suffix.lower() not in PARSERS:
            unsupported = f"unsupported format {file.suffix or '(no extension)'}"
            if skip_unsupported:
                return done("skipped", reason=unsupported)
            return done("failed", reason=f"{unsupported} (botgw reads {' '.join(sorted(PARSERS))})")
        try:
            cut = await self._cut(kb, doc, file.name, self._read(file))
        except FileRejected as exc:
            return done("failed", reason=str(exc))
        except OSError as exc:
            return done("failed", reason=f"cannot read it: {exc.strerror or exc}")
        if cut.chunks is None:
            return done("unchanged", cut.existing.chunks if cut.existing else 0)
        # A failed write raises: it is not the file's fault.
        chunks = await self._write(kb, cut, str(file.resolve()), added_by, embedding)
        return done("replaced" if cut.existing is not None else "added", chunks)

    async def add_uploads(self, kb: str, uploads: Sequence[Upload], added_by: str = "") -> list[Outcome]:
        """Add files held in memory (an admin upload). Every file is read and cut before anything is written: one
        that cannot be (`FileRejected`, naming it) leaves the knowledge base as it was. `added_by`: who sent them."""
        names = [upload.doc for upload in uploads]
        if len(set(names)) != len(names):
            raise FileRejected("two uploaded files have the same name")
        cuts: list[tuple[Upload, _Cut, float]] = []
        for upload in uploads:
            started = time.monotonic()
            suffix = Path(upload.doc).suffix.lower()
            try:
                if suffix not in PARSERS:
                    raise FileRejected(f"unsupported format {suffix or '(no extension)'}")
                self._check_size(len(upload.data))
                cuts.append((upload, await self._cut(kb, upload.doc, upload.doc, upload.data), started))
            except FileRejected as exc:
                raise FileRejected(f"{upload.doc}: {exc}") from None
        outcomes = []
        for upload, cut, started in cuts:
            if cut.chunks is None:
                status: Status = "unchanged"
                chunks = cut.existing.chunks if cut.existing else 0
            else:
                chunks = await self._write(kb, cut, f"upload:{upload.doc}", added_by)
                status = "replaced" if cut.existing is not None else "added"
            outcomes.append(Outcome(upload.doc, upload.doc, status, chunks, "", time.monotonic() - started))
        return outcomes

    async def _cut(self, kb: str, doc: str, name: str, data: bytes) -> _Cut:
        """Fingerprint, parse and chunk a file in memory; `chunks` is None when it is unchanged."""
        fingerprint = self.fingerprint(data)
        existing = await asyncio.to_thread(self._store.document, kb, doc)
        if existing is not None and existing.fingerprint == fingerprint:
            return _Cut(doc, fingerprint, len(data), "", None, existing)
        size, overlap = self._settings.chunking.size, self._settings.chunking.overlap
        # Both in a thread: a long document's parse and cut must not hold up a gateway's callbacks.
        document, chunks = await asyncio.to_thread(lambda: _parse_and_cut(name, data, size, overlap))
        if not chunks:
            raise FileRejected("no text found in the file")
        return _Cut(doc, fingerprint, len(data), document.title, chunks, existing)

    async def _write(self, kb: str, cut: _Cut, source: str, added_by: str, embedding: Embedding | None = None) -> int:
        """Embed a cut file and publish it (new version, flip, old one out); the number of chunks."""
        assert cut.chunks is not None
        if self.release_while_embedding and self._store.embedded:
            await asyncio.to_thread(self._store.release)
            try:
                points = await self._points(kb, cut.doc, cut.title, cut.chunks, embedding)
            finally:
                await asyncio.to_thread(self._store.reacquire, REACQUIRE_WAIT_S)
        else:
            points = await self._points(kb, cut.doc, cut.title, cut.chunks, embedding)
        record = DocRecord(
            kb=kb,
            doc=cut.doc,
            version=points[0].version,
            fingerprint=cut.fingerprint,
            title=cut.title,
            chunks=len(points),
            bytes=cut.size,
            source=source,
            added_at=time.time(),
            added_by=added_by,
        )
        await asyncio.to_thread(self._publish, record, points)
        return len(points)

    def _check_size(self, size: int) -> None:
        cap = self._settings.max_file_mb * 1024 * 1024
        if size > cap:
            raise FileRejected(
                f"{size / 1024 / 1024:.1f} MB is over knowledge.max_file_mb ({self._settings.max_file_mb:g} MB)"
            )
        if size == 0:
            raise FileRejected("empty file")

    def _read(self, file: Path) -> bytes:
        self._check_size(file.stat().st_size)
        return file.read_bytes()

    async def _points(
        self, kb: str, doc: str, title: str, chunks: list[Chunk], embedding: Embedding | None = None
    ) -> list[ChunkPoint]:
        texts = [embedding_text(title, chunk.section, chunk.text, chunk.question) for chunk in chunks]
        folded = [fold(text) for text in texts]  # one script: a question in the other one still finds it
        batch = self._settings.embedding.batch_size
        vectors = []
        for start in range(0, len(folded), batch):
            if embedding is not None:
                embedding(doc, start, len(folded))
            vectors.extend(await self._embedder.passages(folded[start : start + batch]))
        if embedding is not None:
            embedding(doc, len(folded), len(folded))
        asked = [fold(chunk.question) for chunk in chunks if chunk.question]
        question_vectors = iter(await self._embedder.queries(asked) if asked else [])
        version = uuid.uuid4().hex
        return [
            ChunkPoint(
                kb=kb,
                doc=doc,
                version=version,
                index=chunk.index,
                title=title,
                section=chunk.section,
                text=chunk.text,
                question=chunk.question,
                dense=vector,
                lexical=document_vector(text),
                question_vector=next(question_vectors) if chunk.question else None,
            )
            for chunk, text, vector in zip(chunks, texts, vectors, strict=True)
        ]

    def _publish(self, record: DocRecord, points: list[ChunkPoint]) -> None:
        """New chunks, then the flip, then the old chunks out. A failure before the flip removes what it wrote.

        Nothing locks a document across processes (a Qdrant server, several gateways, `botgw kb add`), so another
        add or a removal of it may run at any step of this one (found by reviews). What keeps its record and its
        chunks together:
        - an add deletes only the versions it found stored before it wrote its own: older adds' (current, stale or
          crashed). A version written after that (an add begun later) is never deleted by it;
        - before it deletes or writes anything back, it reads the record again, and goes on only while the record
          names its version. A record that names a later add's version: that add decides what stays, and this
          one's chunks are deleted. No record: the document was removed, and so are this add's chunks (written
          back after a removal, they would be reachable by nothing);
        - a record that names an older version (an add begun before this one that flipped after it) is flipped
          back: the add begun later wins, whichever flips last;
        - its chunks found missing while its record is current (a removal between its write and its flip) are
          written again."""
        kb, doc, version = record.kb, record.doc, record.version
        store = self._store
        store.ensure(self._embedder.identity, int(points[0].dense.shape[0]))
        older = store.versions(kb, doc) - {version}
        try:
            store.write(points)
        except BaseException:
            try:
                store.drop_versions(kb, doc, {version})
            except Exception:  # unreachable (not current) chunks: the next add of this document deletes them
                log.warning("knowledge: could not remove the partly written %s/%s", kb, doc)
            raise
        store.publish(record)
        for _ in range(PUBLISH_ROUNDS):
            current = self._current_version(kb, doc)
            if current in older:
                store.publish(record)
            elif current != version:
                store.drop_versions(kb, doc, {version})  # removed, or replaced by a later add
                return
            else:
                store.drop_versions(kb, doc, older)
                if store.count(kb, doc, version) >= len(points):
                    return
                if self._current_version(kb, doc) == version:
                    log.warning("knowledge: %s/%s lost chunks to a removal or add running beside it; written again",
                                kb, doc)  # fmt: skip
                    store.write(points)  # then the record is read again: a removal may have come meanwhile
        log.warning("knowledge: %s/%s was changed by other adds or removals %d times while it was published; "
                    "check it with `botgw kb list`", kb, doc, PUBLISH_ROUNDS)  # fmt: skip

    def _current_version(self, kb: str, doc: str) -> str | None:
        record = self._store.document(kb, doc)
        return record.version if record is not None else None


def _parse_and_cut(name: str, data: bytes, size: int, overlap: int) -> tuple[ParsedDocument, list[Chunk]]:
    document = parse(name, data)
    return document, chunk_document(document, size, overlap)
