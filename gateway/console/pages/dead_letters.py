"""The console's dead letters: the messages that could not be answered, with why, the message and its reply record;
replay and purge (as `botgw dlq`), one or many, for admins.

Everything goes through `DeadLetters` (gateway/queue/dead_letters.py), as the command does: a replay keeps the
message's dedup key, so its reply record decides what is sent, and a letter replayed twice (a second click, a stale
page) is queued once: the second finds it gone ("not found"). Ids are checked as `botgw dlq` checks them; a bad one
refuses the whole request (400) before anything changed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from gateway.console.auth import Operator
from gateway.console.web import (
    SECURITY_HEADERS,
    Admin,
    Viewer,
    bounded,
    json_answer,
    record,
    render,
    small_form,
    small_json,
    wants_json,
)
from gateway.queue.dead_letters import (
    URL,
    DeadLetter,
    DeadLetters,
    NoSuchDeadLetter,
    ReportedUndelivered,
    UnreadableLetter,
)
from gateway.state.redis_text import is_stream_id

router = APIRouter(prefix="/console")
PAGE = 50
PAGE_MAX = 200
IDS_MAX = 200  # ids one replay or purge takes
# what happened to one id, as the page's notice names it (the redirect carries these words only)
OUTCOMES = ("queued", "delivered", "missing", "unreadable", "undelivered", "purged")


def _letters(request: Request) -> DeadLetters:
    runtime = request.app.state.runtime
    return DeadLetters(runtime.redis, runtime.keys, runtime.scheduler, runtime.settings)


def _valid(text: str) -> bool:
    """An id as `botgw dlq` takes it (letter_id), each number within what Redis reads."""
    return is_stream_id(text)




def _without_urls(raw: str) -> str:
    """An unreadable letter's text as a viewer may see it: a URL in it may be a reply target that posts into the
    conversation (a DingTalk sessionWebhook, a response_url), so none is shown."""
    return URL.sub("[URL]", raw)


def _row(letter: DeadLetter) -> dict[str, Any]:
    row = {**letter.summary(), "readable": letter.entry is not None}
    if "raw" in row:
        row["raw"] = _without_urls(str(row["raw"]))
    return row


@router.get("/dead-letters")
async def dead_letters_page(request: Request, operator: Viewer) -> Response:
    """The newest letters first, a page at a time (`before`: the id the previous page ended on)."""
    before = request.query_params.get("before", "")
    if before and not _valid(before):
        return json_answer({"error": f"{before!r} is not a dead-letter id"}, 400)
    limit = bounded(request.query_params.get("limit"), PAGE, PAGE_MAX) or PAGE
    letters = await _letters(request).list(limit, before)
    rows = [_row(letter) for letter in letters]
    more = rows[-1]["id"] if len(rows) == limit else ""
    if wants_json(request, operator):
        return json_answer({"letters": rows, "more": more})
    results = _shown_results(request.query_params.get("results", ""))
    purged = request.query_params.get("purged", "")
    return render(request, operator, "dead_letters.html", rows=rows, more=more, before=before, results=results,
                  purged=int(purged) if purged.isascii() and purged.isdigit() else None)  # fmt: skip


def _shown_results(text: str) -> list[tuple[str, str]]:
    """The outcomes a change sent back in its redirect (`id:outcome,…`), only ids and words the page knows."""
    shown = []
    for item in text.split(",")[:IDS_MAX]:
        found, _, outcome = item.partition(":")
        if _valid(found) and outcome in OUTCOMES:
            shown.append((found, outcome))
    return shown


def _message(letter: DeadLetter) -> dict[str, Any]:
    """What an operator needs of the message: never its reply target (a DingTalk sessionWebhook posts into the
    conversation, a response_url answers it: those stay out of the page)."""
    message = letter.message
    assert letter.entry is not None
    return {"bot": message.bot_id, "platform": message.platform, "user": message.sender_id, "person": message.person,
            "group": message.group_id, "type": message.msg_type, "text": message.text, "at": message.received_at,
            "msg_id": message.msg_id, "dedup_key": message.dedup_key, "kind": str(letter.entry.kind.value),
            "notice": letter.entry.notice or ""}  # fmt: skip


@router.get("/dead-letters/{letter}")
async def dead_letter_detail(letter: str, request: Request, operator: Viewer) -> Response:
    """One letter: why, the message, and its reply record (how far its answer got)."""
    if not _valid(letter):
        return json_answer({"error": f"{letter!r} is not a dead-letter id"}, 400)
    letters = _letters(request)
    try:
        found = await letters.get(letter)
    except NoSuchDeadLetter:
        if wants_json(request, operator):
            return json_answer({"error": f"no dead letter {letter}"}, 404)
        return render(request, operator, "dead_letter_detail.html", status_code=404, letter=None, letter_id=letter)
    message = _message(found) if found.entry is not None else None
    reply = asdict(await letters.reply_state(found)) if found.entry is not None else None
    shown = {"id": found.letter_id, "at": found.at, "reason": found.reason, "message": message, "reply": reply,
             "raw": _without_urls(found.raw)}
    if wants_json(request, operator):
        return json_answer(shown)
    fields = [(name, value) for name, value in (reply or {}).items() if value not in ("", 0, {}, None)]
    return render(request, operator, "dead_letter_detail.html", letter=shown, letter_id=letter, reply_fields=fields)


async def _chosen(request: Request) -> tuple[list[str], bool] | None:
    """The ids a change names (`one` alone when a row's own button was pressed, else the ticked `ids`; JSON
    {"ids": [...], "all": bool} from a script) and whether it asks for every letter; None when one is not an id."""
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await small_json(request)
        ids = body.get("ids", []) if isinstance(body, dict) else None
        everything = body.get("all") is True if isinstance(body, dict) else False  # "false" is no yes (a review)
        if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
            return None
    else:
        form = await small_form(request)
        one = str(form.get("one", ""))
        ids = [one] if one else [str(item) for item in form.getlist("ids")]
        everything = form.get("all") == "1"
    if len(ids) > IDS_MAX or not all(_valid(item) for item in ids):
        return None
    return list(dict.fromkeys(ids)), everything


def _answer(request: Request, operator: Operator, results: dict[str, str], status_code: int = 200) -> Response:
    if wants_json(request, operator):
        return json_answer({"results": results}, status_code)
    query = urlencode({"results": ",".join(f"{key}:{value}" for key, value in results.items())})
    response = RedirectResponse(f"/console/dead-letters?{query}", status_code=303)
    response.headers.update(SECURITY_HEADERS)
    return response


def _refused(request: Request, operator: Operator) -> Response:
    """A bad id, or none: 400 and nothing changed."""
    if wants_json(request, operator):
        return json_answer({"error": f"dead-letter ids look like 1712345678901-0, at most {IDS_MAX} at once"}, 400)
    return render(request, operator, "message.html", status_code=400, title="400",
                  message="死信编号不对（形如 1712345678901-0），或一个也没选：什么都没改。"
                          " / Not dead-letter ids (like 1712345678901-0), or none chosen: nothing changed.")


@router.post("/dead-letters/replay")
async def replay(request: Request, operator: Admin) -> Response:
    """Queue the chosen letters again (as `botgw dlq replay`): each id's outcome."""
    chosen = await _chosen(request)
    if chosen is None or not chosen[0]:
        return _refused(request, operator)
    letters = _letters(request)
    results: dict[str, str] = {}
    for letter in chosen[0]:
        try:
            said = await letters.replay(letter)
            results[letter] = "queued" if said == "queued" else "delivered"
        except NoSuchDeadLetter:
            results[letter] = "missing"
        except UnreadableLetter:
            results[letter] = "unreadable"
        except ReportedUndelivered:
            results[letter] = "undelivered"
    await record(request, operator, "dead-letter.replay", ",".join(results), results)
    return _answer(request, operator, results)


@router.post("/dead-letters/purge")
async def purge(request: Request, operator: Admin) -> Response:
    """Drop the chosen letters, or every one with `all` (as `botgw dlq purge [--all]`)."""
    chosen = await _chosen(request)
    if chosen is None or (not chosen[0] and not chosen[1]):
        return _refused(request, operator)
    ids, everything = chosen
    letters = _letters(request)
    if everything and not ids:
        count = await letters.purge([])
        await record(request, operator, "dead-letter.purge-all", "*", {"purged": count})
        if wants_json(request, operator):
            return json_answer({"purged": count})
        return RedirectResponse(f"/console/dead-letters?{urlencode({'purged': count})}", status_code=303)
    results = {letter: "purged" if await letters.purge([letter]) else "missing" for letter in ids}
    await record(request, operator, "dead-letter.purge", ",".join(results), results)
    return _answer(request, operator, results)
