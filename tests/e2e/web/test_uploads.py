"""The page's attachments through the real gateway and worker (issue 23): `POST /web/{bot}/uploads` keeps a file
that is what it says, within the bot's max_media_bytes and the user's allowance, and refuses anything else with a
clear 4xx that keeps nothing; a chat message may name only its sender's own refs; an attached image reaches the
engine as a `data:` image part, a text file's text reaches the prompt."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from redis.asyncio import Redis

from bots.parts import Media, MediaError
from bots.web.adapter import WebAdapter
from bots.web.config import WebBotConfig
from bots.web.uploads import Upload, media_ref
from gateway.state.uploads import RedisUploadStore
from tests.e2e.web.page_stack import PageStack, page_stack

MAX_MEDIA_BYTES = 64 * 1024


def png(size: int = 32, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), color).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def stack(redis_url: str, log_dir: Path) -> Iterator[PageStack]:
    with page_stack(redis_url, log_dir, max_media_bytes=MAX_MEDIA_BYTES, uploads_per_user="3/minute") as made:
        yield made


def events(response: object) -> list[str]:
    return [line for line in response.text.splitlines() if line.startswith("data:")]  # type: ignore[attr-defined]


def test_an_attached_image_reaches_the_engine_as_a_data_url(stack: PageStack) -> None:
    image = png()
    taken = stack.upload("alice", "红色.png", image, "image/png")
    assert taken.status_code == 201, taken.text
    attachment = taken.json()
    assert attachment["mime"] == "image/png" and attachment["size"] == len(image) and attachment["name"] == "红色.png"
    answered = stack.chat("alice", "what colour is this?", [attachment])
    assert answered.status_code == 200 and '"done": true' in answered.text, answered.text
    request = next(r for r in stack.engine_requests() if "what colour is this?" in r["user"])
    assert len(request["images"]) == 1 and request["images"][0].startswith("data:image/"), request["images"]
    sent = base64.b64decode(request["images"][0].split(",", 1)[1])
    pixel = Image.open(io.BytesIO(sent)).convert("RGB").getpixel((5, 5))  # re-encoded on the way: within a little
    assert all(abs(a - b) <= 4 for a, b in zip(pixel, (200, 30, 30), strict=True)), f"not the picture sent: {pixel}"


def test_an_attached_text_file_reaches_the_prompt(stack: PageStack) -> None:
    notes = "退货期限是三十天。The return window is thirty days.".encode()
    taken = stack.upload("alice", "notes.md", notes, "text/markdown")
    assert taken.status_code == 201, taken.text
    answered = stack.chat("alice", "how long is the return window?", [taken.json()])
    assert answered.status_code == 200, answered.text
    request = next(r for r in stack.engine_requests() if "how long is the return window?" in r["user"])
    assert "退货期限是三十天" in str(request), "the file's text is not in the prompt"


@pytest.mark.parametrize(("name", "data", "mime", "status", "error"), [
    ("big.png", b"\x89PNG\r\n\x1a\n" + b"\0" * MAX_MEDIA_BYTES, "image/png", 413, "too_large"),
    ("tool.exe", b"MZ\x90\x00" + b"\0" * 100, "application/x-msdownload", 415, "unsupported_type"),
    ("fake.png", b"%PDF-1.7 not a picture", "image/png", 415, "unsupported_type"),
    ("report.pdf", png(), "image/png", 415, "unsupported_type"),  # the name says PDF, the type PNG
    ("notes.txt", b"\xff\xfe\x00binary", "text/plain", 415, "unsupported_type"),
    ("empty.txt", b"", "text/plain", 400, "empty"),
])
def test_bad_uploads_are_refused_and_keep_nothing(
    stack: PageStack, name: str, data: bytes, mime: str, status: int, error: str
) -> None:
    before = stack.uploads_kept()
    refused = stack.upload("bob", name, data, mime)
    assert refused.status_code == status, refused.text
    assert refused.json()["error"] == error and refused.json()["message"]
    assert stack.uploads_kept() == before


def test_uploads_need_the_key_and_a_real_user(stack: PageStack) -> None:
    before = stack.uploads_kept()
    assert stack.upload("bob", "a.png", png(), "image/png").status_code == 201
    wrong_key = httpx.post(f"{stack.api}/uploads", content=png(), params={"user": "bob", "name": "a.png"},
                           headers={"Authorization": "Bearer wrong", "Content-Type": "image/png"}, timeout=10)
    assert wrong_key.status_code == 401
    assert stack.upload("bob:x", "a.png", png(), "image/png").status_code == 400
    assert stack.upload("bob", "a.png", png(), "image/png", login="wecom").status_code == 400  # not offered here
    assert stack.uploads_kept() == before + 1  # only the first, with the right key


def test_a_message_names_only_its_senders_own_uploads(stack: PageStack) -> None:
    carols = stack.upload("carol", "carol.png", png(color=(0, 0, 255)), "image/png")
    assert carols.status_code == 201
    engine_before = len(stack.engine_requests())
    stolen = stack.chat("dave", "what is in carol's picture?", [carols.json()])
    assert stolen.status_code == 400 and stolen.json()["error"] == "unknown_upload", stolen.text
    unknown = stack.chat("dave", "and this one?", [{**carols.json(), "ref": "0" * 32}])
    assert unknown.status_code == 400 and unknown.json()["error"] == "unknown_upload"
    forged = stack.chat("dave", "and this?", [{**carols.json(), "ref": "../carol"}])
    assert forged.status_code == 400 and forged.json()["error"] == "malformed_fields"
    lying = stack.chat("carol", "mine, bigger", [{**carols.json(), "size": 10}])
    assert lying.status_code == 400 and lying.json()["error"] == "unknown_upload"
    assert not events(stolen) and len(stack.engine_requests()) == engine_before, "a refused message was queued"


def test_a_users_allowance_of_uploads(stack: PageStack) -> None:
    for _ in range(3):  # uploads_per_user: 3/minute
        assert stack.upload("erin", "a.png", png(), "image/png").status_code == 201
    before = stack.uploads_kept()
    refused = stack.upload("erin", "a.png", png(), "image/png")
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
    assert refused.json()["error"] == "too_many_uploads" and stack.uploads_kept() == before
    assert stack.upload("dave", "a.png", png(), "image/png").status_code == 201, "another user's allowance was spent"


def test_the_worker_reads_only_an_owners_kept_upload(stack: PageStack, redis_url: str) -> None:
    """`WebAdapter.download` on the Redis store the worker gets: the owner's upload as it was kept; gone (its TTL
    passed), or named with another owner, is "expired"; over the bot's bound, "too_large"."""
    adapter = WebAdapter(WebBotConfig(id="web", api_key="k", max_media_bytes=2048))

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        try:
            adapter.attach_uploads(RedisUploadStore(client, stack.keys))
            kept = Upload(png(), "image/png", "a.png")
            await adapter.uploads.put("web", "web:web:alice", "a" * 32, kept, 60)  # type: ignore[union-attr]
            got = await adapter.download(Media(ref=media_ref("a" * 32, "web:web:alice")))
            assert (got.data, got.mime, got.name) == (kept.data, "image/png", "a.png")
            for ref in (media_ref("a" * 32, "web:web:bob"), media_ref("b" * 32, "web:web:alice")):
                with pytest.raises(MediaError) as missing:
                    await adapter.download(Media(ref=ref))
                assert missing.value.reason == "expired"
            large = Upload(b"x" * 4096, "text/plain", "b.txt")
            await adapter.uploads.put("web", "web:web:alice", "c" * 32, large, 60)  # type: ignore[union-attr]
            with pytest.raises(MediaError) as refused:
                await adapter.download(Media(ref=media_ref("c" * 32, "web:web:alice")))
            assert refused.value.reason == "too_large"
        finally:
            await client.aclose()

    asyncio.run(scenario())
