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

Tools, for tests of function calling: when a request offers OpenAI `tools`, every line of the last user message of
the form `tool:<name> <JSON object>` whose name is one of the offered functions becomes a tool call (in the order
written: id `call_<request number>_<i>`, the arguments the rest of the line verbatim, `{}` when it is empty, so a
test may also send malformed JSON); the answer then has content null and finish_reason "tool_calls", streamed as
vLLM does (a call's id and name first, its arguments in pieces). A line naming a tool not offered stays text. When
the last message is a `tool` message, the answer is "tool results: " + the trailing tool messages' contents joined
by " | ". Recorded requests carry "tools" (the offered function names), "tool_results" (those contents),
"tool_choice" and "fields" (the request body's top-level keys, sorted).

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
TOOL_LINE = re.compile(r"^tool:(\S+)(?:[ \t]+(.*))?$")


def answer_for(user_text: str) -> str:
    return f"answer to: {user_text}"


def text_of(content: str | list[dict]) -> str:
    """A message's text: its content, or the text parts of a content list (OpenAI's image messages)."""
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


def offered_names(tools: list[dict] | None) -> list[str]:
    """The function names a request offers (OpenAI `tools`)."""
    return [str((tool.get("function") or {}).get("name", "")) for tool in tools or []]


def trailing_tool_results(messages: list[dict]) -> list[str]:
    """The contents of the `tool` messages that end the conversation (the results the model is to answer from)."""
    results: list[str] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        results.insert(0, text_of(message.get("content") or ""))
    return results


def asked_tools(user_text: str, offered: list[str], request_number: int) -> list[dict]:
    """The OpenAI tool calls the `tool:<name> <JSON>` lines of the user's text ask for, among the offered tools."""
    calls = []
    for line in user_text.splitlines():
        match = TOOL_LINE.match(line.strip())
        if match is None or match.group(1) not in offered:
            continue
        arguments = (match.group(2) or "").strip() or "{}"
        call_id = f"call_{request_number}_{len(calls)}"
        calls.append({"id": call_id, "type": "function", "function": {"name": match.group(1), "arguments": arguments}})
    return calls


def tool_call_chunks(calls: list[dict]) -> list[dict]:
    """The stream deltas of `calls`, as vLLM sends them: id, type and name first, then the arguments in two pieces."""
    chunks = []
    for index, call in enumerate(calls):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        head = {"index": index, "id": call["id"], "type": "function", "function": {"name": name, "arguments": ""}}
        chunks.append({"tool_calls": [head]})
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            chunks.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    return chunks


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
        offered = offered_names(body.get("tools"))
        prompt = json.dumps(messages, ensure_ascii=False) + (json.dumps(body["tools"]) if offered else "")
        prompt_tokens = max(1, len(prompt.encode()) // 3)
        warmup = body.get("max_tokens") == 1
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        results = trailing_tool_results(messages)
        record = {"user": last_user, "max_tokens": body.get("max_tokens"), "start": time.time(), "warmup": warmup,
                  "images": [part["image_url"]["url"] for part in content if part.get("type") == "image_url"]
                  if isinstance(content, list) else [],
                  "continued": continued, "system": system,
                  "history": [m["content"] for m in messages[:-1] if m.get("role") != "system"],
                  "tools": offered, "tool_results": results, "tool_choice": body.get("tool_choice"),
                  "fields": sorted(body)}
        requests.append(record)
        if FAIL_ONCE in last_user and last_user not in failed:
            failed.add(last_user)
            return JSONResponse({"error": {"message": "engine restarting"}}, status_code=503)
        calls = [] if results else asked_tools(last_user, offered, len(requests))
        answer = ("tool results: " + " | ".join(results)) if results else answer_for(last_user)
        if continued is not None:
            answer = answer[len(continued) :] if answer.startswith(continued) else ""
        pieces = [answer[len(answer) * i // CHUNKS : len(answer) * (i + 1) // CHUNKS] for i in range(CHUNKS)]
        deltas = tool_call_chunks(calls) if calls else [{"content": piece} for piece in pieces]
        finish_reason = "tool_calls" if calls else "stop"
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
            message = {"role": "assistant", "content": None, "tool_calls": calls} if calls else \
                {"role": "assistant", "content": answer}
            choice = {"message": message, "finish_reason": finish_reason}
            return JSONResponse({"choices": [choice], "usage": usage})

        async def events():  # type: ignore[no-untyped-def]
            try:
                for index, delta in enumerate(deltas):
                    if index and chunk_delay_s:
                        await asyncio.sleep(chunk_delay_s)
                    chunk = {"choices": [{"delta": delta, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": CHUNKS}
                final = {"choices": [{"delta": {}, "finish_reason": finish_reason}], "usage": usage}
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
