"""The knowledge bases over the admin API: the same operations as `botgw kb list|add|remove|search`, behind the
admin token (on the admin listener; on the public port too, for a caller with the token, as every /admin/…).

- `GET /admin/kb`: the knowledge bases ({"bases": [{"kb", "documents", "chunks", "bytes"}]}).
- `GET /admin/kb/{kb}`: its documents (the fields `botgw kb list --json` prints); 404 for a base with none.
- `POST /admin/kb/{kb}/documents`: multipart upload of one or more files (field `files`). Only the file name's
  last part is kept as the document name (`../../etc/x.md` is `x.md`); nothing the client sends is taken as a
  path on the server, and nothing is ingested until every file is read and cut (if one is refused: type, empty,
  size, unreadable, a zip that unpacks too big, nothing is written). Starlette spools a part over 1 MB to a
  temporary file while parsing the form. One upload is ingested at a time; a second one meanwhile is 429.
- `DELETE /admin/kb/{kb}/documents/{doc}`: remove a document (the name `GET /admin/kb/{kb}` shows).
- `GET /admin/kb/{kb}/search?q=…&top=5&mode=hybrid&per_doc=false`: what retrieval finds, best first, before the
  answer threshold: the JSON of `botgw kb search --json` (`per_doc=true`: one hit per document, as `--per-doc`);
  404 for a base that does not exist.

The embedded store can be open in one process at a time. The gateway opens it for a request and lets go after
`knowledge.store.idle_release_s` (knowledge.service.SharedKnowledge), as the worker does; when another process
(a worker answering, a `botgw kb` command) holds it for longer than ADMIN_LOCK_WAIT_S, the answer is 503 with
Retry-After, and nothing changed.

The console's knowledge page (gateway/console/pages/knowledge.py) calls the same functions (`read_documents`,
`add_uploaded`, `remove_one`, `search_in`): the same checks, and the same refusals (`KbRefused`) with their reasons.
Documents uploaded here are recorded as added by "admin-api".
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from dataclasses import asdict
from pathlib import PurePosixPath
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from bots.base import CallbackRejected
from gateway.edge.admin_routes import refused
from gateway.edge.routes import BodyTooLarge, read_body
from knowledge.config import KB_NAME_PATTERN
from knowledge.errors import EmbeddingMismatch, FileRejected, KnowledgeError, StoreLocked
from knowledge.formats import PARSERS
from knowledge.ingest import Outcome, Upload
from knowledge.search import Hit
from knowledge.service import SharedKnowledge
from knowledge.store import DocRecord

router = APIRouter(prefix="/admin/kb")
ADMIN_LOCK_WAIT_S = 3.0  # how long a request waits for another process to let go of the embedded store
RETRY_AFTER_S = 10
MAX_FILES = 100
MAX_DOC_NAME = 200
MAX_QUESTION_CHARS = 2000
ADMIN_API_ADDED_BY = "admin-api"  # who a document uploaded here was added by (its record's `added_by`)
BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def shared_knowledge(request: Request) -> SharedKnowledge:
    app = request.app
    if getattr(app.state, "knowledge", None) is None:
        runtime = app.state.runtime
        app.state.knowledge = SharedKnowledge(runtime.settings.knowledge, runtime.http, wait_s=ADMIN_LOCK_WAIT_S)
    return app.state.knowledge


class KbRefused(Exception):
    """A knowledge request that cannot be done, and nothing changed: the status, the reason an operator reads and
    acts on, and headers (Retry-After). The admin API and the console's knowledge page answer with the same."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def answer(self, headers: dict[str, str] | None = None) -> JSONResponse:
        """The refusal as JSON ({"error": reason, ...}), with its own headers and `headers` (a page's)."""
        return JSONResponse({"error": self.message, **self.extra}, status_code=self.status,
                            headers={**(headers or {}), **self.headers} or None)  # fmt: skip


def _busy(message: str) -> KbRefused:
    return KbRefused(503, message, {"Retry-After": str(RETRY_AFTER_S)})


def check_name(kb: str) -> None:
    """Raise KbRefused (400) for a knowledge base name the store would not take."""
    if not re.match(KB_NAME_PATTERN, kb):
        raise KbRefused(400, "a knowledge base name is letters, digits, '_', '.' or '-' (at most 64)")


def refusal_of(exc: KnowledgeError) -> KbRefused:
    """A knowledge error as an answer an operator can act on (never a 500)."""
    if isinstance(exc, StoreLocked):
        return _busy(
            f"the knowledge store is held by another process (a worker answering, or a `botgw kb` command); "
            f"try again in {RETRY_AFTER_S} s. With several processes, run a Qdrant server (knowledge.store.qdrant_url)."
        )
    if isinstance(exc, FileRejected):
        return KbRefused(422, f"nothing was added: {exc}")
    if isinstance(exc, EmbeddingMismatch):
        return KbRefused(409, str(exc))
    return _busy(str(exc))  # an embedding engine or server away


