"""Commands packed by hiredis in C, as redis-py's own synchronous client does (its HiredisRespSerializer), and
sent under Python 3.12's `asyncio.wait_for` on 3.11.

redis-py's asyncio connection packs every command in Python, argument by argument: in issue 22's profile of the
worker that was a fifth of its Redis cost per answer (the scripts carry a dozen arguments each). hiredis, which
redis-py already uses to parse replies, packs the same bytes in one call; `install()` makes the asyncio
connections use it for the commands where it gives exactly redis-py's bytes at less cost, and leaves the rest to
redis-py's packer: another encoding, a bytearray or memoryview (hiredis would read a strided view's raw buffer),
a large value (redis-py sends it apart without copying it), an argument hiredis does not take.

redis-py sends every command under `asyncio.wait_for(..., socket_timeout)` (botgw always sets one: a blackholed
Redis must fail a call, not hang it). Python 3.11's wait_for runs what it awaits in a Task of its own: one more
Task and turn of the event loop per command (bench/callback_path.py: 111-120 against 126-131 µs of CPU per EVALSHA
through redis-py at the best of 8 rounds, 139-150 against 176-201 at the median). Python 3.12 made wait_for a
timeout around the await (CPython gh-96764), with the same errors; `install()` gives redis-py's connection module
that one on 3.11, and nothing else in the process changes.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import connection as redis_connection
from redis.asyncio.connection import AbstractConnection

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis]); without it nothing changes
    hiredis = None

T = TypeVar("T")
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


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """asyncio.wait_for as Python 3.12 has it: the awaitable awaited in this task under a timeout (TimeoutError
    when it passes, what is awaited cancelled), not in a Task of its own. A timeout of 0 or less is 3.11's own."""
    if timeout is not None and timeout <= 0:
        return await asyncio.wait_for(awaitable, timeout)
    async with asyncio.timeout(timeout):
        return await awaitable


def _asyncio_with_312_wait_for() -> types.ModuleType:
    """asyncio as redis-py's connection module sees it: the same names, with `wait_for` above."""
    shim = types.ModuleType("asyncio", asyncio.__doc__)
    shim.__dict__.update(vars(asyncio))
    shim.wait_for = wait_for  # type: ignore[attr-defined]
    return shim


def install() -> None:
    """Pack with hiredis, and on Python 3.11 send under 3.12's wait_for, in this process's asyncio Redis
    connections (idempotent)."""
    global _python_pack
    # From 3.11.3 only: asyncio.timeout mishandled a cancel before (redis-py issue 2633, which is why redis-py itself
    # reads under it only from there).
    if (3, 11, 3) <= sys.version_info < (3, 12) and redis_connection.asyncio is asyncio:
        redis_connection.asyncio = _asyncio_with_312_wait_for()  # type: ignore[attr-defined]
    if hiredis is None or AbstractConnection.pack_command is _pack:
        return
    _python_pack = AbstractConnection.pack_command
    AbstractConnection.pack_command = _pack  # type: ignore[method-assign]
