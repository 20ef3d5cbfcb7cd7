"""A person tapping a card's button, for the simulator: DingTalk pushes a CALLBACK frame on topic
/v1.0/card/instances/callback to a live Stream connection of the app that created the card and subscribed to the
topic (S13 handlers.py TOPIC_CARD_CALLBACK; S12 protocol.md).

The callback's data is the shape of the SDK's own sample (open-dingtalk/dingtalk-stream-sdk-python
card_callback_message.py): `userId` (userIdType 1), `corpId`, `outTrackId`, `type: actionCallback`, `extension`,
`content` and `value` (JSON strings of `{"cardPrivateData": {"actionIds": [<button id>], "params": {}}}`), and
`spaceType`/`spaceId` left empty as in that sample (the harsher reading: the callback does not say where the card
is). A tap is refused when the card was never delivered where the person is (another person's one-to-one chat,
another group) or shows no such callback button; `stale_view` taps the card as it was delivered, before any update
reached the person's client (a double tap, a slow client). Whether DingTalk resends a card callback that is not
acked is UNCONFIRMED: like a robot message it is pushed once, never again (the harsher reading).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from simulator.dingtalk.cards import buttons_of
from simulator.dingtalk.state import CARD_CALLBACK_TOPIC, DingTalkState, PendingFrame

SIM_CORP = "ding-sim-corp"  # the organisation the simulated people belong to (user.py's senderCorpId)


class TapRefused(Exception):
    """The person could not have tapped that: why."""


def push_tap(state: DingTalkState, track: str, user: str, button: str, *, conversation: str = "",
             stale_view: bool = False) -> str:
    """Queue the callback of `user` tapping `button` on card `track` in `conversation` (a group's id; '' their chat
    with the robot); the frame's id. TapRefused when DingTalk would not show them that button."""
    if track not in state.delivered_cards:
        raise TapRefused("no such card was delivered")
    spaces = [e.get("openSpaceId", "") for e in state.cards.get(track, []) if e.get("op") == "deliver"]
    where = f"dtv1.card//IM_GROUP.{conversation}" if conversation else f"dtv1.card//IM_ROBOT.{user}"
    if where not in spaces:
        raise TapRefused("the card was never delivered where this person is")
    created = next((e for e in state.cards[track] if e.get("op") == "create"), {})
    params = created.get("params", {}) if stale_view else state.card_params.get(track, {})
    if not any(b.get("id") == button and b.get("request") is True for b in buttons_of(params) or []):
        raise TapRefused("the card shows no such button")
    private = json.dumps({"cardPrivateData": {"actionIds": [button], "params": {}}})
    data: dict[str, Any] = {
        "extension": "{}", "corpId": SIM_CORP, "spaceType": "", "userIdType": 1, "type": "actionCallback",
        "userId": user, "content": private, "spaceId": "", "outTrackId": track, "value": private,
    }
    client_id = state.card_apps.get(track, "")
    message_id = secrets.token_hex(12)
    frame = {
        "specVersion": "1.0",
        "type": "CALLBACK",
        "headers": {"topic": CARD_CALLBACK_TOPIC, "messageId": message_id, "contentType": "application/json",
                    "time": str(int(time.time() * 1000)), "appId": client_id},
        "data": json.dumps(data, ensure_ascii=False),
    }
    state.pending[message_id] = PendingFrame(client_id, message_id, json.dumps(frame, ensure_ascii=False),
                                             topic=CARD_CALLBACK_TOPIC, card=track)
    state.card_taps.append({"track": track, "user": user, "button": button, "conversation": conversation,
                            "message_id": message_id, "at": time.time()})
    return message_id
