"""Files to structured text: a title and blocks, each under its section path (the headings above it).

Markdown, plain text, HTML, PDF (its text layer), DOCX, and question/answer tables (CSV, XLSX) whose rows are
kept as pairs. A file that cannot be read raises `FileRejected` with a reason an operator can act on.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, NamedTuple
from xml.sax.saxutils import quoteattr

from knowledge.bounds import (
    DOCX_LIMITS,
    MAX_GRID_CELLS,
    MAX_HTML_TAGS,
    MAX_MARKDOWN_LINES,
    MAX_MARKED_HEADING_CHARS,
    MAX_PDF_DECODED_BYTES,
    MAX_PDF_PAGES,
    MAX_PDF_STREAM_BYTES,
    MAX_ROWS,
    MAX_TEXT_LINES,
    PDF_CONFIGURATION,
    XLSX_LIMITS,
    BoundedZip,
    megabytes,
)
from knowledge.bounds import MAX_UNPACKED_BYTES as MAX_UNPACKED_BYTES  # what tests and callers knew it as
from knowledge.errors import FileRejected

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.rules_block import StateBlock
    from markdown_it.token import Token


@dataclass(frozen=True)
class Block:
    """A paragraph, list or table under `section`; a Q&A row when `question` is set (then `text` is the answer)."""

    section: tuple[str, ...]
    text: str
    question: str | None = None


@dataclass(frozen=True)
class ParsedDocument:
    """`title` is the document's own (its first heading, a DOCX's or PDF's title), or empty: never made up from the
    file name, which is shown as the source anyway and would be embedded with every chunk as noise ("bx0123")."""

    title: str
    blocks: list[Block]


QUESTION_HEADERS = {"问题", "问", "提问", "标准问题", "question", "q"}
ANSWER_HEADERS = {"答案", "答", "回答", "回复", "answer", "a"}
TITLE_HEADERS = {"标题", "主题", "分类", "类别", "類別", "標題", "title", "category", "topic"}  # a row's heading

# Chinese documents number their headings instead of styling them: 第一章 / 一、 / （一） / 1.1
_TEXT_HEADINGS = [
    (1, re.compile(r"^第[一二三四五六七八九十百零〇\d]+[章篇部]")),
    (2, re.compile(r"^(第[一二三四五六七八九十百零〇\d]+[节条]|[一二三四五六七八九十]+[、．.])")),
    (3, re.compile(r"^([（(][一二三四五六七八九十\d]+[)）]|\d+(\.\d+)+\s*)")),
]
_SENTENCE_END = "。！？；：，.!?;:,"

# DOCX and XLSX are zip files: a 40 KB upload can unpack to hundreds of MB of XML and keep a core busy for
# minutes, and a PDF's streams can inflate as much. knowledge/bounds.py says what reading one may cost.
MAX_BLOCKS = 50_000  # paragraphs, rows and tables of one document: a real manual has a few thousand


def parse(name: str, data: bytes) -> ParsedDocument:
    """Parse a file by its extension."""
    suffix = PurePath(name).suffix.lower()
    parser = PARSERS.get(suffix)
    if parser is None:
        raise FileRejected(f"unsupported format {suffix or '(no extension)'} (supported: {', '.join(sorted(PARSERS))})")
    if not data.strip():
        raise FileRejected("empty file")
    try:
        document = parser(data)
    except RecursionError:  # e.g. HTML nested thousands of tags deep: the walk over it recurses per level
        raise FileRejected("nested too deeply to read") from None
    if not any(block.text.strip() for block in document.blocks):
        raise FileRejected("no text found in the file")
    if len(document.blocks) > MAX_BLOCKS:
        raise _too_many_blocks(len(document.blocks))
    return document


def _too_many_blocks(count: int) -> FileRejected:
    return FileRejected(f"{count} paragraphs and rows, over {MAX_BLOCKS}: split the document")


# What str.splitlines() breaks lines at (\r\n once), and the spaces that are not one of them
_BREAK_CHARS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK = rf"(?>\r\n|[{_BREAK_CHARS}])"  # atomic: \r\n is one break, never read as \r, \n (a blank line)
_SPACE = rf"[^\S{_BREAK_CHARS}]"
_PARAGRAPH_START = re.compile(rf"(?:\A|{_BREAK}{_SPACE}*{_BREAK}){_SPACE}*\S")  # text after a blank line (or first)
_LINE_WITH_TEXT = re.compile(rf"(?:\A|{_BREAK}){_SPACE}*\S")
_TAG_START = re.compile(rb"<[A-Za-z]")


def _at_most(pattern: re.Pattern[Any], text: Any, limit: int) -> int:
    """How often `pattern` occurs in `text`, counted up to limit + 1 only (enough to refuse)."""
    return sum(1 for _ in itertools.islice(pattern.finditer(text), limit + 1))


def check_text_size(text: str, max_lines: int) -> None:
    """Refuse Markdown or plain text of more paragraphs than MAX_BLOCKS or more lines than `max_lines` before it is
    parsed: parsing costs by the line, and the paragraph limit checked after the parse came seconds and hundreds of
    MB too late (knowledge/bounds.py). Paragraphs separated by blank lines are what both parsers make blocks of."""
    if sum(map(text.count, _BREAK_CHARS)) < min(MAX_BLOCKS, max_lines):  # the usual file: nothing to count
        return
    paragraphs = _PARAGRAPH_START.subn("", text)[1]  # counted in C: twice as fast as a Python loop over the matches
    if paragraphs > MAX_BLOCKS:
        raise _too_many_blocks(paragraphs)
    if _at_most(_LINE_WITH_TEXT, text, max_lines) > max_lines:
        raise FileRejected(f"over {max_lines} lines: split the document")


def check_html_size(data: bytes) -> None:
    """Refuse HTML of more than MAX_HTML_TAGS tags before it is parsed (knowledge/bounds.py)."""
    if data.count(b"<") > MAX_HTML_TAGS and _at_most(_TAG_START, data, MAX_HTML_TAGS) > MAX_HTML_TAGS:
        raise FileRejected(f"over {MAX_HTML_TAGS} tags: split the page")


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

    def document(self) -> ParsedDocument:
        return ParsedDocument(self.title, self.blocks)


def parse_markdown(data: bytes) -> ParsedDocument:
    """Headings from the Markdown itself, as plain text; each top-level block (paragraph, list, table, code) kept
    as written.

    Only the block structure is parsed, and tables are paragraphs to it (their lines are kept as written either
    way): the inline parse of every paragraph and the cells of every table row cost seconds per MB and would not be
    used (knowledge/bounds.py). A heading is parsed inline on its own, for its plain text: a section name is shown
    in the page's sources and in 来源 lines, where `## [退款请点此](https://evil.example/login)` would be a link
    (found by a review)."""
    text = decode_text(data)
    check_text_size(text, MAX_MARKDOWN_LINES)
    lines = text.splitlines()
    tokens = _markdown_blocks().parse(text)
    headings = _HeadingText()
    sections = _Sections("")
    depth = 0
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            sections.heading(int(token.tag[1:]), headings.plain(tokens[index + 1].content))
        elif depth == 0 and token.map and token.nesting >= 0 and token.type != "hr":
            start, end = token.map  # the block as written: list markers and table pipes are meaningful
            sections.add("\n".join(lines[start:end]))
        depth += token.nesting
    return sections.document()


_THEMATIC_BREAK = re.compile(r"([-*_])(?:[ \t]*+\1)*+[ \t]*+")  # a line of only ---, ***, ___ (spaced or not)


def _markdown_blocks() -> MarkdownIt:
    """markdown-it for the block structure only (parse_markdown says why). Its thematic-break rule reads a line
    character by character in Python, once for each list it is nested in: a 2 MB line of `- - - …` took 2 s. Here
    one regular expression (in C) says first whether the line can be a break at all."""
    from markdown_it import MarkdownIt
    from markdown_it.rules_block import hr

    def thematic_break(state: StateBlock, start: int, end: int, silent: bool) -> bool:
        first = state.bMarks[start] + state.tShift[start]
        return bool(_THEMATIC_BREAK.fullmatch(state.src, first, state.eMarks[start])) and hr(state, start, end, silent)

    markdown = MarkdownIt("commonmark").disable("inline")
    markdown.block.ruler.at("hr", thematic_break, {"alt": ["paragraph", "reference", "blockquote", "list"]})  # its own
    return markdown


class _HeadingText:
    """Markdown headings' plain text. A heading without a character that can start a mark is its own plain text;
    the others are parsed inline, at most MAX_MARKED_HEADING_CHARS of them in a document (knowledge/bounds.py)."""

    MARK = re.compile(r"[\\`*_\[\]<>!&]")

    def __init__(self) -> None:
        from markdown_it import MarkdownIt

        self._inline = MarkdownIt("commonmark")
        self._parsed = 0

    def plain(self, markdown: str) -> str:
        if not self.MARK.search(markdown):
            return markdown
        self._parsed += len(markdown)
        if self._parsed > MAX_MARKED_HEADING_CHARS:
            raise FileRejected(f"headings of over {MAX_MARKED_HEADING_CHARS} characters of Markdown marks: "
                               "split the document")  # fmt: skip
        return _plain_text(self._inline.parseInline(markdown)[0].children or [])


def _plain_text(tokens: Sequence[Token]) -> str:
    """What inline tokens show as text: marks, link addresses and HTML tags dropped; an image's description kept."""
    parts = []
    for token in tokens:
        if token.type in ("text", "code_inline"):
            parts.append(token.content)
        elif token.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif token.children:  # an image: its description
            parts.append(_plain_text(token.children))
    return "".join(parts)


