"""An OpenAI-compatible transcription endpoint for tests: multipart in, `{"text": ...}` out.

POST /v1/audio/transcriptions must carry the multipart fields `file` and `model` (OpenAI's required fields; a
request without them gets a 400 with OpenAI's error shape), and the file must be a WAV that the standard
library's `wave` module opens: stricter than a real endpoint, which also takes mp3, ogg…, because what botgw
sends a transcription endpoint after converting a platform's codec is WAV. The answer is the fixed `--text`,
or, without it, "heard N.N seconds" (N from the WAV's own length), so a test can tell that the audio reached
it whole. Every request is recorded (GET /__stub__/requests: model, response_format, language, file name,
channels, rate, seconds, authorization seen); POST /__stub__/config {"text": ..., "delay_s": ...} changes
the answer or makes it slow. `--api-key K` refuses a request without `Authorization: Bearer K` (401).

    python -m testkit.fakes.stub_asr --port 8021 [--text "你好"] [--delay 0] [--api-key K]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import wave
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.datastructures import UploadFile

from testkit.processes import Proc, free_port, wait_http


def _error(status: int, message: str) -> JSONResponse:
    """OpenAI's error body."""
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


def heard(seconds: float) -> str:
    """The derived answer: how much audio arrived."""
    return f"heard {seconds:.1f} seconds"


def create_app(text: str | None = None, delay_s: float = 0.0, api_key: str | None = None) -> FastAPI:
    app = FastAPI()
    requests: list[dict] = []
    config: dict = {"text": text, "delay_s": delay_s}

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/__stub__/requests")
    async def recorded() -> JSONResponse:
        return JSONResponse(requests)

    @app.post("/__stub__/config")
    async def configure(request: Request) -> JSONResponse:
        config.update(await request.json())
        return JSONResponse(config)

    @app.post("/v1/audio/transcriptions")
    async def transcribe(request: Request) -> JSONResponse:
        authorization = request.headers.get("authorization", "")
        if api_key is not None and authorization != f"Bearer {api_key}":
            return _error(401, "invalid api key")
        form = await request.form()
        upload, model = form.get("file"), form.get("model")
        if not isinstance(upload, UploadFile) or not isinstance(model, str) or not model:
            return _error(400, "multipart fields `file` and `model` are required")
        data = await upload.read()
        try:
            with wave.open(io.BytesIO(data), "rb") as audio:
                channels, rate, frames = audio.getnchannels(), audio.getframerate(), audio.getnframes()
        except (wave.Error, EOFError) as exc:
            return _error(400, f"not a WAV file: {exc}")
        seconds = frames / rate if rate else 0.0
        requests.append({
            "model": model, "response_format": form.get("response_format"), "language": form.get("language"),
            "filename": upload.filename, "channels": channels, "rate": rate, "seconds": seconds,
            "bytes": len(data), "authorized": bool(authorization),
        })  # fmt: skip
        if config["delay_s"]:
            await asyncio.sleep(float(config["delay_s"]))
        return JSONResponse({"text": config["text"] if config["text"] is not None else heard(seconds)})

    return app


def start_stub_asr(log_dir: Path, name: str = "stub-asr", *flags: str) -> tuple[Proc, str]:
    """This stub as a process on a free port (flags: --text, --delay, --api-key), once it answers /health; the URL
    is the server root, as `asr.base_url` takes it."""
    port = free_port()
    proc = Proc([sys.executable, "-m", "testkit.fakes.stub_asr", "--port", str(port), *flags], log_dir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 30, proc)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--text", default=None, help="the fixed answer (default: derived from the audio's length)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before answering")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    app = create_app(args.text, args.delay, args.api_key)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
