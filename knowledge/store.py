"""The store: Qdrant through qdrant-client, embedded (a local folder) or a server (`knowledge.store.qdrant_url`),
with the same calls either way.

Two collections: `<name>` holds the chunks (a dense vector, a sparse lexical vector and the payload), and
`<name>_docs` one record per document, plus one that records the embedding model and dimension the store was
built with. A document's record names its current version, and search asks only for chunks of current versions.
A re-added document's chunks are written under a new version first, then its record is switched to it in one
point write (the flip), then the old version's chunks are deleted: a search sees the old version or the new one,
never half of each, and a crash leaves only unreachable chunks that the next add of that document deletes.

The embedded store lets one process open its folder (Qdrant's local mode locks it); see `open`. That process
searches an in-memory copy of the chunks and keeps the document records in memory too (local_index.py says why);
a server is searched by Qdrant.

Lexical statistics are per knowledge base, so that one base's scores do not move when another changes. The embedded
index counts them itself. For a server, each written version also gets a "terms" record in `<name>_docs`: how many
of its chunks hold each term. A version never changes, so a process caches these records by version, sums them per
base for the current versions, and sends each base its own IDF as the query's weights (the chunks collection has
no IDF modifier: Qdrant's would count the whole collection, every base and stale version included).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass
from typing import Any

import numpy as np

from bots.urls import redact_url
from knowledge.config import StoreSettings
from knowledge.errors import EmbeddingMismatch, KnowledgeError, StoreLocked
from knowledge.lexical import LEXICAL_SCHEME
from knowledge.local_index import LocalIndex, Row

_NS = uuid.UUID("6b8e5b0e-3f0c-4a53-9a57-2f4d0b1c9e21")
META_ID = str(uuid.uuid5(_NS, "meta"))
DENSE, LEXICAL, QUESTION = "dense", "lexical", "question"
WRITE_BATCH = 256


@dataclass(frozen=True)
class DocRecord:
    """A document as `kb list` shows it; `doc` is its name in the knowledge base. `added_by`: who added this
    version ("cli", "admin-api", a console operator's identity); "" in records written before it was kept."""

    kb: str
    doc: str
    version: str
    fingerprint: str
    title: str
    chunks: int
    bytes: int
    source: str
    added_at: float
    added_by: str = ""

    @staticmethod
    def point_id(kb: str, doc: str) -> str:
        return str(uuid.uuid5(_NS, f"doc\0{kb}\0{doc}"))


@dataclass(frozen=True)
class ChunkPoint:
    kb: str
    doc: str
    version: str
    index: int
    title: str
    section: tuple[str, ...]
    text: str
    question: str | None
    dense: np.ndarray
    lexical: tuple[list[int], list[float]]
    question_vector: np.ndarray | None = None  # a Q&A row's question embedded as a query: question-to-question

    @property
    def point_id(self) -> str:
        return str(uuid.uuid5(_NS, f"chunk\0{self.kb}\0{self.doc}\0{self.version}\0{self.index}"))


@dataclass(frozen=True)
class Found:
    """A chunk a query found: its payload, the query's score and its dense vector."""

    id: str
    payload: dict[str, Any]
    score: float
    dense: np.ndarray
    question: np.ndarray | None


def _locked_message(folder: str) -> str:
    return (
        f"the knowledge store {folder} is in use by another process: most likely a running `botgw worker`, "
        "which holds the embedded store while it answers (and store.idle_release_s after). Stop the worker and "
        "run the command again, or run a Qdrant server and set knowledge.store.qdrant_url so that the worker and "
        "these commands share it."
    )


class KnowledgeStore:
    """Qdrant, embedded or served. Every call is synchronous: callers on an event loop use a thread."""

    def __init__(self, client: Any, settings: StoreSettings, where: str) -> None:
        self._client = client
        self._settings = settings
        self.where = where
        self.embedded = settings.qdrant_url is None
        self.chunks = settings.collection
        self.docs = f"{settings.collection}_docs"
        self._lock = threading.RLock()  # the local mode is not made for concurrent calls
        self._index: LocalIndex | None = None  # embedded only: what search reads (see local_index.py)
        self._records: dict[tuple[str, str], DocRecord] | None = None  # embedded only: the documents, likewise
        self._meta: dict[str, Any] | None = None  # embedded only: the model and dimension, once read
        self._terms: dict[str, dict[int, int]] = {}  # server: each version's chunks per term (versions never change)

    @classmethod
    def open(cls, settings: StoreSettings, wait_s: float = 0.0) -> KnowledgeStore:
        """Open the store. The embedded folder is locked by whoever has it open; wait up to `wait_s` for it."""
        from qdrant_client import QdrantClient

        if settings.qdrant_url:
            api_key = settings.api_key.get_secret_value() if settings.api_key else None
            # whole seconds (its gRPC timeout is an int), rounded up: int() made 0.5 a 0 that failed every call
            timeout = math.ceil(settings.timeout_s)
            client = QdrantClient(url=settings.qdrant_url, api_key=api_key, timeout=timeout)
            return cls(client, settings, redact_url(settings.qdrant_url))  # `where` is shown in messages
        folder = settings.folder()
        folder.mkdir(parents=True, exist_ok=True)
        return cls(_local_client(str(folder), wait_s), settings, str(folder))

    def close(self) -> None:
        with self._lock:
            self._client.close()

    def release(self) -> None:
        """Embedded: let go of the folder for a while, so that a worker can answer from it meanwhile (`botgw kb
        add` does while it embeds, which takes minutes on a CPU); `reacquire` takes it back."""
        if self.embedded:
            self.close()

    def reacquire(self, wait_s: float) -> None:
        """Embedded: open the folder again (waiting up to `wait_s` for whoever took it) and forget what was read
        of it: another process may have written meanwhile."""
        if not self.embedded:
            return
        with self._lock:
            self._client = _local_client(self.where, wait_s)
            self._index, self._records, self._meta = None, None, None

    @contextmanager
    def _call(self) -> Iterator[Any]:
        """One client call: serialised, and a server that cannot be reached said plainly."""
        with self._lock:
            try:
                yield self._client
            except KnowledgeError:
                raise
            except Exception as exc:
                if self.embedded:
                    raise
                raise KnowledgeError(f"the Qdrant server at {self.where} failed: {type(exc).__name__}: {exc}") from None

    # --- the model the store was built with

    def meta(self) -> dict[str, Any] | None:
        if self._meta is not None:  # embedded: this process is the only one that can change it
            return self._meta
        with self._call() as client:
            if not client.collection_exists(self.docs):
                return None
            found = client.retrieve(self.docs, [META_ID], with_payload=True)
        meta = dict(found[0].payload or {}) if found else None
        if self.embedded:
            self._meta = meta
        return meta

    def check_model(self, identity: str, dim: int | None = None) -> None:
        """Refuse to mix vectors of two models: their scores would be garbage, not errors."""
        meta = self.meta()
        if meta is None:
            return
        if meta.get("embedding_model") != identity or (dim is not None and meta.get("dim") != dim):
            raise EmbeddingMismatch(
                f"the knowledge store {self.where} was built with the embedding model {meta.get('embedding_model')} "
                f"({meta.get('dim')} dimensions), but the configuration now embeds with {identity}"
                f"{f' ({dim} dimensions)' if dim else ''}. Set knowledge.embedding back, or point "
                "knowledge.store at a new path (or collection) and add the documents again."
            )
        if meta.get("lexical") != LEXICAL_SCHEME:
            raise EmbeddingMismatch(
                f"the knowledge store {self.where} was indexed with the lexical scheme {meta.get('lexical')}, this "
                f"botgw uses {LEXICAL_SCHEME}: open it once with `botgw kb list` to re-index it."
            )

    def lexical_outdated(self) -> bool:
        """Whether the chunks' lexical vectors were made by another botgw's scheme (and need `relex`)."""
        meta = self.meta()
        return meta is not None and meta.get("lexical") != LEXICAL_SCHEME

    def relex(self, lexical_of: Callable[[dict[str, Any]], tuple[list[int], list[float]]]) -> int:
        """Rewrite every chunk's lexical vector from its stored text under this botgw's scheme, then record the
        scheme: an upgrade re-indexes words without embedding anything again. Idempotent, so a crash midway (or two
        processes at once, on a server) only repeats work. Returns the chunks rewritten."""
        from qdrant_client import models

        rewritten = 0
        counts: dict[tuple[str, str, str], Counter[int]] = {}
        with self._call() as client:
            if client.collection_exists(self.chunks):
                no_idf = models.SparseVectorParams(modifier=models.Modifier.NONE)  # per-base IDF comes with the query
                client.update_collection(self.chunks, sparse_vectors_config={LEXICAL: no_idf})
                offset = None
                while True:
                    points, offset = client.scroll(self.chunks, limit=WRITE_BATCH, offset=offset, with_payload=True)
                    updates = []
                    for point in points:
                        payload = dict(point.payload or {})
                        indices, values = lexical_of(payload)
                        sparse = models.SparseVector(indices=indices, values=values)
                        updates.append(models.PointVectors(id=point.id, vector={LEXICAL: sparse}))
                        key = (payload["kb"], payload["doc"], payload["version"])
                        counts.setdefault(key, Counter()).update(indices)
                    if updates:
                        client.update_vectors(self.chunks, updates, wait=True)
                    rewritten += len(updates)
                    if offset is None:
                        break
            for (kb, doc, version), holding in counts.items():
                client.upsert(self.docs, [_terms_point(kb, doc, version, holding)], wait=True)
            self._terms.clear()
            meta = {**(self.meta() or {}), "lexical": LEXICAL_SCHEME}
            client.upsert(self.docs, [models.PointStruct(id=META_ID, vector={}, payload=meta)], wait=True)
            self._meta = None
            self._index = None  # read again, with the new vectors
        return rewritten

    def ensure(self, identity: str, dim: int) -> None:
        """Create the collections for this model on first use; otherwise check that they match it."""
        from qdrant_client import models

        self.check_model(identity, dim)
        with self._call() as client:
            if not client.collection_exists(self.chunks):
                client.create_collection(
                    self.chunks,
                    vectors_config={
                        name: models.VectorParams(size=dim, distance=models.Distance.COSINE)
                        for name in (DENSE, QUESTION)
                    },
                    sparse_vectors_config={LEXICAL: models.SparseVectorParams(modifier=models.Modifier.NONE)},
                )
                if not self.embedded:  # the local mode has no payload indexes (it scans)
                    for field in ("kb", "doc", "version"):
                        client.create_payload_index(self.chunks, field, models.PayloadSchemaType.KEYWORD)
            if not client.collection_exists(self.docs):
                client.create_collection(self.docs, vectors_config={})
                if not self.embedded:
                    for field in ("kind", "kb"):
                        client.create_payload_index(self.docs, field, models.PayloadSchemaType.KEYWORD)
            if not client.retrieve(self.docs, [META_ID]):
                payload = {"kind": "meta", "embedding_model": identity, "dim": dim, "lexical": LEXICAL_SCHEME}
                client.upsert(self.docs, [models.PointStruct(id=META_ID, vector={}, payload=payload)])
                self._meta = None  # read again

    # --- documents

    def documents(self, kbs: Sequence[str] | None = None) -> list[DocRecord]:
        if self.embedded:
            with self._lock:
                records = list(self._local_records().values())
            return sorted((r for r in records if kbs is None or r.kb in kbs), key=lambda r: (r.kb, r.doc))
        return self._scroll_documents(kbs)

    def _local_records(self) -> dict[tuple[str, str], DocRecord]:
        """Embedded: the document records in memory (this process is the only one with the folder open)."""
        if self._records is None:
            self._records = {(record.kb, record.doc): record for record in self._scroll_documents(None)}
        return self._records

    def _scroll_documents(self, kbs: Sequence[str] | None) -> list[DocRecord]:
        from qdrant_client import models

        must: list[Any] = [models.FieldCondition(key="kind", match=models.MatchValue(value="doc"))]
        if kbs is not None:
            must.append(models.FieldCondition(key="kb", match=models.MatchAny(any=list(kbs))))
        records: list[DocRecord] = []
        with self._call() as client:
            if not client.collection_exists(self.docs):
                return []
            offset = None
            while True:
                points, offset = client.scroll(
                    self.docs, scroll_filter=models.Filter(must=must), limit=1000, offset=offset, with_payload=True
                )
                records += [_record(point.payload or {}) for point in points]
                if offset is None:
                    break
        return sorted(records, key=lambda record: (record.kb, record.doc))

    def document(self, kb: str, doc: str) -> DocRecord | None:
        if self.embedded:
            with self._lock:
                return self._local_records().get((kb, doc))
        with self._call() as client:
            if not client.collection_exists(self.docs):
                return None
            found = client.retrieve(self.docs, [DocRecord.point_id(kb, doc)], with_payload=True)
        return _record(found[0].payload or {}) if found else None

    def publish(self, record: DocRecord) -> None:
        """The flip: one point write makes `record.version` the version search sees."""
        from qdrant_client import models

        point = models.PointStruct(
            id=DocRecord.point_id(record.kb, record.doc), vector={}, payload={"kind": "doc", **asdict(record)}
        )
        with self._call() as client:
            client.upsert(self.docs, [point], wait=True)
            if self._records is not None:
                self._records[(record.kb, record.doc)] = record

    def unpublish(self, kb: str, doc: str) -> None:
        from qdrant_client import models

        with self._call() as client:
            if client.collection_exists(self.docs):
                selector = models.PointIdsList(points=[DocRecord.point_id(kb, doc)])
                client.delete(self.docs, points_selector=selector, wait=True)
            if self._records is not None:
                self._records.pop((kb, doc), None)

    # --- chunks

    def write(self, points: Sequence[ChunkPoint]) -> None:
        """Write the chunks of a version (all of them, in one call), then its terms record."""
        from qdrant_client import models

        counts: dict[tuple[str, str, str], Counter[int]] = {}
        with self._call() as client:
            for start in range(0, len(points), WRITE_BATCH):
                rows = [_row(point) for point in points[start : start + WRITE_BATCH]]
                batch = [
                    models.PointStruct(id=row.id, vector=_vectors(point), payload=row.payload)
                    for row, point in zip(rows, points[start : start + WRITE_BATCH], strict=True)
                ]
                client.upsert(self.chunks, batch, wait=True)
                if self._index is not None:
                    self._index.add(rows)
            for point in points:
                counts.setdefault((point.kb, point.doc, point.version), Counter()).update(point.lexical[0])
            # the embedded index counts terms itself; the records are written anyway, so that the same folder read
            # the way a server is read (tests do) has them
            client.upsert(self.docs, [_terms_point(*key, holding) for key, holding in counts.items()], wait=True)

    def _drop_terms(self, client: Any, must: list[Any], must_not: list[Any]) -> None:
        """Delete the terms records that match (as the chunks they count are deleted)."""
        from qdrant_client import models

        if client.collection_exists(self.docs):
            only = [models.FieldCondition(key="kind", match=models.MatchValue(value="terms")), *must]
            selector = models.FilterSelector(filter=models.Filter(must=only, must_not=must_not))
            client.delete(self.docs, points_selector=selector, wait=True)

    def prune(self, kb: str, doc: str, keep: str | None = None) -> None:
        """Delete the document's chunks of every version but `keep` (all of them when `keep` is None)."""
        from qdrant_client import models

        must = [
            models.FieldCondition(key="kb", match=models.MatchValue(value=kb)),
            models.FieldCondition(key="doc", match=models.MatchValue(value=doc)),
        ]
        must_not = [models.FieldCondition(key="version", match=models.MatchValue(value=keep))] if keep else []
        with self._call() as client:
            if client.collection_exists(self.chunks):
                selector = models.FilterSelector(filter=models.Filter(must=must, must_not=must_not))
                client.delete(self.chunks, points_selector=selector, wait=True)
                if self._index is not None:
                    self._index.remove_where(kb, doc, keep=keep)
            self._drop_terms(client, must, must_not)

    def drop_versions(self, kb: str, doc: str, versions: Collection[str]) -> None:
        """Delete the document's chunks of these versions (and nothing else: another add's may be there too)."""
        from qdrant_client import models

        if not versions:
            return
        must = [
            models.FieldCondition(key="kb", match=models.MatchValue(value=kb)),
            models.FieldCondition(key="doc", match=models.MatchValue(value=doc)),
            models.FieldCondition(key="version", match=models.MatchAny(any=sorted(versions))),
        ]
        with self._call() as client:
            if client.collection_exists(self.chunks):
                selector = models.FilterSelector(filter=models.Filter(must=must))
                client.delete(self.chunks, points_selector=selector, wait=True)
                if self._index is not None:
                    self._index.remove_where(kb, doc, versions=set(versions))
            self._drop_terms(client, must, [])

    def versions(self, kb: str, doc: str) -> set[str]:
        """The versions the document has chunks of now, current or not."""
        from qdrant_client import models

        must = [
            models.FieldCondition(key="kb", match=models.MatchValue(value=kb)),
            models.FieldCondition(key="doc", match=models.MatchValue(value=doc)),
        ]
        found: set[str] = set()
        with self._call() as client:
            if not client.collection_exists(self.chunks):
                return found
            offset = None
            while True:
                points, offset = client.scroll(
                    self.chunks, models.Filter(must=must), limit=1000, offset=offset, with_payload=["version"]
                )
                found.update(str((point.payload or {}).get("version")) for point in points)
                if offset is None:
                    return found

    def count(self, kb: str | None = None, doc: str | None = None, version: str | None = None) -> int:
        """Chunks stored, current or not (a check that nothing was left behind), of one version where given."""
        from qdrant_client import models

        must = [
            models.FieldCondition(key=key, match=models.MatchValue(value=value))
            for key, value in (("kb", kb), ("doc", doc), ("version", version))
            if value is not None
        ]
        with self._call() as client:
            if not client.collection_exists(self.chunks):
                return 0
            return client.count(self.chunks, count_filter=models.Filter(must=must), exact=True).count

    def _query(
        self, query: Any, using: str, versions: Sequence[str], limit: int, only_ids: Sequence[str] | None = None
    ) -> list[Found]:
        from qdrant_client import models

        if not versions:
            return []
        must: list[Any] = [models.FieldCondition(key="version", match=models.MatchAny(any=list(versions)))]
        if only_ids is not None:
            must.append(models.HasIdCondition(has_id=list(only_ids)))
        only = models.Filter(must=must)
        with self._call() as client:
            if not client.collection_exists(self.chunks):
                return []
            result = client.query_points(
                self.chunks,
                query=query,
                using=using,
                query_filter=only,
                limit=limit,
                with_payload=True,
                with_vectors=[DENSE, QUESTION],
            )
        found = []
        for point in result.points:
            vectors = point.vector if isinstance(point.vector, dict) else {}
            question = vectors.get(QUESTION)
            found.append(
                Found(
                    str(point.id),
                    dict(point.payload or {}),
                    float(point.score),
                    np.asarray(vectors[DENSE]),
                    None if question is None else np.asarray(question),
                )
            )
        return found

    def dense(self, vector: np.ndarray, versions: Sequence[str], limit: int) -> list[Found]:
        if self.embedded:
            with self._lock:
                return [_found(row, score) for row, score in self._local().dense(vector, versions, limit)]
        return self._query(vector.tolist(), DENSE, versions, limit)

    def lexical(self, vector: tuple[list[int], list[float]], documents: Sequence[DocRecord], limit: int) -> list[Found]:
        """The chunks of `documents` (current versions) best by BM25, each scored with its own base's IDF."""
        if not vector[0] or not documents:
            return []
        if self.embedded:
            with self._lock:
                versions = [record.version for record in documents]
                return [_found(row, score) for row, score in self._local().lexical(vector, versions, limit)]
        found: list[Found] = []
        for query, versions in self._per_base_queries(vector, documents):
            found += self._query(query, LEXICAL, versions, limit)
        return sorted(found, key=lambda hit: -hit.score)[:limit]

    def lexical_scores(
        self, vector: tuple[list[int], list[float]], documents: Sequence[DocRecord], ids: Sequence[str]
    ) -> dict[str, float]:
        """The lexical score of each chunk named (absent or 0: no word in common with the query)."""
        if not vector[0] or not ids or not documents:
            return {}
        if self.embedded:
            with self._lock:
                return self._local().lexical_scores(vector, [record.version for record in documents], ids)
        scores: dict[str, float] = {}
        for query, versions in self._per_base_queries(vector, documents):
            scores.update((hit.id, hit.score) for hit in self._query(query, LEXICAL, versions, len(ids), only_ids=ids))
        return scores

    def _per_base_queries(
        self, vector: tuple[list[int], list[float]], documents: Sequence[DocRecord]
    ) -> list[tuple[Any, list[str]]]:
        """Server: for each base, the query with that base's IDF as its weights, and the base's current versions."""
        from qdrant_client import models

        self._load_terms([record.version for record in documents])
        bases: dict[str, list[DocRecord]] = {}
        for record in documents:
            bases.setdefault(record.kb, []).append(record)
        queries = []
        for records in bases.values():
            population = sum(record.chunks for record in records)
            indices, values = [], []
            for term, weight in zip(*vector, strict=True):
                holding = sum(self._terms.get(record.version, {}).get(term, 0) for record in records)
                if holding:
                    indices.append(term)
                    values.append(weight * math.log1p((population - holding + 0.5) / (holding + 0.5)))
            if indices:
                queries.append((models.SparseVector(indices=indices, values=values), [r.version for r in records]))
        return queries

    def _load_terms(self, versions: Sequence[str]) -> None:
        """Server: read the terms records of the versions not cached yet (and forget those no longer asked for)."""
        missing = [version for version in versions if version not in self._terms]
        if missing:
            with self._call() as client:
                points = client.retrieve(self.docs, [_terms_id(version) for version in missing], with_payload=True)
            for point in points:
                payload = point.payload or {}
                self._terms[payload["version"]] = {int(term): count for term, count in payload["terms"].items()}
        if len(self._terms) > 4 * max(len(versions), 1_000):  # old versions of documents re-added since
            wanted = set(versions)
            self._terms = {version: terms for version, terms in self._terms.items() if version in wanted}

    def _local(self) -> LocalIndex:
        """The embedded store's chunks in memory, read once from the folder and kept in step by every write."""
        if self._index is None:
            index = LocalIndex()
            with self._call() as client:
                if client.collection_exists(self.chunks):
                    offset = None
                    while True:
                        points, offset = client.scroll(
                            self.chunks, limit=1000, offset=offset, with_payload=True, with_vectors=True
                        )
                        index.add(_row_of_record(point) for point in points)
                        if offset is None:
                            break
            self._index = index
        return self._index


def _local_client(folder: str, wait_s: float) -> Any:
    """Qdrant's local mode on `folder`, which one process at a time may hold: wait up to `wait_s` for it."""
    from qdrant_client import QdrantClient

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return QdrantClient(path=folder)
        except RuntimeError as exc:
            if "already accessed" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise StoreLocked(_locked_message(folder)) from None
            time.sleep(0.2)


def _row(point: ChunkPoint) -> Row:
    payload = {
        "kb": point.kb,
        "doc": point.doc,
        "version": point.version,
        "index": point.index,
        "title": point.title,
        "section": list(point.section),
        "text": point.text,
        "question": point.question,
    }
    terms = dict(zip(*point.lexical, strict=True))
    return Row(point.point_id, payload, point.dense.astype(np.float32), point.question_vector, terms)


def _row_of_record(record: Any) -> Row:
    vectors = record.vector or {}
    sparse = vectors.get(LEXICAL)
    terms = dict(zip(sparse.indices, sparse.values, strict=True)) if sparse is not None else {}
    question = vectors.get(QUESTION)
    return Row(
        str(record.id),
        dict(record.payload or {}),
        np.asarray(vectors[DENSE], dtype=np.float32),
        None if question is None else np.asarray(question, dtype=np.float32),
        terms,
    )


def _terms_id(version: str) -> str:
    return str(uuid.uuid5(_NS, f"terms\0{version}"))


def _terms_point(kb: str, doc: str, version: str, holding: Counter[int]) -> Any:
    """A version's terms record: how many of its chunks hold each term (JSON keys are strings)."""
    from qdrant_client import models

    payload = {
        "kind": "terms",
        "kb": kb,
        "doc": doc,
        "version": version,
        "terms": {str(t): n for t, n in holding.items()},
    }
    return models.PointStruct(id=_terms_id(version), vector={}, payload=payload)


def _found(row: Row, score: float) -> Found:
    return Found(row.id, row.payload, score, row.dense, row.question)


def _vectors(point: ChunkPoint) -> dict[str, Any]:
    from qdrant_client import models

    vectors: dict[str, Any] = {
        DENSE: point.dense.tolist(),
        LEXICAL: models.SparseVector(indices=point.lexical[0], values=point.lexical[1]),
    }
    if point.question_vector is not None:
        vectors[QUESTION] = point.question_vector.tolist()
    return vectors


def _record(payload: dict[str, Any]) -> DocRecord:
    """A document record from its point's payload; a field added since it was written takes its default."""
    fields = DocRecord.__dataclass_fields__
    kept = {key: payload[key] for key, field in fields.items() if key in payload or field.default is MISSING}
    return DocRecord(**kept)
