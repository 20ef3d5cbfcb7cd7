"""The `botgw kb` commands: open the store, do one thing, print it for an operator (or as JSON for a script).

Each works on its own with the default configuration: the embedded store and the offline embedder need no
other process. When a worker holds the embedded folder, the command waits for it (`store.lock_wait_s`), then
says what to do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

from knowledge.config import KB_NAME_PATTERN, KnowledgeSettings
from knowledge.errors import EmbeddingMismatch, FileRejected, KnowledgeError, StoreLocked
from knowledge.formats import PARSERS
from knowledge.ingest import collect
from knowledge.progress import AddProgress
from knowledge.service import Knowledge

CLI_ADDED_BY = "cli"  # who a document added by `botgw kb add` was added by (its record's `added_by`)
ADD_NICENESS = 10  # `kb add` runs at a lower CPU priority than the engine and the workers beside it


def run_kb_command(settings: KnowledgeSettings, args: argparse.Namespace) -> int:
    commands = {"add": kb_add, "list": kb_list, "remove": kb_remove, "search": kb_search}

    async def main() -> int:
        try:
            knowledge = await Knowledge.open(settings)
        except StoreLocked:
            wait_s = settings.store.lock_wait_s
            print(f"botgw kb: the knowledge store is in use; waiting up to {wait_s:g} s for it", file=sys.stderr)
            knowledge = await Knowledge.open(settings, wait_s=wait_s)
        try:
            return await commands[args.kb_command](knowledge, args)
        finally:
            await knowledge.aclose()

    if args.kb_command == "add":
        # Embedding takes every core it is given; a question asked meanwhile should not wait for it.
        with contextlib.suppress(OSError):
            os.nice(ADD_NICENESS)
    try:
        return asyncio.run(main())
    except (FileRejected, EmbeddingMismatch) as exc:  # what was asked cannot be done: fix it and ask again
        print(f"botgw kb {args.kb_command}: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, FileRejected) else 2
    except KnowledgeError as exc:  # the store or the embedding engine is busy, down or refusing
        print(f"botgw kb {args.kb_command}: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:  # a folder given that cannot be listed, say
        print(f"botgw kb {args.kb_command}: {exc.filename or 'a file'}: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def kb_add(knowledge: Knowledge, args: argparse.Namespace) -> int:
    if not re.match(KB_NAME_PATTERN, args.kb):
        _say("botgw kb: a knowledge base name is letters, digits, '_', '.' or '-' (at most 64)")
        return 2

    shown = AddProgress(collect(args.paths), sys.stderr, terminal=sys.stderr.isatty())
    knowledge.ingestor.release_while_embedding = True  # workers answer from the store while files are embedded
    outcomes = await knowledge.add(
        args.kb, args.paths, shown.file_done, embedding=shown.embedding, skip_unsupported=args.skip_unsupported,
        added_by=CLI_ADDED_BY,
    )
    counts = {status: sum(o.status == status for o in outcomes) for status in ("added", "replaced", "unchanged")}
    failed = [o for o in outcomes if o.status == "failed"]
    skipped = sum(o.status == "skipped" for o in outcomes)
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    print(f"{args.kb}: {summary}, {len(failed)} failed, {skipped} skipped")
    if skipped:
        _say(f"botgw kb: {skipped} file(s) skipped: botgw cannot read their format ({' '.join(sorted(PARSERS))})")
    for outcome in failed:
        _say(f"failed: {outcome.path}: {outcome.reason}")
    if failed:
        _say("botgw kb: nothing of the failed files was written; the others were added. Fix them and run again.")
    if any(o.reason.startswith("unsupported format") for o in failed):
        _say("botgw kb: to add the rest and leave files of other formats out, add --skip-unsupported")
    return 1 if failed else 0


async def kb_list(knowledge: Knowledge, args: argparse.Namespace) -> int:
    records = await knowledge.documents(args.kb)
    if args.json:
        print(json.dumps([asdict(record) for record in records], ensure_ascii=False, indent=2))
        return 0
    if args.kb is None:
        bases: dict[str, list[int]] = {}
        for record in records:
            bases.setdefault(record.kb, []).append(record.chunks)
        for kb, chunks in bases.items():
            print(f"{kb}\t{len(chunks)} documents\t{sum(chunks)} chunks")
        if not bases:
            _say("botgw kb: no knowledge bases yet (`botgw kb add --config FILE KB PATH...`)")
        return 0
    for record in records:
        added = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.added_at))
        print(f"{record.doc}\t{record.chunks} chunks\t{record.bytes / 1024:.1f} KB\t{added}\t{record.title}")
    if not records:
        _say(f"botgw kb: no documents in {args.kb}")
    return 0


async def kb_remove(knowledge: Knowledge, args: argparse.Namespace) -> int:
    record = await knowledge.remove(args.kb, args.doc)
    if record is None:
        _say(f"botgw kb: no document {args.doc!r} in {args.kb} (`botgw kb list` shows the names)")
        return 1
    print(f"removed {record.doc} from {args.kb} ({record.chunks} chunks)")
    return 0


async def kb_search(knowledge: Knowledge, args: argparse.Namespace) -> int:
    """What retrieval finds, best first, before the answer threshold (the score it applies to is shown)."""
    if (args.question is None) == (args.questions is None):
        _say("botgw kb search: give a question, or --questions FILE (not both)")
        return 2
    if not await knowledge.documents(args.kb):
        bases = sorted({record.kb for record in await knowledge.documents()})
        known = f"the knowledge bases are: {', '.join(bases)}" if bases else "there are no knowledge bases yet"
        _say(f"botgw kb: no knowledge base {args.kb!r} ({known})")
        return 1
    if args.questions is not None:
        return await _search_many(knowledge, args)
    hits = await knowledge.search([args.kb], args.question, limit=args.top, mode=args.mode, per_doc=args.per_doc)
    if args.json:
        print(json.dumps([hit.as_json() for hit in hits], ensure_ascii=False, indent=2))
        return 0
    for rank, hit in enumerate(hits, start=1):
        print(f"{rank}. {hit.score:.3f} ({hit.scale}) 《{hit.doc}》{hit.section_path}")
        print(f"   {' '.join(hit.display.split())[:200]}")
        if hit.also:
            print(
                f"   (and {len(hit.also)} more of its chunks: {', '.join(f'{other.score:.3f}' for other in hit.also)})"
            )
    if not hits:
        _say(f"botgw kb: nothing found in {args.kb}")
    return 0


def read_questions(text: str) -> list[dict]:
    """The questions of a --questions file: a question a line, or JSON objects with `query` (other fields, such as
    an id, are echoed back). Blank lines are skipped; a JSON line without a `query` string is an error."""
    questions = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
            except ValueError:
                raise ValueError(f"line {number} starts like JSON but is not") from None
            if not isinstance(item, dict) or not isinstance(item.get("query"), str) or not item["query"].strip():
                raise ValueError(f"line {number} is a JSON line without a 'query' string")
            questions.append(item)
        else:
            questions.append({"query": line})
    return questions


async def _search_many(knowledge: Knowledge, args: argparse.Namespace) -> int:
    """One process for many questions: the store is read and the model loaded once, not once per question."""
    try:
        text = sys.stdin.read() if args.questions == "-" else Path(args.questions).read_text("utf-8-sig")
        questions = read_questions(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        _say(f"botgw kb search: cannot read the questions in {args.questions}: {exc}")
        return 2
    for item in questions:
        hits = await knowledge.search([args.kb], item["query"], limit=args.top, mode=args.mode, per_doc=args.per_doc)
        print(json.dumps({**item, "hits": [hit.as_json() for hit in hits]}, ensure_ascii=False), flush=True)
    return 0
