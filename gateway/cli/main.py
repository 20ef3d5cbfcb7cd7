"""The `botgw` command: the parser assembled from each command group's `register`, and what a failure prints and
exits with (the same for every command)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings

import httpx
from pydantic import ValidationError

from gateway.cli import config_check, dlq, engine, kb, kf, limits, migrate_keys, processes, push, sim, tools
from gateway.cli.common import UsageError
from gateway.config import ConfigError, describe_errors

LONG_RUNNING = {"serve", "worker", "dingtalk-stream", "web", "sim serve", "engine serve"}

# In the order `botgw --help` lists them.
COMMAND_GROUPS = (processes, push, kf, limits, migrate_keys, dlq, tools, config_check, kb, engine, sim)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="botgw", description="WeCom/DingTalk bots answered by ERNIE-4.5 on vLLM")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
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
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("BOTGW_DEBUG", "") not in ("", "0")
    sub = getattr(args, f"{args.command.replace('-', '_')}_command", None)
    command = f"{args.command} {sub}" if sub else args.command
    if command in LONG_RUNNING:
        logging.captureWarnings(True)  # a library's warning becomes a log line like every other
    elif not debug:  # and is no line for an operator of a one-shot command (qdrant-client's version check)
        warnings.filterwarnings("ignore", category=UserWarning)
    code, line, error = outcome(args, command)
    if line:
        print(line, file=sys.stderr)
    if debug and error is not None:
        import traceback

        traceback.print_exception(error)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return code


def outcome(args: argparse.Namespace, command: str) -> tuple[int, str, BaseException | None]:
    """Run the command: its exit code, the one line that explains a failure, and the failure itself."""
    from redis.exceptions import RedisClusterException, RedisError

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
        if isinstance(exc, (RedisError, RedisClusterException)):  # the cluster client's own are no RedisError
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
