"""A message's parts (bots/parts.py) turned into what the engine reads, or into a clear reply when they cannot be.

    voice  → the platform's own recognition, else the transcription endpoint (`asr:`), else "type it, please"
    image  → a `data:` image part of the request when the engine can see (`engine.vision`), else "describe it"
    file   → its text (the knowledge base's parsers and bounds), kept with the conversation's memory: a file
             alone is acknowledged with what it holds, a question then (or with it) is answered from it
    quote  → the quoted text before the question, as the context the sender meant

Downloads happen here, in the worker, never on the callback's fast path; the adapter's `download` asks only its
platform's hosts. What the engine sees of a file lives in Redis as long as the conversation's memory and goes
with /reset.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import json
import logging
import time

from PIL import Image

from bots.parts import MediaError, Part
from engine.asr import TranscriptionError
from gateway import metrics, texts
from gateway.pipeline.job import Attachment, Composed, Job, Services
from gateway.pipeline.stage import Next
from knowledge.errors import FileRejected
from knowledge.formats import PARSERS, parse

log = logging.getLogger(__name__)

IMAGE_MAX_SIDE = 1024  # pixels: ERNIE-4.5-VL reads 28×28 patches, so about 1,340 image tokens at most
IMAGE_TOKEN_BOUND = 1400  # what one image may add to the prompt, for the prompt plan
IMAGE_FORMATS = {"JPEG", "PNG", "GIF", "WEBP", "BMP"}
MAX_IMAGE_PIXELS = 16_000_000  # a decompression bomb is refused before it is decoded (a 16 Mpx RGBA decode: 64 MB)
MAX_IMAGES = 4  # per message: more is refused rather than silently dropped
KEPT_FILES = 3  # the newest files of a conversation that join its questions (older ones are dropped)
MAX_KEPT_CHARS = 60_000  # of one file's text: more than any context window here takes (a note says it was cut)
MAX_PARTS = 8  # attachments read for one message (a merged burst): more get a reply, not minutes of downloads


class ReadParts:
    """What cannot be read gets a reply that says what can; the rest joins the job (job.images, job.attachments)
    and the message's text becomes the turn the engine answers (voice transcribed, the quote before it)."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._files = KeptFiles(services)

    async def __call__(self, job: Job, next: Next) -> Composed:
        message, services = job.message, self._services
        if message.tap is not None:  # a button of botgw's question: nothing to read, settled further on
            return await next(job)
        media = [part for part in message.parts if part.kind != "text"]
        if not media and (message.msg_type != "text" or not message.text.strip()):
            return await services.commit(job, texts.UNSUPPORTED_TEXT)
        read = await self._read(job, media)
        if read.files:
            await self._files.keep(job, read.files)
        if not read.question and not read.images:
            if read.files:
                return await services.commit(job, "\n".join([texts.file_received_text(read.files), *read.notes]))
            return await services.commit(job, "\n".join(read.notes) or texts.UNSUPPORTED_TEXT)
        job.images = read.images
        job.answer_notes += read.notes  # a part that could not be read beside a question: said under the answer
        job.attachments = await self._files.load(job)
        if read.question != message.text:
            job.message = message.model_copy(update={"text": read.question})
        return await next(job)

    async def _read(self, job: Job, media: list[Part]) -> Read:
        """Every part that can be read; for each one that cannot, the reply that says why (a burst merged into one
        message may hold a photo the engine cannot see and a question it can answer: the question is kept)."""
        read, spoken, quotes = Read(), [], []
        for index, part in enumerate(media):
            if index == MAX_PARTS:
                read.note(texts.TOO_MANY_PARTS_TEXT.format(count=MAX_PARTS))
                break
            try:
                if part.kind == "quote":
                    quotes.append(part.text.strip())
                elif part.kind == "audio":
                    heard = part.text.strip() or await self._transcribe(job, part)
                    if not heard:
                        read.note(texts.VOICE_NOT_READ_TEXT)
                        continue
                    spoken.append(heard)
                elif part.kind == "image":
                    if not self._services.engine.sees_images:
                        read.note(texts.IMAGE_NEEDS_VISION_TEXT)
                        continue
                    if len(read.images) == MAX_IMAGES:
                        read.note(texts.TOO_MANY_IMAGES_TEXT.format(count=MAX_IMAGES))
                        continue
                    read.images.append(await self._image(job, part))
                elif part.kind == "file":
                    file = await self._file(job, part)
                    if isinstance(file, str):
                        read.note(file)
                        continue
                    read.files.append(dataclasses.replace(file, part=index))
            except MediaError as exc:
                metrics.MEDIA.labels(job.message.platform, exc.reason).inc()
                log.info("an attachment could not be had", extra={"reason": exc.reason, "error": str(exc)})
                read.note(texts.media_error_text(exc.reason, job.adapter.max_media_bytes))
                continue
            metrics.MEDIA.labels(job.message.platform, f"read_{part.kind}").inc()
        question = "\n".join([*spoken, job.message.text.strip()]).strip()
        quoted = "\n".join(quote for quote in quotes if quote)
        if quoted and (question or read.images):
            question = texts.QUOTED.format(quoted=quoted, question=question or texts.IMAGE_QUESTION)
        read.question = question
        return read

    async def _transcribe(self, job: Job, part: Part) -> str:
        """The transcription endpoint's text of a voice message ('' when there is none or it failed)."""
        transcriber = self._services.transcriber
        if transcriber is None or part.media is None:
            return ""
        audio = await job.adapter.download(part.media)
        try:
            return (await transcriber.transcribe(audio.data, part.media.format, part.media.name)).strip()
        except TranscriptionError as exc:
            log.warning("a voice message could not be transcribed", extra={"error": str(exc)})
            return ""

    async def _image(self, job: Job, part: Part) -> str:
        assert part.media is not None, "an image part names its media"
        picture = await job.adapter.download(part.media)
        return await asyncio.to_thread(image_data_url, picture.data)

    async def _file(self, job: Job, part: Part) -> Attachment | str:
        """A file's text, or the reply that says why not. Where the message names the file, its kind is checked
        before the download; where it does not (微信客服, the AI bot), on the name the download gave."""
        assert part.media is not None, "a file part names its media"
        if part.media.name and not readable_name(part.media.name):
            return texts.FILE_TYPE_TEXT.format(name=part.media.name, kinds=", ".join(sorted(PARSERS)))
        document = await job.adapter.download(part.media)
        name = part.media.name or document.name or "file"
        if not readable_name(name):
            return texts.FILE_TYPE_TEXT.format(name=name, kinds=", ".join(sorted(PARSERS)))
        try:
            parsed = await asyncio.to_thread(parse, name, document.data)
        except FileRejected as exc:
            return texts.FILE_UNREADABLE_TEXT.format(name=name, why=str(exc))
        except Exception as exc:  # a damaged file the parsers do not name (zipfile's NotImplementedError…)
            log.info("a file could not be parsed", extra={"error": type(exc).__name__})
            return texts.FILE_UNREADABLE_TEXT.format(name=name, why="damaged")
        lines = [block.text.strip() for block in parsed.blocks if block.text.strip()]
        return Attachment(name, "\n".join(lines))


