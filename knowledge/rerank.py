"""An optional cross-encoder reranker through vLLM's `/rerank` (Jina/Cohere-compatible), e.g. bge-reranker-v2-m3.

It reads the question and each passage together, so its score says more than a cosine; it is also slower, so
only the fused top candidates go to it. A failure is raised, and search falls back to the fused order: an error
here must not silently empty the results (a complaint of AstrBot's users)."""

from __future__ import annotations

import httpx

from bots.urls import redact_url
from knowledge.config import RerankSettings
from knowledge.errors import KnowledgeError


class RerankUnavailable(KnowledgeError):
    """The reranker could not be reached or answered something unusable."""


class Reranker:
    def __init__(self, settings: RerankSettings, http: httpx.AsyncClient | None = None) -> None:
        assert settings.base_url
        self._url = f"{settings.base_url.removesuffix('/v1')}/rerank"
        self._at = redact_url(self._url)  # for messages: no credentials
        self._settings = settings
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=settings.timeout_s)

    async def scores(self, question: str, passages: list[str]) -> list[float]:
        """One relevance score per passage, in the passages' order."""
        headers = {}
        if self._settings.api_key:
            headers["Authorization"] = f"Bearer {self._settings.api_key.get_secret_value()}"
        body = {"model": self._settings.model, "query": question, "documents": passages, "top_n": len(passages)}
        try:
            response = await self._http.post(self._url, json=body, headers=headers, timeout=self._settings.timeout_s)
        except httpx.HTTPError as exc:
            raise RerankUnavailable(f"the reranker at {self._at} is not reachable ({exc!r})") from None
        if response.status_code != 200:
            raise RerankUnavailable(f"the reranker at {self._at} answered {response.status_code}")
        scores = [float("nan")] * len(passages)
        try:
            for result in response.json()["results"]:
                scores[int(result["index"])] = float(result["relevance_score"])
        except (ValueError, KeyError, TypeError, IndexError):
            raise RerankUnavailable(f"the reranker at {self._at} answered no usable results") from None
        if any(score != score for score in scores):  # NaN: a passage left unscored
            raise RerankUnavailable(f"the reranker at {self._at} scored {len(passages)} passages only in part")
        return scores

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()
