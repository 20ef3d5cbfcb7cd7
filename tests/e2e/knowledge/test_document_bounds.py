"""Hostile documents in the bad-input corpus (issue 19, item 5): what reading an uploaded DOCX, XLSX or PDF may cost.

Each sample is built here at run time (nothing big is committed) and parsed in a child process of its own, which
must refuse it with the clear FileRejected that the admin API answers 422 and `botgw kb add` prints, while the
child's peak RSS (VmHWM, reset before the parse) grows by less than RSS_BOUND_MB. The child runs under an address
space limit and a timeout, so that a parser without the bounds fails the test instead of taking the machine down.
Before knowledge/bounds.py the samples cost, on the machine these tests were written on: a 70 MB document.xml under
word/media/ was added (+151 MB), a 0.5 MB DOCX with a 512 MB "image" was added (+1 GB), 1.5 million one-word
paragraphs took 1 GB and 136 s before being refused, a 1 KB XLSX whose grid spans A1:XFD1048576 ran out of a 3 GB
address space, and a PDF of 5,000 pages or with a stream inflating to 60 MB was added.

The repo's own DOCX, XLSX and PDF still parse (the same blocks as before); over the admin API each hostile sample is
a 422 that says why, and nothing is added; `botgw kb add` reports each without a traceback.
"""

from __future__ import annotations

import functools
import io
import json
import re
import resource
import secrets
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.configs import write_config
from testkit.processes import BOTGW, ROOT, child_env
from tests.e2e.knowledge.test_knowledge_admin import RETURNS, start_admin

FIXTURES = ROOT / "tests" / "fixtures" / "kb"
MB = 1024 * 1024
RSS_BOUND_MB = 100
CHILD_ADDRESS_SPACE = 3 * 1024 * MB  # an unbounded parser fails here (MemoryError) rather than swapping
CHILD_TIMEOUT_S = 90

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
PACKAGE_RELS = "http://schemas.openxmlformats.org/package/2006/relationships"
OOXML = "application/vnd.openxmlformats-officedocument"


def _types(*overrides: tuple[str, str]) -> str:
    listed = "".join(f'<Override PartName="/{part}" ContentType="{OOXML}.{kind}"/>' for part, kind in overrides)
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
        'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
        'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
        f'<Default Extension="png" ContentType="image/png"/>{listed}</Types>'
    )


def _rels(*rels: tuple[str, str]) -> str:
    listed = "".join(
        f'<Relationship Id="rId{n}" Type="{R}/{kind}" Target="{target}"/>'
        for n, (kind, target) in enumerate(rels, start=1)
    )
    return f'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="{PACKAGE_RELS}">{listed}</Relationships>'


def _part(archive: zipfile.ZipFile, name: str, *pieces: bytes, repeat: bytes = b"", times: int = 0) -> None:
    """A deflated part written as it is made: `pieces[0]`, `repeat` `times` times, then the other pieces."""
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with archive.open(info, "w", force_zip64=True) as part:
        part.write(pieces[0])
        for _ in range(times):
            part.write(repeat)
        for piece in pieces[1:]:
            part.write(piece)


def docx(document_at: str = "word/document.xml", paragraph: bytes = b"", times: int = 0, image_mb: int = 0) -> bytes:
    """A DOCX whose main document lives at `document_at` (one real paragraph, then `paragraph` `times` times) and
    that relates to an image of `image_mb` MB of zeros (they compress about 1000 to 1)."""
    folder, _, leaf = document_at.rpartition("/")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", _types((document_at, "wordprocessingml.document.main+xml")))
        archive.writestr("_rels/.rels", _rels(("officeDocument", document_at)))
        archive.writestr(f"{folder}/_rels/{leaf}.rels", _rels(*([("image", "media/image1.png")] if image_mb else [])))
        head = f'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="{W}" xmlns:r="{R}"><w:body>'.encode()
        text = "<w:p><w:r><w:t>退货须在签收后十五天之内申请，商品完好即可。</w:t></w:r></w:p>".encode()
        _part(archive, document_at, head + text, b"</w:body></w:document>", repeat=paragraph, times=times)
        if image_mb:
            _part(archive, f"{folder}/media/image1.png", b"\x89PNG\r\n\x1a\n", repeat=bytes(MB), times=image_mb)
    return out.getvalue()


