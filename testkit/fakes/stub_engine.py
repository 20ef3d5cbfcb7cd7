"""An OpenAI-compatible engine with a fixed answer time, for tests about scheduling rather than generation.

It answers every chat request `delay` seconds after it arrives, with "answer to: <last user
message>", streamed in a few chunks (`--chunk-delay` apart), and usage counted as UTF-8 bytes // 3
for the prompt and one token per chunk. A user message containing `sleep=SECONDS` is answered
after that many seconds instead (a test can give messages answers of different lengths). A request
that continues an assistant message (vLLM's continue_final_message) gets the rest of the answer
after what that message already holds. It serves /health, /v1/models (with max_model_len),
/tokenize and /metrics like vLLM (running counts a request until its last chunk is sent), records
every request (GET /__stub__/requests: the user's text; "images", the image parts' URLs) so a test can see
what reached the engine and when, and can
be told to report extra load or to answer slower (POST /__stub__/load {"running": N, "delay_s": S}).
A user message containing `fail-once` is refused with HTTP 503 the first time that exact text arrives
(an engine restarting under a retry), and answered after that.

    python -m testkit.fakes.stub_engine --port 8011 --delay 1.0 [--chunk-delay 0] [--model ernie-tiny] \
        [--max-model-len 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

CHUNKS = 4
SLEEP = re.compile(r"sleep=([0-9.]+)")
FAIL_ONCE = "fail-once"


def answer_for(user_text: str) -> str:
    return f"answer to: {user_text}"


def text_of(content: str | list[dict]) -> str:
    """A message's text: its content, or the text parts of a content list (OpenAI's image messages)."""
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


def create_app(model: str, delay_s: float, max_model_len: int, chunk_delay_s: float = 0.0) -> FastAPI:
    app = FastAPI()
    requests: list[dict] = []
    failed: set[str] = set()  # fail-once texts already refused
    running = {"n": 0, "extra": 0}
    timing = {"delay": delay_s}

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": model, "max_model_len": max_model_len}]})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"count": max(1, len(str(body.get("prompt", "")).encode()) // 3)})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{model}"}} {running["n"] + running["extra"]}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{model}"}} 0\n'
        )
        return PlainTextResponse(text)

    @app.get("/__stub__/requests")
    async def recorded() -> JSONResponse:
        return JSONResponse(requests)

    @app.post("/__stub__/load")
    async def load(request: Request) -> JSONResponse:
        """Report `running` extra requests (as another gateway's would be); `delay_s`: a new answer time."""
        body = await request.json()
        running["extra"] = int(body.get("running", running["extra"]))
        timing["delay"] = float(body.get("delay_s", timing["delay"]))
        return JSONResponse({"running": running["n"] + running["extra"], "delay_s": timing["delay"]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request):  # type: ignore[no-untyped-def]
        body = await request.json()
        messages = body.get("messages", [])
        content = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        last_user = text_of(content)
        continued = messages[-1]["content"] if body.get("continue_final_message") and messages else None
        prompt_tokens = max(1, len(json.dumps(messages, ensure_ascii=False).encode()) // 3)
        warmup = body.get("max_tokens") == 1
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        record = {"user": last_user, "max_tokens": body.get("max_tokens"), "start": time.time(), "warmup": warmup,
                  "images": [part["image_url"]["url"] for part in content if part.get("type") == "image_url"]
                  if isinstance(content, list) else [],
                  "continued": continued, "system": system,
                  "history": [m["content"] for m in messages[:-1] if m.get("role") != "system"]}
        requests.append(record)
        if FAIL_ONCE in last_user and last_user not in failed:
            failed.add(last_user)
            return JSONResponse({"error": {"message": "engine restarting"}}, status_code=503)
        answer = answer_for(last_user)
        if continued is not None:
            answer = answer[len(continued) :] if answer.startswith(continued) else ""
        pieces = [answer[len(answer) * i // CHUNKS : len(answer) * (i + 1) // CHUNKS] for i in range(CHUNKS)]
        sleep = SLEEP.search(last_user)
        running["n"] += 1
        try:
            await asyncio.sleep(0 if warmup else float(sleep.group(1)) if sleep else timing["delay"])
        except BaseException:
            running["n"] -= 1
            raise
        record["usage"] = prompt_tokens + CHUNKS
        if not body.get("stream"):
            running["n"] -= 1
            record["end"] = time.time()
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": CHUNKS}
            choice = {"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
            return JSONResponse({"choices": [choice], "usage": usage})

        async def events():  # type: ignore[no-untyped-def]
            try:
                for index, piece in enumerate(pieces):
                    if index and chunk_delay_s:
                        await asyncio.sleep(chunk_delay_s)
                    chunk = {"choices": [{"delta": {"content": piece}, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": CHUNKS}
                final = {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": usage}
                yield f"data: {json.dumps(final)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                running["n"] -= 1
                record["end"] = time.time()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--model", default="ernie-tiny")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args()
    app = create_app(args.model, args.delay, args.max_model_len, args.chunk_delay)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
