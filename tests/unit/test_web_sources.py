"""The sources the page shows under a grounded answer (webchat/markdown.py): document names and sections come from
uploaded files, and are shown as written, never as a link or an image (a review found a heading
`[退款请点此](https://evil.example/login)` shown as a clickable link in 参考资料)."""

from __future__ import annotations

from markdown_it import MarkdownIt

from webchat.markdown import sources_text


def rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").render(markdown)


def test_a_section_that_is_markdown_is_shown_as_its_text() -> None:
    hostile = "[退款请点此](https://evil.example/login) ![x](https://evil.example/p.png) <img src=x> **粗**"
    text = sources_text([{"doc": "售后_政策*.md", "section": hostile}, {"doc": "常见问题.csv", "section": ""}])
    html = rendered(text)
    assert "<a" not in html and "<img" not in html and "<strong>" not in html
    assert "来源：《售后_政策*.md》[退款请点此](https://evil.example/login)" in html
    assert "；《常见问题.csv》" in html


def test_plain_sources_read_as_before() -> None:
    text = sources_text([{"doc": "售后服务政策.md", "section": "退货 › 期限"}, {"doc": "常见问题.csv"}])
    assert rendered(text) == "<p>来源：《售后服务政策.md》退货 › 期限；《常见问题.csv》</p>\n"
