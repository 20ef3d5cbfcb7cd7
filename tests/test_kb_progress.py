"""`botgw kb add` says how far it is (a redrawn line on a terminal, plain lines elsewhere) and refuses a named
file it cannot read, as the admin API does (415), unless told to skip it."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

from knowledge.ingest import Found, Outcome
from knowledge.progress import AddProgress
from tests.procs import BOTGW, ROOT, child_env, write_config


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
