"""Prometheus metrics of retrieval, on the default registry (the worker exports it on worker.metrics_port)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RETRIEVAL_SECONDS = Histogram(
    "botgw_knowledge_retrieval_seconds",
    "Time to retrieve passages for a question (embedding, search, rerank)",
    ["bot"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PASSAGES = Histogram(
    "botgw_knowledge_passages", "Passages above the threshold per question", ["bot"], buckets=(0, 1, 2, 3, 4, 6, 8, 12)
)
# the no-answer rate of a bot is outcome="no_answer" over the sum of its outcomes
ANSWERS = Counter("botgw_knowledge_questions_total", "Questions by retrieval outcome", ["bot", "outcome"])