def readable_name(name: str) -> bool:
    """Whether the knowledge base's parsers read a file of this name (by its extension)."""
    return any(name.lower().endswith(suffix) for suffix in PARSERS)


@dataclasses.dataclass
class Read:
    """What the parts stage read of a message: the question, the pictures, the files, and the replies to the
    parts it could not read."""

    question: str = ""
    images: list[str] = dataclasses.field(default_factory=list)
    files: list[Attachment] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def image_data_url(data: bytes) -> str:
    """A picture as the engine takes it: checked to be an image, at most IMAGE_MAX_SIDE pixels a side, JPEG
    (PNG where it has transparency), as a `data:` URL. MediaError("unsupported") for what is not a picture."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.format not in IMAGE_FORMATS:
                raise MediaError("unsupported", f"image format {opened.format}")
            if opened.width * opened.height > MAX_IMAGE_PIXELS:
                raise MediaError("too_large", f"{opened.width}×{opened.height} pixels")
            opened.seek(0)  # an animated GIF: its first frame
            if opened.format == "JPEG":
                opened.draft("RGB", (IMAGE_MAX_SIDE, IMAGE_MAX_SIDE))  # decoded at a smaller scale: less memory
            picture = opened.convert("RGBA" if _has_alpha(opened) else "RGB")
    except MediaError:
        raise
    except Exception as exc:  # Pillow raises ValueError, SyntaxError… on damaged files: none may fail the job
        raise MediaError("unsupported", f"not a picture: {type(exc).__name__}") from exc
    picture.thumbnail((IMAGE_MAX_SIDE, IMAGE_MAX_SIDE))
    out = io.BytesIO()
    if picture.mode == "RGBA":
        picture.save(out, "PNG", optimize=True)
        mime = "image/png"
    else:
        picture.save(out, "JPEG", quality=85)
        mime = "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(out.getvalue()).decode()}"


def _has_alpha(picture: Image.Image) -> bool:
    return picture.mode in ("RGBA", "LA", "PA") or (picture.mode == "P" and "transparency" in picture.info)


def user_content(text: str, images: list[str]) -> str | list[dict]:
    """The user turn as OpenAI's chat API takes it: plain text, or text and image parts."""
    if not images:
        return text
    parts: list[dict] = [{"type": "text", "text": text or texts.IMAGE_QUESTION}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return parts


def user_text(job: Job) -> str:
    """The user's turn as the engine reads it: the files the conversation was sent, marked as such, then the
    message. In the user's turn, not the system prompt: a document is the user's words, with no authority."""
    files = attachments_text(job.attachments)
    return f"{files}\n\n{job.message.text}" if files else job.message.text


def remembered_turn(text: str, images: list[str]) -> str:
    """What memory keeps of a user turn with pictures: the text and a mark per picture (not the picture)."""
    marks = " ".join(texts.IMAGE_MARK for _ in images)
    return f"{text} {marks}".strip() if marks else text


class KeptFiles:
    """The files a conversation was sent, kept as text beside its memory (same lifetime, cleared by /reset), by
    message: a retried job keeps them once."""

    def __init__(self, services: Services) -> None:
        self._services = services

    def _key(self, job: Job) -> str:
        return self._services.keys.attachments(job.scope.lane)

    async def keep(self, job: Job, files: list[Attachment]) -> None:
        """Keep the files by message and part (a retried job keeps them once), each cut to MAX_KEPT_CHARS, and
        no more than KEPT_FILES in all: the oldest go."""
        at = time.time()
        fields = {
            f"{job.message.msg_id}:{file.part}": json.dumps(
                {"name": file.name, "text": file.text[:MAX_KEPT_CHARS], "at": at}, ensure_ascii=False
            )
            for file in files
        }
        key = self._key(job)
        kept = {field.decode(): raw for field, raw in (await self._services.redis.hgetall(key)).items()}
        older = sorted((field for field in kept if field not in fields), key=lambda field: _kept_at(kept[field]))
        stale = older[: max(0, len(older) + len(fields) - KEPT_FILES)]
        async with self._services.redis.pipeline(transaction=True) as pipe:
            if stale:
                pipe.hdel(key, *stale)
            pipe.hset(key, mapping=fields)
            pipe.expire(key, self._services.memory.ttl_s)
            await pipe.execute()
        job.record.files = None  # what the record read is stale now

    async def load(self, job: Job) -> list[Attachment]:
        """The newest KEPT_FILES files, oldest first (as read with the reply record, unless this job kept one)."""
        stored = job.record.files
        if stored is None:
            stored = await self._services.redis.hgetall(self._key(job))
        if not stored:
            return []
        files = []
        for raw in stored.values():
            try:
                item = json.loads(raw)
                files.append((float(item["at"]), Attachment(str(item["name"]), str(item["text"]))))
            except (ValueError, KeyError, TypeError):
                continue  # an unreadable entry is left out, not fatal
        files.sort(key=lambda pair: pair[0])
        return [file for _, file in files[-KEPT_FILES:]]


def _kept_at(raw: bytes) -> float:
    try:
        return float(json.loads(raw)["at"])
    except (ValueError, KeyError, TypeError):
        return 0.0  # unreadable: the first to go


def attachments_text(files: list[Attachment]) -> str:
    """The files as the system prompt shows them."""
    return "\n\n".join(texts.ATTACHMENT.format(name=file.name, text=file.text) for file in files)


def trimmed(files: list[Attachment], fraction: float) -> list[Attachment]:
    """Each file cut to its first `fraction`, so that all of them fit the prompt."""
    return [dataclasses.replace(file, text=file.text[: int(len(file.text) * fraction)]) for file in files]
