"""The served embedder (knowledge.embedding.base_url → OpenAI /v1/embeddings, as vLLM's pooling runner serves it
with `botgw engine serve --profile embed-bge-m3`), against a small local HTTP server.

The server is a STUB of the HTTP shape only (vectors made from a hash of the characters, not a model): no model
hub is reachable here to load bge-m3, and what is checked is the request botgw sends and what it does with the
answer (the path with or without /v1, the key, the batches, the order by `index`, a vector of another size than
the store recorded, errors). The real embedded store is used."""

from __future__ import annotations

import hashlib
import http.server
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from knowledge.config import KnowledgeSettings
from knowledge.errors import EmbeddingMismatch, EmbeddingUnavailable
from knowledge.service import Knowledge

RETURNS = "# 退货说明\n\n## 退货期限\n\n签收后十五天之内，商品完好即可申请退货，运费由蓝鲸公司承担。\n"
PARKING = "# 园区停车\n\n## 访客车位\n\n访客车辆请停在东门外的地下二层，凭前台发放的停车券免费停放四小时。\n"


class EmbeddingsStub:
    """POST /v1/embeddings → {"data": [{"index", "embedding"}], ...} in a shuffled order; records each request."""

    def __init__(self) -> None:
        self.dim = 16
        self.status = 200
        self.requests: list[dict] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                stub.requests.append({"path": self.path, "auth": self.headers.get("authorization"), **body})
                if self.path != "/v1/embeddings":
                    return self._answer(404, {"detail": "Not Found"})
                if stub.status != 200:
                    return self._answer(stub.status, {"error": {"message": "the engine is overloaded"}})
                data = [{"object": "embedding", "index": i, "embedding": stub.vector(text)}
                        for i, text in enumerate(body["input"])]  # fmt: skip
                random.shuffle(data)
                self._answer(200, {"object": "list", "model": body["model"], "data": data})

            def _answer(self, status: int, payload: dict) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def vector(self, text: str) -> list[float]:
        """Characters hashed into `dim` buckets: texts sharing characters point the same way (a stand-in)."""
        vector = np.zeros(self.dim)
        for char in text:
            vector[int(hashlib.sha256(char.encode()).hexdigest(), 16) % self.dim] += 1.0
        return vector.tolist()


@pytest.fixture
def stub() -> Iterator[EmbeddingsStub]:
    made = EmbeddingsStub()
    yield made
    made.server.shutdown()


def settings(tmp_path: Path, base_url: str, **embedding: object) -> KnowledgeSettings:
    return KnowledgeSettings.model_validate(
        {"store": {"path": str(tmp_path / "store")}, "embedding": {"base_url": base_url, **embedding}}
    )


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
async def test_the_served_embedder_speaks_v1_embeddings(stub: EmbeddingsStub, tmp_path: Path, suffix: str) -> None:
    (tmp_path / "退货说明.md").write_text(RETURNS, encoding="utf-8")
    (tmp_path / "园区停车.md").write_text(PARKING, encoding="utf-8")
    knowledge = await Knowledge.open(settings(tmp_path, stub.url + suffix, api_key="sk-test", batch_size=2))
    try:
        outcomes = await knowledge.add("t", [tmp_path / "退货说明.md", tmp_path / "园区停车.md"])
        assert [o.status for o in outcomes] == ["added", "added"], outcomes
        hits = await knowledge.search(["t"], "签收后几天内可以退货？", 2)
        assert hits[0].doc == "退货说明.md"
    finally:
        await knowledge.aclose()
    assert {r["path"] for r in stub.requests} == {"/v1/embeddings"}, "base_url with or without /v1"
    assert {r["auth"] for r in stub.requests} == {"Bearer sk-test"}
    assert {r["model"] for r in stub.requests} == {"BAAI/bge-m3"}, "the model the embed-bge-m3 profile serves"
    assert {r["encoding_format"] for r in stub.requests} == {"float"}
    assert all(len(r["input"]) <= 2 for r in stub.requests), "batch_size"
    assert not any(text.startswith(("query: ", "passage: ")) for r in stub.requests for text in r["input"])
    assert stub.requests[-1]["input"] == ["签收后几天内可以退货？"], "the question itself, no e5 prefix for bge-m3"


async def test_answers_are_matched_to_their_texts_by_index(stub: EmbeddingsStub, tmp_path: Path) -> None:
    knowledge = await Knowledge.open(settings(tmp_path, stub.url))
    try:
        texts = ["退货", "停车", "发票", "保修", "积分", "配送"]
        vectors = await knowledge.embedder.passages(texts)
    finally:
        await knowledge.aclose()
    expected = np.asarray([stub.vector(text) for text in texts], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(vectors, expected)


async def test_a_vector_size_other_than_the_stores_is_a_clear_error(stub: EmbeddingsStub, tmp_path: Path) -> None:
    (tmp_path / "退货说明.md").write_text(RETURNS, encoding="utf-8")
    (tmp_path / "园区停车.md").write_text(PARKING, encoding="utf-8")
    knowledge = await Knowledge.open(settings(tmp_path, stub.url))
    try:
        assert [o.status for o in await knowledge.add("t", [tmp_path / "退货说明.md"])] == ["added"]
        stub.dim = 24  # the engine now serves another model under the same name
        with pytest.raises(EmbeddingMismatch, match=r"\(16 dimensions\).*\(24 dimensions\)"):
            await knowledge.search(["t"], "签收后几天内可以退货？", 2)
        with pytest.raises(EmbeddingMismatch, match="24 dimensions"):
            await knowledge.add("t", [tmp_path / "园区停车.md"])
        assert [r.doc for r in await knowledge.documents("t")] == ["退货说明.md"], "nothing of it was written"
        assert knowledge.store.count("t", "园区停车.md") == 0
    finally:
        await knowledge.aclose()


async def test_an_engine_that_fails_is_a_clear_error(stub: EmbeddingsStub, tmp_path: Path) -> None:
    (tmp_path / "退货说明.md").write_text(RETURNS, encoding="utf-8")
    stub.status = 503
    knowledge = await Knowledge.open(settings(tmp_path, stub.url))
    try:
        with pytest.raises(EmbeddingUnavailable, match=r"/v1/embeddings answered 503.*overloaded"):
            await knowledge.add("t", [tmp_path / "退货说明.md"])
        assert await knowledge.documents("t") == []
    finally:
        await knowledge.aclose()
    gone = await Knowledge.open(settings(tmp_path, "http://127.0.0.1:9/v1"))
    try:
        with pytest.raises(EmbeddingUnavailable, match="not reachable"):
            await gone.embedder.query("你好")
    finally:
        await gone.aclose()
