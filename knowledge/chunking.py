"""Parsed blocks to chunks: a chunk never crosses a heading, packs whole paragraphs up to `size` characters, and
cuts a longer paragraph at sentence ends, repeating up to `overlap` characters so that a fact on the cut is whole
in one of the two. A Q&A row is always a chunk of its own, so that it can be answered directly."""

from __future__ import annotations

import re
from dataclasses import dataclass

from knowledge.formats import Block, ParsedDocument

CHUNKER_VERSION = 2  # part of a file's fingerprint: a change here re-chunks files that were added before (2: no
# title made from the file name; a Q&A table's title column; text folded to one script before it is embedded)
_SENTENCE = re.compile(r"[^。！？!?；;\n]*(?:[。！？!?；;]+[”’」』)]*|\n|$)")


@dataclass(frozen=True)
class Chunk:
    index: int
    section: tuple[str, ...]
    text: str
    question: str | None = None  # a Q&A row's question; `text` then holds its answer

    @property
    def display(self) -> str:
        """What a reader (and the prompt) sees."""
        return f"问：{self.question}\n答：{self.text}" if self.question else self.text


def sentences(text: str) -> list[str]:
    return [part for part in (match.group().strip() for match in _SENTENCE.finditer(text)) if part]


def _pieces(paragraph: str, size: int, overlap: int) -> list[str]:
    """A paragraph as units no longer than `size`: sentences, and hard cuts of a sentence that is still longer."""
    units: list[str] = []
    for sentence in sentences(paragraph) if len(paragraph) > size else [paragraph]:
        if len(sentence) <= size:
            units.append(sentence)
            continue
        step = size - overlap
        units += [sentence[start : start + size] for start in range(0, len(sentence) - overlap, step)]
    return units


Unit = tuple[int, str]  # (which paragraph, text)


def _tail(units: list[Unit], overlap: int) -> list[Unit]:
    """The last units of a cut paragraph that fit in `overlap` characters (or the end of the last one)."""
    paragraph = units[-1][0]
    kept: list[Unit] = []
    for unit in reversed(units):
        if unit[0] != paragraph or sum(len(text) for _, text in kept) + len(unit[1]) > overlap:
            break
        kept.insert(0, unit)
    if not kept and overlap:
        kept = [(paragraph, units[-1][1][-overlap:])]
    return kept


def _render(units: list[Unit]) -> str:
    """Paragraphs on their own lines; sentences of one paragraph run on (with a space between Latin ones)."""
    out, previous = "", -1
    for paragraph, text in units:
        if out:
            if paragraph != previous:
                out += "\n"
            elif out[-1].isascii() and out[-1].isalnum() and text[0].isascii():
                out += " "
        out, previous = out + text, paragraph
    return out


def _pack(paragraphs: list[str], size: int, overlap: int) -> list[str]:
    chunks: list[str] = []
    current: list[Unit] = []
    for number, paragraph in enumerate(paragraphs):
        for piece in _pieces(paragraph, size, overlap):
            candidate = [*current, (number, piece)]
            if current and len(_render(candidate)) > size:
                chunks.append(_render(current))
                # repeat the end only when the cut falls inside a paragraph
                current = _tail(current, overlap) if current[-1][0] == number else []
                candidate = [*current, (number, piece)]
                if len(_render(candidate)) > size:
                    candidate = [(number, piece)]
            current = candidate
    if current:
        chunks.append(_render(current))
    return chunks


def chunk_document(document: ParsedDocument, size: int, overlap: int) -> list[Chunk]:
    """The document's chunks, in reading order."""
    chunks: list[Chunk] = []
    run: list[Block] = []

    def flush() -> None:
        if run:
            for text in _pack([block.text for block in run], size, overlap):
                chunks.append(Chunk(len(chunks), run[0].section, text))
            run.clear()

    for block in document.blocks:
        if block.question is not None:
            flush()
            chunks.append(Chunk(len(chunks), block.section, block.text, question=block.question))
        elif run and block.section != run[0].section:
            flush()
            run.append(block)
        else:
            run.append(block)
    flush()
    return chunks
