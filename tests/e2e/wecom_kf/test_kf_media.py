"""微信客服 beyond text, end to end: a WeChat customer's photo, voice and files reach the engine (or get a clear reply),
a photo followed by a question is one question with its picture, and the bot's deny list keeps a customer out.

Two stacks of their own (each a simulator, a gateway and a worker on the session's Redis) share one stub engine
(testkit/fakes/stub_engine.py, which records what reached it): `seeing` with `engine.vision: true`, a deny list and a
200 kB media cap; `blind` with a text engine. The customer's media is uploaded to the simulator, which names it by
media_id in kf/sync_msg and serves it at media/get, as WeCom does.
"""

from __future__ import annotations

import io
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from PIL import Image

from gateway import texts
from testkit.configs import random_aes_key, stack_config, write_config
from testkit.fakes.stub_engine import answer_for
from testkit.processes import BOTGW, Proc, free_port, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import start_stub_engine, stub_requests
from tests.e2e.knowledge.test_document_bounds import docx, pdf
from tests.kf_env import KFID, Kf, customer

DENIED = "wmdenied" + secrets.token_hex(3)
MAX_MEDIA_BYTES = 200_000


@dataclass
class Stacks:
    seeing: Kf
    blind: Kf
    engine_url: str


def kf_stack(redis_url: str, log_dir: Path, engine_url: str, name: str, vision: bool, **bot: object) -> Kf:
    """A 微信客服 bot's simulator, gateway and worker (own namespace), on the stub engine."""
    namespace = name + secrets.token_hex(3)
    sim_port, port = free_port(), free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    kefu = {
        "id": "kefu", "platform": "wecom-kf", "corp_id": "wwkf" + secrets.token_hex(5),
        "secret": secrets.token_urlsafe(24), "token": secrets.token_hex(8), "encoding_aes_key": random_aes_key(),
        "api_base": sim_url, "open_kfids": [KFID], "welcome_text": None, **bot,
    }  # fmt: skip
    config = stack_config(redis_url, engine_url, sim_url, namespace, engine={"vision": vision})
    config["bots"] = [kefu]
    config["limits"] = {"per_user": "100/minute"}
    path = write_config(log_dir / f"{namespace}.yaml", config)
    sim_args = [*BOTGW, "sim", "serve", "--config", str(path), "--port", str(sim_port)]
    sim = Proc(sim_args, log_dir / f"{namespace}-sim.log")
    wait_http(f"{sim_url}/__sim__/healthz", 30, sim)
    client = redis.Redis.from_url(redis_url)
    env = Kf(config, path, f"http://127.0.0.1:{port}", sim_url, client, namespace, log_dir, {"sim": sim})
    env.procs["gateway"] = start_gateway(path, port, log_dir, f"gw-{namespace}")
    env.procs["worker-1"] = start_worker(path, log_dir, f"{namespace}-w1")
    return env


@pytest.fixture(scope="module")
def stacks(redis_url: str, log_dir: Path) -> Iterator[Stacks]:
    engine, engine_url = start_stub_engine(log_dir, 0.2, "stub-kf-media")
    made: list[Kf] = []
    try:
        made.append(kf_stack(redis_url, log_dir, engine_url, "kfsee", True, deny_users=[DENIED],
                             max_media_bytes=MAX_MEDIA_BYTES))  # fmt: skip
        made.append(kf_stack(redis_url, log_dir, engine_url, "kfblind", False))
        yield Stacks(made[0], made[1], engine_url)
    finally:
        for env in made:
            for proc in env.procs.values():
                proc.stop()
        engine.stop()


def send(kf: Kf, person: str, kind: str, data: bytes, name: str, mime: str, **upload: object) -> None:
    """The customer's WeChat uploads the media, then the message naming it arrives (and WeCom calls back)."""
    media = kf.sim("POST", "/__sim__/kf/media", params={"name": name, "mime": mime, **upload}, content=data)
    kf.write(person, "", msgtype=kind, media_id=media["media_id"])  # type: ignore[index]


def png(size: int = 64) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def requests_about(engine_url: str, words: str) -> list[dict]:
    return [request for request in stub_requests(engine_url) if words in request["user"]]


def contents(sent: list[dict]) -> list[str]:
    return [item["content"] for item in sent]


def test_a_photo_reaches_an_engine_that_sees_as_an_image_part(stacks: Stacks) -> None:
    person = customer()
    send(stacks.seeing, person, "image", png(), "photo.png", "image/png")
    answer = stacks.seeing.wait_sent(person, 1, settle=2.0)
    assert answer[0]["content"].startswith("answer to:"), answer
    seen = [request for request in stub_requests(stacks.engine_url) if request["images"]]
    mine = [request for request in seen if texts.IMAGE_QUESTION in request["user"]]
    assert mine and mine[-1]["images"][0].startswith("data:image/"), "no image part reached the engine"


