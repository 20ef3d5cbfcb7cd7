"""Async client for one vLLM endpoint's OpenAI-compatible API: streamed chat, token counting, readiness.

A chat may offer the model OpenAI `tools`; the functions it asks for come back as `Completion.tool_calls`, from whole
and streamed answers alike (vLLM's tool-call parser turns the model's own format into OpenAI's). It knows nothing of
platforms, Redis or what the tools do. Backpressure (at most `max_in_flight` requests open
per engine) and routing between engines are the pool's job (engine/pool.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx

from bots.urls import redact_url
from engine.settings import EngineSettings

DeltaCallback = Callable[[str], Awaitable[None]]
HEALTH_TIMEOUT_S = 5.0
TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError)
log = logging.getLogger(__name__)


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The lines of a server-sent event stream, split at "\n" only.

    httpx's aiter_lines also splits at U+2028, U+0085 and the other Unicode line breaks, which a model
    may well write inside a JSON string (JSON leaves them unescaped): the chunk would be cut in two.
    """
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        *lines, buffer = buffer.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if buffer:
        yield buffer.removesuffix("\r")


async def sse_chunks(response: httpx.Response) -> AsyncIterator[dict]:
    """The JSON chunks of an OpenAI-style stream, up to its `data: [DONE]`.

    A generation that fails once the stream began still ends with HTTP 200: vLLM sends `data: {"error": {...}}` and
    then `[DONE]` (vllm/entrypoints/openai/chat_completion/serving.py). That chunk, and a stream cut before both
    `[DONE]` and a finish_reason, raise a retryable EngineError: taken as an end, they made a cut answer final."""
    finished = False
    async for line in sse_lines(response):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError as exc:  # a proxy's page, a cut line: the engine's failure, which may pass
            raise EngineError("engine streamed a chunk that is not JSON") from exc
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            raise _streamed_error(chunk["error"])
        finished = finished or any(
            isinstance(choice, dict) and choice.get("finish_reason") for choice in chunk.get("choices") or []
        )
        yield chunk
    if not finished:
        # 502, as a proxy says of a cut upstream: the pool asks /health before it takes the engine out for it
        raise EngineError("engine stream ended before the answer did (no [DONE], no finish_reason)", status=502)


def _streamed_error(error: object) -> EngineError:
    """The EngineError for an error chunk in a stream: its message (cut short) and its HTTP-like code."""
    detail = error if isinstance(error, dict) else {"message": str(error)}
    code = detail.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    message = str(detail.get("message") or detail.get("type") or "an error")[:300]
    return EngineError(f"engine failed mid-answer: {message}", retryable=status >= 500 or status == 429, status=status)


class EngineError(Exception):
    """The engine could not answer; `retryable` says whether asking again may help."""

    def __init__(self, message: str, *, retryable: bool = True, status: int = 0, timed_out: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.timed_out = timed_out  # the request took too long: the request's failure, not the engine's death

    @property
    def too_long(self) -> bool:
        """vLLM refused the request as longer than its context window (HTTP 400): the request's fault,
        not the engine's or the session's."""
        text = str(self).lower()
        return self.status == 400 and any(word in text for word in ("context length", "max_model_len", "too long"))


@dataclass(frozen=True)
class ToolCall:
    """A function the model asks to run. `arguments` is the JSON text as the engine wrote it: the caller parses it
    (and decides what a malformed one means), as a model may well write invalid JSON."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Completion:
    """A finished answer with the engine's own token counts; `tool_calls` when the model asked for functions
    (finish_reason "tool_calls", `text` then usually empty)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    first_token_s: float
    total_s: float
    routed_experts: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


def whole_tool_calls(message: dict) -> tuple[ToolCall, ...]:
    """The tool calls of a whole answer's message (OpenAI's `message.tool_calls`)."""
    calls = []
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        calls.append(ToolCall(call.get("id") or f"call_{index}", function.get("name") or "",
                              function.get("arguments") or ""))
    return tuple(calls)


class StreamedToolCalls:
    """Tool calls assembled from a stream's `delta.tool_calls` pieces, by their `index`.

    The id, type and name come once, in a call's first piece (OpenAI's and vLLM's way), so the first one given is
    kept; the arguments come in pieces to be joined in order.
    """

    def __init__(self) -> None:
        self._ids: dict[int, str] = {}
        self._names: dict[int, str] = {}
        self._arguments: dict[int, list[str]] = {}

    def add(self, pieces: list[dict]) -> None:
        for piece in pieces:
            index = int(piece.get("index", 0))
            function = piece.get("function") or {}
            self._arguments.setdefault(index, [])
            if piece.get("id") and index not in self._ids:
                self._ids[index] = piece["id"]
            if function.get("name") and index not in self._names:
                self._names[index] = function["name"]
            if function.get("arguments"):
                self._arguments[index].append(function["arguments"])

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(self._ids.get(index, f"call_{index}"), self._names.get(index, ""), "".join(self._arguments[index]))
            for index in sorted(self._arguments)
        )


