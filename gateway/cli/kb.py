"""`botgw kb add|list|remove|search`: the knowledge bases bots answer from (knowledge/commands.py)."""

from __future__ import annotations

import argparse

from gateway.cli.common import positive_int
from gateway.config import load_settings
from gateway.logs import setup_logging


def register(sub: argparse._SubParsersAction) -> None:
    kb = sub.add_parser("kb", help="knowledge bases: add documents, list, remove, search")
    kb_sub = kb.add_subparsers(dest="kb_command", required=True)
    kb_add = kb_sub.add_parser("add", help="add (or update) files and folders; unchanged files are skipped")
    kb_add.add_argument("kb", help="the knowledge base (created on first add)")
    kb_add.add_argument("paths", nargs="+", help="files (.md .txt .html .pdf .docx .csv .xlsx) or folders")
    kb_add.add_argument(
        "--skip-unsupported", action="store_true",
        help="skip named files of a format botgw cannot read (they fail otherwise; in folders they are skipped)",
    )
    kb_list = kb_sub.add_parser("list", help="the knowledge bases, or the documents of one")
    kb_list.add_argument("kb", nargs="?", default=None)
    kb_list.add_argument("--json", action="store_true")
    kb_remove = kb_sub.add_parser("remove", help="remove a document (by the name `kb list` shows)")
    kb_remove.add_argument("kb")
    kb_remove.add_argument("doc")
    kb_search = kb_sub.add_parser("search", help="what retrieval finds for a question, before the answer threshold")
    kb_search.add_argument("kb")
    kb_search.add_argument("question", nargs="?", help="the question (or --questions FILE)")
    kb_search.add_argument(
        "--top", type=positive_int, default=5, help="hits to show (chunks, or documents with --per-doc)"
    )
    kb_search.add_argument("--json", action="store_true", help="a list of hits: doc, title, section, score, text")
    kb_search.add_argument("--mode", choices=["hybrid", "dense", "lexical"], default="hybrid")
    kb_search.add_argument("--per-doc", action="store_true", help="one hit per document (its other chunks listed)")
    kb_search.add_argument(
        "--questions",
        metavar="FILE",
        help="many questions in one run (a line each, or JSONL with 'query'; - is stdin): "
        "one JSON line of hits per question",
    )
    for cmd in (kb_add, kb_list, kb_remove, kb_search):
        cmd.add_argument("--config", required=True)
        cmd.set_defaults(run=_kb)


def _kb(args: argparse.Namespace) -> int:
    """`botgw kb add|list|remove|search`: the knowledge bases that bots answer from (knowledge/commands.py)."""
    from knowledge.commands import run_kb_command

    settings = load_settings(args.config)
    setup_logging("WARNING")
    return run_kb_command(settings.knowledge, args)
