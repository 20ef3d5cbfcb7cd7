"""The embedded store's chunks in memory, searched with numpy instead of Qdrant's local mode.

Why: Qdrant's local mode checks a filter point by point in Python and scores sparse vectors the same way; with
10,000 chunks one search took about 3 s here. The embedded folder is open in one process only (it is locked), and
every write of that process goes through `KnowledgeStore`, so a copy kept in memory and updated on each write is
exact. Qdrant still holds and persists the data; this is only how the one process that has it searches it. With a
Qdrant server, Qdrant searches (it indexes what local mode scans).

Scores: cosine for dense vectors, and for the lexical vectors the dot product with the query's terms weighted by
BM25's IDF as Qdrant computes it, ln(1 + (N - n + 0.5) / (n + 0.5)), but with N and n counted per knowledge base over
the chunks search may see (current versions): a base's scores and rankings do not move when another base, or an
old version of one of its own documents, comes or goes (Qdrant's modifier counts the whole collection).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Row:
    id: str
    payload: dict[str, Any]
    dense: np.ndarray
    question: np.ndarray | None
    terms: dict[int, float]


class LocalIndex:
    """Rows are appended and marked dead (compacted when half are dead); numpy views are rebuilt on demand."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._rows: list[Row] = []
        self._alive: list[bool] = []
        self._where: dict[str, int] = {}  # point id -> row number
        self._postings: dict[int, tuple[list[int], list[float]]] = {}  # term -> row numbers (alive or not), weights
        self._versions: dict[str, int] = {}  # version -> a small number, so that filtering is one numpy call
        self._row_versions: list[int] = []
        self._bases: dict[str, int] = {}  # knowledge base -> a small number, for statistics per base
        self._row_bases: list[int] = []
        self._alive_count = 0
        self._views: dict[Any, np.ndarray] = {}  # numpy copies of the lists above, dropped on every change

    def __len__(self) -> int:
        return self._alive_count

    def add(self, rows: Iterable[Row]) -> None:
        for row in rows:
            if row.id in self._where:
                self._kill(self._where.pop(row.id))
            number = len(self._rows)
            self._rows.append(row)
            self._alive.append(True)
            self._where[row.id] = number
            version = str(row.payload.get("version"))
            self._row_versions.append(self._versions.setdefault(version, len(self._versions)))
            self._row_bases.append(self._bases.setdefault(str(row.payload.get("kb")), len(self._bases)))
            for term, weight in row.terms.items():
                numbers, weights = self._postings.setdefault(term, ([], []))
                numbers.append(number)
                weights.append(weight)
            self._alive_count += 1
        self._views.clear()

    def _kill(self, number: int) -> None:
        if self._alive[number]:
            self._alive[number] = False
            self._alive_count -= 1

    def remove_where(self, kb: str, doc: str, versions: Collection[str] | None = None, keep: str | None = None) -> None:
        """Mirror a delete by filter: the document's rows of `versions`, or of every version but `keep`."""
        for point_id, number in list(self._where.items()):
            payload = self._rows[number].payload
            if payload.get("kb") != kb or payload.get("doc") != doc or payload.get("version") == keep:
                continue
            if versions is None or payload.get("version") in versions:
                self._kill(self._where.pop(point_id))
        self._views.clear()
        if len(self._rows) > 1000 and self._alive_count < len(self._rows) // 2:
            rows = [row for row, alive in zip(self._rows, self._alive, strict=True) if alive]
            self._reset()
            self.add(rows)

    def _view(self, key: Any, build: Any) -> np.ndarray:
        if key not in self._views:
            self._views[key] = build()
        return self._views[key]

    def _eligible(self, versions: Sequence[str]) -> np.ndarray:
        alive = self._view("alive", lambda: np.asarray(self._alive, dtype=bool))
        codes = self._view("versions", lambda: np.asarray(self._row_versions, dtype=np.int64))
        wanted = [self._versions[v] for v in versions if v in self._versions]
        return alive & np.isin(codes, wanted)

    def _tie_order(self) -> np.ndarray:
        """Each row's place by (kb, doc, chunk): equal scores rank the same on every run (row order would not:
        it depends on the random version ids the rows were read back in)."""
        keys = [(r.payload.get("kb", ""), r.payload.get("doc", ""), r.payload.get("index", 0)) for r in self._rows]
        order = np.empty(len(keys), dtype=np.int64)
        order[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
        return order

    def _top(self, scores: np.ndarray, mask: np.ndarray, limit: int) -> list[tuple[Row, float]]:
        candidates = np.flatnonzero(mask)
        if not len(candidates):
            return []
        ties = self._view("ties", self._tie_order)[candidates]
        chosen = candidates[np.lexsort((ties, -scores[candidates]))[:limit]]
        return [(self._rows[i], float(scores[i])) for i in chosen]

    def dense(self, vector: np.ndarray, versions: Sequence[str], limit: int) -> list[tuple[Row, float]]:
        if not self._rows:
            return []
        matrix = self._view("dense", lambda: np.vstack([row.dense for row in self._rows]).astype(np.float32))
        return self._top(matrix @ vector.astype(np.float32), self._eligible(versions), limit)

    def lexical(
        self, vector: tuple[list[int], list[float]], versions: Sequence[str], limit: int
    ) -> list[tuple[Row, float]]:
        """BM25 over the rows of `versions`, each row's IDF counted within its own knowledge base."""
        if not self._rows:
            return []
        scores, matched = self._bm25(vector, versions)
        return self._top(scores, matched, limit)

    def lexical_scores(
        self, vector: tuple[list[int], list[float]], versions: Sequence[str], ids: Sequence[str]
    ) -> dict[str, float]:
        """The BM25 of the rows named (0 for a row that shares no term with the query)."""
        if not self._rows:
            return {}
        scores, _ = self._bm25(vector, versions)
        return {point_id: float(scores[self._where[point_id]]) for point_id in ids if point_id in self._where}

    def _bm25(self, vector: tuple[list[int], list[float]], versions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every row's score, and whether it shares a term with the query (rows outside `versions`: none)."""
        eligible = self._eligible(versions)
        bases = self._view("bases", lambda: np.asarray(self._row_bases, dtype=np.int64))
        population = np.bincount(bases[eligible], minlength=len(self._bases))  # N, per base
        scores = np.zeros(len(self._rows))
        matched = np.zeros(len(self._rows), dtype=bool)
        for term, weight in zip(*vector, strict=True):
            if term not in self._postings:
                continue
            numbers = self._view(("rows", term), lambda term=term: np.asarray(self._postings[term][0], dtype=np.int64))
            weights = self._view(("weights", term), lambda term=term: np.asarray(self._postings[term][1]))
            live = eligible[numbers]
            if not live.any():
                continue
            found = numbers[live]
            holding = np.bincount(bases[found], minlength=len(self._bases))  # n, per base
            idf = np.log1p((population - holding + 0.5) / (holding + 0.5))
            scores[found] += weight * idf[bases[found]] * weights[live]
            matched[found] = True
        return scores, matched
