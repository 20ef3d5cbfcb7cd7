"""What reading one uploaded document may cost: the bounds formats.py applies to DOCX, XLSX, PDF, and to Markdown,
plain text, HTML and CSV.

DOCX and XLSX are zip files of XML parts. A few hundred KB can unpack to gigabytes, name its main part anything
(`word/media/document.xml` is as good as `word/document.xml`), or hold millions of tiny XML elements that the
parsers turn into Python objects (python-docx keeps the whole document as a tree, about 200 bytes an element;
openpyxl makes an object of every cell style, about 2 KB each). So the zip is read through `BoundedZip`:

- the directory is checked before anything is unpacked: its own size (MAX_ZIP_DIRECTORY_BYTES) and what all its
  entries declare together (MAX_DECLARED_BYTES), read or not;
- a part is counted when the parser opens it, wherever it lives and whatever it is called: its declared size must
  fit in what is left of MAX_UNPACKED_BYTES, and every byte handed to the parser is counted against it. zipfile
  never hands out more than an entry declares; an entry whose data is longer (or shorter) than it says fails its
  check and is refused as damaged;
- before the parser sees a part, the part is read once with expat (no tree, no entities: a DTD is refused,
  OOXML has none; a part that is not XML is refused, the parsers are only given XML) and its elements are counted
  against the format's `ZipLimits`.

The parsers themselves open only the parts the text needs: formats.py hands python-docx a package of the main
document, its styles and the core properties (images and every other part are never unpacked), and openpyxl reads
no theme, properties, charts or images.

PDF (pypdf) is bounded through pypdf's own Configuration (PDF_CONFIGURATION) and the page count and decoded bytes
counted in formats.parse_pdf.

Markdown, plain text and HTML need no unpacking, but their parsers cost by structure, not by size: markdown-it
takes about 20 µs a line (a list item, a table row, a paragraph) and BeautifulSoup about 15 µs an element, so a
1 MB file of "a\n\n" (333,000 paragraphs) took 9 s and 580 MB before the paragraph limit refused it. formats.py
counts paragraphs, lines and tags in the raw text first (counting costs milliseconds, at most a second for a 20 MB
file) and refuses before parsing. CSV rows are counted as the reader yields them, as XLSX rows are.
"""

from __future__ import annotations

import io
import zipfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import IO, Any
from xml.parsers import expat

from knowledge.errors import FileRejected

MB = 1024 * 1024

# Zip containers. knowledge.max_file_mb (20 MB by default) bounds the upload; these bound what it unpacks to.
MAX_UNPACKED_BYTES = 64 * MB  # read by the parser, all parts together (about 3x the default upload limit)
MAX_DECLARED_BYTES = 256 * MB  # declared by all entries of the zip together, read or not: more is a zip bomb
MAX_ZIP_DIRECTORY_BYTES = 2 * MB  # the zip's directory: zipfile keeps an object per entry (~600 bytes each)
XML_CHUNK = 64 * 1024

# DOCX: python-docx holds the whole document as a tree, about 200 bytes an element: ~200 MB at this bound, which
# a real document reaches only past formats.MAX_BLOCKS (50,000 paragraphs, refused anyway).
MAX_DOCX_ELEMENTS = 1_000_000
MAX_DOCX_PARAGRAPHS = 100_000  # every <w:p>, also inside tables: twice formats.MAX_BLOCKS

# XLSX: openpyxl streams the sheets and the shared strings (read-only mode) and holds the rest whole.
MAX_XLSX_WHOLE_ELEMENTS = 50_000  # workbook, styles, relationships, content types: ~100 MB of objects at worst
MAX_XLSX_STREAMED_ELEMENTS = 2_000_000  # sheets and shared strings: what openpyxl parses, row by row
MAX_ROWS = 100_000  # rows of all sheets, empty ones the sheet skips included; more than 50,000 Q&A rows is refused
MAX_GRID_CELLS = 2_000_000  # cells of those rows as the sheet's grid spans them, empty ones included
MAX_SHARED_STRINGS = 500_000  # openpyxl keeps every shared string in a list

# Markdown and plain text: lines that are not blank. markdown-it takes up to ~25 µs a line (a list of one-word items);
# plain text ~0.5 µs. Paragraphs (blocks) are counted against formats.MAX_BLOCKS before either is parsed.
MAX_MARKDOWN_LINES = 50_000
MAX_TEXT_LINES = 500_000
# Markdown headings with inline marks ([link](…), *emphasis*): their plain text is parsed at up to ~4 µs a character
MAX_MARKED_HEADING_CHARS = 200_000
# HTML: tags (`<` and a letter), parsed by lxml (no quadratic cases, unlike html.parser) at ~15 µs an element
MAX_HTML_TAGS = 100_000

