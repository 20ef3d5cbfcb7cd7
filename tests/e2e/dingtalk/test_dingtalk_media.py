"""DingTalk beyond text, end to end on the real redis-server, gateway and worker against the simulator and a stub
engine: a voice message answered from DingTalk's own recognition, rich text's picture reaching an engine that
sees (and the clear reply where it cannot), a PDF and a DOCX read into the prompt, a file over the limit and an
expired downloadCode refused with a reply, a quoted message as context, and Markdown answers (sampleMarkdown with
a title through the OpenAPI, markdown through the sessionWebhook)."""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from bots.dingtalk.adapter import title_of
from gateway import texts
from simulator.dingtalk import messages
from simulator.dingtalk.user import DingTalkUser
from testkit.configs import dingtalk_bot
from testkit.fakes.stub_engine import answer_for
from testkit.processes import BOTGW, ROOT, child_env, wait_for
from testkit.stacks import Cluster, Stack
from tests.e2e.dingtalk.test_dingtalk import bot
from tests.e2e.knowledge.test_document_bounds import docx, pdf

MAX_MEDIA_BYTES = 200_000
PDF_LINE = "Refunds: ask within fifteen days, page 1."  # what test_document_bounds.pdf writes on page 1
DOCX_MIME = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
DOCX_LINE = "退货须在签收后十五天之内申请，商品完好即可。"  # and docx's one paragraph


@pytest.fixture(scope="module")
def seeing(stack: Stack) -> Iterator[Cluster]:
    """A gateway and a worker whose engine (a stub) sees images; its robot downloads at most MAX_MEDIA_BYTES."""
    robot = {**dingtalk_bot("ding-http", "http", stack.sim_url), "max_media_bytes": MAX_MEDIA_BYTES}
    made = Cluster(stack, 0.1, engine={"vision": True}, bots=[robot])
    try:
        made.add_gateway()
        made.add_worker("w1")
        yield made
    finally:
        made.close()


def talk(stack: Stack, user: str, *steps: tuple[str, Any], group: str = "", webhook_ttl_s: float = 5400) -> dict:
    """As `user` of ding-http: each step an upload ("upload", (bytes, name, mime)) whose downloadCode the next steps
    use as `{code}`, or a message ("send", message builder taking the codes so far). The last payload sent."""

    async def go() -> dict:
        async with httpx.AsyncClient(timeout=10) as http:
            person = DingTalkUser(bot(stack, "ding-http"), stack.gateway_url, stack.sim_url, http)
            codes: list[str] = []
            payload: dict = {}
            for kind, what in steps:
                if kind == "upload":
                    data, name, mime = what
                    codes.append(await person.upload(data, name=name, mime=mime))
                else:
                    message = what(*codes)
                    payload = await person.send(user, "", group=group, webhook_ttl_s=webhook_ttl_s, message=message)
        return payload

    return asyncio.run(go())


def answers(stack: Stack, conversation: str, count: int, timeout: float = 60) -> list[dict]:
    """The robot's first `count` messages in the conversation, once they are there."""
    url = f"{stack.sim_url}/__sim__/dingtalk/messages"

    def mine() -> list[dict]:
        return httpx.get(url, params={"conversation": conversation}, timeout=5).json()

    wait_for(lambda: len(mine()) >= count, timeout, f"{count} answers in {conversation}")
    return mine()[:count]


def engine_saw(made: Cluster, needle: str) -> list[dict]:
    """The engine requests whose prompt (system, history, the user's turn) holds `needle`."""
    return [r for r in made.engine_requests() if needle in json.dumps(r, ensure_ascii=False)]


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def test_a_voice_message_is_answered_from_dingtalks_recognition(stack: Stack, seeing: Cluster, user: str) -> None:
    heard = f"明天几点开会 {user}"
    payload = talk(seeing.stack, user, ("upload", (b"#!AMR\n" + bytes(64), "voice.amr", "audio/amr")),
                   ("send", lambda code: messages.audio_message(code, recognition=heard)))  # fmt: skip
    (reply,) = answers(stack, payload["conversationId"], 1)
    assert reply["content"] == answer_for(heard)
    assert (reply["via"], reply["format"]) == ("session", "markdown") and reply["title"]