def xlsx(
    strings_at: str = "xl/sharedStrings.xml",
    strings: int = 0,
    long_string_mb: int = 0,
    dimension: str = "A1:B2",
    last_row: int = 0,
    cell_formats: int = 0,
) -> bytes:
    """A one-sheet Q&A workbook: its shared strings at `strings_at`, with `strings` more tiny ones or one of
    `long_string_mb` MB; a sheet whose grid says `dimension`, with a lone row at `last_row`; `cell_formats` styles."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            "[Content_Types].xml",
            _types(
                ("xl/workbook.xml", "spreadsheetml.sheet.main+xml"),
                ("xl/worksheets/sheet1.xml", "spreadsheetml.worksheet+xml"),
                (strings_at, "spreadsheetml.sharedStrings+xml"),
            ),
        )
        archive.writestr("_rels/.rels", _rels(("officeDocument", "xl/workbook.xml")))
        archive.writestr(
            "xl/workbook.xml",
            f'<workbook xmlns="{S}" xmlns:r="{R}"><sheets><sheet name="问答" '
            'sheetId="1" r:id="rId1"/></sheets></workbook>',
        )
        archive.writestr(
            "xl/_rels/workbook.xml.rels",
            _rels(("worksheet", "worksheets/sheet1.xml"), ("sharedStrings", f"/{strings_at}")),
        )
        qa = "<si><t>问题</t></si><si><t>答案</t></si><si><t>怎么退货？</t></si><si><t>签收后十五天之内申请。</t></si>"
        head = f'<?xml version="1.0" encoding="UTF-8"?><sst xmlns="{S}">{qa}'.encode()
        if long_string_mb:
            _part(archive, strings_at, head + b"<si><t>", b"</t></si></sst>", repeat=b"x" * MB, times=long_string_mb)
        else:
            _part(archive, strings_at, head, b"</sst>", repeat=b"<si><t>9</t></si>" * 1000, times=strings // 1000)
        rows = '<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c></row>'
        rows += '<row r="2"><c r="A2" t="s"><v>2</v></c><c r="B2" t="s"><v>3</v></c></row>'
        rows += f'<row r="{last_row}"><c r="A{last_row}" t="s"><v>2</v></c></row>' if last_row else ""
        archive.writestr(
            "xl/worksheets/sheet1.xml",
            f'<worksheet xmlns="{S}"><dimension ref="{dimension}"/><sheetData>{rows}</sheetData></worksheet>',
        )
        if cell_formats:
            xf = b'<xf numFmtId="14" fontId="0" fillId="0" borderId="0" xfId="0"/>'
            head = f'<styleSheet xmlns="{S}"><cellXfs count="{cell_formats}">'.encode()
            _part(
                archive, "xl/styles.xml", head, b"</cellXfs></styleSheet>", repeat=xf * 1000, times=cell_formats // 1000
            )
    return out.getvalue()


def pdf(pages: int = 1, inflating_mb: int = 0, inflating_pages: int = 0) -> bytes:
    """`pages` pages of one line of text each; the first `inflating_pages` of them have a FlateDecode content
    stream that inflates to `inflating_mb` MB (the line, then spaces: about 1000 to 1)."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for number in range(1, pages + 1):
        line = f"BT /F1 12 Tf 72 720 Td (Refunds: ask within fifteen days, page {number}.) Tj ET\n".encode()
        if number <= inflating_pages:
            packer = zlib.compressobj(9)
            packed = packer.compress(line) + b"".join(packer.compress(b" " * MB) for _ in range(inflating_mb))
            packed += packer.flush()
            objects.append(b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(packed), packed))
        else:
            objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(line), line))
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents %d 0 R >>" % len(objects)
        )
        kids.append(b"%d 0 R" % len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), pages)
    out = io.BytesIO(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    out.seek(0, io.SEEK_END)
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


@dataclass(frozen=True)
class Sample:
    name: str
    build: Callable[[], bytes]
    refused: str | None  # a regular expression the refusal matches; None: it parses


ONE_WORD = b"<w:p><w:r><w:t>x</w:t></w:r></w:p>"
HOSTILE = [
    Sample(
        "正文在media.docx",
        lambda: docx(
            "word/media/document.xml",
            b"<w:p><w:r><w:t>" + "退货说明".encode() * 2500 + b"</w:t></w:r></w:p>",
            times=2450,  # 70 MB
        ),
        r"its text unpacks to 7\d MB, over 64 MB \(word/media/document\.xml alone: 7\d MB\)",
    ),
    Sample(
        "512MB图片.docx",
        lambda: docx(image_mb=512),
        r"its parts declare 512 MB unpacked, over 256 MB \(word/media/image1\.png alone: 512 MB\): a zip bomb",
    ),
    Sample(
        "百万段落.docx",
        lambda: docx(paragraph=ONE_WORD * 1000, times=1500),
        r"over 100000 paragraphs \(word/document\.xml\): split the document",
    ),
    Sample(
        "字符串在media.xlsx",
        lambda: xlsx("xl/media/sharedStrings.xml", long_string_mb=100),
        r"its text unpacks to 100 MB, over 64 MB \(xl/media/sharedStrings\.xml alone: 100 MB\)",
    ),
    Sample(
        "两百万字符串.xlsx",
        lambda: xlsx(strings=2_000_000),
        r"over 500000 shared strings \(xl/sharedStrings\.xml\): split the document",
    ),
    Sample(
        "整张网格.xlsx",
        lambda: xlsx(dimension="A1:XFD1048576", last_row=1_048_576),
        r"over 2000000 cells \(empty ones in the sheet's grid included\)",
    ),
    Sample(
        "样式炸弹.xlsx",
        lambda: xlsx(cell_formats=500_000),
        r"its XML has over 50000 elements \(xl/styles\.xml and the parts read before it\)",
    ),
    Sample("五千页.pdf", lambda: pdf(pages=5000), r"over 2000 pages \(5000 pages\): split the PDF"),
    Sample(
        "膨胀流.pdf",
        lambda: pdf(inflating_mb=60, inflating_pages=1),
        r"a stream in the PDF decodes to over 16 MB: a compression bomb",
    ),
    Sample(
        "二十个流.pdf",
        lambda: pdf(pages=20, inflating_mb=10, inflating_pages=20),
        r"its pages' streams decode to over 64 MB by page 7",
    ),
]
# Within the bounds, and parsed: an image that is never unpacked (python-docx used to load it: +100 MB).
PARSED = [
    Sample("100MB图片.docx", lambda: docx(image_mb=100), None),
    *(
        Sample(name, functools.partial((FIXTURES / name).read_bytes), None)
        for name in ("员工手册.docx", "实习生管理办法.docx", "产品故障代码.xlsx", "差旅报销制度.pdf")
    ),
]

CHILD = r"""
import json, sys, time
from pathlib import Path

import docx, docx.table, openpyxl.reader.excel, pypdf, pypdf.generic  # imports are not the parse's cost
from knowledge.errors import FileRejected
from knowledge.formats import parse

def kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

path = Path(sys.argv[1])
data = path.read_bytes()
try:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM back to the current RSS
except OSError:
    pass
before, started = kib("VmRSS"), time.process_time()
try:
    document = parse(path.name, data)
    outcome = {"blocks": len(document.blocks)}
except FileRejected as exc:
    outcome = {"refused": str(exc)}
outcome.update(growth_mb=(kib("VmHWM") - before) / 1024, cpu_s=round(time.process_time() - started, 2))
print(json.dumps(outcome, ensure_ascii=False))
"""


@functools.cache
def sample_bytes(sample: Sample) -> bytes:
    return sample.build()


def parse_in_child(tmp_path: Path, sample: Sample) -> dict:
    path = tmp_path / sample.name
    path.write_bytes(sample_bytes(sample))

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))

    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        preexec_fn=bounded,
        check=False,
    )
    assert done.returncode == 0, f"{sample.name}: the parse failed, not refused:\n{done.stderr[-3000:]}"
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n{sample.name} ({len(sample_bytes(sample)) / 1024:.0f} KB): {outcome}")
    return outcome


