"""WeCom crypto against wechatpy's published test vector, and the strict checks we add."""

from __future__ import annotations

import base64
import struct

import pytest
from wechatpy.crypto.cryptography import WeChatCipher

from bots.base import CallbackRejected
from bots.wecom.crypto import WeComCrypto, decode_aes_key, sign
from bots.wecom.models import parse_app_message

# platform-protocols.md §E (wechatpy tests/unit/test_crypto.py)
TOKEN = "123456"
AES_KEY = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR"
CORP_ID = "wx49f0ab532d5d035a"
ECHO_SIG, ECHO_TS, ECHO_NONCE = "dd6b9c95b495b3f7e2901bfbc76c664930ffdb96", "1411443780", "437374425"
ECHOSTR = "4ByGGj+sVCYcvGeQYhaKIk1o0pQRNbRjxybjTGblXrBaXlTXeOo1+bXFXDQQb1o6co6Yh9Bv41n7hOchLF6p+Q=="
MSG_SIG, MSG_TS, MSG_NONCE = "74d92dfeb87ba7c714f89d98870ae5eb62dff26d", "1411525903", "461056294"
MSG_ENCRYPT = (
    "RgqEoJj5A4EMYlLvWO1F86ioRjZfaex/gePD0gOXTxpsq5Yj4GNglrBb8I2BAJVODGajiFnXBu7mCPatfjsu6IHCrsTyeDXzF6Bv283dGymzxh6y"
    "dJRvZsryDyZbLTE7rhnus50qGPMfp2wASFlzEgMW9z1ef/RD8XzaFYgm7iTdaXpXaG4+BiYyolBug/gYNx410cvkKR2/nPwBiT+P4hIiOAQqGp/T"
    "ywZBtDh1yCF2KOd0gpiMZ5jSw3e29mTvmUHzkVQiMS6td7vXUaWOMZnYZlF3So2SjHnwh4jYFxdgpkHHqIrH/54SNdshoQgWYEvccTKe7FS709/5"
    "t6NMxuGhcUGAPOQipvWTT4dShyqio7mlsl5noTrb++x6En749zCpQVhDpbV6GDnTbcX2e8K9QaNWHp91eBdCRxthuL0="
)


@pytest.fixture
def crypto() -> WeComCrypto:
    return WeComCrypto(TOKEN, AES_KEY, CORP_ID)


def test_url_verification_vector(crypto: WeComCrypto) -> None:
    assert crypto.verify_and_decrypt(ECHO_SIG, ECHO_TS, ECHO_NONCE, ECHOSTR) == "5927782489442352469"


def test_message_vector_decrypts_and_parses(crypto: WeComCrypto) -> None:
    plaintext = crypto.verify_and_decrypt(MSG_SIG, MSG_TS, MSG_NONCE, MSG_ENCRYPT)
    message = parse_app_message("bot", plaintext, received_at=1411525903.0)
    assert message is not None
    assert (message.text, message.sender_id, message.msg_id) == ("test", "messense", "4363689963896700987")


def test_signature_vector() -> None:
    assert sign(TOKEN, MSG_TS, MSG_NONCE, MSG_ENCRYPT) == MSG_SIG


def test_wrong_signature_rejected(crypto: WeComCrypto) -> None:
    with pytest.raises(CallbackRejected) as err:
        crypto.verify_and_decrypt("0" * 40, MSG_TS, MSG_NONCE, MSG_ENCRYPT)
    assert err.value.status == 403 and err.value.reason == "bad_signature"


def test_wrong_receiver_rejected() -> None:
    other = WeComCrypto(TOKEN, AES_KEY, "ww-someone-else")
    with pytest.raises(CallbackRejected) as err:
        other.verify_and_decrypt(MSG_SIG, MSG_TS, MSG_NONCE, MSG_ENCRYPT)
    assert err.value.reason == "wrong_receiver"


def test_round_trip_chinese(crypto: WeComCrypto) -> None:
    text = "<xml><Content><![CDATA[你好，世界]]></Content></xml>"
    encrypted, signature = crypto.signed_envelope(text, "1700000000", "42")
    assert crypto.verify_and_decrypt(signature, "1700000000", "42", encrypted) == text


def _encrypt_raw(plain: bytes) -> str:
    return base64.b64encode(WeChatCipher(decode_aes_key(AES_KEY)).encrypt(plain)).decode()


@pytest.mark.parametrize("pad", [0, 33, 200])
def test_pad_byte_out_of_range_rejected(crypto: WeComCrypto, pad: int) -> None:
    body = b"r" * 16 + struct.pack(">I", 3) + b"abc" + CORP_ID.encode()
    body += b"x" * (-(len(body) + 1) % 32) + bytes([pad])
    with pytest.raises(CallbackRejected) as err:
        crypto.decrypt(_encrypt_raw(body))
    assert err.value.reason == "bad_padding"


def test_length_field_beyond_plaintext_rejected(crypto: WeComCrypto) -> None:
    body = b"r" * 16 + struct.pack(">I", 10_000) + b"abc"
    pad = 32 - len(body) % 32
    with pytest.raises(CallbackRejected) as err:
        crypto.decrypt(_encrypt_raw(body + bytes([pad]) * pad))
    assert err.value.reason == "bad_length"


@pytest.mark.parametrize("value", ["not base64 at all!", "YWJj", ""])
def test_non_base64_or_partial_blocks_rejected(crypto: WeComCrypto, value: str) -> None:
    with pytest.raises(CallbackRejected):
        crypto.decrypt(value)


@pytest.mark.parametrize("key", ["short", "!" * 43, "a" * 44])
def test_bad_aes_key_is_a_configuration_error(key: str) -> None:
    with pytest.raises(ValueError):
        WeComCrypto(TOKEN, key, CORP_ID)
