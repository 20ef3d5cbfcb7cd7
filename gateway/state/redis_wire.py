"""Commands packed by hiredis in C, as redis-py's own synchronous client does (its HiredisRespSerializer).

redis-py's asyncio connection packs every command in Python, argument by argument: in issue 22's profile of the
worker that was a fifth of its Redis cost per answer (the scripts carry a dozen arguments each). hiredis, which
redis-py already uses to parse replies, packs the same bytes in one call; `install()` makes the asyncio
connections use it for the commands where it gives exactly redis-py's bytes at less cost, and leaves the rest to
redis-py's packer: another encoding, a bytearray or memoryview (hiredis would read a strided view's raw buffer),
a large value (redis-py sends it apart without copying it), an argument hiredis does not take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import AbstractConnection

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis]); without it nothing changes
    hiredis = None

Packer = Callable[..., list[bytes]]
_python_pack: Packer = AbstractConnection.pack_command


def _pack(self: AbstractConnection, *args: Any) -> list[bytes]:
    encoder = self.encoder
    if encoder.encoding != "utf-8" or encoder.encoding_errors != "strict":
        return _python_pack(self, *args)
    cutoff = self._buffer_cutoff
    for arg in args:
        kind = type(arg)  # the exact types first: a script call's dozen arguments are str, bytes and int
        if kind is str or kind is bytes:
            if len(arg) > cutoff:
                return _python_pack(self, *args)
        elif kind is not int and kind is not float and (
            isinstance(arg, bytearray | memoryview) or (isinstance(arg, bytes | str) and len(arg) > cutoff)
        ):
            return _python_pack(self, *args)
    words = args
    if isinstance(args[0], str):  # a command name with a space ("CONFIG GET") is sent as separate words
        words = (*args[0].encode().split(), *args[1:])
    elif b" " in args[0]:
        words = (*args[0].split(), *args[1:])
    try:
        return [hiredis.pack_command(words)]
    except TypeError:  # a bool, None...: redis-py's packer says why (DataError), or copes
        return _python_pack(self, *args)


def install() -> None:
    """Pack with hiredis in this process's asyncio Redis connections (idempotent)."""
    global _python_pack
    if hiredis is None or AbstractConnection.pack_command is _pack:
        return
    _python_pack = AbstractConnection.pack_command
    AbstractConnection.pack_command = _pack  # type: ignore[method-assign]
