"""Settings of the engine client: where the vLLM engines are and how to ask them."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from bots.urls import url_in_message


def engine_root(url: str) -> str:
    """An engine's server root from what users copy: `http://host:8000`, `…/v1` (OpenAI clients, vLLM's docs),
    `…/v1/chat/completions` (a curl example); botgw adds /v1 itself, and /health and /metrics live at the root."""
    root = url.strip().rstrip("/").removesuffix("/chat/completions").rstrip("/")
    return root.removesuffix("/v1")


class EngineEndpoint(BaseModel):
    """One engine in `engine.endpoints` written out, where engines differ: `{url: ..., vision: true}`."""

    model_config = ConfigDict(extra="forbid")

    url: str
    vision: bool | None = Field(default=None, description="can see images; unset: the engine-wide `vision`")


class EngineSettings(BaseModel):
    """Where the vLLM engines are, how to ask them, and how to watch them."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = "http://127.0.0.1:8000"
    endpoints: list[str | EngineEndpoint] = Field(
        default_factory=list, description="several engines (a URL, or {url, vision}); base_url when empty"
    )
    vision: bool = Field(default=False, description="the engines can see images (a multimodal model)")
    model: str = "ernie-tiny"
    api_key: SecretStr | None = None
    max_tokens: int = Field(default=512, ge=1)
    temperature: float = Field(default=0.3, ge=0.0, le=2.0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    first_token_timeout_s: float = Field(default=60.0, gt=0, description="shorter than request_timeout_s")
    request_timeout_s: float = Field(default=180.0, gt=0)
    max_in_flight: int = Field(default=16, ge=1, description="per engine; match vLLM's --max-num-seqs")
    poll_interval_s: float = Field(default=1.0, gt=0, description="how often /health and /metrics are read")
    warmup: bool = True
    wait_notice_after_s: float = Field(default=20.0, ge=0, description="tell a waiting user the engine is starting")
    max_wait_s: float = Field(default=900.0, gt=0, description="longest a message waits for an engine")
    kv_warn_threshold: float = Field(default=0.92, gt=0, le=1)
    kv_warn_after_s: float = Field(default=30.0, ge=0)
    expert_trace: bool = Field(default=False, description="ask for routed_experts (vLLM GPU, MoE) and record them")
    attach_expert_trace: bool = Field(default=False, description="append the busiest experts to each reply")

    def urls(self) -> list[str]:
        """The engines' server roots. `http://host:8000/v1`, the form OpenAI clients and vLLM's docs use, is
        taken as `http://host:8000`: botgw adds /v1 itself, and /health and /metrics live at the root."""
        return [root for root, _ in self.targets()]

    def targets(self) -> list[tuple[str, bool]]:
        """Each engine's server root and whether it can see images (its own `vision`, else the engine-wide one)."""
        entries = self.endpoints or [self.base_url]
        out = []
        for entry in entries:
            endpoint = entry if isinstance(entry, EngineEndpoint) else EngineEndpoint(url=entry)
            sees = self.vision if endpoint.vision is None else endpoint.vision
            out.append((engine_root(endpoint.url), sees))
        return out

    @model_validator(mode="after")
    def _first_token_comes_first(self) -> EngineSettings:
        """A first-token limit at or past the whole request's could never fire: the request's would, saying "did not
        finish in time" of an engine that never began. Refused when both were set; a request limit lowered below the
        first token's default takes half of it for the first token."""
        if self.first_token_timeout_s >= self.request_timeout_s:
            if "first_token_timeout_s" not in self.model_fields_set:  # only the request's was lowered: follow it
                self.first_token_timeout_s = self.request_timeout_s / 2
                return self
            raise ValueError(
                f"first_token_timeout_s ({self.first_token_timeout_s:g}) must be shorter than request_timeout_s "
                f"({self.request_timeout_s:g})"
            )
        return self

    @model_validator(mode="after")
    def _urls_reachable(self) -> EngineSettings:
        """An engine URL without a scheme or host (`localhost:8000`) could only fail later, as "never ready"."""
        for root, _ in self.targets():
            parts = urlsplit(root)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"engine URL {url_in_message(root)} needs http:// or https:// and a host, "
                                 "like http://127.0.0.1:8000/v1")  # fmt: skip
        return self
