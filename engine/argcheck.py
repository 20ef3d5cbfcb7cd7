"""Checks engine command lines against vLLM's own argument parser (run inside the engine venv).

`python -m engine.argcheck` reads a JSON list of argument lists on stdin (each what follows
`vllm serve`: the model, then the flags) and prints a JSON list of error strings ("" where vLLM accepts the
arguments). Parsing is checked, then the checks `vllm serve` makes before it loads anything (a flag that needs
another, the chat template, the tool-call parser's name: an unknown `--tool-call-parser` passes the parser and
would stop the server only at start), not whether the hardware exists, so GPU and multi-node profiles can be
checked on a CPU machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def check(argv_list: list[list[str]]) -> list[str]:
    import vllm.entrypoints.launchers.api_server.entry  # noqa: F401 - import order the server itself uses
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import validate_api_server_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    errors = []
    for argv in argv_list:
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))  # `vllm serve`'s parser: model_tag, flags
        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured):
                args = parser.parse_args(argv)
        except SystemExit:
            errors.append(captured.getvalue().strip().splitlines()[-1] if captured.getvalue() else "rejected")
            continue
        try:
            validate_parsed_serve_args(args)  # what `vllm serve` checks right after parsing
            validate_api_server_args(args)  # ... and as the API server starts: the tool and reasoning parsers' names
        except (TypeError, ValueError, KeyError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        errors.append("")
    return errors


if __name__ == "__main__":
    print(json.dumps(check(json.load(sys.stdin))))
