"""`botgw kb add` on a folder shows progress per file, and a run killed part way resumes: the same command again
skips what is already in (by content hash) and adds the rest, leaving no chunk twice. Real processes, real
embedded store and offline embedder."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

from knowledge.config import StoreSettings
from knowledge.store import KnowledgeStore
from testkit.configs import write_config
from testkit.processes import BOTGW, ROOT, child_env

TOPICS = ["退货", "换货", "保修", "发票", "配送", "积分", "会员", "停车", "报销", "年假", "加班", "门禁"]
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (\S+): (\w+) \(")


def folder_of_documents(root: Path) -> Path:
    folder = root / "资料"
    for number, topic in enumerate(TOPICS):
        (folder / ("部门" + str(number % 3))).mkdir(parents=True, exist_ok=True)
        parts = [f"## {topic}规定第{n}条\n\n关于{topic}的第{n}条规定：编号 R-{number}{n}，请按流程办理。"
                 for n in (1, 2, 3)]  # fmt: skip
        text = "\n\n".join(parts)
        (folder / f"部门{number % 3}" / f"{topic}.md").write_text(f"# {topic}说明\n\n{text}\n", encoding="utf-8")
    return folder


def test_kb_add_shows_progress_and_resumes_after_a_kill(tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = write_config(tmp_path / "botgw.yaml", {"knowledge": {"store": {"path": str(store)}}})
    folder = folder_of_documents(tmp_path)
    command = [*BOTGW, "kb", "add", "--config", str(config), "many", str(folder)]

    started = time.monotonic()
    first = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    seen: list[tuple[int, int, str, str]] = []
    assert first.stderr is not None
    for line in first.stderr:
        match = PROGRESS.match(line)
        if match:
            seen.append((int(match[1]), int(match[2]), match[3], match[4]))
            if len(seen) == 4:
                first.send_signal(signal.SIGKILL)  # mid-folder: 4 of 12 reported
                break
    first.wait(30)
    print(f"\nfirst run killed after {len(seen)} files, {time.monotonic() - started:.1f} s")
    assert [n for n, *_ in seen] == [1, 2, 3, 4] and {total for _, total, *_ in seen} == {len(TOPICS)}
    assert {status for *_, status in seen} == {"added"}
    done_before = {doc for *_, doc, _ in seen}

    started = time.monotonic()
    second = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    print(f"second run: {time.monotonic() - started:.1f} s")
    assert second.returncode == 0, second.stderr
    statuses = {m[3]: m[4] for m in map(PROGRESS.match, second.stderr.splitlines()) if m}
    assert len(statuses) == len(TOPICS)
    assert {doc for doc, status in statuses.items() if status == "unchanged"} >= done_before, statuses
    assert set(statuses.values()) <= {"unchanged", "added"}
    assert f"{len(TOPICS) - sum(s == 'unchanged' for s in statuses.values())} added" in second.stdout

    opened = KnowledgeStore.open(StoreSettings(path=str(store)), wait_s=10)
    try:
        records = opened.documents(["many"])
        assert {r.doc for r in records} == {f"部门{n % 3}/{topic}.md" for n, topic in enumerate(TOPICS)}
        assert opened.count("many") == sum(r.chunks for r in records), "a chunk of the killed run was left behind"
    finally:
        opened.close()