def parse_text(data: bytes) -> ParsedDocument:
    """Plain text: numbered lines are headings, blank lines end paragraphs (outline_lines)."""
    text = decode_text(data)
    check_text_size(text, MAX_TEXT_LINES)
    return outline_lines(text.splitlines(), wrapped=False)


_HTML_SKIP = {"script", "style", "nav", "footer", "header", "noscript", "template", "form", "aside", "head"}
_HTML_INLINE = {"a", "span", "b", "strong", "em", "i", "u", "code", "small", "sup", "sub", "mark", "abbr", "time"}
_HTML_BLOCK = {"p", "pre", "blockquote", "dd", "dt", "figcaption", "address", "summary"}


def parse_html(data: bytes) -> ParsedDocument:
    """The page's text without its scripts, styles and navigation; headings h1–h6, lists and tables kept.

    lxml parses it (a dependency of python-docx): Python's html.parser is quadratic on some input (1.9 MB of
    `<![CDATA[` took a minute, 1 MB of `<!--` longer) and 2 MB of one tag's attributes took it 600 MB. lxml's
    `huge_tree` lifts libxml2's 10 MB limits, past which the push parser BeautifulSoup feeds hung on 10 MB of `<!`:
    what it reads is bounded here (the file's size by knowledge.max_file_mb, its tags by check_html_size)."""
    from bs4 import BeautifulSoup, NavigableString, Tag

    check_html_size(data)
    soup = BeautifulSoup(data, "lxml", huge_tree=True)
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
    return sections.document()


