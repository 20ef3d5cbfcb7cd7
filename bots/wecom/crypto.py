"""WeCom callback crypto: signatures, AES-256-CBC envelopes, receiver-id check.

wechatpy provides the cipher (AES-CBC with IV = key[:16]), the signer and the encrypting
side. Its decrypt path compares signatures with `!=`, accepts any padding byte and
decodes base64 loosely, so verification and unwrapping are done here, strictly, on top
of wechatpy's cipher: every malformed input becomes a `CallbackRejected`, never a crash.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import struct

from wechatpy.crypto.cryptography import WeChatCipher
from wechatpy.enterprise.crypto import PrpCrypto
from wechatpy.utils import WeChatSigner

from bots.base import CallbackRejected

_RANDOM_PREFIX = 16
_LENGTH_FIELD = 4
_PAD_BLOCK = 32


def decode_aes_key(encoding_aes_key: str) -> bytes:
    """The 43-character EncodingAESKey → the 32-byte AES key, or a clear configuration error."""
    if len(encoding_aes_key) != 43:
        raise ValueError("encoding_aes_key must be 43 characters (WeCom console value)")
    try:
        key = base64.b64decode(encoding_aes_key + "=", validate=True)
    except binascii.Error as exc:
        raise ValueError("encoding_aes_key is not valid base64") from exc
    if len(key) != 32:
        raise ValueError("encoding_aes_key must decode to 32 bytes")
    return key


def strip_pkcs7(plain: bytes) -> bytes:
    """`plain` without its PKCS#7 padding to 32 bytes, checked strictly (wechatpy's decoder takes any last byte
    outside 1..32 as no padding at all); ValueError when the padding is not valid."""
    pad = plain[-1] if plain else 0
    if not 1 <= pad <= _PAD_BLOCK or plain[-pad:] != bytes([pad]) * pad:
        raise ValueError("PKCS#7 padding out of range")
    return plain[:-pad]


def sign(token: str, timestamp: str, nonce: str, payload: str) -> str:
    """WeCom's msg_signature: sha1 of the four strings sorted and joined."""
    signer = WeChatSigner()
    signer.add_data(token, timestamp, nonce, payload)
    return signer.signature


class WeComCrypto:
    """One bot's crypto: its token, AES key and the receiver id its messages must carry."""

    def __init__(self, token: str, encoding_aes_key: str, receive_id: str) -> None:
        self._token = token
        self._key = decode_aes_key(encoding_aes_key)
        self._cipher = WeChatCipher(self._key)  # built once: each decrypt takes a decryptor of its own from it
        self._receive_id = receive_id

    def verify(self, msg_signature: str, timestamp: str, nonce: str, payload: str) -> None:
        """Constant-time signature check; raises CallbackRejected(403) on mismatch."""
        try:
            expected = sign(self._token, timestamp, nonce, payload).encode()
            given = (msg_signature or "").lower().encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no platform signed that
            raise CallbackRejected("bad_encoding", 400, "signed values are not valid Unicode") from exc
        if not hmac.compare_digest(expected, given):
            raise CallbackRejected("bad_signature", 403, "msg_signature does not match")

    def decrypt(self, encrypted: str) -> str:
        """Unwrap an `Encrypt` value: random(16) ‖ len(4, big-endian) ‖ msg ‖ receive_id, PKCS#7/32."""
        try:
            raw = base64.b64decode(encrypted, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CallbackRejected("bad_base64", 400, "Encrypt is not base64") from exc
        if not raw or len(raw) % 16:
            raise CallbackRejected("bad_cipher_length", 400, "Encrypt is not whole AES blocks")
        try:
            content = strip_pkcs7(self._cipher.decrypt(raw))[_RANDOM_PREFIX:]
        except ValueError as exc:
            raise CallbackRejected("bad_padding", 400, "PKCS#7 padding out of range") from exc
        if len(content) < _LENGTH_FIELD:
            raise CallbackRejected("bad_length", 400, "plaintext too short")
        (msg_len,) = struct.unpack(">I", content[:_LENGTH_FIELD])
        body_end = _LENGTH_FIELD + msg_len
        if body_end > len(content):
            raise CallbackRejected("bad_length", 400, "declared length exceeds plaintext")
        try:
            message = content[_LENGTH_FIELD:body_end].decode("utf-8")
            receiver = content[body_end:].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CallbackRejected("bad_encoding", 400, "plaintext is not UTF-8") from exc
        if not hmac.compare_digest(receiver.encode(), self._receive_id.encode()):
            raise CallbackRejected("wrong_receiver", 403, "receiver id does not match this bot")
        return message

    def verify_and_decrypt(self, msg_signature: str, timestamp: str, nonce: str, encrypted: str) -> str:
        """Verify first, then decrypt: nothing unsigned is ever decrypted."""
        self.verify(msg_signature, timestamp, nonce, encrypted)
        return self.decrypt(encrypted)

    def encrypt(self, plaintext: str) -> str:
        """Wrap `plaintext` for this bot's receiver id (used by the simulator and passive replies)."""
        return PrpCrypto(self._key).encrypt(plaintext, self._receive_id).decode("ascii")

    def signed_envelope(self, plaintext: str, timestamp: str, nonce: str) -> tuple[str, str]:
        """Encrypt and sign: returns (Encrypt value, msg_signature)."""
        encrypted = self.encrypt(plaintext)
        return encrypted, sign(self._token, timestamp, nonce, encrypted)
