"""DingTalk AI cards as the gateway's card delivery sees them (bots.channels.Cards): create, deliver, show
the text so far, finish or fail; the flow states are DingTalk's own (client.py FLOW_*)."""

from __future__ import annotations

from bots.dingtalk.client import FLOW_FAILED, FLOW_FINISHED, FLOW_INPUTTING, DingTalkApiClient


class DingTalkCards:
    def __init__(self, api: DingTalkApiClient, updates_per_second: float) -> None:
        self._api = api
        self.updates_per_second = updates_per_second

    def new_track_id(self, *parts: str) -> str:
        return self._api.new_track_id(*parts)

    async def create(self, track_id: str, *, group_id: str) -> None:
        await self._api.create_card(track_id, group_id=group_id)

    async def deliver(self, track_id: str, *, group_id: str, user_id: str) -> None:
        await self._api.deliver_card(track_id, group_id=group_id, user_id=user_id)

    async def writing(self, track_id: str) -> None:
        await self._api.set_card_status(track_id, FLOW_INPUTTING)

    async def show(self, track_id: str, text: str, *, final: bool = False) -> None:
        await self._api.stream_card(track_id, text, final=final)

    async def finished(self, track_id: str, text: str) -> None:
        await self._api.set_card_status(track_id, FLOW_FINISHED, text)

    async def failed(self, track_id: str, text: str) -> None:
        await self._api.set_card_status(track_id, FLOW_FAILED, text)
