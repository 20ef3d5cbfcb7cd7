"""Files to structured text: a title and blocks, each under its section path (the headings above it).

Markdown, plain text, HTML, PDF (its text layer), DOCX, and question/answer tables (CSV, XLSX) whose rows are
kept as pairs. A file that cannot be read raises `FileRejected` with a reason an operator can act on.
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePath

from knowledge.errors import FileRejected


@dataclass(frozen=True)
class Block:
    """A paragraph, list or table under `section`; a Q&A row when `question` is set (then `text` is the answer)."""

    section: tuple[str, ...]
    text: str
    question: str | None = None


@dataclass(frozen=True)
class ParsedDocument:
    title: str
    blocks: list[Block]


QUESTION_HEADERS = {"问题", "问", "提问", "标准问题", "question", "q"}
ANSWER_HEADERS = {"答案", "答", "回答", "回复", "answer", "a"}

# Chinese documents number their headings instead of styling them: 第一章 / 一、 / （一） / 1.1
_TEXT_HEADINGS = [
    (1, re.compile(r"^第[一二三四五六七八九十百零〇\d]+[章篇部]")),
    (2, re.compile(r"^(第[一二三四五六七八九十百零〇\d]+[节条]|[一二三四五六七八九十]+[、．.])")),
    (3, re.compile(r"^([（(][一二三四五六七八九十\d]+[)）]|\d+(\.\d+)+\s*)")),
]
_SENTENCE_END = "。！？；：，.!?;:,"

# DOCX and XLSX are zip files: a 40 KB upload can unpack to hundreds of MB of XML and keep a core busy for
# minutes. Their text parts (media left out) are measured before any parser sees them.
ZIP_FORMATS = {".docx", ".xlsx"}
MAX_UNPACKED_BYTES = 64 * 1024 * 1024
MAX_BLOCKS = 50_000  # paragraphs, rows and tables of one document: a real manual has a few thousand


def parse(name: str, data: bytes) -> ParsedDocument:
    """Parse a file by its extension."""
    suffix = PurePath(name).suffix.lower()
    parser = PARSERS.get(suffix)
    if parser is None:
        raise FileRejected(f"unsupported format {suffix or '(no extension)'} (supported: {', '.join(sorted(PARSERS))})")
    if not data.strip():
        raise FileRejected("empty file")
    if suffix in ZIP_FORMATS:
        _check_unpacked_size(data, suffix)
    try:
        document = parser(PurePath(name).stem, data)
    except RecursionError:  # e.g. HTML nested thousands of tags deep: the walk over it recurses per level
        raise FileRejected("nested too deeply to read") from None
    if not any(block.text.strip() for block in document.blocks):
        raise FileRejected("no text found in the file")
    if len(document.blocks) > MAX_BLOCKS:
        raise FileRejected(f"{len(document.blocks)} paragraphs and rows, over {MAX_BLOCKS}: split the document")
    return document


def _check_unpacked_size(data: bytes, suffix: str) -> None:
    """Refuse a zip container whose text parts unpack past MAX_UNPACKED_BYTES (its directory says how big)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            parts = [info for info in archive.infolist() if "/media/" not in f"/{info.filename}"]
    except (zipfile.BadZipFile, ValueError, OSError):
        raise FileRejected(f"not a readable {suffix[1:].upper()} (not a zip file)") from None
    unpacked = sum(info.file_size for info in parts)
    if unpacked > MAX_UNPACKED_BYTES:
        limit = MAX_UNPACKED_BYTES // (1024 * 1024)
        raise FileRejected(f"its text unpacks to {unpacked // (1024 * 1024)} MB, over {limit} MB")


def decode_text(data: bytes) -> str:
    """UTF-8 (with or without BOM), else GB18030: what Chinese Windows tools write."""
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    raise FileRejected("text is neither UTF-8 nor GB18030")


def join_wrapped(lines: Iterable[str]) -> str:
    """Lines that a PDF wrapped, joined back: Chinese needs no space at a break, Latin words do."""
    text = ""
    for line in (part.strip() for part in lines):
        if not line:
            continue
        if text and text[-1].isascii() and text[-1].isalnum() and line[0].isascii() and line[0].isalnum():
            text += " "
        text += line
    return text


def _heading_level(line: str) -> int:
    if len(line) > 30 or line[-1] in _SENTENCE_END:
        return 0
    for level, pattern in _TEXT_HEADINGS:
        if pattern.match(line):
            return level
    return 0


