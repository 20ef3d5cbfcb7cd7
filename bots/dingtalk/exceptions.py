"""DingTalk error codes and how a sender must react to each."""

from __future__ import annotations

from bots.base import PermanentSendError, RetryableSendError, SendError, Throttled

SEND_TOO_FAST = 130101  # "send too fast, exceed 20 times per minute": the robot throttled 10 minutes (seen in public)
THROTTLE_PROBE_S = 15.0  # how often a throttled conversation is tried again (the throttle's end is not told)
# A sessionWebhook that will not take the reply: the OpenAPI is asked instead. Neither code is in DingTalk's docs
# (UNCONFIRMED): 300001 is an ended session's answer in public logs ("session 不存在", agentscope-ai/agentscope#1318),
# 310000 "security check failed" a third party's (platform-protocols.md). Nothing depends on them alone: any
# refusal of the webhook that is not a rate limit falls back the same way (adapter.py).
SESSION_EXPIRED_CODES = frozenset({300001, 310000})
OLD_API_QPS_CODES = frozenset({90018, 90002})  # 附录B：如何处理钉钉服务端API限流, as QPS_LIMIT_CODES in client.py


class SessionWebhookExpired(SendError):
    """The message's sessionWebhook no longer works: answer through the OpenAPI instead."""


def error_for(errcode: int, errmsg: str) -> SendError:
    if errcode == SEND_TOO_FAST:
        return Throttled(
            "DingTalk says send too fast (130101)", code=errcode, retry_after=THROTTLE_PROBE_S, not_sent=True
        )
    if errcode in SESSION_EXPIRED_CODES:
        return SessionWebhookExpired(f"sessionWebhook refused ({errcode}): {errmsg}", code=errcode)
    if errcode == -1:
        return RetryableSendError("DingTalk is busy (-1)", code=errcode)
    if errcode in OLD_API_QPS_CODES:  # the old API's QpsLimitForAppkeyAndApi and QpsLimitForApi (client.py)
        return RetryableSendError(f"DingTalk rate limit ({errcode})", code=errcode, retry_after=1.0, not_sent=True)
    return PermanentSendError(f"DingTalk errcode {errcode}: {errmsg}", code=errcode)
