"""Knowledge base benchmark: ingestion rate, search latency and recall on the embedded store, on this CPU.

Why: the embedded Qdrant store and the in-process e5 embedder are the default (`make run`, a single worker); how fast
documents go in, how long a question waits for its passages, and whether the right passage is still found among
many others bound what that default serves before a Qdrant server and a vLLM embedding engine are needed.

What, in one temporary store:
1. the sample company's documents (tests/fixtures/kb): recall@5 on the labelled questions;
2. generated manuals of other products (same vocabulary: filters, warranty, error codes) up to 1,000 chunks,
   through the whole pipeline (parse, chunk, embed with e5, write): chunks per second; then hybrid search latency
   p50/p99 for the labelled questions (query embedding included, and apart) and recall@5 among the 1,000;
3. more generated chunks up to 10,000, written with lexical vectors of their own text but dense vectors copied from
   step 2's (embedding 9,000 more chunks takes about half an hour on two busy cores; `--embed-all` does it): the
   store's write rate, search latency at 10,000, and how long the embedded store takes to open (what a worker pays
   when it opens the folder again after letting it go).

Run: `.venv/bin/python bench/kb.py [--sizes 1000,10000] [--embed-all] [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from knowledge.config import KnowledgeSettings  # noqa: E402
from knowledge.lexical import document_vector  # noqa: E402
from knowledge.service import Knowledge  # noqa: E402
from knowledge.store import ChunkPoint, DocRecord, KnowledgeStore  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "kb"
SECTIONS_PER_DOC = 20
PARTS = ["滤网", "电机", "风扇", "传感器", "水泵", "显示屏", "遥控器", "电源板", "滤芯", "进水阀"]
PLACES = ["卧室", "客厅", "办公室", "会议室", "厨房", "门店", "仓库", "教室"]


def manual(number: int, rng: random.Random) -> str:
    """A generated product manual: realistic near-misses for the sample's questions, in Markdown."""
    model = f"QL-{100 + number}"
    lines = [f"# {model} 产品手册", "", f"{model} 是青岚科技的第 {number} 款设备，适用于{rng.choice(PLACES)}。", ""]
    for section in range(SECTIONS_PER_DOC):
        part, place = rng.choice(PARTS), rng.choice(PLACES)
        months, years, code = rng.randint(3, 24), rng.randint(1, 6), rng.randint(10000, 99999)
        lines += [
            f"## {part}说明 {section + 1}",
            "",
            f"{model} 的{part}建议每 {months} 个月检查一次，在{place}连续使用时可以适当缩短周期。"
            f"{part}的保修期为 {years} 年，人为损坏不在保修范围内。出现错误码 {code} 时，请先断电 {rng.randint(1, 9)} "
            f"分钟再重新开机；仍然报 {code} 的，请携带购买凭证联系售后服务网点，工作人员会在 {rng.randint(1, 7)} "
            f"个工作日内答复。更换{part}时请使用原装配件，并在 App 中把使用时长清零。",
            "",
        ]
    return "\n".join(lines)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def recall_at_5(knowledge: Knowledge, labels: list[dict]) -> float:
    found = 0
    for label in labels:
        hits = await knowledge.search(["demo", "gen"], label["q"], 5)
        found += any(label["passage"] in hit.display and hit.doc == label["doc"] for hit in hits)
    return found / len(labels)


async def latency(knowledge: Knowledge, labels: list[dict], repeat: int) -> str:
    totals, embeds = [], []
    for _ in range(repeat):
        for label in labels:
            started = time.perf_counter()
            await knowledge.embedder.query(label["q"])
            embeds.append(time.perf_counter() - started)
            started = time.perf_counter()
            await knowledge.search(["demo", "gen"], label["q"], 5)
            totals.append(time.perf_counter() - started)
    ms = [t * 1000 for t in totals]
    return (
        f"hybrid search p50 {percentile(ms, 0.5):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms "
        f"({len(ms)} questions; the query's embedding alone p50 {statistics.median(embeds) * 1000:.0f} ms)"
    )


async def add_generated(knowledge: Knowledge, folder: Path, first: int, count_docs: int, rng: random.Random) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number in range(first, first + count_docs):
        path = folder / f"QL-{100 + number}手册.md"
        path.write_text(manual(number, rng), encoding="utf-8")
        paths.append(path)
    outcomes = await knowledge.add("gen", paths)
    return sum(o.chunks for o in outcomes)