def parse_pdf(data: bytes) -> ParsedDocument:
    """The text layer, page by page; a PDF without one (a scan) is refused rather than indexed empty.

    Bounded (knowledge/bounds.py): at most MAX_PDF_PAGES pages; pypdf's own limits lowered to MAX_PDF_STREAM_BYTES
    for what one stream decodes to; and the content and form streams of all pages together, decoded before each
    page's text is extracted, at most MAX_PDF_DECODED_BYTES."""
    from pypdf import PdfReader, apply_configuration
    from pypdf.errors import LimitReachedError

    with apply_configuration(**PDF_CONFIGURATION):
        try:
            reader = PdfReader(io.BytesIO(data))
            if reader.is_encrypted and not reader.decrypt(""):
                raise FileRejected("the PDF is password-protected")
            pages = _pdf_pages(reader)
            lines: list[str] = []
            decoded = 0
            for number, page in enumerate(pages, start=1):
                streams = _drawn_streams(page)
                decoded += sum(len(stream.get_data()) for stream in streams)
                if decoded > MAX_PDF_DECODED_BYTES:
                    raise FileRejected(
                        f"its pages' streams decode to over {megabytes(MAX_PDF_DECODED_BYTES)} by page {number}: "
                        f"a compression bomb, or split the PDF"
                    )
                lines += (page.extract_text() or "").splitlines()
                for stream in streams:  # pypdf keeps every decoded stream: only one page's are held at a time
                    if getattr(stream, "decoded_self", None) is not None:
                        stream.decoded_self = None
            meta_title = (reader.metadata.title if reader.metadata else None) or ""
        except FileRejected:
            raise
        except LimitReachedError as exc:
            if "decompress" in str(exc).lower():
                raise FileRejected(
                    f"a stream in the PDF decodes to over {megabytes(MAX_PDF_STREAM_BYTES)}: a compression bomb"
                ) from None
            raise FileRejected(f"the PDF is over a limit of its reader ({exc})") from None
        except Exception as exc:  # pypdf raises many kinds for broken files
            raise FileRejected(f"not a readable PDF ({type(exc).__name__}: {exc})") from None
    if not any(line.strip() for line in lines):
        raise FileRejected("the PDF has no text layer (a scanned document?): OCR it first")
    document = outline_lines(lines, wrapped=True)
    return ParsedDocument(document.title or str(meta_title).strip(), document.blocks)


