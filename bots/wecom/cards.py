"""WeCom's button card (模板卡片 of type `button_interaction`) for a question botgw asks, and the tap it sends back.

The same card serves the app (doc 90236 发送应用消息, 模板卡片消息 按钮交互型) and the AI bot (doc 101031/101138
模板卡片类型 按钮交互模版卡片): `card_type`, `main_title.title`, `sub_title_text`, `button_list[]` of
{text, style, key} (at most 6; key at most 1024 bytes, "用户点击后，会产生回调事件将本参数作为EventKey返回") and
`task_id` ("只能由数字、字母和“_-@”组成，最长128字节", unique per app or bot). The lengths of the texts are
suggestions ("建议不超过N个字"); what WeCom does past them is UNCONFIRMED, so the texts are cut to them (by
characters: a cut never splits a UTF-8 sequence) with an ellipsis. The card shows plain text, never Markdown.

The tap comes back with the button's key and the card's task_id (the app: XML `EventKey`, `TaskId`, doc 90240
模板卡片事件推送; the AI bot: JSON `event.template_card_event.event_key`, `task_id`, doc 100719 模板卡片事件). A key
that is not one of botgw's, or a task id that is not the one botgw gave that key's question, is another card's
(another app's on the same callback URL, a card of an older deployment): no tap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bots.buttons import ButtonTap, Question, read_button_key
from bots.markdown import to_text

CARD_TYPE = "button_interaction"
CARD_EVENT = "template_card_event"  # the app's Event and the AI bot's event.eventtype for a tap
TASK_ID_PREFIX = "botgw-"
TASK_ID_PATTERN = re.compile(r"^[0-9A-Za-z_\-@]{1,128}$")
MAX_BUTTONS = 6
MAX_KEY_BYTES = 1024
# Button styles "目前可填1~4，不填或错填默认1" (the looks are shown only as a picture in the docs): the first
# (confirm) in the default style, cancel in style 2.
BUTTON_STYLES = (1, 2)
ELLIPSIS = "…"


@dataclass(frozen=True)
class CardLimits:
    """How many characters the docs suggest for the card's texts (a field past them is cut)."""

    title_chars: int
    sub_title_chars: int


# doc 90236 (app): main_title.title "建议不超过36个字", sub_title_text "建议不超过160个字"
APP_CARD = CardLimits(title_chars=36, sub_title_chars=160)
# doc 101031 模板卡片类型 (AI bot): MainTitle.title "建议不超过26个字", sub_title_text "建议不超过112个字"
AIBOT_CARD = CardLimits(title_chars=26, sub_title_chars=112)


def task_id_for(question_id: str) -> str:
    """The card's task_id: one per question (WeCom refuses to reuse one), made of the allowed characters only."""
    task_id = TASK_ID_PREFIX + question_id
    if not TASK_ID_PATTERN.match(task_id):
        raise ValueError("a question id makes no valid WeCom task_id")
    return task_id


def cut(text: str, chars: int) -> str:
    """`text` at most `chars` characters, an ellipsis saying where it was cut."""
    text = text.strip()
    return text if len(text) <= chars else text[: chars - len(ELLIPSIS)].rstrip() + ELLIPSIS


def button_card(question: Question, limits: CardLimits) -> dict[str, Any]:
    """The `template_card` object that shows `question` with its buttons."""
    buttons = question.buttons()
    if not 1 <= len(buttons) <= MAX_BUTTONS or any(len(key.encode()) > MAX_KEY_BYTES for key, _ in buttons):
        raise ValueError("a WeCom card takes 1 to 6 buttons with keys of at most 1024 bytes")
    card: dict[str, Any] = {
        "card_type": CARD_TYPE,
        "main_title": {"title": cut(question.title, limits.title_chars)},
        "button_list": [
            {"text": label, "style": BUTTON_STYLES[min(i, len(BUTTON_STYLES) - 1)], "key": key}
            for i, (key, label) in enumerate(buttons)
        ],
        "task_id": task_id_for(question.id),
    }
    details = cut(to_text(question.text), limits.sub_title_chars)
    if details:
        card["sub_title_text"] = details
    return card


def read_card_tap(event_key: object, task_id: object) -> ButtonTap | None:
    """The tap a card event stands for: botgw's key on the card botgw sent for that question, else None."""
    if not isinstance(event_key, str) or not isinstance(task_id, str):
        return None
    tap = read_button_key(event_key)
    if tap is None or task_id.strip() != TASK_ID_PREFIX + tap.question_id:
        return None
    return tap
