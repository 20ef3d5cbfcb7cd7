"""The tools' audit trail: every confirmation asked, given or refused and every call with its outcome, one record
each in a Redis stream (keys.tools_audit), kept for `tools.audit_retention_days` and at most about
`tools.audit_max_records`. An operator reads it with `botgw tools audit` or `GET /admin/tools/audit`.

Arguments are kept as the model wrote them, but for values under keys that look secret (a password, a token, an
API key...), which become "***": the trail is read by operators who must not learn a user's credentials.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from redis.asyncio import Redis

from gateway.state.keys import Keys
from gateway.state.redis_text import as_text
from tools.config import ToolsSettings

log = logging.getLogger(__name__)

Kind = Literal["confirm_asked", "confirmed", "cancelled", "call"]
Outcome = Literal["ok", "error", "timeout", "refused", "unknown", ""]
MASK = "***"
SECRET_WORDS = frozenset({"password", "passwd", "pwd", "token", "secret", "key", "apikey", "authorization",
                          "cookie", "credential", "credentials"})
SECRET_ENDINGS = ("password", "passwd", "token", "secret", "apikey", "authorization", "cookie")
READ_PAGE = 500  # stream entries fetched per round trip while filtering by user
MAX_READ = 10_000  # the most records one read returns
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.ASCII)
UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_FORMS = "90s, 30m, 12h, 7d or bare seconds"


@dataclass(frozen=True)
class AuditRecord:
    """One event of the trail; `tool` is server.tool, `user` the asker's qualified identity."""

    ts: float
    bot: str
    user: str
    tool: str
    kind: Kind
    arguments: dict = field(default_factory=dict)
    outcome: Outcome = ""
    duration_ms: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def looks_secret(name: str) -> bool:
    """Whether a key names a credential: one of its words (snake, kebab or camelCase) is, or it ends in one."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    words = [word for word in re.split(r"[^a-z0-9]+", spaced.lower()) if word]
    joined = "".join(words)
    return any(word in SECRET_WORDS for word in words) or joined.endswith(SECRET_ENDINGS)


def masked(value: Any) -> Any:
    """`value` with whatever is under a secret-looking key replaced by "***", in nested objects and lists too."""
    if isinstance(value, Mapping):
        return {str(k): MASK if looks_secret(str(k)) else masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(item) for item in value]
    return value


def encode(record: AuditRecord) -> dict[str, str]:
    """The stream entry's fields for a record, its arguments masked."""
    return {
        "ts": repr(float(record.ts)),
        "bot": record.bot,
        "user": record.user,
        "tool": record.tool,
        "kind": record.kind,
        "arguments": json.dumps(masked(record.arguments), ensure_ascii=False, default=str),
        "outcome": record.outcome,
        "duration_ms": str(int(record.duration_ms)),
    }


def decode(entry_id: str, fields: Mapping[bytes | str, bytes | str]) -> AuditRecord:
    """A stream entry back as a record; a field missing (an older writer) takes its default, `ts` the entry's."""
    got = {as_text(k): as_text(v) for k, v in fields.items()}
    try:
        arguments = json.loads(got.get("arguments") or "{}")
    except ValueError:
        arguments = {"unreadable": got.get("arguments", "")}
    return AuditRecord(
        ts=float(got.get("ts") or int(entry_id.split("-")[0]) / 1000),
        bot=got.get("bot", ""),
        user=got.get("user", ""),
        tool=got.get("tool", ""),
        kind=got.get("kind", "call"),  # type: ignore[arg-type]
        arguments=arguments if isinstance(arguments, dict) else {"value": arguments},
        outcome=got.get("outcome", ""),  # type: ignore[arg-type]
        duration_ms=int(got.get("duration_ms") or 0),
    )


def parse_duration(text: str) -> float:
    """Seconds in what an operator wrote for --since / ?since= (90s, 30m, 12h, 7d, or bare seconds)."""
    matched = DURATION.match(text or "")
    seconds = float(matched.group(1)) * UNIT_S[matched.group(2)] if matched else 0.0
    if not 0 < seconds < math.inf:  # 400 digits are a float's infinity, which no time bound takes
        raise ValueError(f"{text!r} is not a duration: write {DURATION_FORMS}")
    return seconds


class ToolAudit:
    """Appends records to the trail (trimming it as it goes) and reads them back, newest last."""

    def __init__(self, redis: Redis, keys: Keys, settings: ToolsSettings) -> None:
        self._redis = redis
        self._key = keys.tools_audit
        self._settings = settings

    def _oldest_kept_ms(self, now: float) -> int:
        return int((now - self._settings.audit_retention_days * 86400) * 1000)

    async def record(self, record: AuditRecord) -> None:
        """Append one record; drop what is older than the retention, and what is beyond the record count (both
        approximately: Redis trims whole stream nodes, cheaply)."""
        pipe = self._redis.pipeline(transaction=False)  # one key, so a Cluster takes it too
        pipe.xadd(self._key, encode(record), maxlen=self._settings.audit_max_records, approximate=True)
        pipe.xtrim(self._key, minid=self._oldest_kept_ms(time.time()), approximate=True)
        await pipe.execute()

    async def read(
        self, *, user: str | None = None, since_s: float | None = None, limit: int = 1000,
        tool: str | None = None, outcome: str | None = None, kind: str | None = None,
    ) -> list[AuditRecord]:
        """The most recent `limit` records (of `user`, the exact qualified identity, and not older than `since_s`;
        of that `tool`, `outcome` and `kind` when given), oldest first. Records past the retention that trimming
        left behind are not shown."""
        wanted = {"user": user, "tool": tool, "outcome": outcome, "kind": kind}
        wanted = {name: value for name, value in wanted.items() if value is not None}
        now = time.time()
        oldest_ms = self._oldest_kept_ms(now)
        if since_s is not None:
            oldest_ms = max(oldest_ms, int((now - since_s) * 1000))
        limit = max(0, min(limit, MAX_READ))
        found: list[AuditRecord] = []
        upper = "+"
        while len(found) < limit:
            page = await self._redis.xrevrange(self._key, max=upper, min=str(max(oldest_ms, 0)), count=READ_PAGE)
            for raw_id, fields in page:
                try:
                    record = decode(as_text(raw_id), fields)
                except ValueError:  # not written by ToolAudit (a hand-made entry): skipped, not a failed read
                    log.warning("tools audit: entry %s is unreadable, skipped", as_text(raw_id))
                    continue
                if all(getattr(record, name) == value for name, value in wanted.items()):
                    found.append(record)
                    if len(found) == limit:
                        break
            if len(page) < READ_PAGE:
                break
            upper = "(" + as_text(page[-1][0])
        found.reverse()
        return found
