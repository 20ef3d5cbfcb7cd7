"""`botgw config check`: the start-up checks, then the effective configuration with secrets masked."""

from __future__ import annotations

import argparse
import sys

from gateway.config import load_settings


def register(sub: argparse._SubParsersAction) -> None:
    config_cmd = sub.add_parser("config", help="the configuration: check it, show what takes effect")
    config_sub = config_cmd.add_subparsers(dest="config_command", required=True)
    config_check = config_sub.add_parser(
        "check", help="run the start-up checks and print the effective configuration, secrets masked"
    )
    config_check.add_argument("--config", required=True)
    config_check.set_defaults(run=_config_check)


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
    print(yaml.safe_dump(settings.shown(), allow_unicode=True, sort_keys=False), end="")
    return 2 if failed else 0