async def _known(knowledge: Any, kb: str) -> None:
    """404 naming the bases that exist, for a base with no documents (a typo must not look like an empty answer)."""
    if await knowledge.documents(kb):
        return
    bases = sorted({record.kb for record in await knowledge.documents()})
    known = f"the knowledge bases are: {', '.join(bases[:50])}" if bases else "there are no knowledge bases yet"
    raise KbRefused(404, f"no knowledge base {kb!r} ({known})", bases=bases[:50])


async def read_documents(request: Request, kb: str | None) -> list[DocRecord]:
    """The document records of one base (or of all); KbRefused says why they cannot be read now."""
    if kb is not None:
        check_name(kb)
    try:
        async with shared_knowledge(request).use() as knowledge:
            return await knowledge.documents(kb)
    except KnowledgeError as exc:
        raise refusal_of(exc) from None


def bases_of(records: list[DocRecord]) -> list[dict[str, Any]]:
    """The knowledge bases of these records: {"kb", "documents", "chunks", "bytes"} each, in the records' order."""
    bases: dict[str, dict[str, Any]] = {}
    for record in records:
        base = bases.setdefault(record.kb, {"kb": record.kb, "documents": 0, "chunks": 0, "bytes": 0})
        base["documents"] += 1
        base["chunks"] += record.chunks
        base["bytes"] += record.bytes
    return list(bases.values())


@router.get("")
async def list_bases(request: Request) -> JSONResponse:
    if (refusal := refused(request)) is not None:
        return refusal
    try:
        return JSONResponse({"bases": bases_of(await read_documents(request, None))})
    except KbRefused as exc:
        return exc.answer()


@router.get("/{kb}")
async def list_documents(kb: str, request: Request) -> JSONResponse:
    if (refusal := refused(request)) is not None:
        return refusal
    try:
        records = await read_documents(request, kb)
    except KbRefused as exc:
        return exc.answer()
    if not records:
        return KbRefused(404, f"no knowledge base {kb!r} (or it has no documents): GET /admin/kb lists them").answer()
    return JSONResponse({"kb": kb, "documents": [asdict(record) for record in records]})


def document_name(filename: str | None) -> str:
    """The document name of an uploaded file: the last part of its name, whatever separators the client used.
    Raises ValueError for a name that is empty, hidden, or has control characters."""
    name = PurePosixPath((filename or "").replace("\\", "/")).name.strip()
    if not name or name in (".", "..") or name.startswith("."):
        raise ValueError(f"an uploaded file needs a file name (got {filename!r})")
    if any(unicodedata.category(char)[0] == "C" for char in name):
        raise ValueError(f"the file name {filename!r} has control characters")
    if len(name) > MAX_DOC_NAME:
        raise ValueError(f"the file name is longer than {MAX_DOC_NAME} characters")
    return name


async def _uploads(request: Request) -> list[Upload]:
    """The uploaded files, checked before anything is ingested: type, emptiness, size (KbRefused says which)."""
    settings = request.app.state.runtime.settings.knowledge
    cap = int(settings.max_file_mb * 1024 * 1024)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise KbRefused(415, "send the files as multipart/form-data, in the field 'files'")
    try:
        request._body = await read_body(request, int(settings.max_upload_mb * 1024 * 1024))  # form() reads it
        form = await request.form(max_files=MAX_FILES, max_fields=MAX_FILES)
    except BodyTooLarge:
        over = f"knowledge.max_upload_mb ({settings.max_upload_mb:g} MB)"
        raise KbRefused(413, f"the upload is over {over}; nothing was added") from None
    except CallbackRejected as exc:
        raise KbRefused(exc.status, exc.detail) from None
    except Exception as exc:  # python-multipart's and Starlette's parse errors have no common base
        raise KbRefused(400, f"the multipart body cannot be read: {type(exc).__name__}") from None
    files = [item for item in form.getlist("files") if isinstance(item, UploadFile)]
    try:
        if not files:
            raise KbRefused(400, "no files: send one or more in the multipart field 'files'")
        uploads = []
        for file in files:
            doc = document_name(file.filename)
            suffix = PurePosixPath(doc).suffix.lower()
            if suffix not in PARSERS:
                supported = ", ".join(sorted(PARSERS))
                raise KbRefused(415, f"{doc}: unsupported format {suffix or '(no extension)'} (supported: {supported})")
            data = await file.read(cap + 1)
            if not data:
                raise KbRefused(400, f"{doc}: empty file; nothing was added")
            if len(data) > cap:
                over = f"knowledge.max_file_mb ({settings.max_file_mb:g} MB)"
                raise KbRefused(413, f"{doc}: over {over}; nothing was added")
            uploads.append(Upload(doc, data))
    except ValueError as exc:
        raise KbRefused(400, str(exc)) from None
    finally:
        await form.close()
    if len({upload.doc for upload in uploads}) != len(uploads):
        raise KbRefused(400, "two uploaded files have the same name; nothing was added")
    return uploads


