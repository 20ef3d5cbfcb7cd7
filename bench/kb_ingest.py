"""`botgw kb add`'s ingestion rate: this checkout against another commit, side by side on the same documents.

Why: "several times faster" is a claim about one machine at one moment; the two are run here in turns (baseline,
this, this, baseline: a drift of the machine's load between runs falls on both), each as a fresh process into a
fresh store, exactly as an operator runs `botgw kb add`. The rate is chunks over the seconds the command reports per
file (its progress lines), so start-up (Python, the model's load) is left out of both; the wall time is shown too.

Corpora: the Simplified handbook (short sections), the Traditional FAQ (Q&A rows, each also embedded as a
question), and generated product manuals (chunks of about 400 characters, the size real documents are cut to).

With `--served-stub`, this checkout also adds the corpora through `knowledge.embedding.base_url` (the path a
vLLM-served bge-m3 takes) against a stand-in that answers 1,024 numbers per text at once: what botgw itself costs per
chunk when the embedding is someone else's (a real engine's time per chunk comes on top).

Run: `.venv/bin/python bench/kb_ingest.py --baseline 5630178 [--manuals 12] [--rounds 1] [--served-stub]`.
"""

from __future__ import annotations

import argparse
import http.server
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.kb import manual  # noqa: E402

DATA = ROOT / "bench" / "data" / "kb_quality"
PROGRESS = re.compile(r"^\[\d+/\d+\] .*: (?:added|replaced) \((\d+) chunks, ([\d.]+) s\)$", re.M)


def checkout(ref: str, into: Path) -> Path:
    """The tree of `ref` (a commit of this repository), unpacked without touching the work tree or its worktrees."""
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


class StubEmbeddings(http.server.BaseHTTPRequestHandler):
    """`/v1/embeddings` answered at once with 1,024 pseudo-random numbers per input (bge-m3's size)."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rng = random.Random(len(body["input"]))
        data = [{"index": i, "embedding": [rng.uniform(-1, 1) for _ in range(1024)]} for i in range(len(body["input"]))]
        answer = json.dumps({"data": data, "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def kb_add(tree: Path, store: Path, paths: list[Path], embedding: str = "") -> tuple[int, float, float]:
    """Run `botgw kb add` of the code in `tree` (this venv's packages); chunks, their seconds, and the wall time."""
    config = store.parent / f"{store.name}.yaml"
    config.write_text(f"knowledge: {{store: {{path: {store}}}{embedding}}}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_WAIT_POLICY": "PASSIVE"}
    command = [sys.executable, "-m", "gateway.cli", "kb", "add", "--config", str(config), "bench", *map(str, paths)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"kb add in {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
    found = PROGRESS.findall(done.stderr)
    return sum(int(chunks) for chunks, _ in found), sum(float(seconds) for _, seconds in found), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a commit to compare with (e.g. the main before issue 20)")
    parser.add_argument("--manuals", type=int, default=12, help="generated manuals (about 21 long chunks each)")
    parser.add_argument("--rounds", type=int, default=1, help="baseline/this/this/baseline rounds per corpus")
    parser.add_argument("--served-stub", action="store_true", help="also through /v1/embeddings against a stand-in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="botgw-kb-ingest-") as tmp:
        root = Path(tmp)
        baseline = checkout(args.baseline, root / "baseline")
        rng = random.Random(7)
        manuals = root / "manuals"
        manuals.mkdir()
        for number in range(args.manuals):
            (manuals / f"QL-{100 + number}手册.md").write_text(manual(number, rng), encoding="utf-8")
        corpora = {
            "handbook (zh_hans, short sections)": sorted((DATA / "zh_hans" / "docs").glob("*.md")),
            "bank FAQ (zh_hant, Q&A rows)": [DATA / "zh_hant" / "faq.csv"],
            "manuals (400-character chunks)": sorted(manuals.glob("*.md")),
        }
        print(f"kb add, {args.baseline} against this checkout, on {os.cpu_count()} cores")
        for name, paths in corpora.items():
            rates: dict[str, list[tuple[int, float, float]]] = {"baseline": [], "this": []}
            for round_ in range(args.rounds):
                for which in ("baseline", "this", "this", "baseline"):
                    tree = baseline if which == "baseline" else ROOT
                    store = root / f"store-{which}-{name[:4]}-{round_}-{len(rates[which])}"
                    rates[which].append(kb_add(tree, store, paths))
            line = []
            for which, runs in rates.items():
                chunks = runs[0][0]
                per_second = [c / s for c, s, _ in runs]
                walls = ", ".join(f"{wall:.0f}" for _, _, wall in runs)
                line.append(
                    f"{which} {min(per_second):.1f}–{max(per_second):.1f} chunks/s ({chunks} chunks; wall {walls} s)"
                )
            speedup = (sum(c / s for c, s, _ in rates["this"]) / len(rates["this"])) / (
                sum(c / s for c, s, _ in rates["baseline"]) / len(rates["baseline"])
            )
            print(f"{name}: {'; '.join(line)}; this / baseline: {speedup:.2f}x", flush=True)
        if args.served_stub:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubEmbeddings)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            served = f", embedding: {{base_url: 'http://127.0.0.1:{server.server_address[1]}'}}"
            for name, paths in corpora.items():
                chunks, seconds, wall = kb_add(ROOT, root / f"store-served-{name[:4]}", paths, served)
                print(f"{name}, served embeddings (stand-in): {chunks / seconds:.1f} chunks/s (wall {wall:.0f} s)")
            server.shutdown()


if __name__ == "__main__":
    main()
