"""The console's tool audit: the tools' trail (tools/audit.py), newest first, filtered on the server by user (as
`/admin/tools/audit` qualifies it), age, tool, kind and outcome, and bounded: at most `limit` records, the most
recent that match. The same reader as the admin API and `botgw tools audit`."""

from __future__ import annotations

import json
from typing import get_args

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.console.web import Viewer, bounded, json_answer, language, render, translator
from gateway.edge.admin_routes import qualified_identity, tool_audit
from gateway.state.identities import IdentityError
from tools.audit import DURATION_FORMS, Kind, Outcome, parse_duration

router = APIRouter(prefix="/console")
PAGE = 100
PAGE_MAX = 1000
FIELD_MAX = 200
KINDS = get_args(Kind)
OUTCOMES = tuple(outcome for outcome in get_args(Outcome) if outcome)


@router.get("/tools")
async def tools_page(request: Request, operator: Viewer) -> Response:
    """The trail with the query's filters: user, since (90s, 30m, 12h, 7d), tool, kind, outcome, limit."""
    t = translator(language(request))
    query = request.query_params
    chosen = {name: query.get(name, "").strip()[:FIELD_MAX] for name in ("user", "since", "tool", "kind", "outcome")}
    limit = bounded(query.get("limit"), PAGE, PAGE_MAX) or PAGE
    errors: list[str] = []
    user = None
    if chosen["user"]:
        try:
            user = qualified_identity(chosen["user"], request.app.state.runtime)
        except IdentityError as exc:
            errors.append(str(exc))
    since_s = None
    if chosen["since"]:
        try:
            since_s = parse_duration(chosen["since"])
        except ValueError:
            errors.append(t(f"“{chosen['since']}”不是时长：写 {DURATION_FORMS}", f"{chosen['since']!r} is not a "
                            f"duration: write {DURATION_FORMS}"))  # fmt: skip
    for name, allowed in (("kind", KINDS), ("outcome", OUTCOMES)):
        if chosen[name] and chosen[name] not in allowed:
            errors.append(t(f"{name} 只能是 {', '.join(allowed)}", f"{name} is one of {', '.join(allowed)}"))
    records = []
    if not errors:
        records = await tool_audit(request.app.state.runtime).read(
            user=user, since_s=since_s, limit=limit, tool=chosen["tool"] or None, kind=chosen["kind"] or None,
            outcome=chosen["outcome"] or None)  # fmt: skip
        records.reverse()  # newest first
    if query.get("format") == "json" or operator.via == "bearer":
        if errors:
            return json_answer({"error": "bad_filter", "message": "; ".join(errors)}, 400)
        return json_answer({"records": [item.to_json() for item in records]})
    rows = [{**item.to_json(), "arguments_text": json.dumps(item.arguments, ensure_ascii=False)} for item in records]
    return render(request, operator, "tools.html", status_code=400 if errors else 200, rows=rows, chosen=chosen,
                  user=user, limit=limit, errors=errors, kinds=KINDS, outcomes=OUTCOMES, full=len(rows) == limit)