def write_copied(knowledge: Knowledge, folder: Path, first: int, count_docs: int, rng: random.Random) -> int:
    """Generated documents whose dense vectors are copies (slightly moved) of chunks already embedded."""
    from knowledge.chunking import chunk_document
    from knowledge.formats import parse
    from knowledge.search import embedding_text

    store = knowledge.store
    pool = [found.dense for found in store.dense(np.ones(384, dtype=np.float32) / 384**0.5, _versions(store), 1000)]
    written = 0
    for number in range(first, first + count_docs):
        name = f"QL-{100 + number}手册.md"
        document = parse(name, manual(number, rng).encode())
        chunks = chunk_document(document, knowledge.settings.chunking.size, knowledge.settings.chunking.overlap)
        version = uuid.uuid4().hex
        points = []
        for chunk in chunks:
            text = embedding_text(document.title, chunk.section, chunk.text)
            vector = pool[rng.randrange(len(pool))] + np.random.default_rng(number).normal(0, 0.01, 384)
            dense = (vector / np.linalg.norm(vector)).astype(np.float32)
            lexical = document_vector(text)
            points.append(
                ChunkPoint(
                    "gen", name, version, chunk.index, document.title, chunk.section, chunk.text, None, dense, lexical
                )
            )
        store.write(points)
        store.publish(DocRecord("gen", name, version, "-", document.title, len(points), 0, str(folder), time.time()))
        written += len(points)
    return written


def _versions(store: KnowledgeStore) -> list[str]:
    return [record.version for record in store.documents()]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="store sizes in chunks")
    parser.add_argument("--embed-all", action="store_true", help="embed every generated chunk (slow)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the labelled questions per latency figure")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    labels = yaml.safe_load((FIXTURES / "labels.yaml").read_text(encoding="utf-8"))
    rng = random.Random(12)
    with tempfile.TemporaryDirectory(prefix="botgw-kb-bench-") as tmp:
        settings = KnowledgeSettings.model_validate({"store": {"path": f"{tmp}/store"}})
        knowledge = await Knowledge.open(settings)
        docs = sorted(p for p in FIXTURES.iterdir() if p.suffix not in (".py", ".yaml"))
        started = time.perf_counter()
        sample = sum(o.chunks for o in await knowledge.add("demo", docs))
        print(f"sample documents: {len(docs)} files, {sample} chunks in {time.perf_counter() - started:.1f} s")
        print(f"  recall@5 on {len(labels)} labelled questions: {await recall_at_5(knowledge, labels):.1%}")
        print(f"  {await latency(knowledge, labels, args.repeat)}")
        total, next_doc = sample, 0
        for size in sizes:
            want_docs = max(0, (size - total) // (SECTIONS_PER_DOC + 1))
            started = time.perf_counter()
            if size == sizes[0] or args.embed_all:
                added = await add_generated(knowledge, Path(tmp) / "gen", next_doc, want_docs, rng)
                how = "parse, chunk, embed (e5 in-process), write"
            else:
                added = await asyncio.to_thread(write_copied, knowledge, Path(tmp) / "gen", next_doc, want_docs, rng)
                how = "lexical vectors and write; dense vectors copied"
            elapsed = time.perf_counter() - started
            next_doc += want_docs
            total += added
            print(f"{total} chunks: added {added} in {elapsed:.1f} s = {added / elapsed:.1f} chunks/s ({how})")
            await knowledge.search(["demo", "gen"], labels[0]["q"], 5)  # reads the chunks into memory if not yet
            print(f"  {await latency(knowledge, labels, args.repeat)}")
            print(f"  recall@5 among them: {await recall_at_5(knowledge, labels):.1%}")
            await knowledge.aclose()
            started = time.perf_counter()
            knowledge = await Knowledge.open(settings)
            opened = time.perf_counter() - started
            await knowledge.search(["demo", "gen"], labels[0]["q"], 5)
            print(
                f"  opening the embedded store: {opened:.2f} s, and its first search (which reads every chunk "
                f"into memory) {time.perf_counter() - started - opened:.2f} s more: what a worker pays when it "
                "opens the folder again"
            )
        await knowledge.aclose()


if __name__ == "__main__":
    asyncio.run(main())