@pytest.mark.parametrize("sample", HOSTILE, ids=[s.name for s in HOSTILE])
def test_a_hostile_document_is_refused_within_the_memory_bound(tmp_path: Path, sample: Sample) -> None:
    assert len(sample_bytes(sample)) < 2 * MB, "a sample stays within an ordinary upload limit"
    outcome = parse_in_child(tmp_path, sample)
    assert "refused" in outcome, f"{sample.name} was parsed: {outcome}"
    assert sample.refused and re.search(sample.refused, outcome["refused"]), outcome["refused"]
    assert outcome["growth_mb"] < RSS_BOUND_MB, outcome


@pytest.mark.parametrize("sample", PARSED, ids=[s.name for s in PARSED])
def test_a_document_within_the_bounds_still_parses(tmp_path: Path, sample: Sample) -> None:
    outcome = parse_in_child(tmp_path, sample)
    assert outcome.get("blocks", 0) > 0, outcome
    assert outcome["growth_mb"] < RSS_BOUND_MB, outcome


def test_the_repo_documents_parse_as_before() -> None:
    """The bounded readers give the parsers the same text: titles, sections and blocks of the fixtures."""
    from knowledge.formats import parse

    handbook = parse("员工手册.docx", (FIXTURES / "员工手册.docx").read_bytes())
    assert handbook.title == "青岚科技员工手册" and len(handbook.blocks) == 8
    assert any(b.section == ("第二章 假期", "年休假") and "次年 3 月 31 日" in b.text for b in handbook.blocks)
    assert any("婚假 | 10 天 | 结婚证" in b.text for b in handbook.blocks)
    faults = parse("产品故障代码.xlsx", (FIXTURES / "产品故障代码.xlsx").read_bytes())
    assert len(faults.blocks) == 8 and faults.blocks[0].question == "空气净化器显示错误码 E1 是什么意思？"
    assert faults.blocks[0].section == ("空气净化器故障",)
    travel = parse("差旅报销制度.pdf", (FIXTURES / "差旅报销制度.pdf").read_bytes())
    assert travel.title == "差旅报销制度" and len(travel.blocks) == 7


