"""What retrieved passages become in the conversation: a grounded system-prompt part that asks for citations,
and the sources line a reply carries (来源：《文件名》章节)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol


class Cited(Protocol):
    doc: str
    section: str
    text: str


CITATION_MARK = "来源："
CITED_DOC = re.compile(r"《([^》]+)》")


def source_of(passage: Cited) -> str:
    return f"《{passage.doc}》{passage.section}"


def sources_line(passages: Sequence[Cited]) -> str:
    """来源：《a.md》退款 › 时间；《b.csv》: each document and section once, best first."""
    sources = list(dict.fromkeys(source_of(passage) for passage in passages))
    return f"{CITATION_MARK}{'；'.join(sources)}" if sources else ""


def grounding_prompt(passages: Sequence[Cited], ask_citation: bool = True) -> str:
    """The part of the system prompt that holds the passages and says how to use them. With `ask_citation` the
    model is asked to end with the sources line itself; without it, the caller appends `sources_line`."""
    if not passages:
        return ""
    rules = [
        "以下是从知识库中检索到的资料。请只依据这些资料回答用户的问题。",
        "1. 资料中没有的内容不要编造；资料不足以回答时，直接说明资料中没有相关信息。",
        "2. 资料之间有出入时，以与问题最相关的一条为准，不要混用不同产品或不同对象的规定。",
    ]
    if ask_citation:
        rules.append(f"3. 回答的最后另起一行注明依据的资料：{CITATION_MARK}《文件名》章节，多个来源用“；”隔开。")
    else:
        rules.append("3. 不必列出资料来源，系统会在回答后附上。")
    blocks = [f"【资料{number}】{source_of(passage)}\n{passage.text}" for number, passage in enumerate(passages, 1)]
    return "\n".join(rules) + "\n\n" + "\n\n".join(blocks)


def with_sources(answer: str, passages: Sequence[Cited]) -> str:
    """The answer with the sources line after it. The model's own line is kept only when it ends the answer and
    cites documents that were given to it; a 来源： copied from a document, a made-up source or none at all gets
    botgw's line instead (a review found a copied "来源：市医保局通知" taken for the citation)."""
    line = sources_line(passages)
    if not line:
        return answer
    body, _, last = answer.rstrip().rpartition("\n")
    last = last.strip()
    if last.startswith(CITATION_MARK):
        cited = set(CITED_DOC.findall(last))
        if cited and cited <= {passage.doc for passage in passages}:
            return answer
        answer = body  # a line of sources that were not given: replaced
    return f"{answer.rstrip()}\n\n{line}"
