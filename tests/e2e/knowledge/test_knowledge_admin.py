"""The knowledge bases over the admin API (gateway/edge/kb_routes.py), against a real gateway process with the real
embedded store and the real offline embedder: the token, add → list → search → remove, hostile names, bad
uploads that change nothing, a store held by another process (503 with Retry-After, never a 500), and a second
upload while one is added (429; that test holds the first inside a stub of the served embedder, not by timing)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from knowledge.config import StoreSettings
from knowledge.store import KnowledgeStore
from testkit.configs import stack_config, write_config
from testkit.processes import ROOT, Proc, free_port
from testkit.services import start_gateway
from tests.unit.test_knowledge_served import EmbeddingsStub

FIXTURES = ROOT / "tests" / "fixtures" / "kb"
TOKEN = "admin-" + secrets.token_hex(12)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RETURNS = "# 退货说明\n\n## 退货期限\n\n签收后十五天之内，商品完好即可申请退货，运费由蓝鲸公司承担。\n"
PARKING = "# 园区停车\n\n## 访客车位\n\n访客车辆请停在东门外的地下二层，凭前台发放的停车券免费停放四小时。\n"


@dataclass
class AdminGateway:
    url: str
    store: Path
    proc: Proc

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers=kwargs.pop("headers", AUTH), timeout=60, **kwargs)  # type: ignore[arg-type]

    def upload(self, kb: str, *files: tuple[str, bytes], headers: dict | None = None) -> httpx.Response:
        parts = [("files", (name, data, "application/octet-stream")) for name, data in files]
        auth = AUTH if headers is None else headers
        return httpx.post(f"{self.url}/admin/kb/{kb}/documents", files=parts, headers=auth, timeout=120)

    def delete(self, path: str, headers: dict | None = None) -> httpx.Response:
        return httpx.delete(f"{self.url}{path}", headers=AUTH if headers is None else headers, timeout=60)

    def search(self, kb: str, question: str) -> list[dict]:
        response = self.get(f"/admin/kb/{kb}/search", params={"q": question, "top": 3})
        assert response.status_code == 200, response.text
        return response.json()

    def documents(self, kb: str) -> list[str]:
        response = self.get(f"/admin/kb/{kb}")
        return [] if response.status_code == 404 else [d["doc"] for d in response.json()["documents"]]


def start_admin(redis_url: str, log_dir: Path, store: Path, **knowledge: object) -> AdminGateway:
    """A gateway whose admin API serves the knowledge store in `store` (`knowledge` adds to its settings)."""
    namespace = "k" + secrets.token_hex(4)
    knowledge = {"store": {"path": str(store), "idle_release_s": 0.3}, "max_file_mb": 0.05, "max_upload_mb": 0.2,
                 **knowledge}  # fmt: skip
    config = stack_config(redis_url, "http://127.0.0.1:9", "http://127.0.0.1:9", namespace,
                          admin={"token": TOKEN}, knowledge=knowledge)  # fmt: skip
    path = write_config(log_dir / f"{namespace}.yaml", config)
    proc = start_gateway(path, free_port(), log_dir, name=f"gw-{namespace}")
    return AdminGateway(proc.admin_url, store, proc)


@pytest.fixture(scope="module")
def admin(redis_url: str, log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdminGateway]:
    made = start_admin(redis_url, log_dir, tmp_path_factory.mktemp("kb-admin") / "store")
    yield made
    made.proc.stop()


class HeldEmbeddings(EmbeddingsStub):
    """The served embedder's wire, held: each request waits until the test sets `release`, and `arrived` tells
    the test that an upload has got as far as embedding (it holds the upload slot there)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived, self.release = threading.Event(), threading.Event()
        held, answer = self, self.server.RequestHandlerClass

        class Held(answer):  # type: ignore[misc, valid-type]
            def do_POST(self) -> None:
                held.arrived.set()
                held.release.wait(120)
                super().do_POST()

        self.server.RequestHandlerClass = Held


def test_the_kb_endpoints_need_the_admin_token(admin: AdminGateway) -> None:
    kb = "tok" + secrets.token_hex(3)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        assert admin.get("/admin/kb", headers=headers).status_code == 401
        assert admin.get(f"/admin/kb/{kb}", headers=headers).status_code == 401
        assert admin.get(f"/admin/kb/{kb}/search", params={"q": "退货"}, headers=headers).status_code == 401
        assert admin.upload(kb, ("退货说明.md", RETURNS.encode()), headers=headers).status_code == 401
        assert admin.delete(f"/admin/kb/{kb}/documents/退货说明.md", headers=headers).status_code == 401
    assert admin.documents(kb) == [], "an upload without the token was ingested"


