"""Which listener serves what: operators' routes stay off the public callback port.

The gateway listens twice with one app: the public port (callbacks, /healthz, the web API) and the admin
listener (`admin.host:admin.port`, loopback by default) for /metrics, /readyz (engine URLs, Redis state) and
/admin/…, and the operator console (/console/). On the public port those answer 404 (the console always),
except /metrics and /readyz for a caller with the admin token
(a Prometheus that can only reach the public port); /admin/… checks its token itself.
"""

from __future__ import annotations

import hmac

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPERATOR_PATHS = ("/metrics", "/readyz")
ADMIN_PREFIX = "/admin/"
CONSOLE_PREFIX = "/console"  # the operator console (gateway/console): the admin listener only


def is_operator_path(path: str) -> bool:
    return path in OPERATOR_PATHS or path.startswith(ADMIN_PREFIX)


def is_console_path(path: str) -> bool:
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


class AdminListenerGuard:
    """ASGI middleware: route a request by the local port it came in on."""

    def __init__(self, app: ASGIApp, admin_port: int | None, token: str | None) -> None:
        self.app = app
        self.admin_port = admin_port
        self._expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        on_admin = self.admin_port is not None and (scope.get("server") or (None, None))[1] == self.admin_port
        if on_admin:
            allowed = is_operator_path(path) or is_console_path(path) or path == "/healthz"
        elif is_console_path(path):
            allowed = False  # the console is for the admin listener's network, token or not
        else:
            allowed = path not in OPERATOR_PATHS or self._has_token(scope)
        if allowed:
            await self.app(scope, receive, send)
        else:
            await PlainTextResponse("not found", status_code=404)(scope, receive, send)

    def _has_token(self, scope: Scope) -> bool:
        if self._expected is None:
            return False
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        return hmac.compare_digest(given, self._expected)
