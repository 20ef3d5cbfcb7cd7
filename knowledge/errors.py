"""What can go wrong with a knowledge base, as exceptions whose messages an operator can act on."""

from __future__ import annotations


class KnowledgeError(Exception):
    """A knowledge base operation failed; the message says why and what to do."""


class StoreLocked(KnowledgeError):
    """The embedded store's folder is held by another process (Qdrant's local mode allows one)."""


class EmbeddingMismatch(KnowledgeError):
    """The store was built with another embedding model or dimension: its vectors would be garbage to this one."""


class EmbeddingUnavailable(KnowledgeError):
    """The embedding engine could not be reached or answered something unusable."""


class FileRejected(KnowledgeError):
    """A file cannot be ingested (empty, too large, unreadable, unsupported, no text); nothing of it was written."""
