"""The simulator's memory on disk, for the playground (`botgw sim serve --state FILE`, which scripts/run_local.sh
passes): the 微信客服 log, the cursors and Tokens it handed out, sessions and what customers saw.

Why: a real WeCom never forgets a cursor it issued. A simulator restarted empty refuses the cursor the gateway kept
in Redis (as it must refuse one it never issued), so after `make stop && make run` 微信客服 went quiet: the
simulator was harsher than the platform in a way no deployment sees. Kept here, a restart changes nothing the
gateway can observe. Without `--state` (every test but the playground's) the state lives in memory only.

The file is rewritten after every request that may change the Kefu state, before its answer leaves, so a cursor the
gateway was given is on disk before the gateway can save it; a SIGKILL loses nothing that was answered. A write is a
temporary file (mode 600: it holds the Tokens and codes handed out), fsynced, then renamed over the file; it runs in
a thread (the event loop keeps serving) while the request that asked for it waits, one write at a time, and is
skipped when the state reads as it was last written. A file that cannot be used is refused at start with one line
(`StateFileError`): its shape is checked whole (simulator/wecom_kf/snapshot.py) before any of it is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from simulator.wecom_kf.snapshot import KfSnapshot
from simulator.wecom_kf.state import KfState

FORMAT = 1
log = logging.getLogger(__name__)


class StateFileError(Exception):
    """The state file exists but cannot be used, or cannot be written; the message says which file and why."""


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    format: Literal[1]
    kf: KfSnapshot


def _problem(exc: ValidationError) -> str:
    """Where the file is wrong and how, without any of its values: dict keys in it are cursors, Tokens and codes,
    so a location element that is not one of the format's own field names is shown as `[…]`."""
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ""
    for part in first["loc"]:
        if isinstance(part, int):
            where += f"[{part}]"
        elif part in _FIELD_NAMES:
            where += f".{part}" if where else part
        else:
            where += "[…]"
    more = exc.error_count() - 1
    return f"{where or 'the file'}: {first['msg']}" + (f" (and {more} more)" if more else "")


def _field_names(model: type[BaseModel], into: set[str]) -> set[str]:
    for name, info in model.model_fields.items():
        into.add(name)
        for argument in (info.annotation, *getattr(info.annotation, "__args__", ())):
            for inner in (argument, *getattr(argument, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel) and inner is not model:
                    _field_names(inner, into)
    return into


_FIELD_NAMES = _field_names(_Document, set())


class StateFile:
    """One JSON file holding the simulated platforms' state that must outlive a restart (today: 微信客服's)."""

    def __init__(self, path: Path, kf: KfState) -> None:
        self.path = path
        self._kf = kf
        self._written: str | None = None  # the text the file holds, as far as this process knows
        self._lock = asyncio.Lock()

    def _refuse(self, what: str) -> StateFileError:
        return StateFileError(
            f"the simulator state {self.path} is unreadable ({what}); remove it to start the simulated platforms "
            "empty (`make clean` removes the whole playground)"
        )

    def load(self) -> bool:
        """Read the file into the state; False when there is none yet (a first start)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StateFileError(f"cannot read the simulator state {self.path}: {exc.strerror}") from None
        try:
            document = _Document.model_validate_json(raw)  # nesting bounded by the parser: no RecursionError
        except ValidationError as exc:
            raise self._refuse(_problem(exc)) from None
        try:
            self._kf.restore(document.kf)
        except Exception as exc:  # checked above; anything left is still this file's fault, said in one line
            raise self._refuse(type(exc).__name__) from None
        log.info("simulator state loaded", extra={"path": str(self.path), "kf_log_items": len(self._kf.log)})
        return True

    def _text(self) -> str:
        return json.dumps({"format": FORMAT, "kf": self._kf.snapshot()}, ensure_ascii=False)

    async def save(self) -> None:
        """Write the state if it changed since the last write; returns once it is on disk. Raises StateFileError
        when it cannot be written (the file then still holds the last state written)."""
        async with self._lock:  # one write at a time, each with the state as it is when its turn comes
            text = self._text()  # on the loop: the state is only ever touched there
            if text == self._written:
                return
            await asyncio.to_thread(self._write, text)
            self._written = text

    def _write(self, text: str) -> None:
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.fchmod(fd, 0o600)  # a temporary file left by an older run may have had another mode
                data = memoryview(text.encode("utf-8"))
                while data:  # a full disk may take part of it, then refuse the rest
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            raise StateFileError(f"cannot write the simulator state {self.path}: {exc.strerror}") from None


def changes_kf_state(method: str, path: str) -> bool:
    """Whether a request may change what `StateFile` keeps: every Kefu API call (sync_msg hands out a cursor) and
    every Kefu control route but the read-only listings (a session read may lapse it after 48 h)."""
    if path.startswith("/cgi-bin/kf/"):
        return True
    if path.startswith("/__sim__/kf/"):
        return method != "GET" or path == "/__sim__/kf/session"
    return False