def _pdf_pages(reader: Any) -> list[Any]:
    """The pages, or a refusal when there are more than MAX_PDF_PAGES (pypdf's page tree walk is bounded by
    PDF_CONFIGURATION, so that a tree of millions of entries is refused before it is copied into pages)."""
    from pypdf.errors import LimitReachedError

    try:
        count = len(reader.pages)
    except LimitReachedError:
        count = None
    if count is None or count > MAX_PDF_PAGES:
        if count is None:  # the walk stopped early: the count the PDF states is only for the message
            try:
                count = int(reader.root_object["/Pages"]["/Count"])
            except Exception:
                count = None
        stated = f" ({count} pages)" if count else ""
        raise FileRejected(f"over {MAX_PDF_PAGES} pages{stated}: split the PDF")
    return list(reader.pages)


def _drawn_streams(page: Any) -> list[Any]:
    """The streams text extraction decodes for a page: its content streams and the form XObjects its resources
    hold (forms within forms too), each once."""
    from pypdf.generic import ArrayObject, DictionaryObject, StreamObject

    def resolve(value: Any) -> Any:
        return value.get_object() if value is not None else None

    found: dict[int, Any] = {}
    contents = resolve(page.get("/Contents"))
    for item in contents if isinstance(contents, ArrayObject) else [contents]:
        if isinstance(stream := resolve(item), StreamObject):
            found.setdefault(id(stream), stream)
    pending = [resolve(page.get("/Resources"))]
    while pending:
        resources = pending.pop()
        xobjects = resolve(resources.get("/XObject")) if isinstance(resources, DictionaryObject) else None
        if not isinstance(xobjects, DictionaryObject):
            continue
        for value in xobjects.values():
            form = resolve(value)
            if isinstance(form, StreamObject) and form.get("/Subtype") == "/Form" and id(form) not in found:
                found[id(form)] = form
                pending.append(resolve(form.get("/Resources")))
    return list(found.values())


def parse_docx(data: bytes) -> ParsedDocument:
    """Word's heading styles give the sections; tables become rows of cells.

    python-docx would unpack every part the package's relationships reach, images included; it is given only the
    main document, its styles and the core properties, read within knowledge/bounds.py's DOCX limits."""
    from docx import Document
    from docx.table import Table

    try:
        doc = Document(io.BytesIO(_docx_text_package(data)))
    except FileRejected:
        raise
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
    return sections.document()


_RELS_NS = "http://schemas.openxmlformats.org/package/2006/relationships"


class _Rel(NamedTuple):
    id: str
    kind: str
    target: str  # as written, relative to the source part's folder
    part: Any  # python-docx's PackURI of the target