def test_a_zip_part_that_lies_about_its_size_is_refused() -> None:
    """The directory says document.xml is 100 bytes; its deflate stream holds 10 MB. zipfile hands out no more
    than the 100 bytes, and then the part fails its CRC: refused as damaged, never read past its declared size."""
    from knowledge.errors import FileRejected
    from knowledge.formats import parse

    packed = io.BytesIO()
    with (
        zipfile.ZipFile(
            io.BytesIO(docx(paragraph=b"<w:p><w:r><w:t>" + b"x" * 10_000 + b"</w:t></w:r></w:p>", times=1000))
        ) as source,
        zipfile.ZipFile(packed, "w") as archive,
    ):
        for info in source.infolist():  # written again without zip64, so the size is in the directory entry
            archive.writestr(info.filename, source.read(info), zipfile.ZIP_DEFLATED)
    data = bytearray(packed.getvalue())
    entry = int.from_bytes(data[data.rindex(b"PK\x05\x06") + 16 :][:4], "little")  # the directory's first entry

    def field(at: int) -> int:  # a 2-byte field of the directory entry
        return int.from_bytes(data[entry + at : entry + at + 2], "little")

    while data[entry + 46 : entry + 46 + field(28)] != b"word/document.xml":
        entry += 46 + field(28) + field(30) + field(32)  # the entry, its name, extra field and comment
    assert int.from_bytes(data[entry + 24 : entry + 28], "little") > 10_000_000
    data[entry + 24 : entry + 28] = (100).to_bytes(4, "little")  # the uncompressed size it declares
    with pytest.raises(FileRejected, match=r"word/document\.xml is damaged or not the size it declares"):
        parse("说谎.docx", bytes(data))


