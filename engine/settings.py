"""Settings of the engine client: where vLLM is and how to ask it."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class EngineSettings(BaseModel):
    """Where the vLLM engine is and how to ask it."""

    base_url: str = "http://127.0.0.1:8000"
    model: str = "ernie-tiny"
    api_key: SecretStr | None = None
    max_tokens: int = Field(default=512, ge=1)
    temperature: float = Field(default=0.3, ge=0.0, le=2.0)
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 60.0
    request_timeout_s: float = 180.0
    max_in_flight: int = Field(default=16, ge=1)
