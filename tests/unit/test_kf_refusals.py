"""微信客服 refusals the documents give no code for are told apart by asking the platform, never by a code number the
simulator chose (found by a review): a refused saved cursor (the same pull without it is answered), and a refused
handoff move while a human already holds the session."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bots.base import CursorRefused, PermanentSendError, ReplyTarget
from bots.wecom_kf.adapter import WeComKfAdapter
from bots.wecom_kf.config import WeComKfConfig

KEY = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR"
TARGET = ReplyTarget(user_id="wmcust", chat_id="wkacct")


class Api:
    """sync_msg, trans and service_state as the test wants them answered."""

    def __init__(self, *, cursor_refusals: int = 0, cursorless_ok: bool = True, state: int = 3) -> None:
        self.cursor_refusals, self.cursorless_ok, self.state = cursor_refusals, cursorless_ok, state
        self.pulls: list[str] = []

    async def sync_msg(self, channel: str, cursor: str, hint: str) -> dict[str, Any]:
        self.pulls.append(cursor)
        if cursor and self.cursor_refusals:
            self.cursor_refusals -= 1
            raise PermanentSendError("WeCom errcode 95099: an undocumented refusal", code=95099)
        if not cursor and not self.cursorless_ok:
            raise PermanentSendError("WeCom errcode 95099: an undocumented refusal", code=95099)
        return {"msg_list": [], "next_cursor": "c2", "has_more": 0}

    async def trans(self, channel: str, customer: str, state: int, servicer: str = "") -> str:
        raise PermanentSendError("WeCom errcode 95099: move refused", code=95099)

    async def service_state(self, channel: str, customer: str) -> tuple[int, str]:
        return self.state, ""


def adapter(api: Api) -> WeComKfAdapter:
    config = WeComKfConfig(id="kefu", corp_id="ww1", secret="s", token="tok", encoding_aes_key=KEY)
    kf = WeComKfAdapter(config, httpx.AsyncClient(), None)  # type: ignore[arg-type]  # no token: nothing is sent
    kf.api = api  # type: ignore[assignment]
    kf.sessions._api = api  # type: ignore[attr-defined]
    return kf


async def test_a_cursor_refused_with_any_code_is_told_by_a_pull_without_it() -> None:
    api = Api(cursor_refusals=2)
    with pytest.raises(CursorRefused):
        await adapter(api).pull_page("wkacct", "old-cursor", "tok")
    assert api.pulls == ["old-cursor", "", "old-cursor"]


async def test_a_cursor_refused_once_is_kept() -> None:
    """What is past a dropped cursor is skipped (or answered again): one refusal is not reason enough (a review)."""
    api = Api(cursor_refusals=1)
    page = await adapter(api).pull_page("wkacct", "good-cursor", "tok")
    assert page.next_cursor == "c2" and api.pulls == ["good-cursor", "", "good-cursor"]


async def test_a_pull_refused_with_and_without_its_cursor_is_not_the_cursors_fault() -> None:
    api = Api(cursor_refusals=9, cursorless_ok=False)  # an IP not trusted, a secret revoked: the cursor is kept
    with pytest.raises(PermanentSendError) as refused:
        await adapter(api).pull_page("wkacct", "good-cursor", "tok")
    assert not isinstance(refused.value, CursorRefused) and refused.value.code == 95099


@pytest.mark.parametrize(("state", "moved"), [(3, True), (2, True), (1, False)])
async def test_a_refused_handoff_move_is_a_handoff_made_only_when_a_human_holds_the_session(
    state: int, moved: bool
) -> None:
    kf = adapter(Api(state=state))
    if moved:
        assert await kf.sessions.hand_off(TARGET, None) == ""  # nothing to notify: a human has the customer
    else:
        with pytest.raises(PermanentSendError):
            await kf.sessions.hand_off(TARGET, None)
