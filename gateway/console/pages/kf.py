"""The console's 微信客服 page: the customers handed to a human, waiting for how long, who holds each session, the
reply allowance left; an editor hands a customer to the queue or to a named agent (as `botgw kf handoff`).

WeCom has no call that lists the sessions waiting in its pool, so the list is botgw's own register
(gateway/state/handoffs.py: handoffs botgw made, and the session_status_change events it pulled). Who holds a
session is asked of the platform (service_state/get) for the rows shown, in parallel and with a short timeout; a row
the platform did not answer for shows the register's last knowledge, marked as such. A session the platform says is
no longer with a human (ended, or with the bot again) leaves the register.

A handoff goes the way `POST /admin/kf/{bot}/handoff` goes (gateway/edge/kf_handoff.py): the platform is asked
whether the customer has an open session (409 when not), the move is queued in the customer's lane and a worker
makes it; the change is audited once queued.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from bots.base import CallbackRejected, InboundMessage, SendError
from bots.safe_json import parse_json_object
from bots.wecom_kf.adapter import WeComKfAdapter
from bots.wecom_kf.config import USERID_PATTERN
from bots.wecom_kf.exceptions import SESSION_ENDED
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
from gateway.edge.kf_handoff import HandoffRefused, queue_handoff
from gateway.edge.routes import BodyTooLarge, read_body
from gateway.state.conversations import Conversations
from gateway.state.handoffs import Handoff, Handoffs

router = APIRouter(prefix="/console")
PAGE = 20
PAGE_MAX = 50  # rows a page shows: each asks the platform once
OFFSET_MAX = 100_000
PLATFORM_TIMEOUT_S = 3.0  # the page waits this long for the platform's answer about one row
STATE_ENDED = 4
WITH_HUMAN = (2, 3)
SHOWN_ID = re.compile(USERID_PATTERN)  # what a redirect may carry back to show (ids only, never free text)


@dataclass
class Row:
    """One customer as the page shows them: the platform's answer when it gave one, else the register's."""

    entry: Handoff
    state: int
    servicer: str
    live: bool  # the platform answered just now
    error: str  # why it did not ('' when it did)
    quota_left: int | None  # answer messages the customer may still be sent (None: unknown)

    def json(self, now: float) -> dict[str, Any]:
        entry = self.entry
        return {"open_kfid": entry.open_kfid, "external_userid": entry.external_userid, "state": self.state,
                "servicer": self.servicer, "live": self.live, "error": self.error, "since": entry.since,
                "waited_s": max(0, int(now - entry.since)), "quota_left": self.quota_left,
                "registered": {"state": entry.state, "servicer": entry.servicer, "via": entry.via,
                               "changed": entry.changed}}  # fmt: skip


def _kf_bots(request: Request) -> dict[str, WeComKfAdapter]:
    """The running 微信客服 bots, by id."""
    adapters = request.app.state.runtime.adapters
    return {bot_id: adapter for bot_id, adapter in adapters.items() if isinstance(adapter, WeComKfAdapter)}


async def _ask_platform(adapter: WeComKfAdapter, entry: Handoff) -> tuple[int, str] | str:
    """(state, servicer) from service_state/get, or why there is no answer."""
    try:
        return await asyncio.wait_for(adapter.api.service_state(entry.open_kfid, entry.external_userid),
                                      PLATFORM_TIMEOUT_S)  # fmt: skip
    except SendError as exc:
        if exc.code == SESSION_ENDED:
            return STATE_ENDED, ""
        return f"the platform refused: {exc}"
    except TimeoutError:
        return f"no answer within {PLATFORM_TIMEOUT_S:g} s"
    except Exception as exc:  # a page that lists must not fail on one row's lookup (a connection refused, …)
        return f"cannot ask the platform: {type(exc).__name__}"


def _message(request: Request, adapter: WeComKfAdapter, entry: Handoff) -> InboundMessage | None:
    """The customer as a handoff names them (their conversation's lane: where their quota is counted), or None for
    an account the bot no longer serves."""
    try:
        return request.app.state.runtime.settings.bot(adapter.bot_id).handoff_request(
            entry.open_kfid, entry.external_userid
        )
    except ValueError:
        return None


async def _rows(request: Request, adapter: WeComKfAdapter, entries: list[Handoff]) -> list[Row]:
    """Each entry with the platform's word on its session and the quota left, all at once; a session no longer with
    a human leaves the register (shown this once, as the platform said)."""
    runtime = request.app.state.runtime
    conversations = Conversations(runtime.redis, runtime.keys, runtime.settings.memory.group)
    messages = [_message(request, adapter, entry) for entry in entries]

    async def quota_left(message: InboundMessage | None) -> int | None:
        return None if message is None else await conversations.quota_left(message, adapter.reply_quota)

    answers, quotas = await asyncio.gather(
        asyncio.gather(*(_ask_platform(adapter, entry) for entry in entries)),
        asyncio.gather(*(quota_left(message) for message in messages)),
    )
    rows = []
    for entry, message, answer, quota in zip(entries, messages, answers, quotas, strict=True):
        if isinstance(answer, str):
            rows.append(Row(entry, entry.state, entry.servicer, False, answer, quota))
            continue
        state, servicer = answer
        if state not in WITH_HUMAN and message is not None:
            await conversations.handoffs.forget(message, since=entry.raw_since)
        rows.append(Row(entry, state, servicer, True, "", quota))
    return rows


async def _page(request: Request, operator: Operator, status_code: int = 200, error: str = "",
                form: dict[str, str] | None = None) -> Response:  # fmt: skip
    runtime = request.app.state.runtime
    bots = _kf_bots(request)
    chosen = request.query_params.get("bot") or (form or {}).get("bot") or next(iter(bots), "")
    adapter = bots.get(chosen)
    limit = bounded(request.query_params.get("limit"), PAGE, PAGE_MAX) or PAGE
    offset = bounded(request.query_params.get("offset"), 0, OFFSET_MAX)
    rows: list[Row] = []
    total = 0
    if adapter is not None:
        entries, total = await Handoffs(runtime.redis, runtime.keys).page(adapter.bot_id, offset, limit)
        rows = await _rows(request, adapter, entries)
    now = time.time()
    if wants_json(request, operator):
        return json_answer({"bots": list(bots), "bot": chosen if adapter else "", "total": total, "offset": offset,
                            "customers": [row.json(now) for row in rows]}, status_code)  # fmt: skip
    accounts = {bot_id: list(adapter.config.open_kfids or []) for bot_id, adapter in bots.items()}
    servicers = sorted(
        {row.servicer for row in rows if row.servicer}
        | {adapter.config.handoff.servicer for adapter in bots.values() if adapter.config.handoff.servicer}
    )
    done = {key: value for key in ("customer", "servicer")
            if SHOWN_ID.match(value := request.query_params.get(key, ""))}  # fmt: skip
    return render(request, operator, "kf.html", status_code=status_code, bots=list(bots),
                  bot=chosen if adapter else "", rows=rows, total=total, offset=offset, limit=limit, now=now,
                  accounts=accounts, servicers=servicers, queued=request.query_params.get("done") == "queued",
                  done=done, error=error, form=form or {})  # fmt: skip


@router.get("/kf")
async def kf_page(request: Request, operator: Viewer) -> Response:
    """One 微信客服 bot's customers in the register (`bot`; default the first), the longest waiting first, `limit`
    at a time from `offset`."""
    return await _page(request, operator)


async def _fields(request: Request) -> dict[str, str]:
    """The handoff's fields from the page's form or a script's JSON body."""
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = parse_json_object(await read_body(request, request.app.state.runtime.settings.max_body_bytes),
                                     "body")  # fmt: skip
        except (BodyTooLarge, CallbackRejected, ValueError):  # an unreadable body names no customer: a 400 below
            body = {}
    else:
        body = dict(await small_form(request))
    return {key: str(body.get(key) or "").strip() for key in ("bot", "open_kfid", "customer", "servicer", "to")}


@router.post("/kf/handoff")
async def kf_handoff(request: Request, operator: Editor) -> Response:
    """Hand a customer to a named agent (`to=agent`, `servicer`) or to the queue (`to=queue`), as
    `botgw kf handoff`: refused when the customer has no open session; queued for a worker, then audited."""
    fields = await _fields(request)
    servicer = fields["servicer"] if fields["to"] != "queue" else ""
    try:
        if fields["to"] != "queue" and not servicer:
            raise HandoffRefused(400, "name the agent (servicer userid) to hand the customer to, or choose the queue")
        place = await queue_handoff(request.app.state.runtime, fields["bot"], fields["open_kfid"] or None,
                                    fields["customer"], servicer or None)  # fmt: skip
    except HandoffRefused as refusal:
        if wants_json(request, operator):
            return json_answer({"error": refusal.error}, refusal.status)
        return await _page(request, operator, refusal.status, refusal.error, fields)
    target = f"{fields['bot']}:{fields['open_kfid'] or '-'}:{fields['customer']}"
    await record(request, operator, "kf.handoff", target, {"servicer": servicer or "(queue)", "place": place})
    if wants_json(request, operator):
        return json_answer({"queued": True, "place": place}, 202)
    query = urlencode({"bot": fields["bot"], "done": "queued", "customer": fields["customer"], "servicer": servicer})
    return RedirectResponse(f"/console/kf?{query}", status_code=303, headers=SECURITY_HEADERS)