def test_admin_upload_of_a_hostile_document_is_a_422_and_adds_nothing(
    redis_url: str, log_dir: Path, tmp_path: Path
) -> None:
    """Through a running gateway's admin API: each hostile sample is answered 422 with the reason, nothing is added,
    the gateway's peak RSS grows by less than the bound, and its log holds no traceback."""
    admin = start_admin(redis_url, log_dir, tmp_path / "store", max_file_mb=2, max_upload_mb=4)
    kb = "bounds" + secrets.token_hex(3)
    try:
        assert admin.upload(kb, ("退货说明.md", RETURNS.encode())).status_code == 200
        status = Path(f"/proc/{admin.proc.pid}/status")
        rss = {line.split(":")[0]: int(line.split()[1]) for line in status.read_text().splitlines() if "Vm" in line}
        try:
            Path(f"/proc/{admin.proc.pid}/clear_refs").write_text("5")  # its VmHWM back to its current RSS
        except OSError:
            rss["VmRSS"] = rss["VmHWM"]  # then only a peak above the one before counts
        for sample in (
            s
            for s in HOSTILE
            if s.name in ("正文在media.docx", "512MB图片.docx", "整张网格.xlsx", "五千页.pdf", "膨胀流.pdf")
        ):
            response = admin.upload(kb, (sample.name, sample_bytes(sample)))
            assert response.status_code == 422, (sample.name, response.status_code, response.text)
            error = response.json()["error"]
            assert error.startswith(f"nothing was added: {sample.name}: ") and re.search(sample.refused or "", error)
        peak = {line.split(":")[0]: int(line.split()[1]) for line in status.read_text().splitlines() if "Vm" in line}
        growth_mb = (peak["VmHWM"] - rss["VmRSS"]) / 1024
        print(f"\ngateway: {rss['VmRSS'] / 1024:.0f} MB before, peak {peak['VmHWM'] / 1024:.0f} MB during the uploads")
        assert growth_mb < RSS_BOUND_MB
        assert admin.documents(kb) == ["退货说明.md"], "a refused upload changed the knowledge base"
    finally:
        admin.proc.stop()
    assert b"Traceback" not in admin.proc.log_path.read_bytes()


def test_botgw_kb_add_reports_each_hostile_document_without_a_traceback(tmp_path: Path) -> None:
    config = write_config(tmp_path / "botgw.yaml", {"knowledge": {"store": {"path": str(tmp_path / "store")}}})
    chosen = [s for s in HOSTILE if s.name in ("512MB图片.docx", "两百万字符串.xlsx", "二十个流.pdf")]
    for sample in chosen:
        (tmp_path / sample.name).write_bytes(sample_bytes(sample))
    added = subprocess.run(
        [*BOTGW, "kb", "add", "--config", str(config), "faq", *(str(tmp_path / s.name) for s in chosen)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert added.returncode == 1, added.stderr
    assert "faq: 0 added, 0 replaced, 0 unchanged, 3 failed, 0 skipped" in added.stdout, added.stdout
    for sample in chosen:
        line = next(line for line in added.stderr.splitlines() if line.startswith(f"failed: {tmp_path / sample.name}"))
        assert re.search(sample.refused or "", line), line
    assert "Traceback" not in added.stderr
