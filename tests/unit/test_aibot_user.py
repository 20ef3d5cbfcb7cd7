"""The simulated WeCom delivers an AI bot's callbacks as WeCom does: an answer not in within 5 s (or a 5xx) is
dropped and the same callback sent again, three times at most (platform-protocols.md §B), never waited for longer."""

from __future__ import annotations

import httpx
import pytest

from bots.wecom.config import WeComAIBotConfig
from simulator.wecom.ai_user import ANSWER_WITHIN_S, WeComAIBotUser

BOT = WeComAIBotConfig(id="ai", token="tok", encoding_aes_key="kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR")


async def test_a_slow_or_failed_answer_is_dropped_and_the_callback_sent_again() -> None:
    sent: list[tuple[bytes, float]] = []
    answers = iter([httpx.ReadTimeout("slow"), httpx.Response(502), httpx.Response(200)])

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((request.content, request.extensions["timeout"]["read"]))
        outcome = next(answers)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    user = WeComAIBotUser(BOT, ["http://gw"], "http://sim", httpx.AsyncClient(transport=httpx.MockTransport(answer)))
    assert await user.post({"msgtype": "event", "event": {"eventtype": "enter_chat"}}) == {}
    assert user.resent == 2 and len(sent) == 3
    assert len({body for body, _ in sent}) == 1, "the same callback, sent again"
    assert all(timeout == ANSWER_WITHIN_S for _, timeout in sent)


async def test_a_callback_never_answered_in_time_fails_after_three_resends() -> None:
    calls = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ReadTimeout("slow")

    user = WeComAIBotUser(BOT, ["http://gw"], "http://sim", httpx.AsyncClient(transport=httpx.MockTransport(answer)))
    with pytest.raises(httpx.ReadTimeout):
        await user.post({"msgtype": "event", "event": {"eventtype": "enter_chat"}})
    assert calls == 4