def test_add_list_search_remove(admin: AdminGateway) -> None:
    kb = "support" + secrets.token_hex(3)
    started = time.monotonic()
    added = admin.upload(kb, ("退货说明.md", RETURNS.encode()), ("园区停车.md", PARKING.encode()))
    assert added.status_code == 200, added.text
    statuses = {d["doc"]: d["status"] for d in added.json()["documents"]}
    assert statuses == {"退货说明.md": "added", "园区停车.md": "added"}
    print(f"\nupload of 2 small files: {time.monotonic() - started:.1f} s")

    bases = {b["kb"]: b for b in admin.get("/admin/kb").json()["bases"]}
    assert bases[kb]["documents"] == 2 and bases[kb]["chunks"] >= 2
    listed = admin.get(f"/admin/kb/{kb}").json()["documents"]
    assert {d["doc"] for d in listed} == {"退货说明.md", "园区停车.md"}
    assert all(d["source"].startswith("upload:") for d in listed), "an upload has no server path"

    hits = admin.search(kb, "买的东西不想要了多久内可以退")
    assert hits[0]["doc"] == "退货说明.md" and "十五天" in hits[0]["text"]
    assert set(hits[0]) >= {"doc", "title", "section", "score", "text"} and hits[0]["section"] == "退货期限"
    assert hits == sorted(hits, key=lambda h: h["fused"], reverse=True)
    per_doc = admin.get(f"/admin/kb/{kb}/search", params={"q": "退货 停车", "top": "5", "per_doc": "true"})
    assert per_doc.status_code == 200, per_doc.text
    assert sorted(hit["doc"] for hit in per_doc.json()) == ["园区停车.md", "退货说明.md"]  # one hit a document

    again = admin.upload(kb, ("退货说明.md", RETURNS.encode()))
    assert again.json()["documents"][0]["status"] == "unchanged"

    removed = admin.delete(f"/admin/kb/{kb}/documents/退货说明.md")
    assert removed.status_code == 200 and removed.json()["removed"] == "退货说明.md"
    assert admin.documents(kb) == ["园区停车.md"]
    assert all(h["doc"] != "退货说明.md" for h in admin.search(kb, "买的东西不想要了多久内可以退"))
    assert admin.delete(f"/admin/kb/{kb}/documents/退货说明.md").status_code == 404


def test_a_hostile_file_name_does_not_escape(admin: AdminGateway) -> None:
    kb = "names" + secrets.token_hex(3)
    marker = "x" + secrets.token_hex(4)
    before = {p for p in admin.store.parent.rglob("*") if p.is_file()}
    for name in (f"../../etc/{marker}.md", f"..\\..\\{marker}.md", f"/tmp/{marker}.md"):
        response = admin.upload(kb, (name, RETURNS.encode()))
        assert response.status_code == 200, response.text
        assert response.json()["documents"][0]["doc"] == f"{marker}.md"
    assert admin.documents(kb) == [f"{marker}.md"], "one document, by its bare name"
    for place in (Path("/etc"), Path("/tmp"), ROOT, ROOT.parent, ROOT.parent.parent, admin.store.parent):
        assert not (place / f"{marker}.md").exists(), f"an upload was written to {place}"
    written = {p for p in admin.store.parent.rglob("*") if p.is_file()} - before
    assert all(admin.store in p.parents for p in written), "only the store's own files changed"
    assert admin.upload(kb, ("..", RETURNS.encode())).status_code == 400
    assert admin.upload(kb, (".hidden.md", RETURNS.encode())).status_code == 400


