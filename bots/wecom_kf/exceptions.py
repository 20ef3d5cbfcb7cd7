"""微信客服 errcodes and what each means for a sender (../shared/reference/wecom-kf.md §4–6)."""

from __future__ import annotations

from bots.base import ConversationTaken, PermanentSendError, SendError
from bots.wecom.exceptions import BAD_SECRET, IP_NOT_TRUSTED
from bots.wecom.exceptions import error_for as wecom_error_for

SESSION_NOT_OURS = 95018  # "send msg session status invalid": a human (or the queue for one) holds the session
# The session has ended (or never started): service_state/trans and the state-bound calls refuse a customer who is
# in state 4 (the NetCoreTemp WXKF C# client, around service_state/trans; simulator/wecom_kf/rules.py plays it).
SESSION_ENDED = 95013
QUOTA_CODES = frozenset({95001, 95002})  # 5 messages since the customer's last one; 48 h passed since it
# A repeated msgid is refused, but the documents give no errcode for it (wecom-kf.md §4: "an error is returned"),
# so nothing here recognises one by its number. A resend after an unknown outcome reads any unclassified refusal
# as "sent before" instead (bots/wecom_kf/adapter.py, UNCONFIRMED).
NOT_A_REPEAT = frozenset({IP_NOT_TRUSTED, BAD_SECRET})  # refusals that say nothing about an earlier attempt


def refused_as_repeat(exc: SendError) -> bool:
    """Whether a permanent refusal of a resend may be the platform refusing a msgid (or code) it has seen: any
    refusal that is not one we know to mean something else (a human holds it, the quota, the configuration)."""
    return (
        isinstance(exc, PermanentSendError) and not isinstance(exc, ConversationTaken) and exc.code not in NOT_A_REPEAT
    )


def error_for(errcode: int, errmsg: str) -> SendError:
    if errcode == SESSION_NOT_OURS:
        return ConversationTaken("a human agent holds this 微信客服 session (95018)", code=errcode, by_human=True)
    if errcode in QUOTA_CODES:
        return ConversationTaken(f"the customer's reply allowance is used up ({errcode})", code=errcode)
    return wecom_error_for(errcode, errmsg)
