"""WeCom attachments once fetched: the platform's JSON error answer read, the AI bot's encrypted files opened.

media/get (WeCom doc 96486 获取临时素材) answers a file like any HTTP download (Content-Type, Content-disposition
with its name), or, on an error, a JSON body such as {"errcode": 40007, "errmsg": "invalid media_id"}; a media_id
lives three days ("media_id有效期只有3天"), so 40007 on a message's own MediaId means it expired. A file over the
size media/get serves whole is answered 830002 (it wants Range requests). The AI bot's image.url and file.url
(doc 100719 接收消息, 结构体说明 图片/文件) serve the file AES-256-CBC encrypted with the bot's EncodingAESKey,
IV its first 16 bytes, PKCS#7 padded to a multiple of 32 bytes.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import httpx
from wechatpy.crypto.cryptography import WeChatCipher

from bots.parts import MediaError
from bots.wecom.crypto import strip_pkcs7

INVALID_MEDIA_ID = 40007
MEDIA_TOO_LARGE = 830002
_ERROR_PROBE_BYTES = 4096  # an error answer is a short JSON object; a file this small may be one
_FILENAME_STAR = re.compile(r"filename\*=UTF-8'[^']*'([^;\s]+)", re.IGNORECASE)  # RFC 5987, percent-encoded
_FILENAME = re.compile(r'filename="?([^";]+)"?', re.IGNORECASE)


def platform_error(data: bytes, headers: httpx.Headers) -> tuple[int, str] | None:
    """(errcode, errmsg) when the answer is WeCom's JSON error rather than the file; None for a file."""
    if headers.get("content-disposition"):  # WeCom sends every file with one, never an error answer: a user's
        return None  # own small JSON file is not taken for WeCom's error (and cannot make the token be dropped)
    declared = headers.get("content-type", "").lower()
    looks_json = "json" in declared or "text/plain" in declared or data[:1] == b"{"
    if not looks_json or len(data) > _ERROR_PROBE_BYTES:
        return None
    try:
        answer = json.loads(data)
    except ValueError:
        return None
    if not isinstance(answer, dict) or "errcode" not in answer:
        return None
    try:
        return int(answer["errcode"]), str(answer.get("errmsg", ""))[:200]
    except (TypeError, ValueError):
        return -1, "unreadable errcode"


def media_error_for(errcode: int, errmsg: str) -> MediaError:
    """What a media/get errcode means for the person who sent the attachment."""
    if errcode == INVALID_MEDIA_ID:
        return MediaError("expired", f"WeCom media/get: {errcode} {errmsg}")
    if errcode == MEDIA_TOO_LARGE:
        return MediaError("too_large", f"WeCom media/get: {errcode} {errmsg}")
    if errcode in (-1, 45009, 45033):
        return MediaError("unavailable", f"WeCom media/get: {errcode} {errmsg}")
    return MediaError("refused", f"WeCom media/get: {errcode} {errmsg}")


def filename_from(headers: httpx.Headers) -> str:
    """The file's name from Content-disposition ('' when none is given); `filename*` (RFC 5987) percent-decoded."""
    disposition = headers.get("content-disposition", "")
    if found := _FILENAME_STAR.search(disposition):
        return unquote(found.group(1)).strip()
    found = _FILENAME.search(disposition)
    return found.group(1).strip() if found else ""


def sniffed_name(data: bytes) -> str:
    """A name for a file that came without one (the AI bot's file message has only a URL), from its first bytes:
    what the parsers go by. '' when it is none of those."""
    if data.startswith(b"%PDF-"):
        return "file.pdf"
    if data.startswith(b"PK\x03\x04"):
        head = data[:4096]
        return "file.docx" if b"word/" in head else "file.xlsx" if b"xl/" in head else ""
    for magic, name in ((b"\x89PNG", "image.png"), (b"\xff\xd8\xff", "image.jpg"), (b"GIF8", "image.gif")):
        if data.startswith(magic):
            return name
    return ""


def decrypt_aibot_media(key: bytes, data: bytes) -> bytes:
    """An AI bot's downloaded image or file, decrypted: AES-256-CBC (IV = key[:16]), PKCS#7 to 32 bytes.
    MediaError("unsupported") when it is not such a ciphertext (the wrong key, or not encrypted at all)."""
    if not data or len(data) % 16:
        raise MediaError("unsupported", "the AI bot's file is not whole AES blocks")
    try:
        return strip_pkcs7(WeChatCipher(key).decrypt(data))
    except ValueError as exc:
        raise MediaError("unsupported", f"the AI bot's file does not decrypt: {exc}") from exc


def encrypt_aibot_media(key: bytes, data: bytes) -> bytes:
    """The inverse, as WeCom encrypts a file for its AI bot (the simulator serves files so)."""
    from wechatpy.crypto.pkcs7 import PKCS7Encoder

    return WeChatCipher(key).encrypt(PKCS7Encoder.encode(data))
