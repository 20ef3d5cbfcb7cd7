"""Commands that ride along with a reply record's first load, in its one round trip.

A job reads its record (and the conversation's memory) before anything else; what the stages would ask Redis a
moment later (the memory's adoption, the message's admission) can go in the same pipeline instead of a trip of
its own. Riders are queued before the reads, so the reads see what a rider moved. A rider that failed (a script
that a restarted Redis lost) answers with the exception, and its stage asks again the usual way.
"""

from __future__ import annotations

from typing import Protocol

from redis.asyncio.client import Pipeline


class Rider(Protocol):
    def queue(self, pipe: Pipeline) -> None:
        """Add the command to the load's pipeline (a script by its SHA: a pipeline's script call would first
        ask whether the script exists, one more round trip)."""

    def answer(self, result: object) -> None:
        """Take the command's result, or the exception it raised."""
