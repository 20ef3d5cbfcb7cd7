"""Buttons under a question botgw asks the person (a tool call's 确认/取消), the same on every platform.

A button carries a key, `botgw:<choice>:<question id>`, which comes back with the platform's tap event; the adapter
turns the tap into an `InboundMessage` whose `tap` says which question and which choice, from whom, in which
conversation (the same lane as the question), and the answer pipeline settles it like a typed 确认 or 取消 (once,
by the asker only, before it expires). A platform without buttons shows the question as text, which says to
reply 确认 or 取消.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

Choice = Literal["confirmed", "cancelled"]
CHOICES: tuple[tuple[Choice, str], ...] = (("confirmed", "确认"), ("cancelled", "取消"))
CHOICE_WORDS: dict[str, str] = dict(CHOICES)  # what a tap reads as, in the conversation and in memory
_KEY = re.compile(r"^botgw:(confirmed|cancelled):([0-9a-f]{8,64})$")


class ButtonTap(BaseModel):
    """A button of one of botgw's questions, tapped: which question (its id) and which choice."""

    model_config = ConfigDict(frozen=True)

    question_id: str
    choice: Choice
    card_ref: str = ""  # the platform's handle to update the tapped card (WeCom's ResponseCode); '' none


@dataclass(frozen=True)
class Question:
    """What the buttons ask: a short title, the question in words (Markdown lines), and its id."""

    id: str
    title: str
    text: str

    def buttons(self) -> list[tuple[str, str]]:
        """(key, label) per button, in the order shown."""
        return [(button_key(self.id, choice), label) for choice, label in CHOICES]

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str) -> Question | None:
        """The question a reply record keeps ('' or unreadable: none)."""
        try:
            return cls(**json.loads(raw)) if raw else None
        except (ValueError, TypeError):
            return None


def button_key(question_id: str, choice: Choice) -> str:
    return f"botgw:{choice}:{question_id}"


def read_button_key(key: str) -> ButtonTap | None:
    """The tap a button key stands for; None for a key that is not one of botgw's (another app's card)."""
    matched = _KEY.match(key.strip()) if isinstance(key, str) else None
    if matched is None:
        return None
    return ButtonTap(question_id=matched.group(2), choice=matched.group(1))  # type: ignore[arg-type]