def _upload_lock(request: Request) -> asyncio.Lock:
    """One upload at a time per gateway: each holds its files in memory and takes a core to parse and embed."""
    if getattr(request.app.state, "kb_upload_lock", None) is None:
        request.app.state.kb_upload_lock = asyncio.Lock()
    return request.app.state.kb_upload_lock


async def add_uploaded(request: Request, kb: str, added_by: str) -> list[Outcome]:
    """Ingest the files of a multipart upload (field `files`) into `kb`, recording `added_by` as who added them:
    every file checked first, one upload at a time per gateway (KbRefused 429 meanwhile), all or nothing."""
    check_name(kb)
    lock = _upload_lock(request)
    if lock.locked():
        busy = "another upload is being added; send this one when it is done (nothing was added)"
        raise KbRefused(429, busy, {"Retry-After": str(RETRY_AFTER_S)})
    async with lock:
        uploads = await _uploads(request)
        try:
            async with shared_knowledge(request).use() as knowledge:
                return await knowledge.add_uploads(kb, uploads, added_by)
        except KnowledgeError as exc:
            raise refusal_of(exc) from None


@router.post("/{kb}/documents")
async def add_documents(kb: str, request: Request) -> JSONResponse:
    if (refusal := refused(request)) is not None:
        return refusal
    try:
        outcomes = await add_uploaded(request, kb, ADMIN_API_ADDED_BY)
    except KbRefused as exc:
        return exc.answer()
    return JSONResponse({"kb": kb, "documents": [asdict(outcome) for outcome in outcomes]})


async def remove_one(request: Request, kb: str, doc: str) -> DocRecord:
    """Take document `doc` out of `kb`; its record as it was (KbRefused 404 when there is none)."""
    check_name(kb)
    try:
        async with shared_knowledge(request).use() as knowledge:
            record = await knowledge.remove(kb, doc)
    except KnowledgeError as exc:
        raise refusal_of(exc) from None
    if record is None:
        raise KbRefused(404, f"no document {doc!r} in {kb} (the list of its documents shows the names)")
    return record


@router.delete("/{kb}/documents/{doc:path}")
async def remove_document(kb: str, doc: str, request: Request) -> JSONResponse:
    if (refusal := refused(request)) is not None:
        return refusal
    try:
        record = await remove_one(request, kb, doc)
    except KbRefused as exc:
        return exc.answer()
    return JSONResponse({"removed": record.doc, "kb": kb, "chunks": record.chunks})


async def search_in(request: Request, kb: str, q: str, top: str = "5", mode: str = "hybrid",
                    per_doc: str = "false") -> list[Hit]:  # fmt: skip
    """What retrieval finds in `kb` for `q`, best first, before the answer threshold (the query's values as
    given, checked here: KbRefused 400; 404 for a base that does not exist)."""
    check_name(kb)
    if not q.strip() or len(q) > MAX_QUESTION_CHARS:
        raise KbRefused(400, f"ask a question in q (1 to {MAX_QUESTION_CHARS} characters)")
    if not (top.isascii() and top.isdigit()) or not 1 <= int(top) <= 50:  # "²".isdigit(), but int("²") fails
        raise KbRefused(400, "top is 1 to 50")
    if mode not in ("hybrid", "dense", "lexical"):
        raise KbRefused(400, "mode is hybrid, dense or lexical")
    if per_doc.lower() not in BOOLEANS:
        raise KbRefused(400, "per_doc is true or false")
    try:
        async with shared_knowledge(request).use() as knowledge:
            await _known(knowledge, kb)
            return await knowledge.search([kb], q, int(top), mode, BOOLEANS[per_doc.lower()])  # type: ignore[arg-type]
    except KnowledgeError as exc:
        raise refusal_of(exc) from None


@router.get("/{kb}/search")
async def search(
    kb: str, request: Request, q: str = "", top: str = "5", mode: str = "hybrid", per_doc: str = "false"
) -> JSONResponse:
    if (refusal := refused(request)) is not None:
        return refusal
    try:
        hits = await search_in(request, kb, q, top, mode, per_doc)
    except KbRefused as exc:
        return exc.answer()
    return JSONResponse([hit.as_json() for hit in hits])