class EngineClient:
    """One engine endpoint (vLLM) as the worker uses it."""

    def __init__(
        self,
        settings: EngineSettings,
        http: httpx.AsyncClient,
        base_url: str | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._settings = settings
        self._base = (base_url or settings.base_url).rstrip("/")
        self._http = http  # shared per process, owned by the runtime
        self._session = session  # ditto; whole (non-streamed) answers go through it when given: see _post
        self._headers = {}
        self.max_model_len: int | None = None  # from /v1/models, once the engine is up
        self._explained = False  # a readiness failure that says something has been logged once
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"

    @property
    def model(self) -> str:
        return self._settings.model

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        on_delta: DeltaCallback | None = None,
        extra: dict | None = None,
        tools: list[dict] | None = None,
    ) -> Completion:
        """One chat completion; with `on_delta` it is streamed and `on_delta` sees each piece of text as it arrives.

        `extra` adds vLLM request fields, e.g. continue_final_message to extend a partial answer. `tools` (OpenAI
        function definitions) are offered with tool_choice "auto"; without them (or with none: vLLM refuses an empty
        list) the body carries neither key.
        """
        body = {
            **(extra or {}),
            "model": self._settings.model,
            "messages": messages,
            "max_tokens": max_tokens or self._settings.max_tokens,
            "temperature": self._settings.temperature if temperature is None else temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        # Streamed only when someone watches the text grow: a whole answer costs far less CPU to receive.
        run = self._stream if on_delta is not None and not self._settings.expert_trace else self._whole
        try:
            # asyncio.timeout, not wait_for: wait_for runs the call in a task of its own, one more per request
            async with asyncio.timeout(self._settings.request_timeout_s):
                return await run(body, on_delta)
        except TRANSPORT_ERRORS as exc:  # first: aiohttp's connect timeout is a TimeoutError too
            raise EngineError(f"engine unreachable: {type(exc).__name__}") from exc
        except TimeoutError as exc:
            raise EngineError("engine did not finish the answer in time", timed_out=True) from exc

    async def _stream(self, body: dict, on_delta: DeltaCallback | None) -> Completion:
        started = time.monotonic()
        first_token_at = 0.0
        parts: list[str] = []
        tool_calls = StreamedToolCalls()
        usage: dict = {}
        finish_reason = ""
        url = f"{self._base}/v1/chat/completions"
        async with self._http.stream("POST", url, json=body, headers=self._headers) as response:
            if response.status_code != 200:
                detail = (await response.aread())[:300].decode(errors="replace")
                retryable = response.status_code >= 500 or response.status_code == 429
                raise EngineError(
                    f"engine answered HTTP {response.status_code}: {detail}",
                    retryable=retryable,
                    status=response.status_code,
                )
            try:
                # One deadline for the first token, lifted when it comes (no task per line, as wait_for made).
                async with asyncio.timeout(self._settings.first_token_timeout_s) as first_token:
                    async for chunk in sse_chunks(response):
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                        for choice in chunk.get("choices", []):
                            message = choice.get("delta") or {}
                            delta = message.get("content") or ""
                            finish_reason = choice.get("finish_reason") or finish_reason
                            asked = message.get("tool_calls")
                            if asked:
                                tool_calls.add(asked)
                            if (delta or asked) and not first_token_at:
                                first_token_at = time.monotonic()
                                first_token.reschedule(None)
                            if delta:
                                parts.append(delta)
                                if on_delta:
                                    await on_delta(delta)
            except TimeoutError as exc:
                raise EngineError("engine sent no first token in time", timed_out=True) from exc
        return Completion(
            text="".join(parts),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=finish_reason,
            first_token_s=(first_token_at or time.monotonic()) - started,
            total_s=time.monotonic() - started,
            tool_calls=tool_calls.calls(),
        )

    async def _whole(self, body: dict, on_delta: DeltaCallback | None) -> Completion:
        """Non-streamed request: vLLM returns `routed_experts` only in whole responses."""
        started = time.monotonic()
        url = f"{self._base}/v1/chat/completions"
        whole = {**body, "stream": False, "stream_options": None}
        status, content = await self._post(url, whole)
        if status != 200:
            retryable = status >= 500 or status == 429
            detail = content[:300].decode(errors="replace")
            raise EngineError(f"engine answered HTTP {status}: {detail}", retryable=retryable, status=status)
        try:
            data = json.loads(content)
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:  # a 200 from something else
            raise EngineError("engine answered 200 without a chat completion", status=status) from exc
        if on_delta and text:
            await on_delta(text)
        usage = data.get("usage") or {}
        elapsed = time.monotonic() - started
        return Completion(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=choice.get("finish_reason") or "",
            first_token_s=elapsed,
            total_s=elapsed,
            routed_experts=choice.get("routed_experts"),
            tool_calls=whole_tool_calls(choice["message"]),
        )

    async def _post(self, url: str, body: dict) -> tuple[int, bytes]:
        """POST a JSON body: (status, content). Production passes an aiohttp session (gateway/runtime.py), as a
        small POST costs aiohttp ~0.3 ms of CPU and httpx ~2.3 ms; without one (the model tests route httpx
        transports to an in-process engine and inject faults there) it goes through the httpx client."""
        if self._session is None:
            response = await self._http.post(url, json=body, headers=self._headers)
            return response.status_code, response.content
        data = json.dumps(body, ensure_ascii=False).encode()
        headers = {**self._headers, "Content-Type": "application/json"}
        async with self._session.post(url, data=data, headers=headers) as response:
            return response.status, await response.read()

    def _explain(self, status: int, url: str) -> None:
        """Say once why an engine that answers is not ready: a 404 is a wrong base_url, a 401 or 403 a missing or
        wrong api_key (vLLM started with --api-key guards /v1 but not /health), not a slow start."""
        if self._explained or status not in (401, 403, 404):
            return
        self._explained = True
        if status == 404:
            log.warning(
                "engine answered 404: is engine.base_url the server's root (http://host:8000 or …/v1)?",
                extra={"url": redact_url(url)},
            )
        else:
            given = "wrong" if self._settings.api_key else "missing"
            log.warning(
                f"engine answered {status} to /v1/models: engine.api_key is {given} (vLLM's --api-key)",
                extra={"url": redact_url(url)},
            )

    async def _get(self, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """GET: (status, content), through the aiohttp session when there is one, as `_post` (every process probes
        every engine every few seconds: through httpx each probe cost several times the CPU)."""
        if self._session is None:
            response = await self._http.get(url, headers=headers)  # httpx follows no redirect unless told
            return response.status_code, response.content
        async with self._session.get(url, headers=headers, allow_redirects=False) as response:  # a 3xx: not ready
            return response.status, await response.read()

    async def _probe_get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes] | None:
        """A probe's GET within HEALTH_TIMEOUT_S; None when the engine did not answer."""
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                return await self._get(f"{self._base}{path}", headers)
        except (*TRANSPORT_ERRORS, TimeoutError, OSError):
            return None

    async def _small(self, what: str, request: Awaitable[tuple[int, bytes]], timeout_s: float) -> bytes:
        """A small request's body (/metrics, /tokenize: asked often, so the cheaper client); EngineError else."""
        try:
            async with asyncio.timeout(timeout_s):
                status, content = await request
        except TRANSPORT_ERRORS as exc:  # first: aiohttp's connect timeout is a TimeoutError too
            raise EngineError(f"engine unreachable: {type(exc).__name__}") from exc
        except TimeoutError as exc:
            raise EngineError(f"{what} did not answer in time", timed_out=True) from exc
        if status != 200:
            raise EngineError(f"{what} answered HTTP {status}")
        return content

    async def metrics_text(self) -> str:
        """The engine's Prometheus exposition (/metrics)."""
        content = await self._small("/metrics", self._get(f"{self._base}/metrics"), 5.0)
        return content.decode(errors="replace")

    async def count_tokens(self, text: str) -> int:
        """Tokens of `text` by the engine's own tokenizer (vLLM's /tokenize), never by characters."""
        body = {"model": self._settings.model, "prompt": text, "add_special_tokens": False}
        request = self._post(f"{self._base}/tokenize", body)
        content = await self._small("/tokenize", request, self._settings.request_timeout_s)
        try:
            return int(json.loads(content)["count"])
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError("/tokenize answered without a count") from exc

    async def is_alive(self) -> bool:
        """True when /health answers 200: the light check of an engine already known to serve our model."""
        health = await self._probe_get("/health")
        return health is not None and health[0] == 200

    async def is_ready(self) -> bool:
        """True when /health answers 200 and /v1/models lists our model."""
        for path, headers in (("/health", None), ("/v1/models", self._headers)):
            answer = await self._probe_get(path, headers)
            if answer is None:
                return False
            if answer[0] != 200:
                self._explain(answer[0], f"{self._base}{path}")
                return False
        try:
            listed = json.loads(answer[1])["data"]
            served = {str(item["id"]): item for item in listed}
        except (ValueError, KeyError, TypeError):  # not vLLM's /v1/models answer: not ready, said once
            if not self._explained:
                self._explained = True
                log.warning("engine's /v1/models is not an OpenAI model list", extra={"url": redact_url(self._base)})
            return False
        item = served.get(self._settings.model)
        if item is None:
            if not self._explained:
                self._explained = True
                extra = {"model": self._settings.model, "served": sorted(served)}
                log.warning("the engine does not serve the configured model", extra=extra)
            return False
        self._explained = False
        length = item.get("max_model_len")
        self.max_model_len = int(length) if isinstance(length, int) and length > 0 else None
        return True