def test_a_photo_then_a_question_within_the_merge_window_is_one_request_with_both(stacks: Stacks) -> None:
    person, question = customer(), f"这张图里是什么颜色？{secrets.token_hex(3)}"
    send(stacks.seeing, person, "image", png(), "photo.png", "image/png")
    stacks.seeing.write(person, question)
    answers = stacks.seeing.wait_sent(person, 1, settle=4.0)
    assert len(answers) == 1 and question in answers[0]["content"], answers
    asked = requests_about(stacks.engine_url, question)
    assert len(asked) == 1 and len(asked[0]["images"]) == 1, "the photo and its question were not asked together"


def test_a_photo_to_a_text_engine_gets_the_clear_reply(stacks: Stacks) -> None:
    person = customer()
    send(stacks.blind, person, "image", png(), "photo.png", "image/png")
    assert contents(stacks.blind.wait_sent(person, 1, settle=2.0)) == [texts.IMAGE_NEEDS_VISION_TEXT]


def test_a_photo_then_a_question_to_a_text_engine_answers_the_question_and_says_why_not_the_photo(
    stacks: Stacks,
) -> None:
    """The outside review's lost question: a photo the engine cannot see, merged with the question after it."""
    person, question = customer(), f"退货地址是哪里？{secrets.token_hex(3)}"
    send(stacks.blind, person, "image", png(), "photo.png", "image/png")
    stacks.blind.write(person, question)
    (answer,) = contents(stacks.blind.wait_sent(person, 1, settle=4.0))
    (asked,) = requests_about(stacks.engine_url, question)
    assert not asked["images"]
    assert answer.startswith(answer_for(asked["user"])) and answer.endswith(texts.IMAGE_NEEDS_VISION_TEXT), answer


def test_a_voice_without_speech_recognition_gets_the_clear_reply(stacks: Stacks) -> None:
    person = customer()
    send(stacks.blind, person, "voice", b"#!AMR\n" + bytes(600), "voice.amr", "audio/amr")
    assert contents(stacks.blind.wait_sent(person, 1, settle=2.0)) == [texts.VOICE_NOT_READ_TEXT]


def test_an_expired_media_id_gets_the_clear_reply(stacks: Stacks) -> None:
    person = customer()
    send(stacks.seeing, person, "image", png(), "old.png", "image/png", age_s=4 * 24 * 3600)
    expected = texts.media_error_text("expired", MAX_MEDIA_BYTES)
    assert contents(stacks.seeing.wait_sent(person, 1, settle=2.0)) == [expected]


def test_a_pdf_and_a_docx_then_a_question_put_their_text_in_the_prompt(stacks: Stacks) -> None:
    kf, person = stacks.blind, customer()
    send(kf, person, "file", pdf(), "退款说明.pdf", "application/pdf")
    kf.wait_sent(person, 1, settle=1.0)
    send(kf, person, "file", docx(), "退货政策.docx",
         "application/vnd.openxmlformats-officedocument.wordprocessingml.document")  # fmt: skip
    received = kf.wait_sent(person, 2, settle=1.0)
    assert all("已收到" in item["content"] for item in received), received
    question = f"退货要多久之内申请？{secrets.token_hex(3)}"
    kf.write(person, question)
    kf.wait_sent(person, 3, settle=2.0)
    asked = requests_about(stacks.engine_url, question)
    assert len(asked) == 1
    prompt = json.dumps(asked[0], ensure_ascii=False)
    assert "Refunds: ask within fifteen days" in prompt, "the PDF's text is not in the prompt"
    assert "退货须在签收后十五天之内申请" in prompt, "the DOCX's text is not in the prompt"


def test_a_file_over_the_bots_media_limit_is_refused_with_a_reply(stacks: Stacks) -> None:
    person = customer()
    send(stacks.seeing, person, "file", b"x" * (MAX_MEDIA_BYTES + 1000), "big.txt", "text/plain")
    expected = texts.media_error_text("too_large", MAX_MEDIA_BYTES)
    assert contents(stacks.seeing.wait_sent(person, 1, settle=2.0)) == [expected]


def test_a_denied_customer_gets_nothing_and_an_allowed_one_is_answered(stacks: Stacks) -> None:
    kf, allowed = stacks.seeing, customer()
    question = f"你好 {secrets.token_hex(3)}"
    kf.write(DENIED, question)
    kf.write(allowed, question)
    assert contents(kf.wait_sent(allowed, 1, settle=3.0)) == [f"answer to: {question}"]
    time.sleep(1.0)
    assert kf.sent(DENIED) == [] and kf.memory(DENIED) == []
    assert len(requests_about(stacks.engine_url, question)) == 1, "the denied customer's message reached the engine"
