"""Structured JSON logs with a request id that follows a message from callback to reply.

Secrets never reach a log line: settings hold them as SecretStr, and httpx's own request
logging (whose URLs carry access_token and corpsecret) is kept below INFO.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

# What a caller's X-Request-Id may be to be kept: anything else (too long, a space, a control character, non-ASCII)
# would let a client write what it likes into every log line of its request and into the queued entry.
_GIVEN_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def request_id_for(given: str | None) -> str:
    """The request id of a request: the caller's X-Request-Id if it is 1-64 characters of [A-Za-z0-9._-], else a
    new one (16 hex digits)."""
    if given and _GIVEN_REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex[:16]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id and any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(time.time(), 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = request_id.get()
        if rid:
            entry["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
