"""A voice message the platform did not recognise, through a transcription endpoint (`asr:`): the worker downloads
it from the platform, converts WeCom's AMR, has it transcribed, and answers the text; without `asr:` the person
is asked to type."""

from __future__ import annotations

import secrets

import httpx

from gateway import texts
from testkit.fakes.stub_asr import start_stub_asr
from testkit.stacks import Stack, stub_requests
from tests.unit.test_asr import amr_nb


def send_voice(stack: Stack, user: str, audio: bytes) -> None:
    """The member's client uploads the recording to (simulated) WeCom; the callback names it by MediaId, with no
    Recognition (语音识别 off)."""
    sim = next(b for b in stack.config["bots"] if b["id"] == "app")["api_base"]
    uploaded = httpx.post(f"{sim}/__sim__/wecom/media", params={"name": "voice.amr", "mime": "audio/amr"},
                          content=audio, timeout=10)  # fmt: skip
    uploaded.raise_for_status()
    stack.post_callback(stack.signer().voice(user, uploaded.json()["media_id"], "amr", None))


def test_voice_without_recognition_is_transcribed_and_answered(stack: Stack, cluster, tmp_path) -> None:
    asr, asr_url = start_stub_asr(tmp_path, "stub-asr-e2e")
    try:
        made = cluster(0.05, asr={"base_url": f"{asr_url}/v1/", "model": "whisper-tiny"})
        made.add_gateway()
        made.add_worker("w1")
        user = "v" + secrets.token_hex(4)
        send_voice(made.stack, user, amr_nb(1.0))
        delivered = made.stack.wait_delivered(user, 1)
        assert [item["content"] for item in delivered] == ["answer to: heard 1.0 seconds"]
        heard = httpx.get(f"{asr_url}/__stub__/requests", timeout=5).json()
        assert len(heard) == 1 and heard[0]["model"] == "whisper-tiny" and heard[0]["rate"] == 16000
        assert [r["user"] for r in stub_requests(made.engine_url)] == ["heard 1.0 seconds"]
    finally:
        asr.stop()


def test_voice_without_recognition_or_asr_asks_to_type(stack: Stack, user: str) -> None:
    send_voice(stack, user, amr_nb(0.5))
    assert [item["content"] for item in stack.wait_delivered(user, 1)] == [texts.VOICE_NOT_READ_TEXT]
