"""Counts the Redis round trips of a botgw process, for bench/overhead.py; no part of botgw.

bench/overhead.py puts this directory first on the PYTHONPATH of the gateway and the worker it starts, with
BENCH_TRIPS_SOCKET naming a Unix socket: Python imports this module at start-up, which wraps redis-py's asyncio
`send_packed_command` (one call writes one request and waits for its answer: a command, a pipeline, a MULTI/EXEC
block, each one round trip) and answers on the socket, to whoever connects, the counts so far as one JSON object
({"sends": n, "commands": {name: n}}). With BENCH_TRIPS_COMMANDS=1 it also names the commands of each send
("HGET", a script as "EVALSHA(<module>:<line> where it was registered)", a pipeline as "PIPELINE[HSET+XADD]"),
which costs some CPU in the process measured.
Without BENCH_TRIPS_SOCKET it does nothing. With BENCH_PROFILE naming a directory, the process also runs under
cProfile and writes <directory>/<pid>.prof when it exits (for finding where the CPU per answer goes); with
BENCH_PROFILE_WINDOW=1 as well, only from a SIGUSR1 to a SIGUSR2, which writes the file.

With BENCH_PARTS=1 it also times named parts of the answer (PARTS: the engine call, the platform's API calls, each
Redis step) in CPU seconds of the event loop's thread, and the answer shows them ({"parts": {label: [seconds,
calls]}, "loop_s": the loop thread's CPU so far}). A part's CPU includes whatever else the loop ran while the part
waited: only at concurrency 1, where that is the background alone (leases, probes, the pulse), does it tell
where an answer's CPU goes."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import threading

SOCKET = os.environ.get("BENCH_TRIPS_SOCKET", "")
PARTS_ON = os.environ.get("BENCH_PARTS") == "1"
NAMES = os.environ.get("BENCH_TRIPS_COMMANDS") == "1"
sends = 0
commands: collections.Counter[str] = collections.Counter()
scripts: dict[str, str] = {}  # a registered script's sha -> where it was registered


def _names(command: object) -> str:
    """The command names in one packed send (RESP arrays), e.g. "HGET" or "PIPELINE[HSET+XADD]"."""
    if isinstance(command, str):
        data = command.encode()
    elif isinstance(command, bytes | bytearray | memoryview):
        data = bytes(command)
    else:
        data = b"".join(bytes(part) for part in command)  # type: ignore[attr-defined]
    names, i = [], 0
    while data[i : i + 1] == b"*":
        end = data.index(b"\r\n", i)
        count, i = int(data[i + 1 : end]), end + 2
        for k in range(count):
            end = data.index(b"\r\n", i)
            length, i = int(data[i + 1 : end]), end + 2
            word = data[i : i + length].decode(errors="replace")
            if k == 0:
                names.append(word.upper())
            elif k == 1 and names[-1] == "EVALSHA":
                names[-1] = f"EVALSHA({scripts.get(word, word[:8])})"
            i += length + 2
    if len(names) == 1:
        return names[0]
    return "PIPELINE[" + "+".join(sorted(set(names))) + "]"


def _install() -> None:
    import sys

    from redis.asyncio.connection import AbstractConnection
    from redis.commands.core import AsyncScript

    registered = AsyncScript.__init__

    def named(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        registered(self, *args, **kwargs)
        caller = sys._getframe(2)  # register_script's caller
        where = f"{caller.f_globals.get('__name__', '?')}:{caller.f_lineno}"
        label = caller.f_locals.get("name")  # scripts registered in a loop over their names
        scripts[self.sha] = f"{where} {label}" if isinstance(label, str) else where

    if NAMES:
        AsyncScript.__init__ = named  # type: ignore[method-assign]

    original = AbstractConnection.send_packed_command

    async def send_packed_command(self, command, *args, **kwargs):  # type: ignore[no-untyped-def]
        global sends
        sends += 1  # the event loop's thread alone sends: no lock needed for a count read now and then
        if NAMES:
            with contextlib.suppress(Exception):
                commands[_names(command)] += 1
        return await original(self, command, *args, **kwargs)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]


# label -> (module, class or None for a module's function, coroutine function); labels are bench/overhead.py's
PARTS = {
    "answer": ("gateway.worker.loop", "Worker", "_handle"),
    "engine call": ("engine.pool", "EnginePool", "chat"),
    "platform API calls": ("bots.http", None, "request_json"),
    "record + memory load": ("gateway.state.reply_record", "ReplyRecord", "load"),
    "piece begin mark": ("gateway.state.reply_record", "ReplyRecord", "begin_send"),
    "release": ("gateway.queue.scheduler", "Scheduler", "release"),
    "callback": ("gateway.edge.callbacks", "QueueingHandler", "handle"),
    "enqueue": ("gateway.edge.batching", "RedisBatcher", "_flush"),
}
parts: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])


def _time_parts() -> None:
    """Wrap each part's coroutine function where it is defined, before anything imports it by name."""
    import functools
    import importlib
    import time

    def timed(label: str, function):  # type: ignore[no-untyped-def]
        @functools.wraps(function)
        async def part(*args, **kwargs):  # type: ignore[no-untyped-def]
            started = time.thread_time()
            try:
                return await function(*args, **kwargs)
            finally:
                used = parts[label]
                used[0] += time.thread_time() - started
                used[1] += 1

        return part

    # A module's function first: a module imported for a class below may import the function by name.
    for label, (module_name, class_name, name) in sorted(PARTS.items(), key=lambda item: item[1][1] is not None):
        try:  # another revision (--compare) may not have it: that part is left out
            module = importlib.import_module(module_name)
            owner = getattr(module, class_name) if class_name else module
            setattr(owner, name, timed(label, getattr(owner, name)))
        except (ImportError, AttributeError):
            continue


