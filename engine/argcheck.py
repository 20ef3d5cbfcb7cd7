"""Checks engine command lines against vLLM's own argument parser (run inside the engine venv).

`python -m engine.argcheck` reads a JSON list of argument lists on stdin (each what follows
`vllm serve`: the model, then the flags) and prints a JSON list of error strings ("" where vLLM accepts the
arguments). Parsing alone is checked, not whether the hardware exists, so GPU and multi-node
profiles can be checked on a CPU machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def check(argv_list: list[list[str]]) -> list[str]:
    import vllm.entrypoints.launchers.api_server.entry  # noqa: F401 - import order the server itself uses
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    errors = []
    for argv in argv_list:
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))  # `vllm serve`'s parser: model_tag, flags
        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured):
                parser.parse_args(argv)
            errors.append("")
        except SystemExit:
            errors.append(captured.getvalue().strip().splitlines()[-1] if captured.getvalue() else "rejected")
    return errors


if __name__ == "__main__":
    print(json.dumps(check(json.load(sys.stdin))))
