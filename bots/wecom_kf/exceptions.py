"""微信客服 errcodes and what each means for a sender (../shared/reference/wecom-kf.md §4–6)."""

from __future__ import annotations

from bots.base import ConversationTaken, SendError
from bots.wecom.exceptions import error_for as wecom_error_for

SESSION_NOT_OURS = 95018  # "send msg session status invalid": a human (or the queue for one) holds the session
QUOTA_CODES = frozenset({95001, 95002})  # 5 messages since the customer's last one; 48 h passed since it
# A repeated msgid is refused; our msgids are deterministic per piece, so this means "sent before".
# UNCONFIRMED which errcode WeCom uses ("MSG_ID重复" is reported without its number): 95030 is the simulator's.
DUPLICATE_MSGID_CODES = frozenset({95030})


class AlreadySent(SendError):
    """The platform refused a msgid it has seen: this piece was delivered by an earlier attempt."""

    retryable = False


def error_for(errcode: int, errmsg: str) -> SendError:
    if errcode == SESSION_NOT_OURS:
        return ConversationTaken("a human agent holds this 微信客服 session (95018)", code=errcode)
    if errcode in QUOTA_CODES:
        return ConversationTaken(f"the customer's reply allowance is used up ({errcode})", code=errcode)
    if errcode in DUPLICATE_MSGID_CODES:
        return AlreadySent(f"msgid already used ({errcode})", code=errcode)
    return wecom_error_for(errcode, errmsg)
