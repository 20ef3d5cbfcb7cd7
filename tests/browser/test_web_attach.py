"""The page in Chromium with what issue 23 gives it: an image attached with the page's own button reaches the
engine as a `data:` image part (a stub engine that sees images, the real gateway, worker and page), Chinese text
that shows as Chinese (the browser has CJK fonts: Debian's fonts-noto-cjk), and a conversation that stays on the
page after a settings change."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from testkit.browser import CHROMIUM, chromium_browser
from tests.conftest import ARTIFACTS
from tests.e2e.web.page_stack import PASSWORD, PageStack, page_stack

CHINESE = "请问退货期限是多久"  # nine distinct characters: as tofu they would all be the same box


@pytest.fixture(scope="module")
def stack(redis_url: str, log_dir: Path) -> Iterator[PageStack]:
    if not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed: run `make test`, which installs it")
    with page_stack(redis_url, log_dir, page=True) as made:
        yield made


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with chromium_browser() as browser:
        yield browser


def signed_in(chromium: object, stack: PageStack, user: str) -> object:
    page = chromium.new_page(locale="zh-CN", viewport={"width": 1000, "height": 900})  # type: ignore[attr-defined]
    page.goto(stack.page, wait_until="networkidle")
    page.fill("input:not([type=password])", user)
    page.fill("input[type=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("text=/reset", timeout=30000)  # the chat has started
    return page


def steps(page: object, kind: str) -> list[str]:
    """The texts of the messages of one kind on the page (user_message, assistant_message), in order."""
    return page.evaluate(  # type: ignore[attr-defined]
        f"""() => [...document.querySelectorAll('[data-step-type={kind}]')].map(s => s.innerText)""")


def in_view(page: object) -> list[str]:
    """The user's messages that are in sight: inside the chat's scrolled area as it is shown now."""
    return page.evaluate(  # type: ignore[attr-defined]
        """() => {
            const steps = [...document.querySelectorAll('[data-step-type=user_message]')];
            let area = steps.length ? steps[0].parentElement : null;
            while (area && !['auto', 'scroll'].includes(getComputedStyle(area).overflowY)) area = area.parentElement;
            if (!area) return [];
            const box = area.getBoundingClientRect();
            return steps.filter(s => { const r = s.getBoundingClientRect();
                                       return r.top >= box.top && r.bottom <= box.bottom; }).map(s => s.innerText);
        }""")


def send(page: object, text: str) -> str:
    """Type a message and send it; the answer to it once it has arrived (the stub's `answer to: <text>`)."""
    before = len(steps(page, "assistant_message"))
    page.click("#chat-input")  # type: ignore[attr-defined]
    page.keyboard.type(text)  # type: ignore[attr-defined]
    page.keyboard.press("Enter")  # type: ignore[attr-defined]
    return next_answer(page, before, text)


def next_answer(page: object, before: int, holding: str) -> str:
    """The assistant's next message once it holds `holding` (after `before` of them were on the page)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answers = steps(page, "assistant_message")
        if len(answers) > before and holding in answers[-1]:
            return answers[-1]
        time.sleep(0.1)
    raise AssertionError(f"no answer holding {holding!r} on the page: {steps(page, 'assistant_message')}")


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (48, 48), color).save(out, "PNG")
    return out.getvalue()


def test_an_attached_image_reaches_the_engine(stack: PageStack, chromium: object) -> None:
    page = signed_in(chromium, stack, "alice")
    picture = {"name": "绿色.png", "mimeType": "image/png", "buffer": png((20, 180, 40))}
    with page.expect_response(lambda response: "/project/file" in response.url) as uploaded:  # type: ignore[attr-defined]
        page.set_input_files("input[type=file]", files=[picture])  # type: ignore[attr-defined]
    assert uploaded.value.status == 200, uploaded.value.text()
    send(page, "what colour is the picture?")
    request = next(r for r in stack.engine_requests() if "what colour is the picture?" in r["user"])
    assert len(request["images"]) == 1 and request["images"][0].startswith("data:image/"), request["images"]
    seen = Image.open(io.BytesIO(base64.b64decode(request["images"][0].split(",", 1)[1])))
    pixel = seen.convert("RGB").getpixel((10, 10))  # re-encoded on the way (the parts stage): within a little
    assert all(abs(a - b) <= 4 for a, b in zip(pixel, (20, 180, 40), strict=True)), f"not the picture sent: {pixel}"
    assert stack.uploads_kept() == 1
    page.close()  # type: ignore[attr-defined]


def glyph_prints(page: object, text: str) -> list[str]:
    """Each character of `text` drawn alone on a canvas in the page's own font, as a digest of its pixels: a
    character the fonts lack is drawn as the same missing-glyph box as any other."""
    return page.evaluate(  # type: ignore[attr-defined]
        """(text) => {
            const font = getComputedStyle(document.querySelector('#chat-input') || document.body).fontFamily;
            return [...text].map(ch => {
                const canvas = document.createElement('canvas');
                canvas.width = 64; canvas.height = 64;
                const ctx = canvas.getContext('2d');
                ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, 64, 64);
                ctx.fillStyle = '#000'; ctx.font = `40px ${font}`; ctx.textBaseline = 'top';
                ctx.fillText(ch, 8, 8);
                return canvas.toDataURL();
            });
        }""", text)


def test_chinese_shows_as_chinese(stack: PageStack, chromium: object) -> None:
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, check=True).stdout
    assert "Noto" in fonts, f"no CJK font for the browser (scripts/install.sh installs fonts-noto-cjk): {fonts!r}"
    page = signed_in(chromium, stack, "bob")
    answer = send(page, CHINESE)
    assert CHINESE in answer
    missing = glyph_prints(page, "\U000f0000\U000f0001\U000f0002")  # private use: no font has them, boxes all
    drawn = glyph_prints(page, CHINESE)
    assert len(set(drawn)) == len(CHINESE), "the characters are drawn alike: missing-glyph boxes"
    assert not set(drawn) & set(missing), "a Chinese character is drawn as the missing-glyph box"
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "web-chinese.png"
    page.screenshot(path=str(shot), full_page=True)  # type: ignore[attr-defined]
    assert Image.open(shot).size[0] >= 1000
    page.close()  # type: ignore[attr-defined]


def test_the_conversation_stays_after_a_settings_change(stack: PageStack, chromium: object) -> None:
    page = signed_in(chromium, stack, "carol")
    for text in ("first question", "second question"):
        send(page, text)
    page.click("#chat-settings-open-modal")  # type: ignore[attr-defined]
    page.click("#preset")  # type: ignore[attr-defined]
    page.click("[role=option]:has-text('creative writing')")  # type: ignore[attr-defined]
    page.click("#confirm")  # type: ignore[attr-defined]
    page.wait_for_timeout(1500)  # type: ignore[attr-defined]
    shown = in_view(page)
    assert shown == ["first question", "second question"], f"the conversation is out of sight: {shown}"
    send(page, "third question")
    page.wait_for_timeout(1000)  # type: ignore[attr-defined]  (the view has followed the answer)
    assert in_view(page) == ["first question", "second question", "third question"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-after-settings.png"))  # type: ignore[attr-defined]
    answers = steps(page, "assistant_message")
    assert sum("answer to:" in answer for answer in answers) == 3, answers
    assert next(r for r in stack.engine_requests() if r["user"] == "third question")["history"][-1].startswith(
        "answer to: second question")
    page.close()  # type: ignore[attr-defined]
