"""The gateway's callback route over real HTTP: URL verification, acks, and bad input refused.

Every bad request must be answered 4xx and change nothing: no queue entry is added.
"""

from __future__ import annotations

import time

import httpx
import pytest

from bots.wecom.crypto import WeComCrypto
from simulator.wecom.signer import SignedCallback, text_message_xml
from testkit.stacks import Stack

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>
<xml><Encrypt>&lol4;</Encrypt></xml>"""


def test_url_verification_echoes_bare_plaintext(stack: Stack) -> None:
    query = stack.signer().url_verification("echo-1234567890")
    response = httpx.get(f"{stack.gateway_url}/callback/app", params=query)
    assert response.status_code == 200
    assert response.content == b"echo-1234567890"


def test_url_verification_with_wrong_signature_refused(stack: Stack) -> None:
    query = stack.signer().url_verification("echo")
    query["msg_signature"] = "0" * 40
    assert httpx.get(f"{stack.gateway_url}/callback/app", params=query).status_code == 403


def test_valid_callback_acked_with_empty_body(stack: Stack, user: str) -> None:
    before = stack.entries_added()
    response = stack.post_callback(stack.signer().text(user, "/help"))
    assert response.status_code == 200
    assert response.content == b""
    assert stack.entries_added() == before + 1
    assert "help" in stack.wait_delivered(user)[0]["content"]


def test_event_acked_and_ignored(stack: Stack, user: str) -> None:
    from simulator.wecom.signer import event_xml

    before = stack.entries_added()
    callback = stack.signer().sign_plaintext(event_xml(stack.bot, user, "enter_agent", int(time.time())))
    assert stack.post_callback(callback).status_code == 200
    assert stack.entries_added() == before


def test_unknown_bot_is_404(stack: Stack, user: str) -> None:
    assert stack.post_callback(stack.signer().text(user, "hi"), bot_id="nobody").status_code == 404


def _with_params(callback: SignedCallback, **params: str) -> SignedCallback:
    return SignedCallback({**callback.params, **params}, callback.body)


def _bad_requests(stack: Stack, user: str) -> dict[str, tuple[SignedCallback, int]]:
    signer = stack.signer()
    bot = stack.bot
    now = int(time.time())
    good = signer.text(user, "hello")
    # Correct token and key, but encrypted for another corp: the signature checks out, the receiver does not.
    foreign = WeComCrypto(bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), "ww-other-corp")
    encrypted, signature = foreign.signed_envelope(text_message_xml(bot, user, "hi", "1", now), str(now), "7")
    wrong_receiver = SignedCallback(
        {"msg_signature": signature, "timestamp": str(now), "nonce": "7"},
        f"<xml><Encrypt><![CDATA[{encrypted}]]></Encrypt></xml>".encode(),
    )

    def signed_body(encrypt_value: str, raw_body: bytes | None = None) -> SignedCallback:
        from bots.wecom.crypto import sign

        sig = sign(bot.token.get_secret_value(), str(now), "9", encrypt_value)
        body = raw_body or f"<xml><Encrypt><![CDATA[{encrypt_value}]]></Encrypt></xml>".encode()
        return SignedCallback({"msg_signature": sig, "timestamp": str(now), "nonce": "9"}, body)

    crypto = signer.crypto
    bad_pad = _bad_pad_ciphertext(crypto, bot.corp_id)
    stale_ts = now - 3601 - 60
    stale = signer.sign_plaintext(text_message_xml(bot, user, "old", "2", stale_ts), timestamp=stale_ts)
    return {
        "wrong signature": (_with_params(good, msg_signature="f" * 40), 403),
        "wrong receiver id": (wrong_receiver, 403),
        "timestamp outside the window": (stale, 403),
        "malformed XML": (SignedCallback(good.params, b"<xml><Encrypt>abc</Encr"), 400),
        "XML bomb": (SignedCallback(good.params, BILLION_LAUGHS), 400),
        "non-base64 Encrypt": (signed_body("%%%not-base64%%%"), 400),
        "pad byte out of range": (signed_body(bad_pad), 400),
        "body over the size limit": (SignedCallback(good.params, b"<xml>" + b"a" * 70_000 + b"</xml>"), 413),
        "missing query": (SignedCallback({}, good.body), 400),
    }


def _bad_pad_ciphertext(crypto: WeComCrypto, corp_id: str) -> str:
    import base64
    import struct

    from wechatpy.crypto.cryptography import WeChatCipher

    body = b"r" * 16 + struct.pack(">I", 3) + b"abc" + corp_id.encode()
    body += b"x" * (-(len(body) + 1) % 32) + bytes([77])
    return base64.b64encode(WeChatCipher(crypto._key).encrypt(body)).decode()


CASES = [
    "wrong signature",
    "wrong receiver id",
    "timestamp outside the window",
    "malformed XML",
    "XML bomb",
    "non-base64 Encrypt",
    "pad byte out of range",
    "body over the size limit",
    "missing query",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_refused_and_nothing_enqueued(stack: Stack, user: str, case: str) -> None:
    callback, expected_status = _bad_requests(stack, user)[case]
    before = stack.entries_added()
    dedup_keys_before = len(stack.redis.keys(stack.keys.dedup("*")))
    response = stack.post_callback(callback)
    assert response.status_code == expected_status, response.text
    assert stack.entries_added() == before
    assert len(stack.redis.keys(stack.keys.dedup("*"))) == dedup_keys_before


def test_same_callback_four_times_gives_one_reply(stack: Stack, user: str) -> None:
    callback = stack.signer().text(user, "/help")
    before = stack.entries_added()
    statuses = [stack.post_callback(callback).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 200]
    assert stack.entries_added() == before + 1
    assert len(stack.wait_delivered(user, settle=2.0)) == 1


def test_over_the_limit_user_gets_one_polite_notice(stack: Stack, user: str) -> None:
    signer = stack.signer()
    statuses = [stack.post_callback(signer.text(user, "/help")).status_code for _ in range(23)]
    assert set(statuses) == {200}
    delivered = stack.wait_delivered(user, count=21, settle=2.0)
    notices = [item for item in delivered if "try again in" in item["content"]]
    assert len(delivered) == 21 and len(notices) == 1, "20 answers, one notice, then silence"
    assert "20/minute" in notices[0]["content"] and "秒" in notices[0]["content"], "which limit, and when it resets"
