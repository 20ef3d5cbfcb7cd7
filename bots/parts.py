"""What a message holds besides its text: images, voice, files and quotes, as the platform describes them.

An adapter fills `InboundMessage.parts` from the callback (nothing is downloaded on the callback's fast path);
the worker's parts stage (gateway/pipeline/parts.py) downloads what it needs through the adapter's
`download`, and turns the parts into the engine's request. A `Media` names the attachment the platform's way
(a media_id, a downloadCode, a URL that came inside an encrypted callback): only the adapter reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

PartKind = Literal["text", "image", "audio", "file", "quote"]

DEFAULT_MAX_MEDIA_BYTES = 10 * 1024 * 1024


class Media(BaseModel):
    """An attachment kept by the platform, named the platform's way; downloaded by the adapter, later."""

    model_config = ConfigDict(frozen=True)

    ref: str  # media_id (WeCom, 微信客服), downloadCode (DingTalk), or a URL from inside an encrypted callback
    name: str = ""  # the file's name as the sender's client gave it
    mime: str = ""  # the type the platform declares ('' unknown; checked on download)
    size: int = 0  # the size the platform declares (0 unknown; checked on download)
    format: str = ""  # audio: the codec the platform names (amr, silk, speex, ogg…)


class Part(BaseModel):
    """One part of a message, in the order the sender wrote it.

    text:  `text` is what they typed.
    image: `media` is the picture.
    audio: `media` is the recording; `text` is the platform's own recognition of it ('' none).
    file:  `media` is the document (`media.name` its name).
    quote: `text` is the quoted message's text (what the sender replies to).
    """

    model_config = ConfigDict(frozen=True)

    kind: PartKind
    text: str = ""
    media: Media | None = None


@dataclass(frozen=True)
class Downloaded:
    """An attachment's bytes, as the platform served them."""

    data: bytes
    mime: str = ""
    name: str = ""


class MediaError(Exception):
    """An attachment that cannot be had: `reason` is a short, secret-free label the user's reply is chosen by
    ("expired", "too_large", "refused", "unavailable", "unsupported")."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason

