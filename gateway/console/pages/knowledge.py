"""The console's knowledge page (gateway/console/web.py says what a page module is): the bases and their documents
(chunks, size, added when and by whom), upload (knowledge.js sends each file in its own request, so that each has
its own progress and outcome), removal, and a search box that shows what retrieval finds with the answer threshold
drawn as a line.

Every operation is the admin API's (gateway/edge/kb_routes.py): the same checks and the same refusals with their
reasons (`KbRefused`: 400, 404, 413, 415, 422, 429, 503 with Retry-After when another process holds the embedded
store). Viewers read and search; editors and admins upload and remove, and each upload and removal is written to
the audit stream after it happened.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from gateway.console.auth import Operator
from gateway.console.web import (
    SECURITY_HEADERS,
    Editor,
    Viewer,
    bounded,
    json_answer,
    record,
    render,
    small_form,
    wants_json,
)
from gateway.edge.kb_routes import KbRefused, add_uploaded, bases_of, read_documents, remove_one, search_in
from knowledge.formats import PARSERS
from knowledge.retrieval import answer_floor
from knowledge.search import Hit

router = APIRouter(prefix="/console")
DOCS_PAGE = 50
DOCS_MAX = 200
BASES_MAX = 200  # bases shown at most (a deployment has a handful)
SEARCH_TOP_MAX = 20
SNIPPET_CHARS = 240
MODES = ("hybrid", "dense", "lexical")


def _refusal(exc: KbRefused) -> Response:
    """A refusal as the console answers a script or knowledge.js: JSON with the reason, the page's headers."""
    return exc.answer(SECURITY_HEADERS)


async def _lists(request: Request, chosen: str | None = None) -> dict[str, Any]:
    """The bases, the chosen one's documents (a page of them) and, when the store cannot be read now, why. The
    chosen base: `chosen`, else the query's `kb`, else the first."""
    query = request.query_params
    chosen = chosen or query.get("kb", "")
    try:
        records = await read_documents(request, None)
    except KbRefused as exc:
        return {"bases": [], "kb": chosen, "documents": [], "total": 0, "offset": 0, "limit": DOCS_PAGE,
                "store_error": exc.message, "store_status": exc.status, "retry_after": exc.headers.get("Retry-After")}
    bases = bases_of(records)
    kb = chosen or (bases[0]["kb"] if bases else "")
    documents = [record for record in records if record.kb == kb]
    offset = bounded(query.get("offset"), 0, max(len(documents) - 1, 0))
    limit = bounded(query.get("limit"), DOCS_PAGE, DOCS_MAX) or DOCS_PAGE
    return {"bases": bases[:BASES_MAX], "more_bases": len(bases) > BASES_MAX, "kb": kb,
            "documents": documents[offset:offset + limit], "total": len(documents), "offset": offset, "limit": limit,
            "store_error": "", "store_status": 200, "retry_after": None}  # fmt: skip


def _upload_rules(request: Request) -> dict[str, Any]:
    """What the upload area tells before a file is sent: the formats read and the size allowed."""
    return {"formats": sorted(PARSERS), "max_file_mb": request.app.state.runtime.settings.knowledge.max_file_mb}


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[:SNIPPET_CHARS] + "…"


def _answered(request: Request, hits: list[Hit]) -> dict[str, Any]:
    """The hits split where the answer threshold lies: those a bot would answer from (in retrieval's order), then
    those under it. The floor is the deployment's (a bot's own `knowledge.min_score` overrides it)."""
    thresholds = request.app.state.runtime.settings.knowledge.thresholds
    rows = []
    for rank, hit in enumerate(hits, start=1):
        floor = answer_floor(thresholds, None, hit.scale)
        rows.append({"rank": rank, "doc": hit.doc, "section": hit.section_path, "score": round(hit.score, 4),
                     "scale": hit.scale, "floor": floor, "above": hit.score >= floor,
                     "snippet": _snippet(hit.display), "chunk": hit.id})  # fmt: skip
    scale = hits[0].scale if hits else "cosine"
    return {"above": [row for row in rows if row["above"]], "below": [row for row in rows if not row["above"]],
            "threshold": answer_floor(thresholds, None, scale), "scale": scale}  # fmt: skip


