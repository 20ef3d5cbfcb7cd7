"""The embedded store's chunks in memory, searched with numpy instead of Qdrant's local mode.

Why: Qdrant's local mode checks a filter point by point in Python and scores sparse vectors the same way; with
10,000 chunks one search took about 3 s here. The embedded folder is open in one process only (it is locked), and
every write of that process goes through `KnowledgeStore`, so a copy kept in memory and updated on each write is
exact. Qdrant still holds and persists the data; this is only how the one process that has it searches it. With a
Qdrant server, Qdrant searches (it indexes what local mode scans).

Scores are Qdrant's: cosine for dense vectors, and for the lexical vectors the dot product with the query's terms
weighted by Qdrant's IDF, ln(1 + (N - n + 0.5) / (n + 0.5)), N and n counted over the whole collection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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

    def remove_where(self, kb: str, doc: str, version: str | None = None, keep: str | None = None) -> None:
        """Mirror a delete by filter: the document's rows of `version`, or of every version but `keep`."""
        for point_id, number in list(self._where.items()):
            payload = self._rows[number].payload
            if payload.get("kb") != kb or payload.get("doc") != doc or payload.get("version") == keep:
                continue
            if version is None or payload.get("version") == version:
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
        if not self._rows:
            return []
        alive = self._view("alive", lambda: np.asarray(self._alive, dtype=bool))
        scores = np.zeros(len(self._rows))
        matched = np.zeros(len(self._rows), dtype=bool)
        for term, weight in zip(*vector, strict=True):
            if term not in self._postings:
                continue
            numbers = self._view(("rows", term), lambda term=term: np.asarray(self._postings[term][0], dtype=np.int64))
            weights = self._view(("weights", term), lambda term=term: np.asarray(self._postings[term][1]))
            live = alive[numbers]
            found = int(live.sum())
            if not found:
                continue
            idf = math.log(1 + (self._alive_count - found + 0.5) / (found + 0.5))
            scores[numbers[live]] += weight * idf * weights[live]
            matched[numbers[live]] = True
        return self._top(scores, matched & self._eligible(versions), limit)
