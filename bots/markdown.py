"""Markdown as readable plain text, for platforms (or bots) that show answers as text.

The engine writes Markdown; WeChat shows a WeCom app's `markdown` message as "unsupported", so a bot set to
`reply_format: text` sends text that keeps the answer's meaning: headings and list items stay on their own
lines (numbers and bullets kept), `**` and `#` go, a link becomes "title (url)", a table's rows become lines
of cells. Parsed with markdown-it-py (CommonMark plus tables), not with regular expressions.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

_PARSER = MarkdownIt("commonmark").enable("table").enable("strikethrough")


# What can make a text Markdown: an inline mark, an entity or a backslash escape anywhere (a bare \r ends a line
# that ^ does not see), or a line opening a list item, a setext underline or a rule. A text without any is sent as
# it is, unparsed (a digit or a dash inside a line means nothing to Markdown).
_MAY_BE_MARKUP = re.compile(r"[*_#`\[|>~&\\\r]|^[ \t]*(?:[-+=]|\d{1,9}[.)])", re.MULTILINE)


def to_text(markdown: str) -> str:
    """`markdown` as plain text (see the module's docstring)."""
    if not _MAY_BE_MARKUP.search(markdown):
        return markdown
    writer = _Writer()
    for token in _PARSER.parse(markdown):
        writer.block(token)
    return writer.text() or markdown  # all marks and nothing else ("#", "---"): sent as it is, never empty


class _Writer:
    """Walks markdown-it's block tokens, writing one line per paragraph, heading, list item or table row."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lists: list[list[int]] = []  # per open list: [next number] (ordered) or [] (bullets)
        self.item_prefix = ""
        self.quote_depth = 0
        self.row: list[str] | None = None
        self.cell: list[str] = []

    def block(self, token: Token) -> None:
        kind = token.type
        if kind == "bullet_list_open":
            self.lists.append([])
        elif kind == "ordered_list_open":
            start = token.attrGet("start")
            self.lists.append([int(start) if start is not None else 1])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            self.lists.pop()
            if not self.lists:
                self.lines.append("")
        elif kind == "list_item_open":
            numbering = self.lists[-1] if self.lists else []
            indent = "  " * (len(self.lists) - 1)
            if numbering:
                self.item_prefix = f"{indent}{numbering[0]}. "
                numbering[0] += 1
            else:
                self.item_prefix = f"{indent}• "
        elif kind == "list_item_close":
            self.item_prefix = ""  # an empty item: its bullet does not fall onto what follows
        elif kind == "blockquote_open":
            self.quote_depth += 1
        elif kind == "blockquote_close":
            self.quote_depth -= 1
        elif kind == "tr_open":
            self.row = []
        elif kind in ("th_open", "td_open"):
            self.cell = []
        elif kind in ("th_close", "td_close") and self.row is not None:
            self.row.append("".join(self.cell).strip())
        elif kind == "tr_close" and self.row is not None:
            self.lines.append(" | ".join(self.row))
            self.row = None
        elif kind == "table_close":
            self.lines.append("")
        elif kind == "inline":
            text = _inline(token.children or [])
            if self.row is not None:
                self.cell.append(text)
            else:
                self.write(text)
        elif kind in ("fence", "code_block"):
            for line in token.content.rstrip("\n").split("\n"):
                self.write(line)
            self.lines.append("")
        elif kind == "hr":
            self.write("————")
        elif kind in ("paragraph_close", "heading_close") and not self.lists:
            self.lines.append("")
        elif kind == "html_block":
            self.write(token.content.strip())

    def write(self, text: str) -> None:
        quote = "> " * self.quote_depth
        prefix, self.item_prefix = self.item_prefix, ""
        if not prefix and self.lists:
            prefix = "  " * len(self.lists)  # a list item's second paragraph: under its text
        for index, line in enumerate(text.split("\n")):
            self.lines.append(f"{quote}{prefix if index == 0 else ' ' * len(prefix)}{line}")

    def text(self) -> str:
        out: list[str] = []
        for line in self.lines:
            if line == "" and (not out or out[-1] == ""):
                continue  # one blank line between blocks, none at the start
            out.append(line.rstrip())
        return "\n".join(out).strip("\n")


def _inline(children: list[Token]) -> str:
    parts: list[str] = []
    link_href: list[str] = []
    link_start: list[int] = []
    for child in children:
        kind = child.type
        if kind in ("text", "code_inline", "html_inline"):
            parts.append(child.content)
        elif kind == "softbreak" or kind == "hardbreak":
            parts.append("\n")
        elif kind == "link_open":
            link_href.append(str(child.attrGet("href") or ""))
            link_start.append(len(parts))
        elif kind == "link_close" and link_href:
            href, start = link_href.pop(), link_start.pop()
            title = "".join(parts[start:])
            if href and href != title and not href.startswith("mailto:" + title):
                parts.append(f" ({href})")
        elif kind == "image":
            alt = child.content or "image"
            parts.append(f"{alt} ({child.attrGet('src')})")
    return "".join(parts)