def _loop_cpu_s() -> float:
    """CPU seconds of the main thread (the event loop's), read from another thread."""
    import threading
    import time

    return time.clock_gettime(time.pthread_getcpuclockid(threading.main_thread().ident or 0))


def _serve() -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(SOCKET)
    server.listen(4)
    while True:
        conn, _ = server.accept()
        with conn, contextlib.suppress(OSError):
            answer = {"sends": sends, "commands": dict(commands)}
            if PARTS_ON:
                answer |= {"parts": dict(parts), "loop_s": _loop_cpu_s()}
            conn.sendall(json.dumps(answer).encode())


if SOCKET:
    _install()
    if PARTS_ON:
        _time_parts()
    threading.Thread(target=_serve, name="bench-trips", daemon=True).start()


PROFILE = os.environ.get("BENCH_PROFILE", "")
if PROFILE:
    import atexit
    import cProfile
    import signal
    import sys
    import time

    # CPU time of the event loop's thread, not wall: on a shared machine a process waiting for a core (or a coroutine
    # suspended on I/O) would otherwise be charged to whatever frame it stood in. The timer is a system call per
    # event, which inflates many small calls against few big ones: compare shares within one profile only.
    _profiler = cProfile.Profile(time.thread_time)
    if os.environ.get("BENCH_PROFILE_WINDOW") == "1":
        # Only between SIGUSR1 and SIGUSR2 (sent to the process by hand when the timed run starts and ends), so that
        # start-up and warm-up stay out of the profile. Python runs the handlers on the main thread, the loop's.
        def _dump() -> None:
            _profiler.disable()
            _profiler.dump_stats(os.path.join(PROFILE, f"{os.getpid()}.prof"))

        signal.signal(signal.SIGUSR1, lambda *_: _profiler.enable())
        signal.signal(signal.SIGUSR2, lambda *_: _dump())
    else:
        _profiler.enable()
        atexit.register(lambda: _profiler.dump_stats(os.path.join(PROFILE, f"{os.getpid()}.prof")))
    # uvicorn restores the handler it found and raises SIGTERM again after its shutdown: with the default handler the
    # process would die without running atexit, and the gateway's profile would never be written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
