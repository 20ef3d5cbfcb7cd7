"""Every Redis key botgw uses, and only here, under one namespace (default `botgw`).

Keys that hold a conversation or session embed the normalized keys of InboundMessage,
so that any replica computes the same name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names for one namespace; several deployments can share a Redis with different ones."""

    namespace: str = "botgw"

    @property
    def inbound_stream(self) -> str:
        """The durable work queue (a Redis Stream)."""
        return f"{self.namespace}:inbound"

    @property
    def worker_group(self) -> str:
        """The consumer group every worker joins."""
        return "workers"

    @property
    def dead_letters(self) -> str:
        """Messages that could not be answered after every retry, kept for an operator."""
        return f"{self.namespace}:dead"

    def dedup(self, dedup_key: str) -> str:
        """Marks a platform delivery as seen (SET NX with TTL)."""
        return f"{self.namespace}:dedup:{dedup_key}"

    def conversation_seq(self, conversation_key: str) -> str:
        """Counter giving each enqueued message of a conversation its turn number."""
        return f"{self.namespace}:conv:{conversation_key}:seq"

    def conversation_done(self, conversation_key: str) -> str:
        """The last turn number of a conversation that has been fully handled."""
        return f"{self.namespace}:conv:{conversation_key}:done"

    def reply(self, dedup_key: str) -> str:
        """The answer of one message and how much of it has been delivered (a hash)."""
        return f"{self.namespace}:reply:{dedup_key}"

    def entry_failures(self, entry_id: str) -> str:
        """How many times handling one queue entry has failed unexpectedly."""
        return f"{self.namespace}:failures:{entry_id}"

    def stream(self, stream_id: str) -> str:
        """A streamed answer: the text shown so far and whether it is finished (a hash)."""
        return f"{self.namespace}:stream:{stream_id}"

    def active_streams(self, bot_id: str, user: str) -> str:
        """A user's unfinished streams with one bot (a sorted set by start time)."""
        return f"{self.namespace}:streams:{bot_id}:{user}"

    @property
    def send_pace_prefix(self) -> str:
        """Prefix of the pacing windows of sends (per robot, per conversation)."""
        return f"{self.namespace}:pace"

    def memory(self, session_key: str) -> str:
        """The turns of one session (a list of JSON objects)."""
        return f"{self.namespace}:mem:{session_key}"

    def limit_notice(self, user_key: str) -> str:
        """Set while an over-limit user has been told when to come back."""
        return f"{self.namespace}:limited:{user_key}"

    def token(self, name: str) -> str:
        """A cached platform access token."""
        return f"{self.namespace}:token:{name}"

    def token_lock(self, name: str) -> str:
        """Held by the one process fetching a new token."""
        return f"{self.namespace}:token:{name}:lock"

    @property
    def limits_prefix(self) -> str:
        """Prefix for the `limits` library's counters."""
        return f"{self.namespace}:limits"
