"""Qualified identities in configuration and on the command line: `<family>:<tenant>:<user>`.

Every per-person key (message windows, token budgets, notices, limit overrides) names the person
qualified (InboundMessage.person), so that the page's `zhangsan`, WeCom's `zhangsan` and another
corporation's `zhangsan` never share a limit. Operators write the same form in `limits.users`,
`limits.groups`, `botgw limits` and `/admin/limits/{id}`; the tenant may be left out when the family has
one (`wecom:zhangsan`). A WeCom AI bot's user of another corporation is `wecom:<corp>:<corp>/<userid>`, or
`wecom:<corp>/<userid>` for short. A bare id is refused with the qualified forms it could mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bots.base import qualified

OUTSIDERS_FAMILY = "wecom"  # whose users may belong to a corporation no bot is configured for


class IdentityError(ValueError):
    """An identity that names no configured family or tenant, or none at all; the message shows the forms."""


def tenants_by_family(bots: Iterable[Any]) -> dict[str, list[str]]:
    """The tenants (corp ids, a web page's bot id) of every family that a configured bot answers."""
    found: dict[str, list[str]] = {}
    for bot in bots:
        identity = getattr(bot, "identity", None)
        if identity is not None and identity.tenant not in found.setdefault(identity.family, []):
            found[identity.family].append(identity.tenant)
    return found


def _forms(user: str, tenants: dict[str, list[str]]) -> str:
    return ", ".join(qualified(family, tenant, user) for family, names in tenants.items() for tenant in names)


def qualify(written: str, tenants: dict[str, list[str]]) -> str:
    """The full `<family>:<tenant>:<user>` of what an operator wrote, or IdentityError saying why not. A user id
    may itself hold ':' (DingTalk's `$:LWCP_v1:$…` senderId of someone without a staffId): then it is written with
    its tenant."""
    family, _, rest = written.partition(":")
    if not rest or not family:
        forms = _forms(written, tenants) or "no bot that has users is configured"
        raise IdentityError(f"{written!r} names no platform: write <family>:<tenant>:<user>, here one of: {forms}")
    if family not in tenants:
        known = ", ".join(tenants) or "none"
        raise IdentityError(f"{written!r}: no bot of family {family!r} is configured (families here: {known})")
    tenant, _, user = rest.partition(":")
    if user and tenant in tenants[family]:
        return written
    if family == OUTSIDERS_FAMILY:  # another corporation's user of an AI bot: `<corp>/<userid>` (bots/wecom/aibot.py)
        if user and user.startswith(f"{tenant}/"):
            return written
        corp, slash, userid = rest.partition("/")
        if slash and corp and userid and not user:
            return qualified(family, corp, f"{corp}/{userid}")
    if user:  # a mistyped corp id is likelier than an id with ':' written without its tenant
        raise IdentityError(
            f"{written!r}: no {family} bot of tenant {tenant!r} is configured (tenants: {', '.join(tenants[family])}; "
            f"an id that holds ':' is written with its tenant: {family}:<tenant>:<id>)"
        )
    if len(tenants[family]) == 1:
        return qualified(family, tenants[family][0], rest)
    forms = _forms(rest, {family: tenants[family]})
    raise IdentityError(f"{written!r}: several {family} tenants are configured, say which: {forms}")
