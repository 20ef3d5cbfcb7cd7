"""What `botgw kb add` shows while it works: embedding a long document takes minutes on a CPU, and a command
that says nothing for that long looks hung. On a terminal one status line is redrawn (the file, its chunks,
the rate and the time left for the whole run); elsewhere (a log, CI) plain lines: one per file, and one every
`every_s` while a long file is embedded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from knowledge.formats import PARSERS
from knowledge.ingest import Found, Outcome

PLAIN_EVERY_S = 10.0


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class AddProgress:
    def __init__(
        self,
        files: list[Found],
        stream: TextIO,
        terminal: bool,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = PLAIN_EVERY_S,
    ) -> None:
        self._sizes = {found.doc: _size(found) for found in files}
        self._total = sum(self._sizes.values()) or 1
        self._count = len(files)
        self._stream = stream
        self._terminal = terminal
        self._clock = clock
        self._every_s = every_s
        self._started = clock()
        self._done_bytes = 0
        self._number = 1
        self._said_at = self._started
        self._redrawn = False

    def file_done(self, number: int, total: int, outcome: Outcome) -> None:
        """A file is through: a line that stays (ingest.Progress)."""
        self._done_bytes += self._sizes.get(outcome.doc, 0)
        self._number = number + 1
        detail = outcome.reason or f"{outcome.chunks} chunks"
        self._line(f"[{number}/{total}] {outcome.doc}: {outcome.status} ({detail}, {outcome.seconds:.1f} s)")

    def embedding(self, doc: str, done: int, total: int) -> None:
        """Part of a file is embedded (ingest.Embedding): redraw the status, or now and then a plain line."""
        now = self._clock()
        fraction = (self._done_bytes + self._sizes.get(doc, 0) * done / max(total, 1)) / self._total
        elapsed = now - self._started
        left = f"about {_duration(elapsed * (1 - fraction) / fraction)} left" if fraction > 0.01 else "timing…"
        rate = f"{done / elapsed:.1f} chunks/s" if self._count == 1 and elapsed > 0 and done else ""
        status = f"[{self._number}/{self._count}] {doc}: {done}/{total} chunks embedded, {left}"
        status += f" ({rate})" if rate else ""
        if self._terminal:
            self._stream.write(f"\r\033[K{status}")
            self._stream.flush()
            self._redrawn = True
        elif now - self._said_at >= self._every_s and done < total:
            self._line(status)

    def _line(self, text: str) -> None:
        if self._redrawn:
            self._stream.write("\r\033[K")
            self._redrawn = False
        self._stream.write(text + "\n")
        self._stream.flush()
        self._said_at = self._clock()


def _size(found: Found) -> int:
    """The bytes a file is likely to take work for (none for one that will be skipped or fail at once)."""
    if found.path.suffix.lower() not in PARSERS:
        return 0
    try:
        return found.path.stat().st_size
    except OSError:
        return 0
