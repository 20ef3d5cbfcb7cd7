"""What reading a Markdown, plain text, HTML or CSV file may cost, and what a Markdown heading becomes (knowledge/
formats.py, knowledge/bounds.py). A review found a 1 MB Markdown file of empty paragraphs parsed in full (9 s,
580 MB) before the paragraph limit refused it, chat attachments of up to 10 MB going through the same parsers,
and a heading's Markdown link kept as the section name the page shows.

The refusals are checked by the parser never being called (no timing); the one test of a parse that must stay
cheap has a bound many times what it takes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest

from knowledge.bounds import MAX_HTML_TAGS, MAX_MARKDOWN_LINES, MAX_ROWS
from knowledge.errors import FileRejected
from knowledge.formats import MAX_BLOCKS, parse


def never(what: str) -> Callable[..., object]:
    def called(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"{what} was called: the file was parsed before it was refused")

    return called


@pytest.fixture
def no_markdown_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    from markdown_it import MarkdownIt

    monkeypatch.setattr(MarkdownIt, "parse", never("markdown-it"))


@pytest.mark.usefixtures("no_markdown_parse")
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r", "\u2028"])
def test_a_markdown_file_of_too_many_paragraphs_is_refused_before_it_is_parsed(newline: str) -> None:
    data = f"a{newline}{newline}".encode() * 400_000  # 1.2 MB (2.4 with \r\n): took 9 s and 580 MB to refuse
    with pytest.raises(FileRejected, match=f"^400000 paragraphs and rows, over {MAX_BLOCKS}: split the document$"):
        parse("很多段.md", data)


@pytest.mark.usefixtures("no_markdown_parse")
@pytest.mark.parametrize("line", ["- a", "| a | b |", "# a", "> a"])
def test_a_markdown_file_of_too_many_lines_is_refused_before_it_is_parsed(line: str) -> None:
    """One paragraph, list or table of many lines: markdown-it's cost is per line, not per paragraph."""
    data = f"{line}\n".encode() * (MAX_MARKDOWN_LINES + 1)
    with pytest.raises(FileRejected, match=f"over {MAX_MARKDOWN_LINES} lines: split the document"):
        parse("很多行.md", data)


def test_a_plain_text_file_of_too_many_paragraphs_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("knowledge.formats.outline_lines", never("outline_lines"))
    with pytest.raises(FileRejected, match=f"^60000 paragraphs and rows, over {MAX_BLOCKS}"):
        parse("很多段.txt", "段落。\n \n".encode() * 60_000)


def test_an_html_file_of_too_many_tags_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bs4.BeautifulSoup", never("BeautifulSoup"))
    with pytest.raises(FileRejected, match=f"over {MAX_HTML_TAGS} tags: split the page"):
        parse("很多段.html", b"<p>a</p>" * (MAX_HTML_TAGS + 1))


def test_a_csv_file_of_too_many_rows_is_refused_as_it_is_read() -> None:
    with pytest.raises(FileRejected, match=f"over {MAX_ROWS} rows: split the table"):
        parse("很多行.csv", "问题,答案\n".encode() + "怎么退货,七天内\n".encode() * MAX_ROWS)


def test_files_within_the_bounds_still_parse() -> None:
    assert len(parse("不多.md", "段落文字。\n\n".encode() * 1000).blocks) == 1000
    assert len(parse("不多.txt", "段落文字。\r\n\r\n".encode() * MAX_BLOCKS).blocks) == MAX_BLOCKS
    assert len(parse("长列表.md", "- 一项\n".encode() * MAX_MARKDOWN_LINES).blocks) == 1
    assert len(parse("不多.html", "<p>段落</p>".encode() * 1000).blocks) == 1000


@pytest.mark.parametrize(
    "data",
    [
        "- " * 2_000_000 + "a\n",  # a list nested in a list…: markdown-it read the line once per level (4.4 s)
        "<!" * 2_600_000,  # html.parser is quadratic on it, and libxml2's push parser hung past 10 MB
    ],
    ids=["markdown-nested-list-line", "html-markup-declarations"],
)
def test_a_hostile_line_costs_about_a_second_at_most(data: str) -> None:
    name = "一行.md" if data.startswith("-") else "一行.html"
    started = time.monotonic()
    with contextlib.suppress(FileRejected):  # the HTML has no text
        parse(name, data.encode())
    assert time.monotonic() - started < 3.0  # ~0.3 s here; many seconds or minutes before


# --- headings


def test_a_markdown_heading_is_its_plain_text_not_a_link() -> None:
    """`## [退款请点此](https://evil.example/login)` was kept as the section, and the page showed a phishing link."""
    document = parse(
        "售后.md",
        "# [售后](https://evil.example/a) 服务\n\n"
        "## [退款请点此](https://evil.example/login)\n\n七天内可以退款。\n\n"
        "## **重要** `KX-300` ![图](https://evil.example/p.png) <b>说明</b> &amp; 其他\\[注\\]\n\n内容。\n".encode(),
    )
    assert document.title == "售后 服务"
    assert [block.section for block in document.blocks] == [("退款请点此",), ("重要 KX-300 图 说明 & 其他[注]",)]
    assert all("evil.example" not in block.text for block in document.blocks[:1])


def test_a_heading_without_marks_is_kept_as_written() -> None:
    document = parse("说明.md", "# 说明\n\n## 第一章 退货 (7 天)\n\n正文。\n".encode())
    assert document.blocks[0].section == ("第一章 退货 (7 天)",)
