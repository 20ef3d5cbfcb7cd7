"""The flood guard (gateway/edge/flood_guard.py): `limits.http_per_source` is applied to every request of the
gateway's app, per source address, before any route runs. slowapi's middleware, used before, found no route in
FastAPI's nested routers and limited nothing; these tests would have failed against it."""

from __future__ import annotations

import httpx

from gateway.config import Settings
from gateway.edge.app import create_app


def client(app: object, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


async def test_the_gateway_answers_429_past_the_limit_per_source_and_only_for_that_source() -> None:
    settings = Settings(bots=[], limits={"http_per_source": "3/minute"}, namespace="flood")
    app = create_app(settings)
    async with client(app, "10.0.0.1") as flooding, client(app, "10.0.0.2") as other:
        assert [(await flooding.get("/healthz")).status_code for _ in range(3)] == [200, 200, 200]
        refused = await flooding.get("/healthz")
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert "3 per 1 minute" in refused.json()["error"]
        assert (await flooding.post("/callback/any", content=b"x")).status_code == 429, "refused before any route"
        assert (await other.get("/healthz")).status_code == 200, "another address has its own window"


async def test_every_window_of_the_spec_applies() -> None:
    settings = Settings(bots=[], limits={"http_per_source": "100/minute;2/second"}, namespace="flood2")
    async with client(create_app(settings), "10.0.0.3") as flooding:
        codes = [(await flooding.get("/healthz")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