# PDF (pypdf): pages, what one stream may decode to, and what all pages' streams decode to together.
MAX_PDF_PAGES = 2_000
MAX_PDF_STREAM_BYTES = 16 * MB  # one stream, decoded (pypdf's own default: 75 MB)
MAX_PDF_DECODED_BYTES = 64 * MB  # the content and form streams of all pages, decoded, as text extraction reads them
MAX_PDF_STREAM_TOKENS = 500_000  # operands and operators of one content stream (~150 bytes each while parsed)
MAX_PDF_FORM_USES = 100  # form XObjects drawn on one page (each is parsed again where it is drawn)
PDF_CONFIGURATION: Mapping[str, int] = MappingProxyType(
    {
        "zlib_maximum_output_length": MAX_PDF_STREAM_BYTES,
        "lzw_maximum_output_length": MAX_PDF_STREAM_BYTES,
        "run_length_maximum_output_length": MAX_PDF_STREAM_BYTES,
        "brotli_maximum_output_length": MAX_PDF_STREAM_BYTES,
        "array_based_stream_maximum_output_length": MAX_PDF_STREAM_BYTES,
        "jbig2_maximum_output_length": MAX_PDF_STREAM_BYTES,
        "image_maximum_buffer_size": MAX_PDF_STREAM_BYTES,
        "stream_parsing_work_maximum_count": MAX_PDF_STREAM_TOKENS,
        "xform_maximum_invocations_per_extraction": MAX_PDF_FORM_USES,
        "page_tree_maximum_entries": 2 * MAX_PDF_PAGES,  # pages and the nodes above them
        "page_tree_maximum_page_entries": 100 * MAX_PDF_PAGES,  # dictionary entries copied into pages
    }
)


def megabytes(size: int) -> str:
    return f"{size // MB} MB" if size >= MB else f"{size / MB:.1f} MB"


@dataclass(frozen=True)
class ZipLimits:
    """What one zip format's parser may be made to hold: XML elements of the parts it keeps whole and of the parts
    it streams, and at most so many elements of a kind (by local name, in whatever part they are)."""

    kind: str  # "DOCX", as messages name it
    whole_elements: int
    streamed_elements: int = 0
    tags: Mapping[str, tuple[int, str]] = field(default_factory=dict)  # local name: (at most, what they are)


DOCX_LIMITS = ZipLimits("DOCX", MAX_DOCX_ELEMENTS, tags={"p": (MAX_DOCX_PARAGRAPHS, "paragraphs")})
XLSX_LIMITS = ZipLimits(
    "XLSX",
    MAX_XLSX_WHOLE_ELEMENTS,
    MAX_XLSX_STREAMED_ELEMENTS,
    tags={"row": (MAX_ROWS, "rows"), "si": (MAX_SHARED_STRINGS, "shared strings")},
)


def label(name: str) -> str:
    """A part's name as messages show it: it comes from the file, so it is cut short and escaped."""
    return name if name.isprintable() and len(name) <= 80 else ascii(name[:80])


def directory_size(data: bytes) -> int | None:
    """The size of a zip's central directory, read from its end record as zipfile reads it (None: no end record;
    zipfile then refuses the file itself)."""
    end = data.rfind(b"PK\x05\x06", max(0, len(data) - 22 - 65535))
    if end < 0 or len(data) < end + 22:
        return None
    size = int.from_bytes(data[end + 12 : end + 16], "little")
    if size == 0xFFFFFFFF and end >= 20 and data[end - 20 : end - 16] == b"PK\x06\x07":  # zip64
        record = int.from_bytes(data[end - 12 : end - 4], "little")
        if data[record : record + 4] == b"PK\x06\x06":
            size = int.from_bytes(data[record + 40 : record + 48], "little")
    return size


