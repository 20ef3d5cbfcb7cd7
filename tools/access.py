"""Who may call a tool: a tool with no `access` entry is open to everyone the bot answers; with one, only to the
people and groups it names. The model is offered only what the asker may call, so it cannot be talked into more."""

from __future__ import annotations

from tools.config import BotTools


def may_call(tools: BotTools, tool: str, person: str, group: str | None, departments: tuple[str, ...] = ()) -> bool:
    """`tool` is server.tool; `person` and `group` are qualified identities (the group None one-to-one).
    Departments come from the platform's directory where a message carries them (none do yet: an entry that names
    only departments admits nobody until they do)."""
    access = tools.access.get(tool)
    if access is None:
        return True
    if access.users is not None and person in access.users:
        return True
    if access.groups is not None and group is not None and group in access.groups:
        return True
    named = {str(department) for department in access.departments or ()}
    return bool(named.intersection(departments))
