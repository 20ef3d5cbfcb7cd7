"""The parts stage's pure pieces (gateway/pipeline/parts.py): pictures as the engine takes them, the user turn
with images, what memory keeps of it."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from bots.parts import MediaError
from gateway.pipeline.job import Attachment
from gateway.pipeline.parts import IMAGE_MAX_SIDE, image_data_url, remembered_turn, trimmed, user_content


def encoded(picture: Image.Image, kind: str) -> bytes:
    out = io.BytesIO()
    picture.save(out, kind)
    return out.getvalue()


def decoded(url: str) -> Image.Image:
    head, data = url.split(",", 1)
    assert head.startswith("data:image/") and head.endswith(";base64")
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_a_large_photo_is_resized_to_jpeg() -> None:
    url = image_data_url(encoded(Image.new("RGB", (3000, 1500), (200, 30, 30)), "PNG"))
    assert url.startswith("data:image/jpeg;base64,")
    picture = decoded(url)
    assert picture.size == (IMAGE_MAX_SIDE, IMAGE_MAX_SIDE // 2)


def test_transparency_is_kept_as_png() -> None:
    url = image_data_url(encoded(Image.new("RGBA", (40, 40), (0, 0, 0, 0)), "PNG"))
    assert url.startswith("data:image/png;base64,") and decoded(url).mode == "RGBA"


@pytest.mark.parametrize(
    "data",
    [
        b"%PDF-1.4 not a picture",
        b"",
        b"\x89PNG\r\n\x1a\n broken",
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\x07IHDR" + b"\0" * 20,  # Pillow: ValueError, not OSError (review)
    ],
)
def test_what_is_not_a_picture_is_refused(data: bytes) -> None:
    with pytest.raises(MediaError) as refused:
        image_data_url(data)
    assert refused.value.reason == "unsupported"


def test_a_decompression_bomb_is_refused_before_decoding() -> None:
    bomb = encoded(Image.new("1", (8000, 8000)), "PNG")  # 64 Mpx in a few KB
    assert len(bomb) < 100_000
    with pytest.raises(MediaError) as refused:
        image_data_url(bomb)
    assert refused.value.reason in ("too_large", "unsupported")


def test_user_turn_with_images() -> None:
    assert user_content("你好", []) == "你好"
    content = user_content("这是什么？", ["data:image/jpeg;base64,AAAA"])
    assert content == [
        {"type": "text", "text": "这是什么？"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
    ]
    assert remembered_turn("这是什么？", ["x", "y"]) == "这是什么？ [图片] [图片]"
    assert remembered_turn("", ["x"]) == "[图片]"


def test_files_are_cut_to_their_share() -> None:
    files = [Attachment("a.txt", "甲" * 100), Attachment("b.txt", "乙" * 10)]
    assert [len(file.text) for file in trimmed(files, 0.5)] == [50, 5]
