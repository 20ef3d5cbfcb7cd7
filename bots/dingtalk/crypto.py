"""DingTalk's HTTP-mode signature: sign = base64(HMAC-SHA256(appSecret, f"{timestamp}\\n{appSecret}"))."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from bots.base import CallbackRejected


def sign(timestamp_ms: str, app_secret: str) -> str:
    digest = hmac.new(app_secret.encode(), f"{timestamp_ms}\n{app_secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def verify_headers(headers: Mapping[str, str], app_secret: str, now: float, window_s: int) -> None:
    """Both checks DingTalk asks for: the timestamp within the window (1 h), the sign matching (constant time)."""
    timestamp = headers.get("timestamp", "")
    signature = headers.get("sign", "")
    if not timestamp or not signature:
        raise CallbackRejected("missing_headers", 400, "timestamp and sign headers are required")
    try:
        sent_ms = int(timestamp)
    except ValueError as exc:
        raise CallbackRejected("bad_timestamp", 400, "timestamp is not an integer") from exc
    if window_s and abs(int(now * 1000) - sent_ms) > window_s * 1000:  # integers: a 4000-digit timestamp is no float
        raise CallbackRejected("stale_timestamp", 403, "timestamp outside the replay window")
    try:
        given = signature.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: no platform signed that
        raise CallbackRejected("bad_encoding", 400, "sign is not valid Unicode") from exc
    if not hmac.compare_digest(sign(timestamp, app_secret).encode(), given):
        raise CallbackRejected("bad_signature", 403, "sign does not match")
