"""At start: does every knowledge base a bot answers from exist? A misspelt base answers every question with
no_answer_text, which in 微信客服 hands every customer to a human; better to say so before the first one."""

from __future__ import annotations

import asyncio
import logging

from bots.urls import redact_url
from gateway.config import ConfigError, Settings
from knowledge.errors import StoreLocked
from knowledge.store import KnowledgeStore

log = logging.getLogger(__name__)
STORE_WAIT_S = 10.0  # a `botgw kb add` may hold the embedded folder: wait a little, then start without checking


def missing_bases(settings: Settings, wait_s: float = STORE_WAIT_S) -> dict[str, list[str]]:
    """The bases named in the configuration that hold no document, with the keys naming them."""
    uses = settings.bases_in_use()
    if not uses:
        return {}
    if settings.knowledge.store.qdrant_url is None and not settings.knowledge.store.folder().exists():
        return uses  # no store yet (or a mistyped path): nothing in it, and nothing created by looking
    store = KnowledgeStore.open(settings.knowledge.store, wait_s)
    try:
        present = {record.kb for record in store.documents(list(uses))}
    finally:
        store.close()
    return {base: keys for base, keys in uses.items() if base not in present}


def store_where(settings: Settings) -> str:
    """The knowledge store, for messages: the server's URL without credentials, or the embedded folder."""
    store = settings.knowledge.store
    return redact_url(store.qdrant_url) if store.qdrant_url else str(store.folder())


def describe_missing(missing: dict[str, list[str]], where: str) -> str:
    named = "; ".join(f"{base!r} (named by {', '.join(keys)})" for base, keys in sorted(missing.items()))
    return (
        f"knowledge base{'s' if len(missing) > 1 else ''} not found in the knowledge store {where}: {named}. "
        "Add documents with `botgw kb add BASE FILE...`, correct the name, or set knowledge.allow_missing_bases: "
        "true to start anyway (such a bot answers every question with its no_answer_text)"
    )


async def check_bases(settings: Settings, strict: bool, wait_s: float = STORE_WAIT_S) -> None:
    """`strict` (a worker, unless knowledge.allow_missing_bases): missing bases stop the start (ConfigError);
    otherwise (a gateway) they are a warning. A store that cannot be read now (held by another process for
    longer than `wait_s`, or a server that does not answer) is a warning either way."""
    if not settings.bases_in_use():
        return
    where = store_where(settings)
    try:
        missing = await asyncio.to_thread(missing_bases, settings, wait_s)
    except StoreLocked:
        log.warning("knowledge bases not checked: the store %s is held by another process", where)
        return
    except Exception as exc:  # a server down, a folder unreadable: the start goes on, answers will say the rest
        log.warning("knowledge bases not checked: the store %s could not be read (%s)", where, type(exc).__name__)
        return
    if not missing:
        return
    message = describe_missing(missing, where)
    if strict and not settings.knowledge.allow_missing_bases:
        raise ConfigError(message)
    log.warning(message)
