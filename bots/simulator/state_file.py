"""The simulator's memory on disk, for the playground (`botgw sim serve --state FILE`, which scripts/run_local.sh
passes): the 微信客服 log, the cursors and Tokens it handed out, sessions and what customers saw.

Why: a real WeCom never forgets a cursor it issued. A simulator restarted empty refuses the cursor the gateway kept
in Redis (as it must refuse one it never issued), so after `make stop && make run` 微信客服 went quiet: the
simulator was harsher than the platform in a way no deployment sees. Kept here, a restart changes nothing the
gateway can observe. Without `--state` (every test but the playground's) the state lives in memory only.

The file is rewritten (a temporary file, then an atomic rename) after every request that may change the Kefu state,
before its answer leaves, so a cursor the gateway was given is on disk before the gateway can save it; a SIGKILL
loses nothing that was answered. Not fsynced: a power cut may lose the last writes (the playground's Redis has the
same `everysec` exposure).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from bots.simulator.wecom_kf import KfState

FORMAT = 1
log = logging.getLogger(__name__)


class StateFileError(Exception):
    """The state file exists but cannot be used; the message says which file and what to do."""


class StateFile:
    """One JSON file holding the simulated platforms' state that must outlive a restart (today: 微信客服's)."""

    def __init__(self, path: Path, kf: KfState) -> None:
        self.path = path
        self._kf = kf

    def load(self) -> bool:
        """Read the file into the state; False when there is none yet (a first start)."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StateFileError(f"cannot read the simulator state {self.path}: {exc.strerror}") from None
        try:
            data: Any = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"not format {FORMAT}")
            self._kf.restore(data["kf"])
        except (ValueError, KeyError, TypeError) as exc:
            raise StateFileError(
                f"the simulator state {self.path} is unreadable ({type(exc).__name__}: {exc}); remove it to start the "
                "simulated platforms empty (`make clean` removes the whole playground)"
            ) from None
        log.info("simulator state loaded", extra={"path": str(self.path), "kf_log_items": len(self._kf.log)})
        return True

    def save(self) -> None:
        """Write the state as one atomic replacement of the file."""
        text = json.dumps({"format": FORMAT, "kf": self._kf.snapshot()}, ensure_ascii=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, self.path)


def changes_kf_state(method: str, path: str) -> bool:
    """Whether a request may change what `StateFile` keeps: every Kefu API call (sync_msg hands out a cursor) and
    every Kefu control route but the read-only listings (a session read may lapse it after 48 h)."""
    if path.startswith("/cgi-bin/kf/"):
        return True
    if path.startswith("/__sim__/kf/"):
        return method != "GET" or path == "/__sim__/kf/session"
    return False