def outline_lines(lines: list[str], wrapped: bool) -> ParsedDocument:
    """Plain lines (a .txt file, a PDF's text) into a title and sections: the first short line is the title,
    numbered lines are headings, blank lines end paragraphs (in a PDF, so do lines that end a sentence)."""
    stripped = [line.strip() for line in lines]
    title = ""
    first = next((i for i, line in enumerate(stripped) if line), None)
    if first is not None and len(stripped[first]) <= 40 and stripped[first][-1] not in _SENTENCE_END:
        title, stripped = stripped[first], stripped[first + 1 :]
    headings: list[tuple[int, str]] = []
    blocks: list[Block] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            text = join_wrapped(paragraph) if wrapped else "\n".join(paragraph)
            blocks.append(Block(tuple(h for _, h in headings), text))
            paragraph.clear()

    for line in stripped:
        level = _heading_level(line) if line else 0
        if level:
            flush()
            headings = [(lvl, h) for lvl, h in headings if lvl < level] + [(level, line)]
        elif not line:
            flush()
        else:
            paragraph.append(line)
            if wrapped and line[-1] in "。！？":
                flush()
    flush()
    return ParsedDocument(title, blocks)


class _Sections:
    """The heading stack while walking a document; the title's own heading is not part of section paths."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.stack: list[tuple[int, str]] = []
        self.blocks: list[Block] = []

    def heading(self, level: int, text: str) -> None:
        text = " ".join(text.split())
        if not text:
            return
        if not self.title and not self.stack and not self.blocks:
            self.title = text
            return
        if text == self.title and not self.stack:
            return
        self.stack = [(lvl, h) for lvl, h in self.stack if lvl < level] + [(level, text)]

    def add(self, text: str) -> None:
        text = text.strip()
        if text:
            self.blocks.append(Block(tuple(h for _, h in self.stack), text))

    def document(self, fallback_title: str) -> ParsedDocument:
        return ParsedDocument(self.title or fallback_title, self.blocks)


def parse_markdown(stem: str, data: bytes) -> ParsedDocument:
    """Headings from the Markdown itself; each top-level block (paragraph, list, table, code) kept as written."""
    from markdown_it import MarkdownIt

    text = decode_text(data)
    lines = text.splitlines()
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    sections = _Sections("")
    depth = 0
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            sections.heading(int(token.tag[1:]), tokens[index + 1].content)
        elif depth == 0 and token.map and token.nesting >= 0 and token.type != "hr":
            start, end = token.map  # the block as written: list markers and table pipes are meaningful
            sections.add("\n".join(lines[start:end]))
        depth += token.nesting
    return sections.document(stem)


def parse_text(stem: str, data: bytes) -> ParsedDocument:
    document = outline_lines(decode_text(data).splitlines(), wrapped=False)
    return ParsedDocument(document.title or stem, document.blocks)


_HTML_SKIP = {"script", "style", "nav", "footer", "header", "noscript", "template", "form", "aside", "head"}
_HTML_INLINE = {"a", "span", "b", "strong", "em", "i", "u", "code", "small", "sup", "sub", "mark", "abbr", "time"}
_HTML_BLOCK = {"p", "pre", "blockquote", "dd", "dt", "figcaption", "address", "summary"}


def parse_html(stem: str, data: bytes) -> ParsedDocument:
    """The page's text without its scripts, styles and navigation; headings h1–h6, lists and tables kept."""
    from bs4 import BeautifulSoup, NavigableString, Tag

    soup = BeautifulSoup(data, "html.parser")
    title = soup.title.get_text(strip=True) if soup.title else ""
    sections = _Sections(title)
    pending: list[str] = []

    def text_of(tag: Tag) -> str:
        return re.sub(r"[ \t\r\f\v]+", " ", tag.get_text()).strip()

    def flush() -> None:
        if pending:
            sections.add("".join(pending))
            pending.clear()

    def walk(node: Tag) -> None:
        for child in node.children:
            if isinstance(child, NavigableString):
                if child.strip() and type(child) is NavigableString:
                    pending.append(re.sub(r"\s+", " ", str(child)))
                continue
            if not isinstance(child, Tag) or child.name in _HTML_SKIP:
                continue
            if child.name in ("h1", "h2", "h3", "h4", "h5", "h6"):
                flush()
                sections.heading(int(child.name[1]), text_of(child))
            elif child.name in ("ul", "ol"):
                flush()
                items = [text_of(item) for item in child.find_all("li", recursive=False)]
                marks = [f"{n}." if child.name == "ol" else "-" for n in range(1, len(items) + 1)]
                sections.add("\n".join(f"{mark} {item}" for mark, item in zip(marks, items, strict=True) if item))
            elif child.name == "table":
                flush()
                rows = [[text_of(cell) for cell in row.find_all(["th", "td"])] for row in child.find_all("tr")]
                sections.add("\n".join(" | ".join(row) for row in rows if any(row)))
            elif child.name in _HTML_BLOCK:
                flush()
                sections.add(text_of(child))
            elif child.name == "br":
                pending.append("\n")
            elif child.name in _HTML_INLINE:
                pending.append(text_of(child))
            else:
                flush()
                walk(child)
                flush()

    walk(soup.body or soup)
    flush()
    return sections.document(stem)


