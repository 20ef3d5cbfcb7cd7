"""Every Redis key botgw uses, and only here, under one namespace (default `botgw`).

Keys that hold a conversation or session embed the normalized keys of InboundMessage,
so that any replica computes the same name.

Redis Cluster: a script (or MULTI) may only touch keys of one hash slot. Every key that a
script touches together with the queue (the scheduler's keys, dedup marks, signature
bindings, dead letters, reply records, memory, streams, and what is fenced by a lease: pull cursors, the
holder of a conversation and its reply quota) starts with the hash tag `{<ns>}`
(`core`), so they share one slot; the token budgets, which one script checks for a user
and their group together, share `{<ns>:budget}`. Every other key stands alone and spreads
over the cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names for one namespace; several deployments can share a Redis with different ones."""

    namespace: str = "botgw"

    @property
    def core(self) -> str:
        """The hash-tagged prefix of every key that the queue's, the reply record's and the streams' scripts
        touch together (one slot in a Redis Cluster). The scheduler's Lua scripts build names from it."""
        return "{" + self.namespace + "}"

    # The scheduler's keys. Its Lua scripts build the same names from `core` (`{<ns>}:sched:…`).

    @property
    def scheduler_stats(self) -> str:
        """Counters: entries enqueued, handled, leases taken over."""
        return f"{self.core}:sched:stats"

    @property
    def scheduler_wake(self) -> str:
        """A list workers block on (BLPOP); one item is pushed whenever a lane becomes ready."""
        return f"{self.core}:sched:wake"

    @property
    def scheduler_lanes(self) -> str:
        """Every lane holding work, scored by its oldest entry's enqueue time (ms): the queue's age."""
        return f"{self.core}:sched:lanes"

    @property
    def scheduler_ready(self) -> str:
        """Lanes that can run now, scored by virtual time (round-robin across users, weighted per bot)."""
        return f"{self.core}:sched:ready"

    @property
    def scheduler_leases(self) -> str:
        """Lanes leased now, scored by when their lease runs out (the sweep hands on the expired ones)."""
        return f"{self.core}:sched:leases"

    @property
    def scheduler_epoch(self) -> str:
        """The last lease epoch handed out, for every lane (one counter, so that no epoch is ever reused)."""
        return f"{self.core}:sched:epoch"

    def lane(self, lane: str) -> str:
        """One conversation's (or session's) queued entries, oldest first (a list of JSON objects)."""
        return f"{self.core}:sched:lane:{lane}"

    def lease(self, lane: str) -> str:
        """Who works on a lane's head entry now, and at which epoch (a hash: owner, epoch, u)."""
        return f"{self.core}:sched:lease:{lane}"

    def active_lanes(self, user: str) -> str:
        """The lanes of one user being worked on now (a set), for max_concurrent_per_user."""
        return f"{self.core}:sched:active:{user}"

    @property
    def dead_letters(self) -> str:
        """Messages that could not be answered after every retry, kept for an operator."""
        return f"{self.core}:dead"

    def dedup(self, dedup_key: str) -> str:
        """Marks a platform delivery as seen (SET NX with TTL)."""
        return f"{self.core}:dedup:{dedup_key}"

    def signature_binding(self, bot_id: str, signature: str) -> str:
        """The messages a (timestamp, sign) pair came with when first seen: a reuse with another one is a replay."""
        digest = hashlib.sha1(signature.encode()).hexdigest()[:24]
        return f"{self.core}:sigbind:{bot_id}:{digest}"

    def pull_cursor(self, bot_id: str, channel: str) -> str:
        """Where the next pull of a pulled channel (a 微信客服 account) starts; saved only after enqueueing."""
        return f"{self.core}:pull:cursor:{bot_id}:{channel}"

    def first_pull(self, bot_id: str, channel: str) -> str:
        """When the first pull of a pulled channel that has no cursor yet was asked for (kept until a cursor is
        saved): what came before it is history, whichever later pull takes over from a failing first one."""
        return f"{self.core}:pull:first:{bot_id}:{channel}"

    def legacy_pull_cursor(self, bot_id: str, channel: str) -> str:
        """The cursor's name before it moved into the core slot (to be fenced by the pull's lease): read once, so
        that an upgrade continues where the old release stopped instead of skipping what came meanwhile."""
        return f"{self.namespace}:pull:cursor:{bot_id}:{channel}"

    def conversation_owner(self, lane: str) -> str:
        """Who holds a conversation on a platform with human agents (bot / human / free), cached."""
        return f"{self.core}:owner:{lane}"

    def reply_quota(self, lane: str) -> str:
        """Messages sent to a person since they last wrote (a counter that expires with the platform's window)."""
        return f"{self.core}:quota:{lane}"

    def reply(self, dedup_key: str) -> str:
        """The answer of one message and how much of it has been delivered (a hash)."""
        return f"{self.core}:reply:{dedup_key}"

    def sent_piece(self, bot_id: str, message_id: str) -> str:
        """Which reply a message the platform accepted belongs to (its id → record), for a later report that it
        was not delivered after all (微信客服 msg_send_fail); lives as long as such a report can come."""
        return f"{self.core}:sent:{bot_id}:{message_id}"

    def entry_failures(self, entry_id: str) -> str:
        """How many times handling one queue entry has failed unexpectedly."""
        return f"{self.namespace}:failures:{entry_id}"

    def recent_send(self, bot_id: str, digest: str) -> str:
        """A piece content recently sent to one recipient (a string with the platform's duplicate-check TTL)."""
        return f"{self.namespace}:recent:{bot_id}:{digest}"

    def stream(self, stream_id: str) -> str:
        """A streamed answer: the text shown so far and whether it is finished (a hash)."""
        return f"{self.core}:stream:{stream_id}"

    def stream_events(self, stream_id: str) -> str:
        """Pub/sub channel told of every update of one stream (the web page's SSE waits on it)."""
        return f"{self.namespace}:streamev:{stream_id}"

    def active_streams(self, bot_id: str, user: str) -> str:
        """A user's unfinished streams with one bot (a sorted set by start time)."""
        return f"{self.core}:streams:{bot_id}:{user}"

    @property
    def send_pace_prefix(self) -> str:
        """Prefix of the pacing windows of sends (per robot, per conversation)."""
        return f"{self.namespace}:pace"

    def memory(self, session_key: str) -> str:
        """The turns of one session (a list of JSON objects)."""
        return f"{self.core}:mem:{session_key}"

    def attachments(self, session_key: str) -> str:
        """The text of the files a session was sent (a hash by message; the memory's lifetime)."""
        return f"{self.core}:files:{session_key}"

    def web_upload(self, bot_id: str, owner: str, ref: str) -> str:
        """A file a page user attached (a hash: data, mime, name; expires): named by its owner, so that a ref is
        no one else's (gateway/state/uploads.py)."""
        return f"{self.namespace}:upload:{bot_id}:{owner}:{ref}"

    def console_session(self, digest: str) -> str:
        """One console sign-in (a hash: who, via, csrf; expires), named by the SHA-256 of its cookie."""
        return f"{self.namespace}:console:session:{digest}"

    def console_sign_in_failures(self, digest: str) -> str:
        """Wrong admin tokens typed into the console's sign-in from one address this minute (a counter; expires)."""
        return f"{self.namespace}:console:fails:{digest}"

    def console_login_code(self, digest: str) -> str:
        """A platform's sign-in code the console has used (kept while such a code lives): tried once."""
        return f"{self.namespace}:console:code:{digest}"

    @property
    def console_audit(self) -> str:
        """Every change made on the console, with who made it (a stream, capped)."""
        return f"{self.namespace}:console:audit"

    def tool_ledger(self, call_set: str) -> str:
        """One answer's tool calls (issue 24): each recorded before it is made and its result after (a hash)."""
        return f"{self.namespace}:tools:ledger:{call_set}"

    def tool_confirmation(self, session_key: str) -> str:
        """The tool call waiting for the asker's 确认/取消 in one conversation (a JSON string with a TTL)."""
        return f"{self.namespace}:tools:confirm:{session_key}"

    @property
    def tools_audit(self) -> str:
        """The tools' audit trail: a stream, trimmed by age and length."""
        return f"{self.namespace}:tools:audit"

    def memory_adopted(self, session_key: str) -> str:
        """Set once a person's memory has taken over their one-to-one memory kept per bot before (never again)."""
        return f"{self.core}:memadopt:{session_key}"

    def limit_notice(self, user_key: str) -> str:
        """Set while an over-limit user has been told when to come back."""
        return f"{self.namespace}:limited:{user_key}"

    def token(self, name: str) -> str:
        """A cached platform access token."""
        return f"{self.namespace}:token:{name}"

    def token_lock(self, name: str) -> str:
        """Held by the one process fetching a new token."""
        return f"{self.namespace}:token:{name}:lock"

    def token_budget(self, who: str, bucket: str) -> str:
        """Tokens used by a user or group in one minute or day bucket (a counter)."""
        return f"{self.budget}:tok:{who}:{bucket}"

    def message_window(self, who: str, window_id: str) -> str:
        """The messages a user or group had admitted in one moving window (a sorted set by time); beside the token
        budgets, so that one script checks a sender's and their group's windows together."""
        return f"{self.budget}:win:{who}:{window_id}"

    @property
    def budget(self) -> str:
        """The hash-tagged prefix of the token budgets: one script checks a user's and their group's together."""
        return "{" + self.namespace + ":budget}"

    @property
    def limits_prefix(self) -> str:
        """Prefix for the `limits` library's counters."""
        return f"{self.namespace}:limits"

    @property
    def pulse(self) -> str:
        """The hash-tagged prefix of the processes' activity for the console's overview (gateway/state/pulse.py:
        per-minute counts, last answer times, token errors, each live process): one slot, one flush a trip."""
        return "{" + self.namespace + ":pulse}"

    def kf_handoffs(self, bot_id: str) -> str:
        """The 微信客服 customers one bot handed to a human (a sorted set by when; each customer's entry is a hash
        named `<this>:<open_kfid>/<external_userid>`, gateway/state/handoffs.py): in the core slot, beside the
        holder cache and the lease its writes are fenced by."""
        return f"{self.core}:kfhand:{bot_id}"
