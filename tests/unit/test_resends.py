"""Whether a send's retry is a resend (gateway/delivery/base.py `Resends`): a refusal of a resend may be
the platform refusing a repeat and is taken as delivered, so only an attempt the platform may have acted on makes
the next one a resend. A review found any retry counted as one: a piece refused for good after a rate limit (which
sent nothing) was marked sent, and a DingTalk card that nobody saw was marked delivered."""

from __future__ import annotations

import asyncio

import pytest

from bots.base import PermanentSendError, RetryableSendError, SendError
from bots.dingtalk.exceptions import error_for as dingtalk_error
from bots.wecom.exceptions import error_for as wecom_error
from gateway.config import WorkerSettings
from gateway.delivery.base import Delivery, Resends

RATE_LIMITED = RetryableSendError("HTTP 429", code=429, not_sent=True)
TIMED_OUT = RetryableSendError("unreachable: ReadTimeout", code="network")
SESSION_ENDED = PermanentSendError("WeCom errcode 95013", code=95013)


def resends_seen(failures: list[SendError], unknown: bool = False) -> tuple[list[bool], BaseException | None]:
    """Run one send through the worker's retries, the attempts failing with `failures` in turn (then succeeding);
    what each attempt was told, and what the send ended with."""
    seen: list[bool] = []

    async def send(resend: bool) -> None:
        seen.append(resend)
        if len(seen) <= len(failures):
            raise failures[len(seen) - 1]

    settings = WorkerSettings(backoff_base_s=0.001, backoff_max_s=0.002, max_send_attempts=4)
    delivery = Delivery(None, None, None, None, settings)  # type: ignore[arg-type]  # only its retries are used
    try:
        asyncio.run(delivery.retry_send(Resends(send, unknown)))
    except SendError as exc:
        return seen, exc
    return seen, None


def test_a_retry_after_a_rate_limit_is_not_a_resend() -> None:
    seen, ended = resends_seen([RATE_LIMITED, SESSION_ENDED])
    assert seen == [False, False]
    assert ended is SESSION_ENDED


def test_a_retry_after_an_attempt_that_may_have_arrived_is_a_resend() -> None:
    seen, ended = resends_seen([RATE_LIMITED, TIMED_OUT])
    assert seen == [False, False, True] and ended is None


def test_a_send_whose_earlier_try_is_unknown_is_a_resend_from_the_start() -> None:
    seen, _ = resends_seen([RATE_LIMITED], unknown=True)
    assert seen == [True, True]


@pytest.mark.parametrize(
    "error, not_sent",
    [
        (wecom_error(45009, "api freq out of limit"), True),
        (wecom_error(-1, "system busy"), False),
        (dingtalk_error(130101, "send too fast"), True),
        (dingtalk_error(90018, "qps limit for appkey and api"), True),
        (dingtalk_error(-1, "busy"), False),
    ],
)
def test_the_platforms_rate_limits_say_nothing_was_sent(error: SendError, not_sent: bool) -> None:
    assert error.not_sent is not_sent
