"""The web page's front door: one ASGI middleware in front of Chainlit's app (webchat/serve.py puts it there).

- **The trusted header only from the proxy.** Chainlit's header sign-in sees headers and nothing else, so the
  header naming the user (`trusted_header`) and the proxy's secret header are taken out of every request unless
  the TCP peer, the socket's own address and never a forwarded one, is one of `trusted_proxies` and, when
  `trusted_header_secret` is set, the secret matches (compared in constant time). serve.py starts uvicorn without
  its proxy headers, so this middleware is the first to see the request; it believes `X-Forwarded-For` and
  `X-Forwarded-Proto` from a trusted proxy only, and only to learn the client's address (the login limits' key).
- **Sockets only from the page itself.** Chainlit's socket.io server checks no Origin (`cors_allowed_origins=[]`
  turns its check off), so a page elsewhere could open the chat socket with the user's cookie. A request to
  `/ws/socket.io` (the websocket, and HTTP polling) whose `Origin` is not the page's own (scheme, host and port of
  its `Host` header, also https when the page is reached as http through a TLS proxy that does not say so, or of
  `CHAINLIT_URL`) is refused: 403, or the websocket closed before it is accepted.
- **Small bodies.** The page posts small JSON: a body over `MAX_BODY_BYTES` (1 MB) is answered 413, unread when its
  Content-Length says so, else as soon as the bytes received pass the bound. An upload (`POST /project/file`, the
  attach button) may be the bot's `max_media_bytes` and a multipart envelope (`UPLOAD_SLACK_BYTES`): the same
  413 past that, before Chainlit spools it (Chainlit then checks its type and size, and the gateway again).
  An oversized upload is read and thrown away up to `DRAIN_BYTES` within `DRAIN_S` before the 413 is sent, as
  nginx's lingering close does: a browser still writing its body when the server closes sees a reset, not the
  answer. Past those bounds the connection is closed unread.
- **One trusted header.** The trusted header sent more than once (by a proxy that appends rather than sets) is not
  believed: no header sign-in, as for the secret.
- **No remote content.** Every response carries the Content-Security-Policy: images only from the page's own
  origin and `data:`, scripts from the page (and the inline ones it serves, by hash), connections to itself.
- **Sign-in refusals.** A sign-in the login limits refused (webchat/passwords.py) is answered 429 with its message
  (503 when too many sign-ins wait for scrypt).

What the middleware learned is put in `FACTS` for the sign-in callbacks in webchat/app.py.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bots.web.config import WebBotConfig

NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")  # what a page user may be called (WebUser.name): fullmatch
UPLOAD_PATH = "/project/file"
SOCKET_PATH = "/ws/socket.io"
MAX_BODY_BYTES = 1 << 20  # the page posts small JSON
UPLOAD_SLACK_BYTES = 64 * 1024  # an upload's multipart envelope: its boundaries, headers and file name
DEFAULT_PORTS = {"http": 80, "https": 443}
TOO_LARGE = "The request is too large for this page."
DRAIN_BYTES = 64 << 20  # an oversized upload read and dropped so its sender sees the 413 (lingering close)
DRAIN_S = 10.0


@dataclass
class Refusal:
    """A sign-in refused before the password was looked at: answered 429."""

    message: str
    retry_after_s: int
    status: int = 429


@dataclass
class RequestFacts:
    """What the middleware knows of a request, for the sign-in callbacks."""

    peer: str  # the TCP peer
    address: str  # the client: the peer, or what a trusted proxy says in X-Forwarded-For
    header_from_proxy: bool  # the trusted header, if any, came from a trusted proxy with the right secret
    refusal: Refusal | None = field(default=None)


FACTS: ContextVar[RequestFacts | None] = ContextVar("botgw_web_request", default=None)


def header_user(bot: WebBotConfig, headers: Headers) -> str | None:
    """The name the trusted proxy signed in, or None: not from the proxy (or no middleware in front), no name, a
    name no page user could have, or not a listed user (unless `allow_unlisted`)."""
    facts = FACTS.get()
    if not bot.trusted_header or facts is None or not facts.header_from_proxy:
        return None
    name = (headers.get(bot.trusted_header) or "").strip(" \t")  # HTTP's own whitespace, never a newline
    if not NAME.fullmatch(name):
        return None
    return name if bot.allow_unlisted or bot.listed(name) else None


def content_security_policy(script_hashes: list[str]) -> str:
    """The policy of every page response: the page, its own scripts and styles, images from itself and data:."""
    inline = " ".join(f"'{digest}'" for digest in script_hashes)
    return "; ".join([
        "default-src 'self'",
        f"script-src 'self' {inline}".strip(),
        "style-src 'self' 'unsafe-inline'",  # the page's components set style attributes
        "img-src 'self' data:",
        "font-src 'self' data:",
        "media-src 'self' data:",
        "connect-src 'self'",  # CSP 3: 'self' covers ws:// and wss:// to the page's own host
        "frame-src 'none'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'self'",
    ])


def declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The largest Content-Length the request announces (0: none, or not a number: uvicorn refuses those)."""
    values = [value.strip() for name, value in headers if name == b"content-length"]
    return max((int(value) for value in values if value.isdigit()), default=0)