def parse_pdf(stem: str, data: bytes) -> ParsedDocument:
    """The text layer, page by page; a PDF without one (a scan) is refused rather than indexed empty."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileRejected("the PDF is password-protected")
        lines = [line for page in reader.pages for line in (page.extract_text() or "").splitlines()]
        meta_title = (reader.metadata.title if reader.metadata else None) or ""
    except FileRejected:
        raise
    except Exception as exc:  # pypdf raises many kinds for broken files
        raise FileRejected(f"not a readable PDF ({type(exc).__name__}: {exc})") from None
    if not any(line.strip() for line in lines):
        raise FileRejected("the PDF has no text layer (a scanned document?): OCR it first")
    document = outline_lines(lines, wrapped=True)
    return ParsedDocument(document.title or str(meta_title).strip() or stem, document.blocks)


def parse_docx(stem: str, data: bytes) -> ParsedDocument:
    """Word's heading styles give the sections; tables become rows of cells."""
    from docx import Document
    from docx.table import Table

    try:
        doc = Document(io.BytesIO(data))
    except Exception as exc:
        raise FileRejected(f"not a readable DOCX ({type(exc).__name__})") from None
    sections = _Sections((doc.core_properties.title or "").strip())
    for item in doc.iter_inner_content():
        if isinstance(item, Table):
            rows = []
            for row in item.rows:
                cells = list(dict.fromkeys(cell.text.strip() for cell in row.cells))  # merged cells repeat
                rows.append(" | ".join(cells))
            sections.add("\n".join(rows))
            continue
        style = (item.style.name if item.style is not None else "") or ""
        level = re.match(r"^(?:Heading|标题)\s*(\d)$", style)
        if style == "Title":
            sections.title = sections.title or item.text.strip()
        elif level:
            sections.heading(int(level.group(1)), item.text)
        else:
            sections.add(item.text)
    return sections.document(stem)


def qa_rows(rows: Iterable[list[str]], section: tuple[str, ...]) -> list[Block]:
    """Rows of a Q&A table: the columns headed 问题/答案 (or question/answer), else the first two."""
    rows = [[(cell or "").strip() for cell in row] for row in rows]
    rows = [row for row in rows if any(row)]
    if not rows:
        return []
    header = [cell.lower() for cell in rows[0]]
    q_col = next((i for i, cell in enumerate(header) if cell in QUESTION_HEADERS), None)
    a_col = next((i for i, cell in enumerate(header) if cell in ANSWER_HEADERS), None)
    if q_col is not None and a_col is not None:
        rows = rows[1:]
    else:
        q_col, a_col = 0, 1
    blocks = []
    for row in rows:
        question = row[q_col] if len(row) > q_col else ""
        answer = row[a_col] if len(row) > a_col else ""
        if question and answer:
            blocks.append(Block(section, answer, question=question))
    return blocks


def parse_csv(stem: str, data: bytes) -> ParsedDocument:
    try:
        rows = list(csv.reader(io.StringIO(decode_text(data))))
    except csv.Error as exc:
        raise FileRejected(f"not a readable CSV ({exc})") from None
    blocks = qa_rows(rows, ())
    if not blocks:
        raise FileRejected("no question/answer rows (a Q&A table needs a question column and an answer column)")
    return ParsedDocument(stem, blocks)


def parse_xlsx(stem: str, data: bytes) -> ParsedDocument:
    """Every sheet is a Q&A table; the sheet's name is the section."""
    from openpyxl import load_workbook

    try:
        book = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as exc:
        raise FileRejected(f"not a readable XLSX ({type(exc).__name__})") from None
    blocks: list[Block] = []
    try:
        for sheet in book.worksheets:
            rows = ([("" if cell is None else str(cell)) for cell in row] for row in sheet.iter_rows(values_only=True))
            blocks += qa_rows(rows, (sheet.title,) if len(book.worksheets) > 1 else ())
    finally:
        book.close()
    if not blocks:
        raise FileRejected("no question/answer rows (a Q&A table needs a question column and an answer column)")
    return ParsedDocument(stem, blocks)


PARSERS: dict[str, Callable[[str, bytes], ParsedDocument]] = {
    ".md": parse_markdown,
    ".markdown": parse_markdown,
    ".txt": parse_text,
    ".html": parse_html,
    ".htm": parse_html,
    ".pdf": parse_pdf,
    ".docx": parse_docx,
    ".csv": parse_csv,
    ".xlsx": parse_xlsx,
}
