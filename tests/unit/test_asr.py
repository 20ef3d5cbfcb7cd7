"""Speech to text (engine/asr.py) against the stub transcription endpoint (testkit/fakes/stub_asr.py), with the
real ffmpeg: AMR and Speex converted to 16 kHz mono WAV and transcribed, an endpoint that is down, one that is
too slow, one that refuses, and what is not audio at all."""

from __future__ import annotations

import math
import random
import subprocess
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from pydantic import ValidationError

from engine.asr import AsrSettings, Transcriber, TranscriptionError, audio_format, convert_to_wav, pcm_to_wav
from testkit.fakes.stub_asr import heard, start_stub_asr
from testkit.processes import free_port

KEY = "sk-stub-asr-secret"


def sine_wav(seconds: float, rate: int = 8000, frequency: float = 440.0) -> bytes:
    """A tone, written with the standard library."""
    frames = b"".join(
        int(12000 * math.sin(2 * math.pi * frequency * i / rate)).to_bytes(2, "little", signed=True)
        for i in range(int(seconds * rate))
    )
    return pcm_to_wav(frames, rate)


def speex_from(wav: bytes) -> bytes:
    """Ogg Speex, encoded by ffmpeg (libspeex) from a WAV: the codec WeChat's clients record in."""
    return subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-f", "wav", "-i", "pipe:0", "-c:a", "libspeex", "-f", "ogg",
         "pipe:1"],
        input=wav, capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip


def amr_nb(seconds: float) -> bytes:
    """An AMR-NB file in the storage format of RFC 4867 section 5 (`#!AMR\\n`, then frames): 12.2 kbit/s frames
    (frame type 7: header byte 0x3C, 31 bytes of speech bits), 20 ms each. Debian's ffmpeg decodes AMR but has no
    AMR encoder (that is the non-free libopencore), so the speech bits are random: every bit pattern is a frame
    the decoder must read, the way it reads what WeCom records."""
    rng = random.Random(23)
    frames = int(seconds / 0.02)
    return b"#!AMR\n" + b"".join(b"\x3c" + rng.randbytes(31) for _ in range(frames))


@pytest.fixture(scope="module")
def stub_asr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_stub_asr(tmp_path_factory.mktemp("asr"), "stub-asr", "--api-key", KEY)
    yield url
    proc.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def settings(base_url: str, **overrides: object) -> AsrSettings:
    return AsrSettings(base_url=base_url, api_key=KEY, **overrides)


def requests_of(url: str) -> list[dict]:
    return httpx.get(f"{url}/__stub__/requests", timeout=5).json()


@pytest.mark.parametrize("form", [
    "http://asr:8000", "http://asr:8000/", "http://asr:8000/v1", "http://asr:8000/v1/", " http://asr:8000/v1 ",
    "http://asr:8000/v1/audio/transcriptions",
])  # fmt: skip
def test_every_common_form_of_base_url_names_the_same_endpoint(form: str) -> None:
    assert AsrSettings(base_url=form).transcriptions_url == "http://asr:8000/v1/audio/transcriptions"


def test_a_base_url_under_a_path_keeps_its_path_and_a_non_http_one_is_refused() -> None:
    assert AsrSettings(base_url="https://gw.example/asr/v1").transcriptions_url == (
        "https://gw.example/asr/v1/audio/transcriptions"
    )
    with pytest.raises(ValidationError):
        AsrSettings(base_url="file:///etc/passwd")


def test_the_format_comes_from_the_bytes_before_the_platforms_word() -> None:
    assert audio_format(amr_nb(0.1), "") == "amr"
    assert audio_format(b"#!AMR-WB\n...", "amr") == "amr-wb"
    assert audio_format(b"\x02#!SILK_V3...", "") == "silk"
    assert audio_format(sine_wav(0.01), "amr") == "wav"
    assert audio_format(b"unknown", "audio/AMR") == "amr"
    assert audio_format(b"unknown", ".spx") == "speex"
    assert audio_format(b"unknown", "", "voice.slk") == "silk"
    assert audio_format(b"unknown") == ""


