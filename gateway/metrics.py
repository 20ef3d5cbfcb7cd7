"""Prometheus metrics of the gateway and the workers (next to vLLM's own)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ACK_LATENCY = Histogram(
    "botgw_ack_latency_seconds",
    "Time from a callback's arrival to its acknowledgement",
    ["platform"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
CALLBACKS = Counter("botgw_callbacks_total", "Callbacks by outcome", ["platform", "outcome"])
REJECTED = Counter("botgw_callbacks_rejected_total", "Callbacks refused, by reason", ["platform", "reason"])
DEDUP_HITS = Counter("botgw_dedup_hits_total", "Platform retries recognised and dropped", ["platform"])
IGNORED = Counter(
    "botgw_messages_ignored_total",
    "Messages a bot does not answer (its allow/deny lists, a group message without its prefix), by reason",
    ["platform", "reason"],
)
MEDIA = Counter(
    "botgw_media_total",
    "Attachments read (read_image, read_audio, read_file, read_quote) or refused (expired, too_large, …)",
    ["platform", "outcome"],
)
def count_ignored(platform: str, reason: str) -> None:
    IGNORED.labels(platform, reason).inc()


LIMIT_HITS = Counter(
    "botgw_limit_hits_total",
    "Messages refused by a limit, by kind (messages, tokens_per_minute, …)",
    ["platform", "kind"],
)
QUEUE_DEPTH = Gauge("botgw_queue_depth", "Entries waiting or in progress in the work queue")
QUEUE_AGE = Gauge("botgw_queue_oldest_age_seconds", "Age of the oldest entry in the work queue")
DEAD_LETTERS = Gauge("botgw_dead_letters", "Messages in the dead-letter stream, waiting for an operator")
STREAM_CONNECTED = Gauge(
    "botgw_dingtalk_stream_connected", "1 while a DingTalk bot's Stream connection is open, else 0", ["bot_id"]
)

ENGINE_LATENCY = Histogram(
    "botgw_engine_latency_seconds",
    "Engine time per answer",
    ["phase"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160),
)
ENGINE_TOKENS = Counter("botgw_engine_tokens_total", "Tokens used, by kind and platform", ["platform", "kind"])
ENGINE_ERRORS = Counter("botgw_engine_errors_total", "Engine calls that failed", ["retryable"])
REPLIES = Counter("botgw_replies_total", "Answers handled by the workers, by outcome", ["platform", "outcome"])
SEND_FAILURES = Counter("botgw_send_failures_total", "Failed platform sends by error code", ["platform", "code"])
PULLED = Counter(
    "botgw_pulled_items_total", "Items a pull found, by kind and what became of them", ["platform", "kind", "outcome"]
)
PLATFORM_EVENTS = Counter(
    "botgw_platform_events_total", "Platform events (e.g. msg_send_fail:6)", ["platform", "event"]
)
KF_SEND_FAILED = Counter(
    "botgw_kf_send_failed_total", "Messages the platform accepted and later reported undelivered, by fail_type",
    ["bot_id", "fail_type"],
)
KF_CURSOR_RESETS = Counter(
    "botgw_kf_cursor_reset_total", "Saved pull cursors the platform refused (dropped; pulled again from the start)",
    ["bot_id"],
)
PULL_RETRIES = Counter(
    "botgw_pull_retries_total",
    "Failed pulls of a pulled channel (微信客服), queued again: a pull is never given up",
    ["platform", "bot_id"],
)
HANDOFFS = Counter("botgw_handoffs_total", "Conversations handed to a human, by destination", ["platform", "to"])
WITHHELD = Counter(
    "botgw_withheld_total", "Answers not sent by the platform's rules, by reason", ["platform", "reason"]
)
LEASE_TAKEOVERS = Counter(
    "botgw_lease_takeovers_total", "Messages whose worker stopped renewing its lease, handed on to another worker"
)
LEASES_LOST = Counter("botgw_leases_lost_total", "Answers this worker stopped because its lease had passed on")
# Poison messages (gateway/worker/loop.py, SUSPECT_AFTER_TAKEOVERS). A run alone that ends its worker ends the
# worker's own counts with it, so the deaths are counted by the sweep that hands the message on (in Redis, the
# scheduler's stats) and exported by the gateways at each scrape, as the queue's depth is.
RUN_ALONE = Counter(
    "botgw_messages_run_alone_total",
    "Runs of a message taken over twice from dying workers, alone in this worker (a run that ends it is lost here)",
)
DEATHS_ALONE = Gauge(
    "botgw_deaths_alone",
    "Workers ended or stalled while running a message alone, since the namespace was created (read from Redis)",
)
POISON_GIVEN_UP = Counter(
    "botgw_poison_messages_given_up_total", "Messages given up (dead letters) after ending the workers that ran them"
)
# Tools (issue 24): labelled by server.tool, a set the configuration bounds.
TOOL_CALLS = Counter(
    "botgw_tool_calls_total", "MCP tool calls by tool and outcome (ok, error, timeout, refused, unknown)",
    ["tool", "outcome"],
)
TOOL_CALL_SECONDS = Histogram(
    "botgw_tool_call_seconds", "How long an MCP tool call took", ["tool"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60),
)
TOOL_CONFIRMATIONS = Counter(
    "botgw_tool_confirmations_total",
    "Confirmations before a tool call: asked, given, cancelled, superseded (the asker wrote something else), expired",
    ["event"],
)
# Per user would be an unbounded label set; per bot shows which bot's users wait (`botgw limits show` per user).
QUEUE_WAIT = Histogram(
    "botgw_queue_wait_seconds",
    "Time from enqueue until a worker took the message",
    ["platform", "bot"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
