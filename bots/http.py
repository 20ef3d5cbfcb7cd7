"""What every platform client shares: a cached access token, and HTTP failures mapped to send errors.

Transport errors and 5xx are worth retrying; other non-200 answers are not. A token is
fetched once for all replicas (TokenStore in Redis, one refresher at a time) and fetched
again only when the platform says the cached one is stale.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from bots.base import PermanentSendError, RetryableSendError, SendError, TokenStore
from bots.parts import MediaError

TOKEN_EARLY_REFRESH_S = 300
DOWNLOAD_DEADLINE_S = 120.0  # one attachment's whole download (10 MB at a slow 100 KB/s)
TokenFetch = Callable[[], Awaitable[tuple[str, float]]]


def token_name(platform: str, app: str, secret: str) -> str:
    """One cache entry per (app, secret): a rotated secret gets a new token, and no secret is in the key."""
    return f"{platform}:{app}:{hashlib.sha256(secret.encode()).hexdigest()[:16]}"


async def cached_token(tokens: TokenStore, name: str, fetch: TokenFetch, stale: str | None = None) -> str:
    """A valid token from the cache; fetched once for everyone when missing or equal to `stale`.

    The stale token is dropped first (compare-and-delete, so a token another process put meanwhile stays): the
    store may keep a copy in this process, and a read after the drop goes to the shared cache."""
    if stale:
        await tokens.invalidate(name, stale)
    cached = await tokens.get(name)
    if cached and cached != stale:
        return cached
    async with tokens.refresh_lock(name):
        cached = await tokens.get(name)
        if cached and cached != stale:
            return cached  # another process refreshed it while we waited
        try:
            token, expires_in = await fetch()
        except SendError as exc:  # said, so that the gateway can show it as the bot's token problem (60020, 40001)
            exc.token_refresh = True
            raise
        await tokens.put(name, token, max(60.0, expires_in - TOKEN_EARLY_REFRESH_S))
        return token


class PlatformClient(httpx.AsyncClient):
    """The platforms' HTTP client (httpx), which makes the small JSON calls of `request_json` (a message sent, a
    token asked: at least one per answer) through an aiohttp session when the runtime pairs one with it: such a
    call costs aiohttp ~0.25 ms of CPU against httpx's ~0.9 ms (measured here with uvloop). Like httpx's, the
    session follows no redirect and honours the proxy environment (HTTP(S)_PROXY, NO_PROXY), read once per host
    as httpx reads it once per client: a session that trusts the environment itself (aiohttp's trust_env) reads
    it, and ~/.netrc, in two threads on every call: ~0.7 ms more CPU per call, over three times a call's own."""

    def __init__(self, *, json_session: aiohttp.ClientSession | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.json_session = json_session
        self._proxies: dict[tuple[str, str], tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    def _proxy(self, url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """The environment's proxy for `url`'s scheme and host, and its credentials: (None, None) for none."""
        parsed = URL(url)
        key = (parsed.scheme, parsed.host or "")
        if key not in self._proxies:  # the hosts are the configured platforms' API hosts: a handful
            try:
                self._proxies[key] = get_env_proxy_for_url(parsed)
            except LookupError:  # no proxy for this scheme, or NO_PROXY names the host
                self._proxies[key] = (None, None)
        return self._proxies[key]

    async def json_call(
        self, method: str, url: str, params: dict[str, str] | None, body: object
    ) -> tuple[int, bytes]:
        """(status, content) of one call with a JSON body (or none), through the session when there is one."""
        if self.json_session is None:
            response = await self.request(method, url, params=params, json=body)
            return response.status_code, response.content
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json"} if data is not None else None
        proxy, proxy_auth = self._proxy(url)
        async with self.json_session.request(
            method, url, params=params, data=data, headers=headers, allow_redirects=False, proxy=proxy,
            proxy_auth=proxy_auth,
        ) as response:
            return response.status, await response.read()


def _decoded(content: bytes) -> dict:
    return json.loads(content) if content else {}


async def request_json(
    http: httpx.AsyncClient, method: str, url: str, what: str, *, params: dict[str, str] | None = None,
    json: object = None,
) -> dict:
    """One call whose answer must be 200 with a JSON body; failures become typed send errors."""
    client = http if isinstance(http, PlatformClient) else None
    try:
        if client is not None:
            status, content = await client.json_call(method, url, params, json)
        else:
            response = await http.request(method, url, params=params, json=json)
            status, content = response.status_code, response.content
    except (httpx.HTTPError, aiohttp.ClientError, TimeoutError) as exc:
        raise RetryableSendError(f"{what} unreachable: {type(exc).__name__}", code="network") from exc
    if status >= 500 or status == 429:
        raise RetryableSendError(f"{what} answered HTTP {status}", code=status, not_sent=status == 429)
    if status != 200:
        raise PermanentSendError(f"{what} answered HTTP {status}", code=status)
    try:
        return _decoded(content)
    except ValueError as exc:
        raise RetryableSendError(f"{what} answered non-JSON", code="bad_json") from exc


async def download_bounded(
    http: httpx.AsyncClient, url: str, what: str, max_bytes: int, **kwargs: object
) -> tuple[bytes, httpx.Headers]:
    """GET an attachment, at most `max_bytes` of it, never following a redirect (a redirect could lead off the
    platform); MediaError says why not. A JSON body where media was expected is the platform's error answer:
    the caller reads it from `headers` and the bytes (WeCom answers an expired media_id with errcode JSON)."""
    headers = {**dict(kwargs.pop("headers", None) or {}), "Accept-Encoding": "identity"}  # type: ignore[call-overload]
    try:
        async with asyncio.timeout(DOWNLOAD_DEADLINE_S):  # a host that drips bytes does not hold the job
            return await _download(http, url, what, max_bytes, headers=headers, **kwargs)
    except TimeoutError:
        raise MediaError("unavailable", f"{what}: not downloaded within {DOWNLOAD_DEADLINE_S:.0f} s") from None


async def _download(
    http: httpx.AsyncClient, url: str, what: str, max_bytes: int, **kwargs: object
) -> tuple[bytes, httpx.Headers]:
    try:
        async with http.stream("GET", url, follow_redirects=False, **kwargs) as response:  # type: ignore[arg-type]
            if response.status_code >= 500 or response.status_code == 429:
                raise MediaError("unavailable", f"{what} answered HTTP {response.status_code}")
            if response.status_code != 200:
                raise MediaError("refused", f"{what} answered HTTP {response.status_code}")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise MediaError("too_large", f"{what}: {declared} bytes, over {max_bytes}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise MediaError("too_large", f"{what}: over {max_bytes} bytes")
            return bytes(body), response.headers
    except httpx.HTTPError as exc:
        raise MediaError("unavailable", f"{what} unreachable: {type(exc).__name__}") from exc
