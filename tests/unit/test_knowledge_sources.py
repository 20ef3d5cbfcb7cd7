"""The sources line under a grounded answer (knowledge/prompt.py): the model's own line is kept only when it ends
the answer and names documents it was given; otherwise botgw's line is added (a review found a "来源：" copied
from a document, or a made-up source, taken for the citation, and the real one dropped)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from knowledge.prompt import with_sources


@dataclass
class Passage:
    doc: str
    section: str
    text: str


GIVEN = [Passage("报销制度2024.md", "发票", "发票抬头写公司全称。"), Passage("售后服务政策.md", "", "1到3个工作日。")]
OURS = "来源：《报销制度2024.md》发票；《售后服务政策.md》"


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("发票抬头写公司全称。", f"发票抬头写公司全称。\n\n{OURS}"),
        ("写公司全称。\n来源：《报销制度2024.md》发票", "写公司全称。\n来源：《报销制度2024.md》发票"),
        ("据通知（来源：市医保局通知），写公司全称。", f"据通知（来源：市医保局通知），写公司全称。\n\n{OURS}"),
        ("写公司全称。\n来源：《员工手册.pdf》", f"写公司全称。\n\n{OURS}"),
        ("写公司全称。\n来源：市医保局通知", f"写公司全称。\n\n{OURS}"),
    ],
    ids=["none", "own-line-kept", "copied-mid-text", "made-up-document", "no-document-named"],
)
def test_the_sources_line_names_only_what_was_given(answer: str, expected: str) -> None:
    assert with_sources(answer, GIVEN) == expected


def test_no_passages_no_line() -> None:
    assert with_sources("你好", []) == "你好"