def _docx_text_package(data: bytes) -> bytes:
    """A new (stored) package of the parts parse_docx reads: [Content_Types].xml, the main document that the
    package's officeDocument relationship names (wherever it lives), the styles it relates to, the core properties,
    and relationships to those only. Each is read through BoundedZip, so each counts wherever it is; targets are
    resolved as python-docx resolves them."""
    from xml.etree import ElementTree

    from docx.opc.constants import RELATIONSHIP_TYPE as RT
    from docx.opc.packuri import PACKAGE_URI, PackURI

    with BoundedZip(data, DOCX_LIMITS) as archive:

        def read(member: str) -> bytes | None:
            return archive.read(member) if member in archive.NameToInfo else None

        def relationship(source: PackURI, kind: str) -> _Rel | None:
            """The source part's first internal relationship of this kind, if its target is in the package."""
            xml = read(source.rels_uri.membername)
            for rel in ElementTree.fromstring(xml).iter(f"{{{_RELS_NS}}}Relationship") if xml else ():
                target = rel.get("Target", "")
                if rel.get("Type") == kind and rel.get("TargetMode") != "External" and target:
                    found = _Rel(rel.get("Id", ""), kind, target, PackURI.from_rel_ref(source.baseURI, target))
                    return found if found.part.membername in archive.NameToInfo else None
            return None

        types = read("[Content_Types].xml")
        main = relationship(PACKAGE_URI, RT.OFFICE_DOCUMENT)
        if types is None or main is None:
            raise FileRejected("not a readable DOCX (no [Content_Types].xml, or no main document that it names)")
        core, styles = relationship(PACKAGE_URI, RT.CORE_PROPERTIES), relationship(main.part, RT.STYLES)
        kept = {  # a source part's relationships part: the relationships python-docx is shown
            PACKAGE_URI.rels_uri.membername: [rel for rel in (main, core) if rel],
            main.part.rels_uri.membername: [rel for rel in (styles,) if rel],
        }
        parts = {"[Content_Types].xml": types}
        for rel in (rel for rels in kept.values() for rel in rels):
            if rel.part.membername not in parts:
                parts[rel.part.membername] = archive.read(rel.part.membername)
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w", zipfile.ZIP_STORED) as out:
        for member, rels in kept.items():
            listed = "".join(
                f"<Relationship Id={quoteattr(rel.id)} Type={quoteattr(rel.kind)} Target={quoteattr(rel.target)}/>"
                for rel in rels
            )
            if member not in parts:
                out.writestr(member, f'<Relationships xmlns="{_RELS_NS}">{listed}</Relationships>')
        for member, blob in parts.items():
            out.writestr(member, blob)
    return package.getvalue()


def qa_rows(rows: Iterable[list[str]], section: tuple[str, ...]) -> list[Block]:
    """Rows of a Q&A table: the columns headed 问题/答案 (or question/answer), else the first two. A column headed
    标题/分类 (or title/category) names each row's topic: it becomes the row's section, embedded and cited with it."""
    rows = [[(cell or "").strip() for cell in row] for row in rows]
    rows = [row for row in rows if any(row)]
    if not rows:
        return []
    header = [cell.lower() for cell in rows[0]]
    q_col = next((i for i, cell in enumerate(header) if cell in QUESTION_HEADERS), None)
    a_col = next((i for i, cell in enumerate(header) if cell in ANSWER_HEADERS), None)
    t_col = None
    if q_col is not None and a_col is not None:
        t_col = next((i for i, cell in enumerate(header) if cell in TITLE_HEADERS), None)
        rows = rows[1:]
    else:
        q_col, a_col = 0, 1
    blocks = []
    for row in rows:
        question = row[q_col] if len(row) > q_col else ""
        answer = row[a_col] if len(row) > a_col else ""
        topic = row[t_col] if t_col is not None and len(row) > t_col else ""
        if question and answer:
            blocks.append(Block((*section, topic) if topic else section, answer, question=question))
    return blocks


