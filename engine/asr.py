"""Speech to text through an OpenAI-compatible `/v1/audio/transcriptions` endpoint (vLLM serving Whisper, say).

A voice message arrives in whatever codec its platform records: AMR from the WeCom app and 微信客服, Speex or
SILK from WeChat's clients. OpenAI's transcription API takes flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav and webm
only, so anything else is first turned into 16 kHz mono WAV (what Whisper listens at) by ffmpeg: fed through
stdin, no shell, the demuxer named rather than guessed and only the pipe protocol allowed (a file that claims
to be a playlist cannot make ffmpeg open anything), in bounded time. SILK is Tencent's own codec, which ffmpeg
does not decode: it is refused as an unsupported format.
"""

from __future__ import annotations

import asyncio
import io
import logging
import wave

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from engine.launcher import WHISPER_MODEL

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
# The formats OpenAI's transcription API lists; they go to the endpoint as they came.
ACCEPTED = frozenset({"flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "wav", "webm"})
# The formats ffmpeg turns into WAV first, by the ffmpeg demuxer that reads each.
CONVERTED = {"amr": "amr", "amr-wb": "amr", "speex": "ogg"}
ALIASES = {"amr-nb": "amr", "amrnb": "amr", "amrwb": "amr-wb", "spx": "speex", "oga": "ogg", "opus": "ogg",
           "wave": "wav", "x-wav": "wav", "mpeg3": "mp3", "silk_v3": "silk", "slk": "silk"}  # fmt: skip
MAX_SECONDS = 600  # longer than any platform's voice message (WeCom: 60 s); bounds what ffmpeg writes
CONVERT_TIMEOUT_S = 30.0


class TranscriptionError(Exception):
    """A voice message could not be turned into text; the message is a short label, free of URLs and keys
    ("unsupported format", "unreadable audio", "timed out", "unavailable", "refused", "bad answer")."""


class AsrSettings(BaseModel):
    """Where speech is turned into text (the `asr:` section)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="the server root; `http://host:8000`, `http://host:8000/v1` and "
                                      "`…/v1/audio/transcriptions` all name the same endpoint")
    model: str = Field(default=WHISPER_MODEL, description="the served model name (engine profile asr-whisper-*)")
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=60.0, gt=0, description="longest wait for one transcription")
    language: str | None = Field(default=None, description="ISO-639-1 hint (zh, en); unset: the model detects it")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.strip().lower().startswith(("http://", "https://")):
            raise ValueError("asr.base_url must be an http:// or https:// URL")
        return value

    @property
    def root(self) -> str:
        """The server root, whichever of the common forms base_url was written in."""
        root = self.base_url.strip().rstrip("/")
        return root.removesuffix("/audio/transcriptions").removesuffix("/v1").rstrip("/")

    @property
    def transcriptions_url(self) -> str:
        return f"{self.root}/v1/audio/transcriptions"


def audio_format(data: bytes, declared: str = "", name: str = "") -> str:
    """The audio's format: its magic bytes when they tell, else what the platform declared (`amr`, `.AMR`,
    `audio/amr`), else the file name's suffix; '' when nothing tells."""
    sniffed = _sniff(data)
    if sniffed:
        return sniffed
    for hint in (declared, name.rsplit(".", 1)[-1] if "." in name else ""):
        label = hint.strip().lower().rsplit("/", 1)[-1].lstrip(".").removeprefix("x-")
        if label:
            return ALIASES.get(label, label)
    return ""


def _sniff(data: bytes) -> str:
    head = data[:64]
    if head.startswith(b"#!AMR-WB\n"):
        return "amr-wb"
    if head.startswith(b"#!AMR\n"):
        return "amr"
    if head.startswith((b"#!SILK_V3", b"\x02#!SILK_V3")):  # WeChat's SILK carries a leading 0x02
        return "silk"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"OggS"):
        return "speex" if b"Speex   " in data[:128] else "ogg"
    if head.startswith(b"fLaC"):
        return "flac"
    return ""


def pcm_to_wav(pcm: bytes, sample_rate: int = SAMPLE_RATE) -> bytes:
    """16-bit mono PCM wrapped in a WAV header with its true sizes (ffmpeg writing to a pipe cannot go back to
    fill them in)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm)
    return buffer.getvalue()


async def convert_to_wav(data: bytes, demuxer: str, timeout_s: float = CONVERT_TIMEOUT_S) -> bytes:
    """`data` (read by ffmpeg's `demuxer`) as 16 kHz mono WAV; TranscriptionError when ffmpeg cannot read it in
    time."""
    command = [
        "ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin",
        "-protocol_whitelist", "pipe", "-f", demuxer, "-i", "pipe:0",
        "-vn", "-ac", "1", "-ar", str(SAMPLE_RATE), "-t", str(MAX_SECONDS), "-f", "s16le", "pipe:1",
    ]  # fmt: skip
    try:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except FileNotFoundError:
        raise TranscriptionError("unsupported format") from None  # no ffmpeg here: scripts/install.sh installs it
    try:
        pcm, errors = await asyncio.wait_for(process.communicate(data), timeout_s)
    except TimeoutError:
        raise TranscriptionError("timed out") from None
    finally:  # timed out, or the job was cancelled (a lost lease, a shutdown): ffmpeg goes with it
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0 or not pcm:
        log.warning("ffmpeg could not read a voice message",
                    extra={"demuxer": demuxer, "error": errors.decode(errors="replace")[-300:]})
        raise TranscriptionError("unreadable audio")
    return pcm_to_wav(pcm)


class Transcriber:
    """Turns a voice message into text through the configured endpoint."""

    def __init__(self, settings: AsrSettings, http: httpx.AsyncClient) -> None:
        self._settings = settings
        self._http = http  # shared per process, owned by the runtime
        self._headers = {}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"

    async def _prepared(self, audio: bytes, format: str, name: str) -> tuple[str, bytes]:
        """(file name, bytes) as the endpoint will take them: converted to WAV unless already in a format it
        lists."""
        kind = audio_format(audio, format, name)
        if kind in ACCEPTED:
            return f"voice.{kind}", audio
        if kind in CONVERTED:
            return "voice.wav", await convert_to_wav(audio, CONVERTED[kind])
        raise TranscriptionError("unsupported format")

    async def transcribe(self, audio: bytes, format: str, name: str = "") -> str:
        """The text spoken in `audio` ('' for silence). `format` is the platform's name for the codec (amr,
        speex, silk, ogg…; '' when it gives none), `name` the file's name where it has one."""
        filename, data = await self._prepared(audio, format, name)
        fields = {"model": self._settings.model, "response_format": "json"}
        if self._settings.language:
            fields["language"] = self._settings.language
        try:
            response = await self._http.post(
                self._settings.transcriptions_url,
                data=fields,
                files={"file": (filename, data, "application/octet-stream")},
                headers=self._headers,
                timeout=self._settings.timeout_s,
            )
        except httpx.TimeoutException:
            raise TranscriptionError("timed out") from None
        except httpx.HTTPError as exc:
            log.warning("transcription endpoint unreachable", extra={"error": type(exc).__name__})
            raise TranscriptionError("unavailable") from None
        if response.status_code != 200:
            log.warning("transcription refused", extra={"status": response.status_code})
            raise TranscriptionError("unavailable" if response.status_code >= 500 else "refused")
        try:
            text = response.json()["text"]
        except (ValueError, KeyError, TypeError):
            raise TranscriptionError("bad answer") from None
        if not isinstance(text, str):
            raise TranscriptionError("bad answer")
        return text.strip()
