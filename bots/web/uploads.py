"""Files a page user attaches: what the page may send, how the bytes are recognised, and where they are kept.

The page (Chainlit) posts each attached file to the gateway (`POST /web/{bot}/uploads`, gateway/edge/web_routes.py),
which keeps it for a while under the uploader's name and answers with a ref; the chat message then names its
refs, and the worker's parts stage downloads them through `WebAdapter.download`, like any platform's media. The
adapter knows nothing of Redis: the store comes in through `UploadStore` (gateway/state/uploads.py is Redis's).

A ref is bound to its owner: the store is asked with the owner the gateway authenticated, so one user's ref is
"unknown" to everyone else, whoever learns it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal, Protocol

from bots.parts import Downloaded

UploadKind = Literal["image", "file"]

# The types the page accepts (issue 23: images png/jpeg/webp/gif; txt, md, pdf, docx, xlsx), with their extensions
# (what Chainlit's file picker offers and its upload check wants) and the part of a message they become.
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
TYPES: dict[str, tuple[tuple[str, ...], UploadKind]] = {
    "image/png": ((".png",), "image"),
    "image/jpeg": ((".jpg", ".jpeg"), "image"),
    "image/webp": ((".webp",), "image"),
    "image/gif": ((".gif",), "image"),
    "text/plain": ((".txt", ".md"), "file"),  # some browsers call a .md file text/plain
    "text/markdown": ((".md",), "file"),
    "application/pdf": ((".pdf",), "file"),
    DOCX: ((".docx",), "file"),
    XLSX: ((".xlsx",), "file"),
}
MAX_ATTACHMENTS = 4  # per message (the parts stage reads at most 4 images: more would be refused there anyway)
REF = re.compile(r"[0-9a-f]{32}")  # what the gateway hands out (secrets.token_hex(16)): fullmatch
MAX_NAME_CHARS = 120


def kind_of(mime: str) -> UploadKind | None:
    """The part an accepted type becomes, or None: a type the page does not take."""
    known = TYPES.get(mime)
    return known[1] if known else None


def canonical_type(mime: str, name: str) -> str | None:
    """The accepted type of a file, from what the browser declared and its name; None: not one the page takes.

    A declared type must agree with the name's extension (a `.png` declared as a PDF is refused); a generic
    declaration (`application/octet-stream`, none) is decided by the extension alone."""
    mime = mime.split(";")[0].strip().lower()
    extension = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if mime == "text/x-markdown":
        mime = "text/markdown"
    if mime in TYPES:
        return mime if extension in TYPES[mime][0] else None
    if mime in ("", "application/octet-stream"):
        return next((known for known, (extensions, _) in TYPES.items() if extension in extensions), None)
    return None


def content_matches(mime: str, data: bytes) -> bool:
    """Whether the bytes are what the type says (their magic numbers; text: UTF-8 without NULs), so that a file
    renamed to pass the type check is refused at the door rather than deep in a parser."""
    if mime == "image/png":
        return data.startswith(b"\x89PNG\r\n\x1a\n")
    if mime == "image/jpeg":
        return data.startswith(b"\xff\xd8\xff")
    if mime == "image/gif":
        return data[:6] in (b"GIF87a", b"GIF89a")
    if mime == "image/webp":
        return data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    if mime == "application/pdf":
        return data.startswith(b"%PDF-")
    if mime in (DOCX, XLSX):
        return data.startswith(b"PK\x03\x04")  # a ZIP (the parsers check what is inside)
    if mime in ("text/plain", "text/markdown"):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            return False
        return "\x00" not in text
    return False


def clean_name(name: str) -> str:
    """The file's name as shown and stored: its last path segment, without control or format characters, at most
    MAX_NAME_CHARS (the sender's client chose it: it is never a path)."""
    base = re.split(r"[\\/]", name)[-1]
    base = "".join(char for char in base if unicodedata.category(char)[0] != "C").strip()
    return base[-MAX_NAME_CHARS:] or "file"


@dataclass(frozen=True)
class Upload:
    """A kept file: its bytes and what the gateway made of it."""

    data: bytes
    mime: str
    name: str

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class UploadInfo:
    """What a kept file is, without its bytes."""

    mime: str
    name: str
    size: int


class UploadStore(Protocol):
    """Where the gateway keeps the page's uploads until the worker reads them (shared by every replica)."""

    async def put(self, bot_id: str, owner: str, ref: str, upload: Upload, ttl_s: int) -> None: ...

    async def info(self, bot_id: str, owner: str, ref: str) -> UploadInfo | None:
        """What the owner's upload is; None: no such ref for this owner (never sent, expired, someone else's)."""
        ...

    async def get(self, bot_id: str, owner: str, ref: str) -> Downloaded | None: ...


def media_ref(ref: str, owner: str) -> str:
    """`Media.ref` of a page upload: the gateway's ref and whose it is (the owner the gateway authenticated)."""
    return f"{ref}/{owner}"


def split_media_ref(value: str) -> tuple[str, str] | None:
    """(ref, owner) of a `media_ref`, or None when it is not one."""
    ref, _, owner = value.partition("/")
    return (ref, owner) if REF.fullmatch(ref) and owner else None