def parse_csv(data: bytes) -> ParsedDocument:
    """A Q&A table; at most MAX_ROWS rows and MAX_GRID_CELLS cells, counted as they are read (as in XLSX)."""
    try:
        blocks = qa_rows(_bounded_rows(csv.reader(io.StringIO(decode_text(data))), {"rows": 0, "cells": 0}), ())
    except csv.Error as exc:
        raise FileRejected(f"not a readable CSV ({exc})") from None
    if not blocks:
        raise FileRejected("no question/answer rows (a Q&A table needs a question column and an answer column)")
    return ParsedDocument("", blocks)


def parse_xlsx(data: bytes) -> ParsedDocument:
    """Every sheet is a Q&A table; the sheet's name is the section.

    Read within knowledge/bounds.py's XLSX limits, and at most MAX_ROWS rows and MAX_GRID_CELLS cells in all
    (counted as openpyxl yields them, the empty cells a sheet's grid spans included)."""
    book = _open_workbook(data)
    blocks: list[Block] = []
    counted = {"rows": 0, "cells": 0}
    try:
        for sheet in book.worksheets:
            section = (sheet.title,) if len(book.worksheets) > 1 else ()
            blocks += qa_rows(_bounded_rows(sheet.iter_rows(values_only=True), counted), section)
    except FileRejected:
        raise
    except Exception as exc:
        raise FileRejected(f"not a readable XLSX ({type(exc).__name__})") from None
    finally:
        book.close()
    if not blocks:
        raise FileRejected("no question/answer rows (a Q&A table needs a question column and an answer column)")
    return ParsedDocument("", blocks)


def _bounded_rows(rows: Iterable[Sequence[Any]], counted: dict[str, int]) -> Iterator[list[str]]:
    """A table's rows as text, refused past MAX_ROWS rows or MAX_GRID_CELLS cells (`counted`: so far, across the
    tables of one file), without the empty cells that end a row (qa_rows reads columns by position)."""
    for row in rows:
        counted["rows"] += 1
        counted["cells"] += len(row)
        if counted["rows"] > MAX_ROWS:
            raise FileRejected(f"over {MAX_ROWS} rows: split the table")
        if counted["cells"] > MAX_GRID_CELLS:
            raise FileRejected(f"over {MAX_GRID_CELLS} cells (empty ones in the sheet's grid included): "
                               f"split the table, or delete what is beyond its last column")  # fmt: skip
        cells = [("" if cell is None else str(cell)) for cell in row]
        while cells and not cells[-1].strip():
            cells.pop()
        yield cells


def _open_workbook(data: bytes) -> Any:
    """openpyxl's read-only workbook over a BoundedZip: the sheets and shared strings are marked as streamed
    (openpyxl parses them row by row and string by string); theme, properties and chart sheets (with their
    drawings and images) are not read at all: Q&A rows need none of them."""
    from openpyxl.reader.excel import ExcelReader
    from openpyxl.xml.constants import SHARED_STRINGS

    archive = BoundedZip(data, XLSX_LIMITS)

    class Reader(ExcelReader):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(io.BytesIO(data), read_only=True, data_only=True, keep_links=False)
            self.archive.close()
            self.archive, self.valid_files = archive, archive.namelist()

        def read_strings(self) -> None:
            if (part := self.package.find(SHARED_STRINGS)) is not None:
                archive.stream(part.PartName[1:])
            super().read_strings()

        def read_worksheets(self) -> None:
            for _, rel in self.parser.find_sheets():
                archive.stream(rel.target)
            super().read_worksheets()

        def read_chartsheet(self, sheet: Any, rel: Any) -> None:
            pass

        def read_theme(self) -> None:
            pass

        def read_properties(self) -> None:
            pass

        def read_custom(self) -> None:
            pass

    try:
        reader = Reader()
        reader.read()
    except FileRejected:
        archive.close()
        raise
    except Exception as exc:
        archive.close()
        raise FileRejected(f"not a readable XLSX ({type(exc).__name__})") from None
    return reader.wb


PARSERS: dict[str, Callable[[bytes], ParsedDocument]] = {
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