async def _search(request: Request) -> dict[str, Any]:
    """The search box's question, asked when there is one: the hits around the threshold, or the refusal."""
    query = request.query_params
    q, kb = query.get("q", ""), query.get("kb", "")
    top = str(bounded(query.get("top"), 5, SEARCH_TOP_MAX) or 5)
    mode = query.get("mode", "hybrid") if query.get("mode") in MODES else "hybrid"
    asked = {"q": q, "search_kb": kb, "top": top, "mode": mode, "modes": MODES, "asked": bool(q)}
    if not q:
        return asked
    try:
        hits = await search_in(request, kb, q, top, mode)
    except KbRefused as exc:
        return {**asked, "search_error": exc.message, "search_status": exc.status}
    return {**asked, **_answered(request, hits)}


@router.get("/knowledge")
async def knowledge_page(request: Request, operator: Viewer) -> Response:
    """The page; with `q`, it also shows what retrieval finds (`format=json`: the same as data)."""
    lists = await _lists(request)
    searched = await _search(request)
    if wants_json(request):
        documents = [asdict(record) for record in lists.pop("documents")]
        return json_answer({**lists, "documents": documents, **searched})
    status = lists["store_status"] if lists["store_error"] else 200
    response = render(request, operator, "knowledge.html", status_code=status, **lists, **searched,
                      **_upload_rules(request), removed=request.query_params.get("removed", ""), error="")  # fmt: skip
    if lists["retry_after"]:
        response.headers["Retry-After"] = lists["retry_after"]
    return response


@router.get("/knowledge/lists")
async def knowledge_lists(request: Request, operator: Viewer) -> Response:
    """The bases and documents part of the page alone, which knowledge.js puts in place after an upload."""
    return render(request, operator, "knowledge_lists.html", **await _lists(request))


@router.post("/knowledge/{kb}/documents")
async def upload(kb: str, request: Request, operator: Editor) -> Response:
    """One upload (knowledge.js sends one file a request): the admin API's checks and ingest, added by `who`."""
    try:
        outcomes = await add_uploaded(request, kb, operator.who)
    except KbRefused as exc:
        return _refusal(exc)
    done = [{"doc": outcome.doc, "status": outcome.status, "chunks": outcome.chunks} for outcome in outcomes]
    await record(request, operator, "knowledge-upload", kb, {"files": [item["doc"] for item in done], "outcomes": done})
    return json_answer({"kb": kb, "documents": [asdict(outcome) for outcome in outcomes]})


@router.post("/knowledge/{kb}/remove")
async def remove(kb: str, request: Request, operator: Editor) -> Response:
    """Remove the document named in the form's `doc` (a name may hold '/', so it is not in the path)."""
    form = await small_form(request)
    doc = str(form.get("doc", ""))
    try:
        removed = await remove_one(request, kb, doc)
    except KbRefused as exc:
        if wants_json(request):
            return _refusal(exc)
        return await _page_with_error(request, operator, exc)
    await record(request, operator, "knowledge-remove", kb, {"doc": removed.doc, "chunks": removed.chunks})
    if wants_json(request):
        return json_answer({"removed": removed.doc, "kb": kb, "chunks": removed.chunks})
    target = f"/console/knowledge?kb={quote(kb, safe='')}&removed={quote(removed.doc, safe='')}"
    return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)


async def _page_with_error(request: Request, operator: Operator, exc: KbRefused) -> Response:
    lists = await _lists(request, request.path_params.get("kb", ""))
    response = render(request, operator, "knowledge.html", status_code=exc.status, **lists, **await _search(request),
                      **_upload_rules(request), removed="", error=exc.message)  # fmt: skip
    response.headers.update(exc.headers)
    return response