class BoundedZip(zipfile.ZipFile):
    """A zip whose parts are counted as the parser opens them (see the module's docstring). `stream(name)` marks a
    part that the parser streams rather than holds whole; its elements count against `streamed_elements`."""

    def __init__(self, data: bytes, limits: ZipLimits) -> None:
        self.limits = limits
        cd_size = directory_size(data)
        if cd_size is not None and cd_size > MAX_ZIP_DIRECTORY_BYTES:
            raise FileRejected(
                f"its zip directory is {megabytes(cd_size)}, over {megabytes(MAX_ZIP_DIRECTORY_BYTES)}: "
                f"tens of thousands of parts, not a {limits.kind}"
            )
        try:
            super().__init__(io.BytesIO(data))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError):
            raise FileRejected(f"not a readable {limits.kind} (not a zip file)") from None
        declared = sum(info.file_size for info in self.infolist())
        if declared > MAX_DECLARED_BYTES:
            biggest = max(self.infolist(), key=lambda info: info.file_size)
            raise FileRejected(
                f"its parts declare {megabytes(declared)} unpacked, over {megabytes(MAX_DECLARED_BYTES)} "
                f"({label(biggest.filename)} alone: {megabytes(biggest.file_size)}): a zip bomb, not a document"
            )
        self.unpacked = 0  # bytes handed to the parser
        self._streamed: set[str] = set()
        self._scanned: set[tuple[str, bool]] = set()
        self._elements = Counter[bool]()  # streamed? -> elements
        self._tags = Counter[str]()

    def stream(self, name: str) -> None:
        self._streamed.add(name)

    def open(self, name: Any, mode: str = "r", pwd: bytes | None = None, **kwargs: Any) -> IO[bytes]:  # type: ignore[override]
        if mode != "r":
            raise ValueError("a BoundedZip is read-only")
        info = name if isinstance(name, zipfile.ZipInfo) else self.getinfo(name)
        if self.unpacked + info.file_size > MAX_UNPACKED_BYTES:
            total = megabytes(self.unpacked + info.file_size)
            raise FileRejected(
                f"its text unpacks to {total}, over {megabytes(MAX_UNPACKED_BYTES)} "
                f"({label(info.filename)} alone: {megabytes(info.file_size)})"
            )
        self._scan(info)
        return _CountedPart(self._unpack(info), info, self)

    def _unpack(self, info: zipfile.ZipInfo) -> IO[bytes]:
        try:
            return super().open(info, "r")
        except (zipfile.BadZipFile, NotImplementedError, RuntimeError, ValueError, EOFError) as exc:
            raise FileRejected(f"not a readable {self.limits.kind} ({label(info.filename)}: {exc})") from None

    def _scan(self, info: zipfile.ZipInfo) -> None:
        """Count the XML elements of a part before the parser sees it (once for each way it is read)."""
        streamed = info.filename in self._streamed
        if (info.filename, streamed) in self._scanned:
            return
        self._scanned.add((info.filename, streamed))
        limits, kind = self.limits, self.limits.kind
        most = limits.streamed_elements if streamed else limits.whole_elements
        parser = expat.ParserCreate(namespace_separator=" ")

        def start(tag: str, _attributes: object) -> None:
            self._elements[streamed] += 1
            if self._elements[streamed] > most:
                raise FileRejected(
                    f"its XML has over {most} elements ({label(info.filename)} and the parts read before it): "
                    f"split the document"
                )
            local = tag.rpartition(" ")[2]
            if local in limits.tags:
                self._tags[local] += 1
                at_most, what = limits.tags[local]
                if self._tags[local] > at_most:
                    raise FileRejected(f"over {at_most} {what} ({label(info.filename)}): split the document")

        def doctype(*_args: object) -> None:
            raise FileRejected(f"{label(info.filename)} declares a DTD, which no {kind} has: refused")

        parser.StartElementHandler = start
        parser.StartDoctypeDeclHandler = doctype
        try:
            with self._unpack(info) as part:
                while chunk := _read(part, info, kind):
                    parser.Parse(chunk, False)
                parser.Parse(b"", True)
        except expat.ExpatError as exc:
            raise FileRejected(
                f"not a readable {kind} ({label(info.filename)} is not well-formed XML: {exc})"
            ) from None


def _read(part: IO[bytes], info: zipfile.ZipInfo, kind: str, size: int = XML_CHUNK) -> bytes:
    try:
        return part.read(size)
    except Exception as exc:  # BadZipFile (a CRC that fails: the data is not what the directory says), zlib.error
        what = f"{label(info.filename)} is damaged or not the size it declares: {type(exc).__name__}"
        raise FileRejected(f"not a readable {kind} ({what})") from None


class _CountedPart(io.RawIOBase):
    """One part as the parser reads it: every byte counts against MAX_UNPACKED_BYTES, and never more bytes than
    the zip's directory declared for it (zipfile stops there; a longer deflate stream then fails its CRC)."""

    def __init__(self, inner: IO[bytes], info: zipfile.ZipInfo, archive: BoundedZip) -> None:
        super().__init__()
        self._inner, self._info, self._archive = inner, info, archive
        self._delivered = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while chunk := self.read(XML_CHUNK):
                chunks.append(chunk)
            return b"".join(chunks)
        data = _read(self._inner, self._info, self._archive.limits.kind, size)
        self._delivered += len(data)
        self._archive.unpacked += len(data)
        if self._delivered > self._info.file_size:
            raise FileRejected(
                f"{label(self._info.filename)} holds more than the {self._info.file_size} bytes it declares"
            )
        if self._archive.unpacked > MAX_UNPACKED_BYTES:
            raise FileRejected(
                f"its text unpacks to over {megabytes(MAX_UNPACKED_BYTES)} (at {label(self._info.filename)})"
            )
        return data

    def close(self) -> None:
        self._inner.close()
        super().close()
