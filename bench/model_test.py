"""The model-based fault test (tests/model/) over any number of seeds: prints seeds run, moves, faults injected
and invariant violations, and for each failing seed the shortest sequence of moves found that still breaks it.

Why: `make test` runs a few fixed seeds (tests/redis/test_model.py); defects of the answer path that need a rarer
interleaving of moves and faults show up only over many seeds.

Run: `.venv/bin/python bench/model_test.py --seeds 30 [--first 1] [--steps 30] [--rate 0.04] [--no-shrink]`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.redis_servers import start_redis
from tests.model.run import generate, report, run_moves, shrink
from tests.model.world import Services


async def main(args: argparse.Namespace) -> int:
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    redis_proc, redis_url = start_redis(log_dir)
    services = Services.start(redis_url, log_dir)
    moves = faults = failing = violations = 0
    kinds: dict[str, list[int]] = {}
    started = time.monotonic()
    try:
        for seed in range(args.first, args.first + args.seeds):
            outcome = await run_moves(services, seed, generate(seed, args.steps), args.rate)
            moves, faults = moves + outcome.steps, faults + outcome.faults
            violations += len(outcome.violations)
            print(f"seed {seed}: {outcome.steps} moves, {outcome.faults} faults, "
                  f"{len(outcome.violations)} violation(s)", flush=True)  # fmt: skip
            if not outcome.violations:
                continue
            failing += 1
            kinds.setdefault(outcome.kind, []).append(seed)
            print(report(await shrink(services, outcome, args.rate) if args.shrink else outcome), flush=True)
    finally:
        services.stop()
        redis_proc.stop()
    print(f"\nseeds run {args.seeds}, moves {moves}, faults injected {faults}, failing seeds {failing}, "
          f"invariant violations {violations}, {time.monotonic() - started:.0f} s")  # fmt: skip
    for kind, seeds in sorted(kinds.items()):
        print(f"  {kind}: seeds {seeds}")
    return 1 if failing else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rate", type=float, default=0.04, help="chance of a fault at each boundary crossed")
    parser.add_argument("--no-shrink", dest="shrink", action="store_false")
    parser.add_argument("--log-dir", default="test-artifacts/model-logs")
    sys.exit(asyncio.run(main(parser.parse_args())))