async def test_an_amr_voice_is_converted_to_16khz_mono_wav_and_transcribed(stub_asr: str, http) -> None:
    text = await Transcriber(settings(stub_asr), http).transcribe(amr_nb(2.0), "amr")
    assert text == heard(2.0)  # the stub heard two seconds: the whole recording arrived, as WAV
    last = requests_of(stub_asr)[-1]
    assert (last["rate"], last["channels"], last["filename"]) == (16000, 1, "voice.wav")
    assert (last["model"], last["response_format"]) == ("openai/whisper-large-v3-turbo", "json")


async def test_a_speex_voice_made_from_a_sine_wav_is_converted_and_transcribed(stub_asr: str, http) -> None:
    speex = speex_from(sine_wav(1.5))
    assert audio_format(speex, "") == "speex"
    text = await Transcriber(settings(stub_asr, language="zh"), http).transcribe(speex, "speex")
    assert text == heard(1.5)
    last = requests_of(stub_asr)[-1]
    assert (last["rate"], last["channels"], last["language"]) == (16000, 1, "zh")


async def test_a_wav_goes_as_it_came(stub_asr: str, http) -> None:
    text = await Transcriber(settings(stub_asr), http).transcribe(sine_wav(1.0), "", "memo.wav")
    assert text == heard(1.0)
    assert requests_of(stub_asr)[-1]["rate"] == 8000  # not converted: the endpoint takes WAV


async def test_silk_and_unknown_formats_are_refused_before_any_request(stub_asr: str, http) -> None:
    before = len(requests_of(stub_asr))
    transcriber = Transcriber(settings(stub_asr), http)
    for audio, declared in ((b"\x02#!SILK_V3" + bytes(64), "silk"), (b"\x00" * 64, "")):
        with pytest.raises(TranscriptionError, match="unsupported format"):
            await transcriber.transcribe(audio, declared)
    assert len(requests_of(stub_asr)) == before


async def test_what_only_claims_to_be_amr_is_unreadable() -> None:
    with pytest.raises(TranscriptionError, match="unreadable audio"):
        await convert_to_wav(b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n", "amr")


async def test_a_conversion_that_takes_too_long_is_stopped() -> None:
    with pytest.raises(TranscriptionError, match="timed out"):
        await convert_to_wav(amr_nb(30.0), "amr", timeout_s=0.001)


async def test_an_endpoint_that_is_down(http) -> None:
    with pytest.raises(TranscriptionError, match="unavailable"):
        await Transcriber(settings(f"http://127.0.0.1:{free_port()}"), http).transcribe(sine_wav(0.2), "wav")


async def test_an_endpoint_that_is_too_slow(stub_asr: str, http) -> None:
    httpx.post(f"{stub_asr}/__stub__/config", json={"delay_s": 3.0}, timeout=5)
    try:
        with pytest.raises(TranscriptionError, match="timed out"):
            await Transcriber(settings(stub_asr, timeout_s=0.5), http).transcribe(sine_wav(0.2), "wav")
    finally:
        httpx.post(f"{stub_asr}/__stub__/config", json={"delay_s": 0.0}, timeout=5)


async def test_a_refusal_says_so_without_the_key(stub_asr: str, http) -> None:
    wrong = AsrSettings(base_url=stub_asr, api_key="sk-wrong-key")
    with pytest.raises(TranscriptionError) as refused:
        await Transcriber(wrong, http).transcribe(sine_wav(0.2), "wav")
    assert str(refused.value) == "refused" and "sk-wrong-key" not in repr(refused.value)
    httpx.post(f"{stub_asr}/__stub__/config", json={"text": " 你好，帮我查一下报销进度 "}, timeout=5)
    try:
        text = await Transcriber(settings(stub_asr), http).transcribe(sine_wav(0.2), "wav")
        assert text == "你好，帮我查一下报销进度"
    finally:
        httpx.post(f"{stub_asr}/__stub__/config", json={"text": None}, timeout=5)
