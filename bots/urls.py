"""Checking URLs that arrive inside platform messages before anything is sent to them.

A DingTalk sessionWebhook or a WeCom AI bot's response_url comes in the (signed) callback body,
but a signature that covers only a timestamp does not vouch for the body: such a URL is used only
when it points at the platform's own API origin, parsed exactly as the HTTP client will parse it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import httpx
from prometheus_client import Counter

DEFAULT_PORTS = {"http": 80, "https": 443}
log = logging.getLogger(__name__)
REFUSED_URLS = Counter(
    "botgw_refused_urls_total", "URLs from inside messages not used: not the platform's origin", ["platform", "kind"]
)


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, url.host, url.port or DEFAULT_PORTS.get(url.scheme, -1)


def same_origin(url: str, allowed_base: str) -> bool:
    """True when `url` has the scheme, host and port of `allowed_base` and carries no userinfo."""
    try:
        candidate = httpx.URL(url)
        allowed = httpx.URL(allowed_base)
    except (httpx.InvalidURL, TypeError, ValueError):
        return False
    if candidate.scheme not in DEFAULT_PORTS or candidate.userinfo or not candidate.host:
        return False
    return _origin(candidate) == _origin(allowed)


def on_hosts(url: str, hosts: Sequence[str]) -> bool:
    """True when `url` is https on its default port, carries no userinfo, and names one of `hosts` exactly."""
    try:
        candidate = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return False
    if candidate.scheme != "https" or candidate.userinfo or candidate.port not in (None, 443):
        return False
    return candidate.host.lower() in {host.lower() for host in hosts}


def trusted(url: str, allowed_base: str, platform: str, kind: str, hosts: Sequence[str] = ()) -> bool:
    """same_origin (or one of `hosts`, over https), with a refusal logged (host only, never the whole URL) and
    counted."""
    if same_origin(url, allowed_base) or (hosts and on_hosts(url, hosts)):
        return True
    try:
        host = httpx.URL(url).host
    except (httpx.InvalidURL, TypeError, ValueError):
        host = "(unparsable)"
    log.warning("refused a URL from inside a message", extra={"platform": platform, "kind": kind, "host": host})
    REFUSED_URLS.labels(platform, kind).inc()
    return False


_SECRET_QUERY_KEY = re.compile(r"pass|secret|token|key|sig|auth|cred", re.IGNORECASE)


def url_in_message(url: str) -> str:
    """A URL a user wrote, quoted back in an error: as written when it holds no credentials (one without a scheme
    is the point of the error), else `redact_url`'s."""
    return redact_url(url) if "@" in url else repr(url)


def redact_url(url: str) -> str:
    """A URL fit for a message or a log line: its scheme, host(s), port and path, never a user name or password
    (`***@` says there are some), and the values of query parameters that look like credentials
    (`?sentinel_password=`, `?api_key=`) as `***`. A password may hold '/', '?', '#' or '@', which makes the
    host ambiguous: then only the scheme is kept, and the rest is said to be hidden."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return "(a URL without a scheme, hidden)"
    ends = [index for index in (rest.find(char) for char in "/?#") if index >= 0]
    authority, tail = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
    if "@" in tail:  # an '@' after the authority "ended": a password holding '/', '?' or '#'
        return f"{scheme}://(address hidden: the password in the URL holds / ? # or @)"
    _, at, host = authority.rpartition("@")
    host = f"***@{host}" if at else host  # that there are credentials is worth seeing; what they are is not
    path, _, query = tail.partition("#")[0].partition("?")
    if query:
        pairs = [pair.partition("=") for pair in query.split("&")]
        query = "&".join(
            f"{name}={'***' if _SECRET_QUERY_KEY.search(name) else value}" if equals else name
            for name, equals, value in pairs
        )
        path += f"?{query}"
    return f"{scheme}://{host}{path}"