def forwarded_client(bot: WebBotConfig, peer: str, forwarded_for: str) -> str:
    """The client a chain of trusted proxies names: the right-most X-Forwarded-For entry that is not itself a
    trusted proxy (entries left of it could have been written by anyone)."""
    address = peer
    for entry in reversed([item.strip() for item in forwarded_for.split(",") if item.strip()]):
        address = entry.removeprefix("[").split("]")[0] if entry.startswith("[") else entry
        if not bot.trusts_proxy(address):
            break
    return address


def origin_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL or Origin header, or None."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def own_origins(scheme: str, host: str, page_url: str | None) -> set[tuple[str, str, int]]:
    """The origins the page itself is served from: the request's scheme with its Host header, https as well when
    the request came in as http (a TLS proxy in front that does not send X-Forwarded-Proto, or is not trusted),
    and `CHAINLIT_URL`'s."""
    scheme = "https" if scheme in ("https", "wss") else "http"
    origins = set()
    for candidate in ([scheme, "https"] if scheme == "http" else [scheme]):
        if host and (origin := origin_of(f"{candidate}://{host}")):
            origins.add(origin)
    if page_url and (origin := origin_of(page_url)):
        origins.add(origin)
    return origins


class BodyTooLarge(Exception):
    """A request body passed MAX_BODY_BYTES while the app read it."""


async def drain(receive: Receive, received: int) -> None:
    """Read and drop the rest of a refused body, up to DRAIN_BYTES in all and for DRAIN_S at most."""
    try:
        async with asyncio.timeout(DRAIN_S):
            while received <= DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
    except TimeoutError:
        return