def test_rich_text_with_a_picture_reaches_an_engine_that_sees(stack: Stack, seeing: Cluster, user: str) -> None:
    question = f"这张图里是什么颜色？{user}"
    payload = talk(seeing.stack, user, ("upload", (png(), "shot.png", "image/png")),
                   ("send", lambda code: messages.rich_text_message(question, (code,))))  # fmt: skip
    (reply,) = answers(stack, payload["conversationId"], 1)
    seen = engine_saw(seeing, question)
    assert len(seen) == 1, f"the engine saw {len(seen)} requests; the reply: {reply['content']}"
    (request,) = seen
    assert question in request["user"]
    (image,) = request["images"]
    assert image.startswith("data:image/")


def test_a_picture_to_an_engine_that_cannot_see_gets_the_clear_reply(stack: Stack, user: str) -> None:
    """The stack's own worker: its engine has no `vision`. (A picture beside a question: the question is answered
    and the reply said under it, tests/e2e/wecom_kf/test_kf_media.py.)"""
    payload = talk(stack, user, ("upload", (png(), "shot.png", "image/png")),
                   ("send", lambda code: messages.picture_message(code)))  # fmt: skip
    (reply,) = answers(stack, payload["conversationId"], 1)
    assert reply["content"] == texts.IMAGE_NEEDS_VISION_TEXT


def test_a_pdf_and_a_docx_then_a_question_carry_their_text_into_the_prompt(
    stack: Stack, seeing: Cluster, user: str
) -> None:
    payload = talk(
        seeing.stack,
        user,
        ("upload", (pdf(), "退货政策.pdf", "application/pdf")),
        ("upload", (docx(), "售后说明.docx", DOCX_MIME)),
        ("send", lambda pdf_code, _: messages.file_message(pdf_code, "退货政策.pdf")),
        ("send", lambda _, docx_code: messages.file_message(docx_code, "售后说明.docx")),
        ("send", lambda *_: messages.text_message(f"多久之内可以退货？{user}")),
    )
    received = answers(stack, payload["conversationId"], 3)
    assert "退货政策.pdf" in received[0]["content"] and "售后说明.docx" in received[1]["content"]
    (request,) = engine_saw(seeing, f"多久之内可以退货？{user}")
    prompt = json.dumps(request, ensure_ascii=False)
    assert PDF_LINE in prompt and DOCX_LINE in prompt
    assert received[2]["content"] == answer_for(request["user"])


