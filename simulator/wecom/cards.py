"""WeCom's template cards in the simulator: what it takes of a button card (an app's message/send, an AI bot's
response_url), what it shows, and the tap it sends back for a button of a card the person received.

What a `button_interaction` card must hold follows the docs (doc 90236 模板卡片消息 for an app; doc 101031/101138
模板卡片类型 for an AI bot): card_type, main_title, button_list of 1 to 6 buttons each with text and a key of at
most 1024 bytes, unique ("不可重复"), and a task_id of digits, letters and "_-@", at most 128 bytes. UNCONFIRMED,
played the harsher way:
- other card types (documented, not played here) are refused;
- texts past the docs' suggested lengths ("建议不超过N个字": title, sub_title_text, a button's 10) are refused;
- which errcode a refused card gets is not documented: 40058, the code this simulator gives content past its
  length;
- a task_id reused by the same app or bot ("不能重复") is answered errcode 0 and never shown (a third-party note
  in the public code index reports exactly that: a reused task_id "sendCard 返回 errcode=0 但不推送给用户");
- an AI bot's response_url takes a template_card only when the callback it came with was a one-to-one chat
  ("当且仅当回调的会话类型为单聊的时候", doc 101138): a URL whose chat is not known to be one is refused too.

A tap is offered only on a button of a card the person was shown (WeCom sends card events for cards it
delivered), and any number of times (nothing documented stops a second tap): the control routes answer the
event WeCom would send, which the person's side signs and posts (simulator/wecom/signer.py, ai_user.py), as
WeCom's callbacks are signed with the bot's secrets, which this server does not hold.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

CARD_TYPE = "button_interaction"
CARD_EVENT = "template_card_event"
TASK_ID = re.compile(r"^[0-9A-Za-z_\-@]{1,128}$")
MAX_BUTTONS = 6
MAX_KEY_BYTES = 1024
BUTTON_TEXT_CHARS = 10  # Button.text "建议不超过10个字"
REFUSED = 40058  # UNCONFIRMED (module docstring)


@dataclass(frozen=True)
class TextLimits:
    title_chars: int
    sub_title_chars: int


APP_LIMITS = TextLimits(36, 160)  # doc 90236: main_title.title 36, sub_title_text 160
AIBOT_LIMITS = TextLimits(26, 112)  # doc 101031 模板卡片类型: MainTitle.title 26, sub_title_text 112


@dataclass
class ShownCard:
    """A card a person was shown, and the taps on it."""

    owner: str  # the app's agentid or the AI bot's response_url token it came through
    touser: str
    card: dict[str, Any]
    at: float
    taps: list[str] = field(default_factory=list)  # the keys tapped, in order
    replaced: str = ""  # update_template_card made its buttons one that cannot be tapped, named this

    @property
    def keys(self) -> list[str]:
        return [str(button.get("key", "")) for button in self.card.get("button_list", [])]


def card_problem(card: object, limits: TextLimits) -> str:
    """Why WeCom would refuse this template card ('' when it would take it): the module docstring's rules."""
    if not isinstance(card, dict):
        return "template_card must be an object"
    if card.get("card_type") != CARD_TYPE:
        return f"card_type {card.get('card_type')!r} is not played (only {CARD_TYPE})"
    title = card.get("main_title")
    if not isinstance(title, dict) or not isinstance(title.get("title"), str) or not title["title"].strip():
        return "main_title.title is required"
    if len(title["title"]) > limits.title_chars:
        return f"main_title.title longer than {limits.title_chars} characters"
    sub_title = card.get("sub_title_text", "")
    if not isinstance(sub_title, str) or len(sub_title) > limits.sub_title_chars:
        return f"sub_title_text must be a text of at most {limits.sub_title_chars} characters"
    task_id = card.get("task_id")
    if not isinstance(task_id, str) or not TASK_ID.match(task_id):
        return "task_id must be 1 to 128 of digits, letters and _-@"
    return _buttons_problem(card.get("button_list"))


def _buttons_problem(buttons: object) -> str:
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= MAX_BUTTONS:
        return f"button_list must hold 1 to {MAX_BUTTONS} buttons"
    keys: list[str] = []
    for button in buttons:
        if not isinstance(button, dict):
            return "a button must be an object"
        text, key = button.get("text"), button.get("key")
        if not isinstance(text, str) or not text.strip() or len(text) > BUTTON_TEXT_CHARS:
            return f"a button's text must be 1 to {BUTTON_TEXT_CHARS} characters"
        if not isinstance(key, str) or not key or len(key.encode("utf-8")) > MAX_KEY_BYTES:
            return f"a button's key must be 1 to {MAX_KEY_BYTES} bytes"
        keys.append(key)
    return "" if len(set(keys)) == len(keys) else "button keys must not repeat"


def find_card(cards: list[ShownCard], touser: str, key: str, owner: str = "") -> ShownCard | None:
    """The latest card shown to `touser` (through `owner`, when named) with a button `key`."""
    for card in reversed(cards):
        if card.touser == touser and key in card.keys and (not owner or card.owner == owner):
            return card
    return None


def app_tap_event(card: ShownCard, key: str, agent_id: int) -> dict[str, str]:
    """The fields of the app's XML event for a tap (doc 90240 模板卡片事件推送), ResponseCode fresh per tap."""
    return {
        "FromUserName": card.touser,
        "CreateTime": str(int(time.time())),
        "MsgType": "event",
        "Event": CARD_EVENT,
        "EventKey": key,
        "TaskId": str(card.card.get("task_id", "")),
        "CardType": str(card.card.get("card_type", "")),
        "ResponseCode": secrets.token_urlsafe(32),
        "AgentID": str(agent_id),
    }


def aibot_tap_event(card: ShownCard, key: str, response_url: str) -> dict[str, Any]:
    """An AI bot's JSON event for a tap in a one-to-one chat (doc 100719 模板卡片事件, 按钮交互模版卡片的事件),
    with the fresh response_url such an event carries (doc 101138: "用户点击模板卡片相关按钮等" returns one);
    the person's side adds the bot's aibotid."""
    return {
        "msgid": secrets.token_hex(16),
        "create_time": int(time.time()),
        "from": {"userid": card.touser},
        "chattype": "single",
        "response_url": response_url,
        "msgtype": "event",
        "event": {
            "eventtype": CARD_EVENT,
            CARD_EVENT: {
                "card_type": str(card.card.get("card_type", "")),
                "event_key": key,
                "task_id": str(card.card.get("task_id", "")),
            },
        },
    }