class PageGuard:
    """The middleware: `PageGuard(chainlit_app, bot, csp)`."""

    def __init__(self, app: ASGIApp, bot: WebBotConfig, csp: str, root_path: str = "") -> None:
        self.app = app
        self.bot = bot
        self.csp = csp.encode()
        self.upload_path = root_path.rstrip("/") + UPLOAD_PATH
        self.upload_bytes = bot.max_media_bytes + UPLOAD_SLACK_BYTES
        self.socket_path = root_path.rstrip("/") + SOCKET_PATH
        self.page_url = os.environ.get("CHAINLIT_URL") or None
        self._user_header = (bot.trusted_header or "").lower().encode()
        self._secret_header = bot.trusted_header_secret_header.lower().encode()
        self._secret = bot.trusted_header_secret.get_secret_value().encode() if bot.trusted_header_secret else None

    def _secret_matches(self, headers: list[tuple[bytes, bytes]]) -> bool:
        if self._secret is None:
            return True
        sent = [value for name, value in headers if name.lower() == self._secret_header]
        return len(sent) == 1 and hmac.compare_digest(sent[0].strip(), self._secret)

    def _foreign_origin(self, scope: Scope, headers: list[tuple[bytes, bytes]]) -> bool:
        """A socket.io request with an Origin header that is not the page's own."""
        path = scope.get("path", "")
        if path != self.socket_path and not path.startswith(self.socket_path + "/"):
            return False
        sent = [value.decode("latin-1") for name, value in headers if name == b"origin"]
        if not sent:
            return False  # not a browser's cross-site request (browsers send Origin on websockets and POSTs)
        host = next((value.decode("latin-1") for name, value in headers if name == b"host"), "")
        own = own_origins(scope.get("scheme") or "http", host, self.page_url)
        return len(sent) != 1 or origin_of(sent[0]) not in own

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        client = scope.get("client") or ("", 0)
        peer = client[0]
        headers: list[tuple[bytes, bytes]] = [(name.lower(), value) for name, value in scope.get("headers", [])]
        from_proxy = self.bot.trusts_proxy(peer)
        address, scheme = peer, scope.get("scheme")
        if from_proxy:
            forwarded = b", ".join(value for name, value in headers if name == b"x-forwarded-for").decode("latin-1")
            address = forwarded_client(self.bot, peer, forwarded) if forwarded else peer
            proto = next((value.decode("latin-1").strip() for name, value in headers if name == b"x-forwarded-proto"),
                         "")
            if proto in ("http", "https"):
                scheme = proto if scope["type"] == "http" else proto.replace("http", "ws")
        header_ok = (from_proxy and self._secret_matches(headers)
                     and sum(name == self._user_header for name, _ in headers) <= 1)
        dropped = {self._secret_header} | (set() if header_ok else {self._user_header})
        headers = [(name, value) for name, value in headers if name not in dropped]
        scope = {**scope, "headers": headers, "client": (address, client[1]), "scheme": scheme}
        facts = RequestFacts(peer=peer, address=address, header_from_proxy=header_ok)
        token = FACTS.set(facts)
        try:
            foreign = self._foreign_origin(scope, headers)
            if scope["type"] == "websocket":
                if foreign:  # closed before it is accepted: uvicorn answers the handshake 403
                    return await send({"type": "websocket.close", "code": 1008})
                return await self.app(scope, receive, send)
            if foreign:
                return await self._answer(send, 403, {"detail": "This page's socket is for this page only."})
            upload = scope["path"] == self.upload_path
            bound = self.upload_bytes if upload else MAX_BODY_BYTES
            declared = declared_length(headers)
            if declared > bound:
                if upload and declared <= DRAIN_BYTES:
                    await drain(receive, 0)
                return await self._answer(send, 413, {"detail": TOO_LARGE}, [(b"connection", b"close")])
            await self._bounded(scope, receive, send, facts, bound)
        finally:
            FACTS.reset(token)

    async def _bounded(self, scope: Scope, receive: Receive, send: Send, facts: RequestFacts, bound: int) -> None:
        """The app, with the bytes of the body counted as it reads them: over `bound`, the app's read raises
        BodyTooLarge and the request is answered 413 (whatever the app answers then is dropped)."""
        state = {"received": 0, "over": False, "started": False}

        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > bound:
                    state["over"] = True
                    raise BodyTooLarge
            return message

        try:
            await self.app(scope, counted, self._sender(send, facts, state))
        except Exception:
            if not state["over"]:
                raise
        if state["over"] and not state["started"]:
            if scope["path"] == self.upload_path:
                await drain(receive, state["received"])
            await self._answer(send, 413, {"detail": TOO_LARGE}, [(b"connection", b"close")])

    def _sender(self, send: Send, facts: RequestFacts, state: dict) -> Send:
        replaced = False

        async def guarded(message: Message) -> None:
            nonlocal replaced
            if state["over"]:
                return None
            if message["type"] == "http.response.start":
                state["started"] = True
                if facts.refusal is not None:
                    replaced = True
                    refusal = facts.refusal
                    return await self._answer(send, refusal.status, {"detail": refusal.message},
                                              [(b"retry-after", str(refusal.retry_after_s).encode())])
                headers = [(name, value) for name, value in message.get("headers", [])
                           if name.lower() != b"content-security-policy"]
                message = {**message, "headers": [*headers, (b"content-security-policy", self.csp)]}
            elif replaced:
                return None
            return await send(message)

        return guarded

    async def _answer(self, send: Send, status: int, body: dict,
                      extra: list[tuple[bytes, bytes]] | None = None) -> None:
        content = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                   (b"content-security-policy", self.csp), *(extra or [])]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})
