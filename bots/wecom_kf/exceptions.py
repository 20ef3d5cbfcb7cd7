"""微信客服 errcodes and what each means for a sender (../shared/reference/wecom-kf.md §4–6)."""

from __future__ import annotations

from bots.base import ConversationTaken, SendError
from bots.wecom.exceptions import error_for as wecom_error_for

SESSION_NOT_OURS = 95018  # "send msg session status invalid": a human (or the queue for one) holds the session
QUOTA_USED_UP = 95001  # 5 messages since the customer's last one (or 48 h passed): wait for them to write
# A repeated msgid is refused; our msgids are deterministic per piece, so this means "sent before".
# UNCONFIRMED which errcode WeCom uses: these are the ones the simulator and public SDKs name.
DUPLICATE_MSGID_CODES = frozenset({95013, 40119})


class AlreadySent(SendError):
    """The platform refused a msgid it has seen: this piece was delivered by an earlier attempt."""

    retryable = False


def error_for(errcode: int, errmsg: str) -> SendError:
    if errcode == SESSION_NOT_OURS:
        return ConversationTaken("a human agent holds this 微信客服 session (95018)", code=errcode)
    if errcode == QUOTA_USED_UP:
        return ConversationTaken("the customer's 5-message allowance is used up (95001)", code=errcode)
    if errcode in DUPLICATE_MSGID_CODES:
        return AlreadySent(f"msgid already used ({errcode})", code=errcode)
    return wecom_error_for(errcode, errmsg)
