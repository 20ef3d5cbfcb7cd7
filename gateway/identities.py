"""Qualified identities in configuration and on the command line: `<family>:<tenant>:<user>`.

Every per-person key (message windows, token budgets, notices, limit overrides) names the person
qualified (InboundMessage.person), so that the page's `zhangsan`, WeCom's `zhangsan` and another
corporation's `zhangsan` never share a limit. Operators write the same form in `limits.users`,
`limits.groups`, `botgw limits` and `/admin/limits/{id}`; the tenant may be left out when the family has
one (`wecom:zhangsan`). A bare id is refused with the qualified forms it could mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bots.base import qualified


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
    """The full `<family>:<tenant>:<user>` of what an operator wrote, or IdentityError saying why not."""
    parts = written.split(":")
    if len(parts) == 1 or not all(parts):
        forms = _forms(parts[-1] or written, tenants) or "no bot that has users is configured"
        raise IdentityError(
            f"{written!r} names no platform: write <family>:<tenant>:<user>, here one of: {forms}"
        )
    if len(parts) > 3:
        raise IdentityError(f"{written!r} has too many ':' for <family>:<tenant>:<user>")
    family = parts[0]
    if family not in tenants:
        known = ", ".join(tenants) or "none"
        raise IdentityError(f"{written!r}: no bot of family {family!r} is configured (families here: {known})")
    if len(parts) == 2:
        if len(tenants[family]) != 1:
            forms = _forms(parts[1], {family: tenants[family]})
            raise IdentityError(f"{written!r}: several {family} tenants are configured, say which: {forms}")
        return qualified(family, tenants[family][0], parts[1])
    if parts[1] not in tenants[family]:
        raise IdentityError(
            f"{written!r}: no {family} bot of tenant {parts[1]!r} is configured (tenants: {', '.join(tenants[family])})"
        )
    return written
