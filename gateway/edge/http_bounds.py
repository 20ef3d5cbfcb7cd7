"""Bounded request heads: a request head over 64 KiB is answered 431 and the connection closed, unread.

Why a protocol class of our own. `botgw serve` runs uvicorn with its "auto" HTTP implementation, which is httptools
(llhttp) whenever httptools is installed, as `uvicorn[standard]` does. Neither bounds a head: llhttp has no size
limit of its own (Node puts one in its wrapper), httptools joins each header's name and value chunk by chunk
(`bytes +=`, so the cost grows with the square of the size) and uvicorn joins the URL the same way and keeps every
header in a list. One 64 MB header took 5.7 s of the gateway's CPU and 423 MB. uvicorn's only head limit,
`h11_max_incomplete_event_size`, belongs to its h11 implementation, which answers 400 instead of 431 and is slower on
every request; a reverse proxy in front (nginx's `large_client_header_buffers`) helps only where there is one.

So `BoundedHttpToolsProtocol` is uvicorn's httptools protocol with a byte count in front of the parser: the bytes of
the head under way (from the first byte of a request to the blank line ending its headers) are counted before they
are fed, and the byte that would make the head longer than `MAX_HEAD_BYTES` (the request line and header block
together) is never fed. The 431 goes out and the connection is closed, with whatever the client still sends left
unread in the kernel: a refused 64 MB head costs the parsing of 64 KiB. A read that holds the end of a head and the
start of its body is fed up to the limit first, and the rest only once the head ended there, so a body is never
counted as head. Counting costs a comparison or two per read. Two cases are bounded to within one read (about
256 KB with uvloop or asyncio) rather than exactly: a pipelined head that starts in the read that ended the request
before it is counted from the next read, and trailers (a header block after a chunked body) over the limit close
the connection without a 431, since the application may already be answering that request.

A head not complete HEAD_TIMEOUT_S after the connection opened (or its last answer ended) is answered 408 and
closed: a client sending nothing, or dripping bytes, would hold the connection for ever (uvicorn arms its
keep-alive timeout only after an answer, and any byte cancels it). The same holds for a body the application
answered without reading (a 404 for an unknown bot, a 413, a 429): its rest is due HEAD_TIMEOUT_S after the answer
ended, or the connection is closed (uvicorn drops such a body's bytes, but each one cancels its keep-alive timer).

The admin listener is served by the same uvicorn server (gateway/cli/processes.py `_serve`), so it has the same bound.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 10.0  # a platform's callback head arrives at once: WeCom waits 5 s for the whole answer
REFUSAL = b"request header fields too large\n"
TOO_SLOW = b"request head too slow\n"

log = logging.getLogger(__name__)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing any request head (request line + headers) over MAX_HEAD_BYTES."""

    max_head_bytes = MAX_HEAD_BYTES
    head_timeout_s = HEAD_TIMEOUT_S

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._head_bytes = 0  # bytes of the head under way (or since the last request ended) fed so far
        self._in_body = False  # between the end of a head and the end of its message
        self._trailing = False  # a chunk header was parsed and no body byte has followed it: maybe trailers
        self._trailer_bytes = 0
        self._body_fed = False
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_body:
            trailing, self._body_fed = self._trailing, False
            super().data_received(data)
            if trailing and self._trailing and self._in_body and not self._body_fed:
                self._count_trailers(len(data))
            return
        room = self.max_head_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return
        if room > 0:
            # The head may end within what is left of the limit: feed that much, and the rest only if it did.
            self._head_bytes = self.max_head_bytes
            super().data_received(data[:room])
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return  # refused as malformed (400), or upgraded
            if self._in_body or self._head_bytes < self.max_head_bytes:
                self.data_received(data[room:])
                return
        self._refuse_head()

    def _count_trailers(self, size: int) -> None:
        """A whole read fed after a chunk header with no body byte in it: the trailer section of the last chunk (a
        chunk with data yields a body byte in the first read that reaches it). Counted to within one read."""
        self._trailer_bytes += size
        if self._trailer_bytes > self.max_head_bytes:
            log.warning("request trailers too large: connection closed", extra={"limit": self.max_head_bytes})
            self._refused = True
            self.transport.close()

    def _refuse_head(self) -> None:
        """431 and close, unless a response on this connection is under way (a pipelined request): then it may
        finish, and the connection closes after it."""
        log.warning("request head too large: answered 431", extra={"limit": self.max_head_bytes})
        self._refuse(431, REFUSAL)

    def _head_too_slow(self) -> None:
        """No complete head HEAD_TIMEOUT_S after the connection opened or its last answer ended (a client that
        sends nothing, or drips a head or blank lines, holding a connection and its buffer): 408 and close.
        uvicorn's keep-alive timeout is cancelled by any byte, and is not armed before a first request. A body
        still unfinished that long after its early answer: closed without a word (the answer went out)."""
        if self._refused or self.transport.is_closing():
            return
        if self._in_body:
            if self.cycle is not None and self.cycle.response_complete:  # answered early, the body still dripping
                log.warning("request body unfinished after its answer: connection closed",
                            extra={"timeout_s": HEAD_TIMEOUT_S})
                self._refused = True
                # abort, not close: a client that keeps its receive window shut would hold a closing connection
                # with data still buffered for it; its answer went out HEAD_TIMEOUT_S ago
                self.transport.abort()
            return
        log.warning("request head too slow: answered 408", extra={"timeout_s": HEAD_TIMEOUT_S})
        self._refuse(408, TOO_SLOW)

    def _refuse(self, status: int, text: bytes) -> None:
        self._refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.flow.pause_reading()
            self.cycle.keep_alive = False
            return
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(text)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n",
                text,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()

    # Parser callbacks: where a head ends and where its message does.

    def on_message_begin(self) -> None:
        self._trailing = False
        self._trailer_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_body = True
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # the first head is due from the moment the connection opens

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and not self.transport.is_closing():
            # the next head is due from the end of this answer (a blank-line drip too), and so is the rest of a
            # body the answer came before
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_chunk_header(self) -> None:
        self._trailing = True

    def on_body(self, body: bytes) -> None:
        self._trailing = False
        self._body_fed = True
        self._trailer_bytes = 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._trailing = False
        self._head_bytes = 0
        super().on_message_complete()
