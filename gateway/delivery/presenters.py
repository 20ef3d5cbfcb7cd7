"""Which presenter shows an answer: by the adapter's reply style (bots.channels), never by its class."""

from __future__ import annotations

from bots.base import InboundMessage
from bots.channels import Channel
from gateway.delivery.base import Delivery, Paced, Presenter
from gateway.delivery.card import CardPresenter
from gateway.delivery.page import PagePresenter
from gateway.delivery.pieces import UNIQUE_MARKS, PiecesPresenter
from gateway.delivery.stream import StreamPresenter
from gateway.state.reply_record import Fence, ReplyRecord

__all__ = [
    "PRESENTERS",
    "UNIQUE_MARKS",
    "CardPresenter",
    "Delivery",
    "Paced",
    "PagePresenter",
    "PiecesPresenter",
    "Presenter",
    "StreamPresenter",
    "presenter_for",
]  # fmt: skip

PRESENTERS: dict[str, type[Presenter]] = {
    "pieces": PiecesPresenter,
    "stream": StreamPresenter,
    "page": PagePresenter,
    "card": CardPresenter,
}


def presenter_for(
    delivery: Delivery, adapter: Channel, message: InboundMessage, record: ReplyRecord, fence: Fence | None
) -> Presenter:
    return PRESENTERS[adapter.reply_style](delivery, adapter, message, record, fence)
