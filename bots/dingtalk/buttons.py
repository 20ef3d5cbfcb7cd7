"""A tool call's question asked on DingTalk with buttons (bots.channels.Buttons), and the tap read back.

Asking: an interactive card of the public Markdown-with-buttons template the dingtalk-stream SDK uses
(S13 card_instance.py `MarkdownButtonCardInstance`, template 1366a1eb-…: cardParamMap `title`, `markdown`, `tips`,
and `sys_full_json_obj` = JSON of `{"msgButtons": [...]}`), created (POST /v1.0/card/instances, callbackType STREAM)
and delivered into the group or the person's chat with the robot (POST /v1.0/card/instances/deliver), as the AI card
is (client.py). A button that calls back is `{"text", "color", "id", "request": true}` (S13 card_instance.py
`CarouselCardInstance`); its `id` comes back in the callback's `cardPrivateData.actionIds`.

The tap: DingTalk pushes a CALLBACK frame on topic /v1.0/card/instances/callback over the Stream connection (S13
handlers.py TOPIC_CARD_CALLBACK, card_callback.py; open-dingtalk/dingtalk-stream-sdk-go card/model.go CardRequest):
`userId` (userIdType 1: the staffId), `corpId`, `outTrackId`, `spaceType`/`spaceId` (empty in the SDK's own sample:
not relied on), and `content`, a JSON string `{"cardPrivateData": {"actionIds": [...], "params": {...}}}`. The
callback names no conversation, so the card's outTrackId carries it: the group and the asker, signed with the app
secret (the outTrackId is ours, DingTalk returns it as set; the signature keeps a card of anyone else's, or a made-up
id, from naming a conversation). Who tapped is only ever the callback's `userId`. Only the asker's tap is queued:
in a group another member sees the same card, and their tap (in a lane of their own, where nothing is pending)
would only draw a "no longer current" reply; it is acked and left, as the answer path would refuse it anyway. The
ack's `response` may update the card (card/model.go CardResponse: cardUpdateOptions, cardData.cardParamMap): the
asker's tap shows the choice and takes the buttons away.

UNCONFIRMED (the harsher reading is taken): the outTrackId's allowed characters and length (kept to [A-Za-z0-9_-],
up to ~140 characters for a group with long ids); the characters a button id may hold (no ':': the key's colons
become '_'); whether DingTalk delivers card callbacks to an HTTP-mode robot without a registered callbackRouteKey
(buttons are offered in Stream mode only). A one-to-one card carries the chat's conversationId (ReplyTarget's
`conversation_id`), so its tap comes back to that chat's lane; without one, `ONE_TO_ONE_CONVERSATION` + the staffId.
The card is updated when the tap is queued, before the answer path settles it: its tip says the choice was sent
(已提交), not that it was carried out; what was done is said in the conversation. The outTrackIds are signed with the
app secret: rotating the secret leaves cards shown before without effect (their taps are acked and left).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from bots.base import CallbackRejected, InboundMessage, ReplyTarget
from bots.buttons import CHOICE_WORDS, ButtonTap, Question, read_button_key
from bots.dingtalk.client import DingTalkApiClient
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.models import PLATFORM
from bots.safe_json import parse_json_object

BUTTON_CARD_TEMPLATE = "1366a1eb-bc54-4859-ac88-517c56a9acb1.schema"
CARD_CALLBACK_TOPIC = "/v1.0/card/instances/callback"
TRACK_PREFIX = "bq1"
MAC_CHARS = 16  # 12 bytes of HMAC-SHA256, base64url
ONE_TO_ONE_CONVERSATION = "IM_ROBOT."  # + staffId: DingTalk's own name of a person's chat with the robot
BUTTON_COLORS = {"confirmed": "blue", "cancelled": "gray"}
CHOSEN_TIPS = {"confirmed": "已提交：确认 Sent: confirm", "cancelled": "已提交：取消 Sent: cancel"}
_MAC_CONTEXT = b"botgw-dingtalk-button-card|"


@dataclass(frozen=True)
class CardPlace:
    """Where a question's card was shown and to whom: what its outTrackId carries."""

    asker: str  # the staffId the question was asked of
    group_id: str  # the group's openConversationId; '' one-to-one
    conversation_id: str = ""  # a one-to-one chat's conversationId, when the target named it


class TrackIds:
    """outTrackIds that carry a CardPlace, signed with the app secret: a made-up or foreign id reads as None."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(_MAC_CONTEXT + secret.encode()).digest()

    def make(self, place: CardPlace) -> str:
        fields = [place.asker, place.group_id, place.conversation_id, secrets.token_hex(6)]  # a new card per try
        payload = _b64(json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode())
        return f"{TRACK_PREFIX}{payload}{self._mac(payload)}"

    def read(self, track: str) -> CardPlace | None:
        if not track.startswith(TRACK_PREFIX) or len(track) <= len(TRACK_PREFIX) + MAC_CHARS:
            return None
        payload, mac = track[len(TRACK_PREFIX):-MAC_CHARS], track[-MAC_CHARS:]
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, binascii.Error):
            return None
        if not (isinstance(fields, list) and len(fields) == 4 and all(isinstance(f, str) for f in fields)):
            return None
        asker, group, conversation, _ = fields
        return CardPlace(asker, group, conversation) if asker else None

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest()[:12])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def button_id(key: str) -> str:
    """A button key (`botgw:<choice>:<id>`) as a card button's id: no ':' (UNCONFIRMED whether DingTalk takes it)."""
    return key.replace(":", "_")


def tap_of(action_id: str) -> ButtonTap | None:
    """The tap a button id stands for (None: not one of botgw's)."""
    parts = action_id.split("_") if isinstance(action_id, str) else []
    return read_button_key(":".join(parts)) if len(parts) == 3 else None


def card_params(question: Question) -> dict[str, str]:
    """The template's cardParamMap (every value a string): title, the question in Markdown, and the two buttons."""
    buttons = [
        {"text": label, "color": BUTTON_COLORS.get(key.split(":")[1], "gray"), "id": button_id(key), "request": True}
        for key, label in question.buttons()
    ]
    return {
        "title": question.title,
        "markdown": question.text,
        "tips": "",
        "sys_full_json_obj": json.dumps({"msgButtons": buttons}, ensure_ascii=False),
    }


def chosen_update(tap: ButtonTap) -> dict[str, Any]:
    """The callback's response that shows the asker's choice and takes the buttons away (card/model.go
    CardResponse; updateCardDataByKey: only the keys given change)."""
    params = {"tips": CHOSEN_TIPS[tap.choice], "sys_full_json_obj": json.dumps({"msgButtons": []})}
    return {"cardUpdateOptions": {"updateCardDataByKey": True}, "cardData": {"cardParamMap": params}}


class DingTalkButtons:
    """bots.channels.Buttons for a Stream-mode robot: the question as an interactive card."""

    def __init__(self, api: DingTalkApiClient, config: DingTalkBotConfig) -> None:
        self._api = api
        self._config = config
        self.tracks = TrackIds(config.app_secret.get_secret_value())

    async def ask(self, target: ReplyTarget, question: Question) -> None:
        """Create the card, then deliver it; each try under an outTrackId of its own (a card created by a try whose
        delivery failed is never shown)."""
        conversation = "" if target.chat_id else target.conversation_id
        track = self.tracks.make(CardPlace(target.user_id, target.chat_id, conversation))
        space = {"supportForward": False}  # a forwarded card would ask elsewhere what was asked here
        body: dict[str, Any] = {
            "cardTemplateId": BUTTON_CARD_TEMPLATE,
            "outTrackId": track,
            "cardData": {"cardParamMap": card_params(question)},
            "callbackType": "STREAM",
            "imGroupOpenSpaceModel" if target.chat_id else "imRobotOpenSpaceModel": space,
        }
        await self._api.call("POST", "/v1.0/card/instances", body)
        await self._api.deliver_card(track, group_id=target.chat_id, user_id=target.user_id)

    async def answered(self, target: ReplyTarget, tap: ButtonTap, label: str) -> None:
        """Nothing more: the card was updated by the tap's acknowledgement (the choice sent, the buttons gone)."""


@dataclass(frozen=True)
class CardTap:
    """A tap read from a card callback: the message for the answer path, whether the asker made it (only then is it
    queued), and the ack's response (the card's update)."""

    message: InboundMessage
    by_asker: bool

    @property
    def response(self) -> dict[str, Any] | None:
        return chosen_update(self.message.tap) if self.by_asker and self.message.tap else None


def read_card_tap(config: DingTalkBotConfig, tracks: TrackIds, frame_id: str, data: Any, now: float) -> CardTap | None:
    """A card callback's data → the tap as an InboundMessage in the question's conversation; None for a callback
    that is not about one of botgw's questions (another card, another button). CallbackRejected: unreadable."""
    payload = data if isinstance(data, dict) else parse_json_object(data if isinstance(data, str) else b"", "data")
    place = tracks.read(str(payload.get("outTrackId") or ""))
    if place is None:
        return None
    tap = next((t for a in _action_ids(payload) if (t := tap_of(a)) is not None), None)
    if tap is None:
        return None
    user = payload.get("userId")
    if not isinstance(user, str) or not user or not frame_id:
        raise CallbackRejected("missing_fields", 400, "a card callback without userId or frame id")
    corp = payload.get("corpId")
    if config.corp_id and corp and str(corp) != config.corp_id:
        raise CallbackRejected("wrong_corp", 403, "corpId is not this organisation's")
    conversation = place.group_id or place.conversation_id or ONE_TO_ONE_CONVERSATION + user
    digest = hashlib.sha256(f"{frame_id}|{payload['outTrackId']}".encode()).hexdigest()[:32]
    message = InboundMessage(
        platform=PLATFORM,
        bot_id=config.id,
        msg_id=f"cardtap-{digest}",  # one per callback frame: a redelivery is the same tap, a new tap a new frame
        conversation_id=conversation,
        sender_id=user,
        text=CHOICE_WORDS[tap.choice],
        msg_type="text",  # the choice's word: read like a typed 确认 until the tap is settled (tool_use.py)
        mentioned_bot=True,
        group_id=place.group_id,
        received_at=now,
        reply_to=ReplyTarget(user_id=user, chat_id=place.group_id, conversation_id=conversation),  # OpenAPI answers
        tap=tap,
    )
    return CardTap(config.identity.stamp(message), by_asker=user == place.asker)


def _action_ids(payload: dict[str, Any]) -> list[str]:
    """`content` (or `value`, the SDK's older name): a JSON string, or an object, holding cardPrivateData.actionIds."""
    for name in ("content", "value"):
        raw = payload.get(name)
        if isinstance(raw, str) and raw:
            raw = parse_json_object(raw, name)
        if not isinstance(raw, dict):
            continue
        private = raw.get("cardPrivateData")
        ids = private.get("actionIds") if isinstance(private, dict) else None
        if isinstance(ids, list):
            return [i for i in ids if isinstance(i, str)]
    return []
