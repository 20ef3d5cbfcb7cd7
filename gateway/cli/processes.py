"""The long-running processes: `botgw serve` (the gateway), `worker`, `dingtalk-stream`, `web` (the page), and
`web-password` for the page's users."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import secrets
import socket
import sys

from gateway.cli.common import UsageError, redis_for, until_signal
from gateway.config import load_settings
from gateway.logs import setup_logging

GRACEFUL_SHUTDOWN_S = 10
log = logging.getLogger("botgw")


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run the gateway (FastAPI on uvicorn)")
    serve.add_argument("--config", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--admin-port", type=int, default=None, help="the admin listener's port (default admin.port)")
    serve.set_defaults(run=_serve)

    worker = sub.add_parser("worker", help="run a worker (any number, anywhere, sharing Redis)")
    worker.add_argument("--config", required=True)
    worker.add_argument("--name", default=None, help="consumer name (default host-pid-random)")
    worker.set_defaults(run=_worker)

    web = sub.add_parser("web", help="the web chat page (Chainlit) on the same pipeline")
    web.add_argument("--config", required=True)
    web.add_argument("--bot", default="web", help="the web bot's id in the configuration")
    web.add_argument("--host", default="127.0.0.1")
    web.add_argument("--port", type=int, default=8100)
    web.add_argument("--app-root", default="~/.cache/botgw/web", help="where Chainlit keeps its files")
    web.set_defaults(run=_web)

    web_password = sub.add_parser("web-password", help="print a password_hash for a web page user (reads stdin)")
    web_password.set_defaults(run=_web_password)

    stream = sub.add_parser("dingtalk-stream", help="hold the Stream-mode connection of every DingTalk stream bot")
    stream.add_argument("--config", required=True)
    stream.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    stream.set_defaults(run=_dingtalk_stream)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.base_check import check_bases
    from gateway.edge.app import create_app
    from gateway.edge.http_bounds import BoundedHttpToolsProtocol
    from gateway.edge.server import QuietServer
    from gateway.state.redis_client import STARTUP_WAIT_S

    settings = load_settings(args.config)
    setup_logging(settings.log_level)
    admin_port = settings.admin.port if args.admin_port is None else args.admin_port
    sockets = [listen(args.host, args.port)]
    if admin_port:
        hint = "another `botgw serve` on this machine? give this one --admin-port PORT (or 0 for none)"
        sockets.append(listen(settings.admin.host, admin_port, hint))

    async def dependencies() -> None:
        """Before uvicorn: a Redis that never comes is one line here, not a traceback from the lifespan."""
        async with redis_for(settings, STARTUP_WAIT_S):
            pass
        await check_bases(settings, strict=False, wait_s=2.0)  # a warning only: not worth a slow start

    asyncio.run(dependencies())
    if admin_port:
        log.info("admin listener (/metrics, /readyz, /admin) on %s:%d", settings.admin.host, admin_port)
    app = create_app(settings, admin_port=admin_port or None)
    # On SIGTERM uvicorn stops accepting, lets in-flight callbacks finish (their acks are milliseconds), then
    # the lifespan flushes the batcher: nothing acknowledged is left unqueued.
    # httptools with a 64 KiB bound on request heads (431), on both listeners: see gateway.edge.http_bounds.
    config = uvicorn.Config(
        app,
        http=BoundedHttpToolsProtocol,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # The client is the TCP peer: uvicorn would otherwise take X-Forwarded-For from any loopback peer (an SSH
        # tunnel, a port-forward, a local proxy passing the header on), and the flood guard and the console's
        # sign-in limit, both keyed by the client, would count a forged address instead.
        proxy_headers=False,
    )
    QuietServer(config).run(sockets=sockets)
    return 0


def listen(host: str, port: int, hint: str = "") -> socket.socket:
    """A listening socket, bound before uvicorn starts so that a port in use fails the start with its address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        in_use = exc.errno == errno.EADDRINUSE and hint
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}" + (f" ({hint})" if in_use else "")) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _worker(args: argparse.Namespace) -> int:
    from gateway.base_check import check_bases
    from gateway.runtime import open_runtime, use_uvloop
    from gateway.worker.loop import Worker

    settings = load_settings(args.config)
    setup_logging(settings.log_level)
    asyncio.run(check_bases(settings, strict=True))
    consumer = args.name or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    if settings.worker.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.worker.metrics_port)

    async def work(stop: asyncio.Event) -> None:
        async with open_runtime(settings) as runtime:
            await Worker(runtime, consumer).run(stop)

    use_uvloop()  # as uvicorn does for the gateway: a quarter of plain asyncio's loop cost per message
    return until_signal(work)


def _dingtalk_stream(args: argparse.Namespace) -> int:
    from gateway.edge.stream_mode import run_stream_mode

    settings = load_settings(args.config)
    setup_logging(settings.log_level)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    return until_signal(lambda stop: run_stream_mode(settings, stop))


def _web(args: argparse.Namespace) -> int:
    """Start the page (webchat/serve.py) with only its own bots checked: the other bots' `${VAR}`s need not be set
    where the page runs, and the page process never reads their secrets (webchat/bot_settings.py)."""
    import secrets as token_source
    from pathlib import Path

    from webchat.bot_settings import load_page_settings

    bot = load_page_settings(args.config, args.bot).web
    app_root = Path(args.app_root).expanduser()
    app_root.mkdir(parents=True, exist_ok=True)
    secret = bot.auth_secret.get_secret_value() if bot.auth_secret else token_source.token_urlsafe(32)
    env = {
        **os.environ,
        "BOTGW_CONFIG": str(Path(args.config).resolve()),
        "BOTGW_WEB_BOT": bot.id,
        "CHAINLIT_APP_ROOT": str(app_root),
        "CHAINLIT_AUTH_SECRET": secret,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
        ),
    }
    # Chainlit's app behind botgw's guard, with Chainlit's settings botgw's (webchat/serve.py), not `chainlit run`
    argv = [sys.executable, "-m", "webchat.serve", "--host", args.host, "--port", str(args.port)]
    os.execve(argv[0], argv, env)
    return 0


def _web_password(args: argparse.Namespace) -> int:
    """Print a `password_hash` for a web user; the password is read without echo (or from stdin when piped)."""
    import getpass

    from bots.web.config import hash_password

    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("botgw: an empty password is not a password", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0
