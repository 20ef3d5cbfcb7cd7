"""The store under adds and removals of one document running side by side (nothing locks a document across
processes), and the Qdrant client's settings. A real embedded store; the vectors are made up (what is checked is
which chunks and which record are left, not search)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from knowledge.config import KnowledgeSettings, StoreSettings
from knowledge.ingest import Ingestor
from knowledge.lexical import document_vector
from knowledge.store import ChunkPoint, DocRecord, KnowledgeStore

KB, DOC, CHUNKS = "shop", "退款.md", 3


class Embedder:
    identity = "stub"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KnowledgeStore]:
    opened = KnowledgeStore.open(StoreSettings(path=str(tmp_path / "store")))
    yield opened
    opened.close()


@pytest.fixture
def ingestor(store: KnowledgeStore, tmp_path: Path) -> Ingestor:
    return Ingestor(store, Embedder(), KnowledgeSettings(store=StoreSettings(path=str(tmp_path / "store"))))  # type: ignore[arg-type]


def version(text: str) -> tuple[DocRecord, list[ChunkPoint]]:
    """A version of the document as an add publishes it: its record and its chunks."""
    name = uuid.uuid4().hex
    points = [
        ChunkPoint(KB, DOC, name, i, "", (), f"{text} {i}", None, np.random.rand(4).astype(np.float32),
                   document_vector(text))
        for i in range(CHUNKS)
    ]  # fmt: skip
    return DocRecord(KB, DOC, name, f"fingerprint of {text}", "", CHUNKS, 10, "test", time.time()), points


def remove(store: KnowledgeStore) -> None:
    """What Knowledge.remove does: the record, then every chunk of the document."""
    store.unpublish(KB, DOC)
    store.prune(KB, DOC, keep=None)


def at_first_chunk_delete(store: KnowledgeStore, monkeypatch: pytest.MonkeyPatch, before: bool,
                          beside: Callable[[], None]) -> list[bool]:  # fmt: skip
    """Run `beside` once, just before (or just after) the next deletion of chunks, in the same thread (the
    store's lock is re-entrant). Returns a list that holds True once it ran."""
    real, ran = store._client.delete, []

    def delete(collection: str, *args: object, **kwargs: object) -> object:
        if collection != store.chunks or ran:
            return real(collection, *args, **kwargs)
        ran.append(True)
        if before:
            beside()
        result = real(collection, *args, **kwargs)
        if not before:
            beside()
        return result

    monkeypatch.setattr(store._client, "delete", delete)
    return ran


def test_an_older_add_never_deletes_the_chunks_of_an_add_that_ran_during_it(
    store: KnowledgeStore, ingestor: Ingestor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flipped to its version and deleted "every version but A", while B ran whole between its flip and that
    delete: B's chunks were deleted, A's written back, and the record named B (unfindable, counted by `kb list`,
    re-adding it "unchanged"). Found by a review."""
    ingestor._publish(*version("退款 旧"))
    record_a, points_a = version("退款 A")
    record_b, points_b = version("退款 B")
    ran = at_first_chunk_delete(store, monkeypatch, True, lambda: ingestor._publish(record_b, points_b))
    ingestor._publish(record_a, points_a)

    assert ran
    current = store.document(KB, DOC)
    assert current is not None and current.version == record_b.version
    assert store.count(KB, DOC, record_b.version) == CHUNKS
    assert store.count(KB, DOC) == CHUNKS  # neither A's nor the old version's are left


def test_a_removal_during_an_add_leaves_no_chunks_behind(
    store: KnowledgeStore, ingestor: Ingestor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A removal between an add's delete of the old version and its check of its own chunks: the add wrote its
    chunks back with no record to reach them."""
    ingestor._publish(*version("退款 旧"))
    ran = at_first_chunk_delete(store, monkeypatch, False, lambda: remove(store))
    ingestor._publish(*version("退款 新"))

    assert ran
    assert store.document(KB, DOC) is None
    assert store.count(KB, DOC) == 0


@pytest.mark.parametrize("beside", ["a removal", "another add's prune"])
def test_chunks_deleted_between_an_adds_write_and_its_flip_are_written_again(
    store: KnowledgeStore, ingestor: Ingestor, monkeypatch: pytest.MonkeyPatch, beside: str
) -> None:
    """The add flips last, so the document is there: its chunks, deleted meanwhile, are written again."""
    ingestor._publish(*version("退款 旧"))
    publish = store.publish

    def deleted_first(record: DocRecord) -> None:
        if beside == "a removal":
            remove(store)
        else:
            store.prune(KB, DOC, keep="another-version")
        publish(record)

    monkeypatch.setattr(store, "publish", deleted_first)
    record, points = version("退款 新")
    ingestor._publish(record, points)
    current = store.document(KB, DOC)
    assert current is not None and current.version == record.version
    assert store.count(KB, DOC, record.version) == store.count(KB, DOC) == CHUNKS


@pytest.mark.parametrize("timeout_s, sent", [(0.5, 1), (2.2, 3), (10.0, 10)])
def test_a_qdrant_timeout_is_whole_seconds_rounded_up(
    monkeypatch: pytest.MonkeyPatch, timeout_s: float, sent: int
) -> None:
    """int(0.5) sent 0, and every call to the server failed with an unclear message (found by a review)."""
    import qdrant_client

    made: list[dict[str, object]] = []
    monkeypatch.setattr(qdrant_client, "QdrantClient", lambda **options: made.append(options))
    KnowledgeStore.open(StoreSettings(qdrant_url="http://127.0.0.1:6333", timeout_s=timeout_s))
    assert made[0]["timeout"] == sent
