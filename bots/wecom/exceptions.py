"""WeCom API error codes and how a sender must react to each (platform-protocols.md §C)."""

from __future__ import annotations

from bots.base import ErrorHint, PermanentSendError, RetryableSendError, SendError

TOKEN_INVALID_CODES = frozenset({40014, 42001, 41001})
THROTTLED_CODES = frozenset({45009, 45033})
IP_NOT_TRUSTED = 60020
BAD_SECRET = 40001

TRUSTED_IP_HINT = (
    "WeCom refused the server's IP (60020): add this server's egress IP under the app's "
    "企业可信IP in the WeCom admin console; retrying will not help"
)
TRUSTED_IP_HINT_ZH = (
    "企业微信拒绝了本服务器的 IP（60020）：请在企业微信管理后台该应用的「企业可信IP」里加入本服务器的出口 IP"
    "（每台 worker 主机，或它们前面的 NAT）。重试无济于事；加好后在「死信」页重放。"
)
TRUSTED_IP_SAID = f"{TRUSTED_IP_HINT}; WeCom said: "  # what error_for puts before WeCom's own words
# The token errors the console explains (gateway/console/pages/overview.py), for every bot on a WeCom token.
TOKEN_HINTS = {str(IP_NOT_TRUSTED): ErrorHint("trusted_ip", TRUSTED_IP_HINT_ZH, TRUSTED_IP_HINT, TRUSTED_IP_SAID)}


class WeComApiError(SendError):
    """An errcode from WeCom that is neither success nor a token problem."""


def error_for(errcode: int, errmsg: str) -> SendError:
    """Map a WeCom errcode to a typed send error; `errmsg` is WeCom's own text (no secrets)."""
    if errcode in THROTTLED_CODES:
        return RetryableSendError(f"WeCom throttled the app ({errcode})", code=errcode, retry_after=2.0, not_sent=True)
    if errcode == IP_NOT_TRUSTED:
        return PermanentSendError(f"{TRUSTED_IP_SAID}{errmsg}", code=errcode)
    if errcode == BAD_SECRET:
        return PermanentSendError("WeCom rejected the app secret (40001): check corp_id/secret", code=errcode)
    if errcode == -1:
        return RetryableSendError("WeCom is busy (-1)", code=errcode)
    return PermanentSendError(f"WeCom errcode {errcode}: {errmsg}", code=errcode)
