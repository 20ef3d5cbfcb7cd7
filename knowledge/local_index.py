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
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._rows: list[Row] = []
        self._alive: list[bool] = []
        self._where: dict[str, int] = {}  # point id -> row
        self._postings: dict[int, list[int]] = {}  # term -> rows (alive or not)
        self._matrix: np.ndarray | None = None  # dense vectors of every row, rebuilt after a change
        self._alive_count = 0

    def __len__(self) -> int:
        return self._alive_count

    def add(self, rows: Iterable[Row]) -> None:
        for row in rows:
            if row.id in self._where:
                self.remove([row.id])
            number = len(self._rows)
            self._rows.append(row)
            self._alive.append(True)
            self._where[row.id] = number
            for term in row.terms:
                self._postings.setdefault(term, []).append(number)
            self._alive_count += 1
        self._matrix = None

    def remove(self, ids: Iterable[str]) -> None:
        for point_id in ids:
            number = self._where.pop(point_id, None)
            if number is not None and self._alive[number]:
                self._alive[number] = False
                self._alive_count -= 1
        if len(self._rows) > 1000 and self._alive_count < len(self._rows) // 2:
            self._compact()

    def remove_where(self, kb: str, doc: str, version: str | None = None, keep: str | None = None) -> None:
        """Mirror a delete by filter: the document's rows of `version`, or of every version but `keep`."""
        doomed = []
        for row, alive in zip(self._rows, self._alive, strict=True):
            payload = row.payload
            if not alive or payload.get("kb") != kb or payload.get("doc") != doc:
                continue
            if (version is None or payload.get("version") == version) and payload.get("version") != keep:
                doomed.append(row.id)
        self.remove(doomed)

    def _compact(self) -> None:
        rows = [row for row, alive in zip(self._rows, self._alive, strict=True) if alive]
        self._reset()
        self.add(rows)

    def _eligible(self, versions: Sequence[str]) -> np.ndarray:
        wanted = set(versions)
        return np.fromiter(
            (
                alive and row.payload.get("version") in wanted
                for row, alive in zip(self._rows, self._alive, strict=True)
            ),
            dtype=bool,
            count=len(self._rows),
        )

    def _top(self, scores: np.ndarray, mask: np.ndarray, limit: int) -> list[tuple[Row, float]]:
        candidates = np.flatnonzero(mask & (scores > -np.inf))
        if not len(candidates):
            return []
        chosen = candidates[np.argsort(-scores[candidates], kind="stable")[:limit]]
        return [(self._rows[i], float(scores[i])) for i in chosen]

    def dense(self, vector: np.ndarray, versions: Sequence[str], limit: int) -> list[tuple[Row, float]]:
        if not self._rows:
            return []
        if self._matrix is None:
            self._matrix = np.vstack([row.dense for row in self._rows]).astype(np.float32)
        return self._top(self._matrix @ vector.astype(np.float32), self._eligible(versions), limit)

    def lexical(
        self, vector: tuple[list[int], list[float]], versions: Sequence[str], limit: int
    ) -> list[tuple[Row, float]]:
        scores = np.zeros(len(self._rows))
        matched = np.zeros(len(self._rows), dtype=bool)
        alive = np.asarray(self._alive, dtype=bool)
        for term, weight in zip(*vector, strict=True):
            rows = np.asarray(self._postings.get(term, ()), dtype=np.int64)
            rows = rows[alive[rows]] if len(rows) else rows
            if not len(rows):
                continue
            idf = math.log(1 + (self._alive_count - len(rows) + 0.5) / (len(rows) + 0.5))
            weights = np.fromiter((self._rows[i].terms[term] for i in rows), dtype=np.float64, count=len(rows))
            scores[rows] += weight * idf * weights
            matched[rows] = True
        return self._top(np.where(matched, scores, -np.inf), self._eligible(versions), limit)
