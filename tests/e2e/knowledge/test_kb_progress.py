"""`botgw kb add` says how far it is (a redrawn line on a terminal, plain lines elsewhere) and refuses a named
file it cannot read, as the admin API does (415), unless told to skip it."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

from knowledge.ingest import Found, Outcome
from knowledge.progress import AddProgress
from testkit.configs import write_config
from testkit.processes import BOTGW, ROOT, child_env


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _files(tmp_path: Path) -> list[Found]:
    (tmp_path / "a.md").write_bytes(b"x" * 3000)
    (tmp_path / "b.md").write_bytes(b"x" * 1000)
    (tmp_path / "c.png").write_bytes(b"x" * 5000)  # not read: no share of the time left
    return [Found(tmp_path / name, name, named=True) for name in ("a.md", "b.md", "c.png")]


def test_plain_lines_come_per_file_and_every_ten_seconds_with_the_time_left(tmp_path: Path) -> None:
    out, clock = io.StringIO(), Clock()
    shown = AddProgress(_files(tmp_path), out, terminal=False, clock=clock)
    shown.embedding("a.md", 0, 60)
    clock.now += 5
    shown.embedding("a.md", 16, 60)
    assert out.getvalue() == "", "nothing before ten seconds"
    clock.now += 7  # 12 s in, a.md half done: 1500 of 4000 bytes, so 20 s left
    shown.embedding("a.md", 30, 60)
    assert out.getvalue() == "[1/3] a.md: 30/60 chunks embedded, about 20 s left\n"
    shown.file_done(1, 3, Outcome(str(tmp_path / "a.md"), "a.md", "added", 60, "", 24.0))
    assert out.getvalue().endswith("[1/3] a.md: added (60 chunks, 24.0 s)\n")
    assert "\r" not in out.getvalue() and "\033" not in out.getvalue()


def test_a_terminal_gets_one_redrawn_line_then_the_files_lines(tmp_path: Path) -> None:
    out, clock = io.StringIO(), Clock()
    shown = AddProgress(_files(tmp_path)[:1], out, terminal=True, clock=clock)
    clock.now += 2
    shown.embedding("a.md", 16, 64)
    clock.now += 2
    shown.embedding("a.md", 32, 64)
    text = out.getvalue()
    assert text.count("\r\033[K") == 2 and text.endswith("32/64 chunks embedded, about 4 s left (8.0 chunks/s)")
    shown.file_done(1, 1, Outcome("a.md", "a.md", "added", 64, "", 8.0))
    assert out.getvalue().endswith("\r\033[K[1/1] a.md: added (64 chunks, 8.0 s)\n")


def test_kb_add_refuses_a_named_file_it_cannot_read_unless_told_to_skip(tmp_path: Path) -> None:
    config = write_config(tmp_path / "botgw.yaml", {"knowledge": {"store": {"path": str(tmp_path / "store")}}})
    logo = tmp_path / "logo.png"
    logo.write_bytes(b"\x89PNG\r\n\x1a\n")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "退货.md").write_text("# 退货\n\n七天无理由退货。", encoding="utf-8")
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")

    def kb_add(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*BOTGW, "kb", "add", "--config", str(config), "support", *args], cwd=ROOT,
                              env=child_env(), capture_output=True, text=True, timeout=300)  # fmt: skip

    refused = kb_add(str(logo))
    assert refused.returncode == 1, refused.stderr
    assert "logo.png: unsupported format .png" in refused.stderr and "--skip-unsupported" in refused.stderr
    skipped = kb_add(str(logo), "--skip-unsupported")
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stderr
    from_folder = kb_add(str(folder))
    assert from_folder.returncode == 0 and "1 added" in from_folder.stdout and "1 skipped" in from_folder.stdout
    assert "[2/2] 退货.md: added" in from_folder.stderr, from_folder.stderr
    assert "Traceback" not in refused.stderr + skipped.stderr + from_folder.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "退货.md").write_text("# 换货\n\n十五天内换货。", encoding="utf-8")
    twice = kb_add(str(folder / "退货.md"), str(other / "退货.md"))
    assert twice.returncode == 1 and "has the same document name" in twice.stderr, twice.stderr
    assert "1 unchanged" in twice.stdout and "1 failed" in twice.stdout, "the second must not replace the first"


def test_kb_add_lets_go_of_the_embedded_store_while_it_embeds(tmp_path: Path) -> None:
    """A worker answers from the embedded store while `kb add` embeds (minutes for a long file on a CPU): the
    command holds the folder only to read and to write, so a question meanwhile waits seconds, not the whole
    add (issue 21: 78 s). Tried from inside the embedding: another holder can open the folder there, and the
    command takes it back to write."""
    import asyncio

    from knowledge.config import KnowledgeSettings
    from knowledge.errors import StoreLocked
    from knowledge.service import Knowledge
    from knowledge.store import KnowledgeStore

    settings = KnowledgeSettings(store={"path": str(tmp_path / "store")})
    manual = tmp_path / "手册.md"
    manual.write_text("".join(f"## 第{n}节\n\n" + "本节说明设备的安装、保养与退换货规则。" * 20 + "\n\n"
                              for n in range(40)), encoding="utf-8")  # fmt: skip
    seen: list[str] = []

    def embedding(doc: str, done: int, total: int) -> None:
        if 0 < done < total:
            try:
                KnowledgeStore.open(settings.store).close()  # as a worker's question would
                seen.append("opened")
            except StoreLocked:
                seen.append("locked")

    async def add(release: bool) -> list[str]:
        knowledge = await Knowledge.open(settings)
        try:
            knowledge.ingestor.release_while_embedding = release
            seen.clear()
            outcomes = await knowledge.add("manual", [manual], embedding=embedding)
            assert outcomes[0].status in ("added", "replaced"), outcomes
            assert await knowledge.documents("manual"), "written after taking the store back"
            return list(seen)
        finally:
            await knowledge.aclose()

    assert set(asyncio.run(add(release=False))) == {"locked"}, "the check itself: held through the add"
    manual.write_text(manual.read_text(encoding="utf-8") + "\n## 附录\n\n新增一节。\n", encoding="utf-8")
    released = asyncio.run(add(release=True))
    assert released and set(released) == {"opened"}, released