def test_bad_input_gets_a_clear_4xx_and_changes_nothing(admin: AdminGateway) -> None:
    kb = "bad" + secrets.token_hex(3)
    assert admin.upload(kb, ("退货说明.md", RETURNS.encode())).status_code == 200
    good = ("园区停车.md", PARKING.encode())
    corrupt = b"%PDF-1.7\n1 0 obj << /Type /Catalog >>\nthis is not a pdf at all"
    url = f"{admin.url}/admin/kb/{kb}/documents"
    cases = {
        "a bad name": (admin.upload("bad name!", good), 400, "knowledge base name"),
        "a name ending in a newline": (admin.upload("support%0A", good), 400, "knowledge base name"),
        "no files": (httpx.post(url, files={"other": ("a.md", b"x")}, headers=AUTH, timeout=30), 400, "no files"),
        "not multipart": (httpx.post(url, json={"path": "/etc/passwd"}, headers=AUTH, timeout=30), 415, "multipart"),
        "a bad type": (admin.upload(kb, good, ("setup.exe", b"MZ\x90\x00")), 415, "unsupported format .exe"),
        "an empty file": (admin.upload(kb, good, ("空白.md", b"")), 400, "empty"),
        "a file too big": (admin.upload(kb, good, ("大文件.txt", "很长的文字。".encode() * 4000)), 413, "max_file_mb"),
        "a body too big": (admin.upload(kb, *[(f"{i}.txt", b"a" * 40_000) for i in range(7)]), 413, "max_upload_mb"),
        "a corrupt PDF": (admin.upload(kb, good, ("损坏.pdf", corrupt)), 422, "损坏.pdf"),
        "the same name twice": (admin.upload(kb, good, good), 400, "same name"),
    }
    for what, (response, status, says) in cases.items():
        assert response.status_code == status, (what, response.status_code, response.text)
        assert says in response.json()["error"], (what, response.json())
    assert admin.documents(kb) == ["退货说明.md"], "a refused upload changed the knowledge base"

    unknown = "nope" + secrets.token_hex(3)
    assert admin.get(f"/admin/kb/{unknown}").status_code == 404
    typo = admin.get(f"/admin/kb/{unknown}/search", params={"q": "退货"})
    assert typo.status_code == 404 and kb in typo.json()["bases"] and kb in typo.json()["error"]
    assert admin.get(f"/admin/kb/{kb}/search", params={"q": "退货", "per_doc": "maybe"}).status_code == 400
    assert admin.delete(f"/admin/kb/{unknown}/documents/退货说明.md").status_code == 404
    assert admin.get(f"/admin/kb/{kb}/search", params={"q": ""}).status_code == 400
    assert admin.get(f"/admin/kb/{kb}/search", params={"q": "退货", "top": "x"}).status_code == 400
    for top in ("²", "٣", "1e1", "-1", "0", "51"):  # "²".isdigit() is true, int("²") is not a number
        assert admin.get(f"/admin/kb/{kb}/search", params={"q": "退货", "top": top}).status_code == 400, top


def test_a_second_upload_while_one_is_added_is_a_429_and_changes_nothing(
    redis_url: str, log_dir: Path, tmp_path: Path
) -> None:
    """One upload at a time per gateway (each holds its files in memory and takes a core to embed). The first one
    is held inside its embedding, so the second certainly comes while it is being added, however busy the machine."""
    import concurrent.futures

    embeddings = HeldEmbeddings()
    held = start_admin(redis_url, log_dir, tmp_path / "store", embedding={"base_url": embeddings.url})
    kb = "busy" + secrets.token_hex(3)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(held.upload, kb, ("园区停车.md", PARKING.encode()))
            assert embeddings.arrived.wait(60), "the first upload never reached its embedding"
            second = held.upload(kb, ("退货说明.md", RETURNS.encode()))
            assert second.status_code == 429, second.text
            assert "another upload" in second.json()["error"] and second.headers["Retry-After"]
            embeddings.release.set()
            assert first.result(timeout=120).status_code == 200
        assert held.documents(kb) == ["园区停车.md"]
        assert held.upload(kb, ("退货说明.md", RETURNS.encode())).status_code == 200, "free again once it is done"
    finally:
        embeddings.release.set()
        held.proc.stop()
        embeddings.server.shutdown()


def test_a_store_held_by_another_process_is_a_503_with_retry_after(admin: AdminGateway) -> None:
    kb = "held" + secrets.token_hex(3)
    assert admin.upload(kb, ("退货说明.md", RETURNS.encode())).status_code == 200
    held = KnowledgeStore.open(StoreSettings(path=str(admin.store)), wait_s=15)  # the gateway let go when idle
    try:
        for response in (admin.get("/admin/kb"), admin.upload(kb, ("园区停车.md", PARKING.encode())),
                         admin.get(f"/admin/kb/{kb}/search", params={"q": "退货"}),
                         admin.delete(f"/admin/kb/{kb}/documents/退货说明.md")):  # fmt: skip
            assert response.status_code == 503, response.text
            assert int(response.headers["retry-after"]) > 0
            assert "held by another process" in response.json()["error"]
    finally:
        held.close()
    assert admin.documents(kb) == ["退货说明.md"], "a refused request changed something"
    assert b"Traceback" not in admin.proc.log_path.read_bytes()
