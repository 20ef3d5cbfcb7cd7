"""Markdown images from elsewhere, shown as links: the page never makes a viewer's browser fetch a URL that an
answer, a knowledge passage or its sources named (tracking, or exfiltration if the model fills in the URL).

`![alt](url)` stays an image only when the URL is the page's own (a path such as `/public/logo.png`) or a
`data:image/` URI; any other `![` loses its `!` and becomes a link, `[alt](url)`, which fetches nothing until
someone clicks it. Reference images (`![alt][ref]`, `![ref]`) become links too. The Content-Security-Policy
(webchat/guard.py) is the second wall: it would block the fetch even if an image got through.

Answers stream in pieces, and a piece can end in the middle of `![alt](ht`: `ImageLinks` holds back the few
characters that are still undecided and lets everything before them through at once.

Text that is not the answer's but is shown in Markdown, the sources under a grounded answer (document names and
their sections, taken from documents someone uploaded), is shown as written: `literal` escapes its marks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from knowledge.prompt import CITATION_MARK

ALT = re.compile(r"[^\[\]\n]{0,500}\]")  # an image's description with no brackets of its own, then its ]
OWN_PATH = re.compile(r"/[^/\\&\s)<>]")  # a path on this origin: not //host, not /\host, not an entity
DATA_IMAGE = "data:image/"
SPACES = " \t"
MAX_HELD = 600  # an undecided `![...` longer than this is decided: a link


def _decide(text: str, bang: int, final: bool) -> tuple[bool | None, int]:
    """The `!`s at text[bang:] followed by `[`: (True: an image of ours, keep; False: make it a link;
    None: not known until more text comes), and where the run of `!`s ends."""
    bracket = bang
    while bracket < len(text) and text[bracket] == "!":
        bracket += 1
    if bracket == len(text):  # "...!" at the end: the next piece may start with "["
        return (None if not final else True), bracket
    if text[bracket] != "[":
        return True, bracket  # a plain exclamation mark
    undecided: bool | None = None if not final else False
    alt = ALT.match(text, bracket + 1)
    if alt is None:
        rest = text[bracket + 1 :]
        unfinished = "\n" not in rest and "[" not in rest and "]" not in rest and len(rest) < 500
        return (undecided if unfinished else False), bracket
    paren = alt.end()
    if paren == len(text):
        return undecided, bracket
    if text[paren] != "(":
        return False, bracket  # a reference image, or no image at all: a link either way is harmless
    url = paren + 1
    while url < len(text) and text[url] in SPACES:
        url += 1
    head = text[url : url + len(DATA_IMAGE)]
    if head.lower() == DATA_IMAGE or OWN_PATH.match(head):
        return True, bracket
    if len(head) < len(DATA_IMAGE) and (DATA_IMAGE.startswith(head.lower()) or head in ("", "/")):
        return undecided, bracket
    return False, bracket


def _scan(text: str, final: bool) -> tuple[str, str]:
    """(what may be shown now, what is held until more comes)."""
    out: list[str] = []
    start = 0
    while (bang := text.find("!", start)) != -1:
        keep, bracket = _decide(text, bang, final)
        if keep is None:
            if len(text) - bang <= MAX_HELD:
                out.append(text[start:bang])
                return "".join(out), text[bang:]
            keep = False
        out.append(text[start:bang] if not keep else text[start:bracket])
        start = bracket  # scan on from the "[": an image inside the description is looked at too
        if not keep and text.startswith("[]", bracket):
            out.append("[image")  # a link with no text would not be seen at all
            start = bracket + 1
    out.append(text[start:])
    return "".join(out), ""


def images_as_links(text: str) -> str:
    """The whole text with every image that is not the page's own made a link."""
    return _scan(text, final=True)[0]


class ImageLinks:
    """The same for a text that arrives in pieces: feed() each piece, send what it returns, then flush()."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str) -> str:
        shown, self._held = _scan(self._held + piece, final=False)
        return shown

    def flush(self) -> str:
        shown, self._held = _scan(self._held, final=True)[0], ""
        return shown


_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def literal(text: str) -> str:
    """`text` as Markdown that shows it as written: every ASCII punctuation mark backslash-escaped (CommonMark
    renders each as itself), so that no link, image, emphasis, HTML or bare-URL autolink can form in it."""
    return _ASCII_PUNCTUATION.sub(r"\\\1", text)


def sources_text(sources: Sequence[Mapping[str, str]]) -> str:
    """来源：《售后服务政策.md》退货 › 期限；《常见问题.csv》: what the page shows under a grounded answer. Names and
    sections come from uploaded documents: a heading `[退款请点此](https://evil.example/login)` is shown as that
    text, not as a link (found by a review)."""
    shown = (f"《{literal(source['doc'])}》{literal(source.get('section') or '')}" for source in sources)
    return CITATION_MARK + "；".join(shown)
