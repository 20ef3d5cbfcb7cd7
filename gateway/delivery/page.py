"""The page style (web): the answer grows in the stream store, which the gateway's /web endpoint streams to the
browser."""

from __future__ import annotations

from gateway.delivery.stream import StoredStreamPresenter


class PagePresenter(StoredStreamPresenter):
    """The web page: the gateway's /web endpoint streams it to the browser."""

    interval_s = 0.05
