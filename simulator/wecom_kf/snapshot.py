"""The shape of a saved 微信客服 state (simulator/state_file.py writes `KfState.snapshot()` and checks it as a
`KfSnapshot` before `KfState.restore()` takes any of it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Saved(BaseModel):
    """A part of a saved state: exactly the keys and JSON types `KfState.snapshot()` writes, nothing coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class SavedAccount(_Saved):
    open_kfid: str
    corp_id: str
    name: str
    avatar: str


class SavedText(_Saved):
    content: str


class SavedMedia(_Saved):
    media_id: str


class SavedEvent(_Saved):
    """An event's payload: the three keys every event has, then whatever the control route was given."""

    model_config = ConfigDict(extra="allow")
    event_type: str
    open_kfid: str
    external_userid: str


_BODIES = ("text", "image", "voice", "video", "file", "event")


class SavedLogItem(_Saved):
    """A sync_msg item as `text_item` / `media_item` / `event_item` make it."""

    msgid: str
    open_kfid: str = ""
    external_userid: str = ""
    send_time: int
    origin: Literal[3, 4, 5]
    servicer_userid: str = ""
    msgtype: Literal["text", "image", "voice", "video", "file", "event"]
    text: SavedText | None = None
    image: SavedMedia | None = None
    voice: SavedMedia | None = None
    video: SavedMedia | None = None
    file: SavedMedia | None = None
    event: SavedEvent | None = None

    @model_validator(mode="after")
    def _one_body(self) -> SavedLogItem:
        bodies = {name for name in _BODIES if getattr(self, name) is not None}
        if bodies != {self.msgtype}:
            raise ValueError(f"a {self.msgtype} item carries {', '.join(sorted(bodies)) or 'no body'}")
        if self.msgtype == "event" and (self.open_kfid or self.external_userid or self.servicer_userid):
            raise ValueError("an event item carries open_kfid and external_userid inside its event only")
        if self.msgtype != "event" and not (self.open_kfid and self.external_userid):
            raise ValueError(f"a {self.msgtype} item without open_kfid or external_userid")
        return self

    def account(self) -> str:
        return self.event.open_kfid if self.event is not None else self.open_kfid


class SavedSession(_Saved):
    state: Literal[0, 1, 2, 3, 4]
    servicer_userid: str
    started_at: float
    last_customer_at: float
    sent_since_customer: int = Field(ge=0)
    lapsed: bool
    first_queue_code_given: bool
    last_welcome_at: float
    last_api_send_at: float


class SavedCode(_Saved):
    kind: Literal["welcome", "msg"]
    open_kfid: str
    external_userid: str
    expires_at: float
    used: bool


class SavedDelivered(_Saved):
    msgid: str
    open_kfid: str
    touser: str
    content: str
    via: Literal["send_msg", "send_msg_on_event"]
    code: str
    at: float


class KfSnapshot(_Saved):
    """What `KfState.snapshot()` writes, checked whole before `restore()` takes any of it: a file that was edited,
    cut short or written by something else is refused at start rather than breaking a later request."""

    accounts: list[SavedAccount]
    log: list[tuple[str, SavedLogItem]]
    cursors: dict[str, tuple[str, int]]
    sync_tokens: dict[str, tuple[str, float]]
    sessions: list[tuple[str, str, SavedSession]]
    codes: dict[str, SavedCode]
    used_msgids: list[tuple[str, str]]
    delivered: list[SavedDelivered]
    refusing: list[tuple[str, str]]
    off_duty: list[str]

    @model_validator(mode="after")
    def _consistent(self) -> KfSnapshot:
        if any(position < 0 for _, position in self.cursors.values()):
            raise ValueError("a cursor with a negative position")
        if any(item.account() != kfid for kfid, item in self.log):
            raise ValueError("a log item filed under another account than its own")
        return self

