"""Commands packed by hiredis in C, as redis-py's own synchronous client does (its HiredisRespSerializer).

redis-py's asyncio connection packs every command in Python, argument by argument: in issue 22's profile of the
worker that was a fifth of its Redis cost per answer (the scripts carry a dozen arguments each). hiredis, which
redis-py already uses to parse replies, packs the same bytes in one call; `install()` makes the asyncio
connections use it, and falls back to redis-py's packer wherever the bytes could differ (another encoding, a
memoryview, an argument hiredis does not take) so that nothing changes but the cost.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.connection import AbstractConnection

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis]); without it nothing changes
    hiredis = None

_PYTHON_PACK = AbstractConnection.pack_command


def _pack(self: AbstractConnection, *args: Any) -> list[bytes]:
    encoder = self.encoder
    if encoder.encoding != "utf-8" or encoder.encoding_errors != "strict":
        return _PYTHON_PACK(self, *args)
    if isinstance(args[0], str):  # a command name with a space ("CONFIG GET") is sent as separate words
        args = (*args[0].encode().split(), *args[1:])
    elif b" " in args[0]:
        args = (*args[0].split(), *args[1:])
    try:
        return [hiredis.pack_command(args)]
    except TypeError:  # a bool, None, memoryview...: redis-py's packer copes, or says why (DataError)
        return _PYTHON_PACK(self, *args)


def install() -> None:
    """Pack with hiredis in this process's asyncio Redis connections (idempotent)."""
    if hiredis is not None:
        AbstractConnection.pack_command = _pack  # type: ignore[method-assign]