def test_a_file_over_the_limit_is_refused_with_a_reply(stack: Stack, seeing: Cluster, user: str) -> None:
    big = ("说明" * (MAX_MEDIA_BYTES // 3)).encode()
    assert len(big) > MAX_MEDIA_BYTES
    payload = talk(seeing.stack, user, ("upload", (big, "说明.txt", "text/plain")),
                   ("send", lambda code: messages.file_message(code, "说明.txt")))  # fmt: skip
    (reply,) = answers(stack, payload["conversationId"], 1)
    assert reply["content"] == texts.media_error_text("too_large", MAX_MEDIA_BYTES)
    assert not engine_saw(seeing, "说明说明")


def test_an_expired_download_code_is_answered_with_send_it_again(stack: Stack, seeing: Cluster, user: str) -> None:
    """DingTalk's downloadCodes are temporary: one it refuses (HTTP 400, simulator/dingtalk/media.py) is told."""

    def expire(code: str) -> dict:
        httpx.post(f"{stack.sim_url}/__sim__/dingtalk/media/expire", json={"downloadCode": code}, timeout=5)
        return messages.picture_message(code)

    payload = talk(seeing.stack, user, ("upload", (png(), "shot.png", "image/png")), ("send", expire))
    (reply,) = answers(stack, payload["conversationId"], 1)
    assert reply["content"] == texts.media_error_text("expired", MAX_MEDIA_BYTES)


def test_a_quoted_message_is_context_for_the_answer(stack: Stack, seeing: Cluster, user: str) -> None:
    quoted = f"下周三起放假三天 {user}"
    payload = talk(seeing.stack, user, ("send", lambda: messages.text_message("这是什么意思？", quote=quoted)))
    (reply,) = answers(stack, payload["conversationId"], 1)
    (request,) = engine_saw(seeing, quoted)
    assert "这是什么意思？" in request["user"]
    assert reply["content"] == answer_for(request["user"])


def test_a_group_answer_through_the_openapi_is_sample_markdown_with_a_title(
    stack: Stack, seeing: Cluster, user: str
) -> None:
    """The sessionWebhook has expired: the answer goes through groupMessages/send as sampleMarkdown {title, text},
    the title the answer's first line as plain text."""
    group = "cid-group-" + secrets.token_hex(4)
    question = f"**加粗** 的问题 {user}"
    talk(seeing.stack, user, ("send", lambda: messages.text_message(question)), group=group, webhook_ttl_s=1)
    (reply,) = answers(stack, group, 1)
    answer = answer_for(question)
    assert (reply["via"], reply["format"], reply["content"]) == ("openapi", "markdown", answer)
    assert reply["title"] == title_of(answer) and "**" not in reply["title"] and reply["title"].startswith("answer")


def sim_cli(made: Cluster, user: str, *args: str) -> str:
    """`botgw sim dingtalk` as a person of ding-http, through the cluster's gateway: what it printed."""
    command = [*BOTGW, "sim", "dingtalk", "--config", str(made.path), "--bot", "ding-http", "--user", user,
               "--gateway", made.stack.gateway_url, "--simulator", made.stack.sim_url, "--timeout", "60", *args]
    done = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sim_cli_sends_voice_files_pictures_and_quotes(seeing: Cluster, user: str, tmp_path: Path) -> None:
    """--voice (the text stands for DingTalk's recognition), --file then a question, --image with text (rich
    text), --quote: each answered, printed."""
    voice, document, picture = tmp_path / "voice.amr", tmp_path / "退货政策.pdf", tmp_path / "shot.png"
    voice.write_bytes(b"#!AMR\n" + bytes(64))
    document.write_bytes(pdf())
    picture.write_bytes(png())
    assert answer_for(f"几点开会 {user}") in sim_cli(seeing, user, "--voice", str(voice), f"几点开会 {user}")
    shown = sim_cli(seeing, user, "--file", str(document), f"多久可以退货 {user}")
    assert "退货政策.pdf" in shown and f"多久可以退货 {user}" in shown.split("answer to:")[-1]
    assert PDF_LINE in json.dumps(engine_saw(seeing, f"多久可以退货 {user}"), ensure_ascii=False)
    shown = sim_cli(seeing, user, "--image", str(picture), f"什么颜色 {user}")  # the PDF's text still joins it
    assert "answer to:" in shown and f"什么颜色 {user}" in shown
    assert engine_saw(seeing, f"什么颜色 {user}")[0]["images"]
    sim_cli(seeing, user, "--quote", f"周三放假 {user}", "什么意思")
    assert engine_saw(seeing, f"周三放假 {user}")


def test_a_file_too_long_for_the_context_is_cut_with_a_note(stack: Stack, seeing: Cluster, user: str) -> None:
    """The stub engine's window is 2,048 tokens: a 40 KB handbook does not fit. Its beginning is read, the rest cut,
    and the answer says how much was read."""
    lines = [f"第{index}条：报销须附发票原件，编号 R{index:04d}。" for index in range(1, 1201)]
    handbook = "\n".join(lines).encode()
    assert 30_000 < len(handbook) < MAX_MEDIA_BYTES
    question = f"报销要附什么？{user}"
    payload = talk(seeing.stack, user, ("upload", (handbook, "手册.txt", "text/plain")),
                   ("send", lambda code: messages.file_message(code, "手册.txt")),
                   ("send", lambda _: messages.text_message(question)))  # fmt: skip
    url = f"{stack.sim_url}/__sim__/dingtalk/messages"

    def said() -> list[str]:
        return [m["content"] for m in httpx.get(url, params={"conversation": payload["conversationId"]}).json()]

    wait_for(lambda: any("只读了前" in text for text in said()), 60, "the answer with its note")
    (request,) = engine_saw(seeing, question)
    assert lines[0] in request["user"] and lines[-1] not in request["user"], "the beginning is read, not the end"
    assert lines[0] not in request["system"], "a file is the user's words, never the system prompt"
    answer = "".join(said()[1:])  # the answer, in as many pieces as DingTalk's cap needs
    assert answer.startswith(answer_for(request["user"])) and "%" in answer, "the cut is said under the answer"
