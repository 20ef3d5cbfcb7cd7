"""Hostile input on every inbound route, over real HTTP to a gateway process of its own.

Each case is a request (or a short sequence) to one route: the WeCom app callback (XML) and its URL verification,
the WeCom AI bot (JSON), the DingTalk HTTP robot, the web API and the admin API (public port and admin listener).
For each the gateway must answer the exact 4xx expected, never a 5xx; a platform's own retry of a valid message is
acknowledged 200. The scheduler's `enqueued` counter must move only by what the case says (0 for bad input), and the
gateway's log must hold no traceback. The gateway has no worker and no engine: nothing here may reach one.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote, urlencode

import httpx
import pytest
from wechatpy.crypto.cryptography import WeChatCipher

from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.crypto import sign as ding_sign
from bots.wecom.config import WeComAIBotConfig, WeComAppConfig
from bots.wecom.crypto import WeComCrypto, decode_aes_key
from bots.wecom.crypto import sign as wecom_sign
from gateway.queue.scheduler import SHARE_SIGNATURE_MS
from gateway.state.keys import Keys
from simulator.wecom.signer import SignedCallback, WeComCallbackSigner, event_xml, text_message_xml
from testkit.configs import write_config
from testkit.processes import free_port
from testkit.services import start_gateway
from testkit.stacks import Stack

MAX_BODY = 64 * 1024
WEB_KEY = "web-key-" + secrets.token_hex(8)
ADMIN_TOKEN = "adm-" + secrets.token_hex(12)

BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY a "lol">'
    + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(9))
    + "]><xml><Encrypt>&j;</Encrypt></xml>"
)
XXE = '<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY x SYSTEM "file:///etc/passwd">]><xml><Encrypt>&x;</Encrypt></xml>'
EXTERNAL_DTD = '<?xml version="1.0"?><!DOCTYPE xml SYSTEM "file:///etc/passwd"><xml><Encrypt>x</Encrypt></xml>'
PARAMETER_ENTITY = '<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><xml/>'
HUGE_INT = "9" * 5000  # past Python's 4300-digit int parsing limit
LARGE_INT = "9" * 4000  # under it, but far past any float
DEEP_JSON = b"[" * 50_000  # well under max_body_bytes: the parser, not the size limit, must refuse it
DEEP_XML = "<a>" * 8_000 + "</a>" * 8_000


@dataclass(frozen=True)
class Sent:
    """One request of a case and the status it must get."""

    method: str
    path: str
    expect: int
    params: dict[str, str] | None = None
    headers: dict[str, str | bytes] | None = None
    content: bytes | Iterator[bytes] | None = None
    admin: bool = False  # to the admin listener instead of the public port
    after_s: float = 0.0  # sent this long after the request before it


@dataclass
class Gateway:
    """The gateway under test and what is needed to speak each platform's protocol to it."""

    stack: Stack

    @property
    def log(self) -> Path:
        return self.stack.procs["gateway"].log_path

    def bot_config(self, bot_id: str) -> dict:
        return next(b for b in self.stack.config["bots"] if b["id"] == bot_id)

    @property
    def app(self) -> WeComAppConfig:
        return WeComAppConfig(**self.bot_config("app"))

    @property
    def ai(self) -> WeComAIBotConfig:
        return WeComAIBotConfig(**self.bot_config("ai"))

    @property
    def ding(self) -> DingTalkBotConfig:
        return DingTalkBotConfig(**self.bot_config("ding-http"))

    @property
    def secrets(self) -> list[str]:
        """Every secret the gateway holds: none may show in an answer or in the log."""
        app, ai = self.app, self.ai
        held = [app.token, app.encoding_aes_key, app.secret, ai.token, ai.encoding_aes_key, self.ding.app_secret]
        return [secret.get_secret_value() for secret in held] + [WEB_KEY, ADMIN_TOKEN]


@pytest.fixture(scope="module")
def gw(stack: Stack) -> Iterator[Gateway]:
    """A gateway of its own (namespace, web bot, admin token) and no worker: entries stay where they were queued."""
    namespace = "b" + secrets.token_hex(4)
    web = {"id": "web", "platform": "web", "api_key": WEB_KEY, "answer_timeout_s": 1}
    config = {
        **stack.config,
        "namespace": namespace,
        "max_body_bytes": MAX_BODY,
        "admin": {"token": ADMIN_TOKEN},
        "bots": [*stack.config["bots"], web],
    }
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    port = free_port()
    own = Stack(config, path, f"http://127.0.0.1:{port}", stack.sim_url, stack.redis, namespace, stack.log_dir)
    own.procs["gateway"] = start_gateway(path, port, stack.log_dir, name=f"gw-bad-input-{namespace}")
    yield Gateway(own)
    own.procs["gateway"].stop()


# -- building requests as each platform signs them ----------------------------------------------------------------


def now_s() -> str:
    return str(int(time.time()))


def encrypt_raw(encoding_aes_key: str, message: bytes, receive_id: str) -> str:
    """WeCom's envelope around arbitrary bytes (the real encrypter only takes text)."""
    body = secrets.token_bytes(16) + struct.pack(">I", len(message)) + message + receive_id.encode()
    pad = 32 - len(body) % 32
    return base64.b64encode(WeChatCipher(decode_aes_key(encoding_aes_key)).encrypt(body + bytes([pad]) * pad)).decode()


def signed_query(token: str, encrypted: str, timestamp: str | None = None) -> dict[str, str]:
    ts, nonce = timestamp or now_s(), str(secrets.randbelow(10**9))
    return {"msg_signature": wecom_sign(token, ts, nonce, encrypted), "timestamp": ts, "nonce": nonce}


def app_envelope(encrypted: str) -> bytes:
    return f"<xml><ToUserName><![CDATA[c]]></ToUserName><Encrypt><![CDATA[{encrypted}]]></Encrypt></xml>".encode()


def app_signed(gw: Gateway, plaintext: str | bytes) -> SignedCallback:
    """A correctly signed app callback whose decrypted plaintext is `plaintext` (any bytes)."""
    app = gw.app
    raw = plaintext.encode() if isinstance(plaintext, str) else plaintext
    encrypted = encrypt_raw(app.encoding_aes_key.get_secret_value(), raw, app.corp_id)
    return SignedCallback(signed_query(app.token.get_secret_value(), encrypted), app_envelope(encrypted))


def header_names(**headers: str) -> dict[str, str] | None:
    """Keyword arguments as HTTP headers: content_type → content-type."""
    return {name.replace("_", "-"): value for name, value in headers.items()} or None


def app_post(callback: SignedCallback, expect: int, **headers: str) -> Sent:
    return Sent("POST", "/callback/app", expect, callback.params, header_names(**headers), callback.body)


def app_text(gw: Gateway, user: str) -> SignedCallback:
    return WeComCallbackSigner(gw.app).text(user, "hello")


def app_with(callback: SignedCallback, expect: int, **params: str) -> Sent:
    return app_post(SignedCallback({**callback.params, **params}, callback.body), expect)


def app_body(gw: Gateway, user: str, body: bytes, expect: int = 400, **headers: str) -> Sent:
    """A valid query with `body` in place of the envelope it was signed for."""
    return app_post(SignedCallback(app_text(gw, user).params, body), expect, **headers)


def app_signed_encrypt(gw: Gateway, encrypted: str, expect: int = 400) -> Sent:
    """An envelope whose (bad) Encrypt value is correctly signed: refused after the signature, by the decrypter."""
    return app_post(SignedCallback(signed_query(gw.app.token.get_secret_value(), encrypted), app_envelope(encrypted)),
                    expect)


def verification(gw: Gateway, expect: int, *, drop: str = "", echo: str = "echo-ok", **params: str) -> Sent:
    query = {**WeComCallbackSigner(gw.app).url_verification(echo), **params}
    query.pop(drop, None)
    return Sent("GET", "/callback/app", expect, query)


def ai_payload(user: str, msg_id: str | None = None, **fields: object) -> dict:
    payload = {"msgid": msg_id or secrets.token_hex(12), "aibotid": "aib", "chattype": "single",
               "from": {"userid": user}, "msgtype": "text", "text": {"content": "hi"}}
    return {**payload, **fields}


def ai_signed(gw: Gateway, plaintext: str | bytes | dict, expect: int = 400) -> Sent:
    """A correctly signed AI-bot callback whose decrypted plaintext is `plaintext` (a dict is JSON, ASCII-escaped)."""
    ai = gw.ai
    if isinstance(plaintext, dict):
        plaintext = json.dumps(plaintext)  # ensure_ascii: a lone surrogate travels as its \\u escape
    raw = plaintext.encode() if isinstance(plaintext, str) else plaintext
    encrypted = encrypt_raw(ai.encoding_aes_key.get_secret_value(), raw, "")
    query = signed_query(ai.token.get_secret_value(), encrypted)
    return Sent("POST", "/callback/ai", expect, query, None, json.dumps({"encrypt": encrypted}).encode())


def ai_body(gw: Gateway, body: bytes, expect: int = 400, **headers: str) -> Sent:
    """A signed AI-bot query with `body` in place of the envelope it was signed for."""
    query = ai_signed(gw, ai_payload("x"), 200).params
    return Sent("POST", "/callback/ai", expect, query, header_names(**headers), body)


def ding_payload(gw: Gateway, user: str, msg_id: str | None = None, **fields: object) -> dict:
    payload = {"msgtype": "text", "text": {"content": "hi"}, "msgId": msg_id or "m" + secrets.token_hex(10),
               "conversationType": "1", "conversationId": f"cid-{user}", "senderStaffId": user,
               "robotCode": gw.ding.robot}
    return {**payload, **fields}


def ding_headers(gw: Gateway, timestamp_ms: str | None = None, secret: str | None = None) -> dict[str, str]:
    ts = timestamp_ms or str(int(time.time() * 1000))
    return {"timestamp": ts, "sign": ding_sign(ts, secret or gw.ding.app_secret.get_secret_value())}


def ding_post(gw: Gateway, body: bytes | dict, expect: int = 400, headers: dict[str, str | bytes] | None = None,
              **extra: str) -> Sent:
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    headers = {**(headers or ding_headers(gw)), **(header_names(**extra) or {})}
    return Sent("POST", "/callback/ding-http", expect, None, headers, content)


def web_post(body: bytes | dict, expect: int = 400, key: str | None = WEB_KEY, **extra: str) -> Sent:
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    return Sent("POST", "/web/web/chat", expect, None, {**headers, **(header_names(**extra) or {})}, content)


def chunks(total: int, size: int = 8192) -> Iterator[bytes]:
    """A body sent chunked (no Content-Length), so that only counting what arrives can stop it."""
    for start in range(0, total, size):
        yield b"a" * min(size, total - start)


def multipart(body: bytes) -> tuple[bytes, str]:
    boundary = secrets.token_hex(8)
    data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.xml\"\r\n"
            f"Content-Type: text/xml\r\n\r\n").encode() + body + f"\r\n--{boundary}--\r\n".encode()
    return data, f"multipart/form-data; boundary={boundary}"


# -- the corpus ---------------------------------------------------------------------------------------------------

Build = Callable[[Gateway, str], list[Sent]]


def _cases() -> dict[str, tuple[Build, int]]:
    """Case id → (requests for a gateway and a fresh user id, entries the case may add to the queue)."""
    form = "application/x-www-form-urlencoded"
    ai_user = {"chattype": "single", "msgid": "m1", "aibotid": "a", "response_url": ""}
    cases: dict[str, tuple[Build, int]] = {
        # WeCom app callback (XML), POST /callback/app
        "app/wrong signature": (lambda g, u: [app_with(app_text(g, u), 403, msg_signature="f" * 40)], 0),
        "app/signature of another token": (
            lambda g, u: [app_with(app_text(g, u), 403, msg_signature=wecom_sign("other", "1", "2", "3"))], 0),
        "app/signature not hex": (lambda g, u: [app_with(app_text(g, u), 403, msg_signature="签名" * 20)], 0),
        "app/no query": (lambda g, u: [app_post(SignedCallback({}, app_text(g, u).body), 400)], 0),
        "app/no msg_signature": (lambda g, u: [app_with(app_text(g, u), 400, msg_signature="")], 0),
        "app/no nonce": (lambda g, u: [app_with(app_text(g, u), 400, nonce="")], 0),
        "app/timestamp not a number": (lambda g, u: [app_with(app_text(g, u), 400, timestamp="abc")], 0),
        "app/timestamp 1e400": (lambda g, u: [app_with(app_text(g, u), 400, timestamp="1e400")], 0),
        "app/timestamp 5000 digits": (lambda g, u: [app_with(app_text(g, u), 400, timestamp=HUGE_INT)], 0),
        "app/timestamp 4000 digits": (lambda g, u: [app_with(app_text(g, u), 403, timestamp=LARGE_INT)], 0),
        "app/timestamp 4000 digits, signed": (
            lambda g, u: [app_post(WeComCallbackSigner(g.app).sign_plaintext(
                text_message_xml(g.app, u, "x", "1", 0), timestamp=int(LARGE_INT)), 403)], 0),
        "app/stale timestamp, signed": (
            lambda g, u: [app_post(WeComCallbackSigner(g.app).text(u, "old", timestamp=int(time.time()) - 3700), 403)],
            0),
        "app/empty body": (lambda g, u: [app_body(g, u, b"")], 0),
        "app/truncated XML": (lambda g, u: [app_body(g, u, app_text(g, u).body[:-9])], 0),
        "app/not XML": (lambda g, u: [app_body(g, u, b"hello")], 0),
        "app/JSON body": (lambda g, u: [app_body(g, u, b'{"Encrypt": "x"}', content_type="application/json")], 0),
        "app/form body": (lambda g, u: [app_body(g, u, urlencode({"Encrypt": "x"}).encode(), content_type=form)], 0),
        "app/multipart body": (
            lambda g, u: [app_body(g, u, (m := multipart(app_text(g, u).body))[0], content_type=m[1])], 0),
        "app/invalid UTF-8 envelope": (lambda g, u: [app_body(g, u, b"<xml><Encrypt>\xff\xfe\x80</Encrypt></xml>")],
                                       0),
        "app/bogus XML encoding": (
            lambda g, u: [app_body(g, u, b'<?xml version="1.0" encoding="x-bogus"?><xml><Encrypt>a</Encrypt></xml>')],
            0),
        "app/billion laughs": (lambda g, u: [app_body(g, u, BILLION_LAUGHS.encode())], 0),
        "app/XXE file entity": (lambda g, u: [app_body(g, u, XXE.encode())], 0),
        "app/external DTD": (lambda g, u: [app_body(g, u, EXTERNAL_DTD.encode())], 0),
        "app/parameter entity": (lambda g, u: [app_body(g, u, PARAMETER_ENTITY.encode())], 0),
        "app/deeply nested XML": (lambda g, u: [app_body(g, u, DEEP_XML.encode())], 0),
        "app/no Encrypt": (lambda g, u: [app_body(g, u, b"<xml><ToUserName>c</ToUserName></xml>")], 0),
        "app/Encrypt not base64, signed": (lambda g, u: [app_signed_encrypt(g, "%%%not-base64%%%")], 0),
        "app/Encrypt partial block, signed": (
            lambda g, u: [app_signed_encrypt(g, base64.b64encode(b"x" * 17).decode())], 0),
        "app/Encrypt a bare number, signed": (lambda g, u: [app_signed_encrypt(g, HUGE_INT[:4096])], 0),
        "app/over max_body_bytes": (lambda g, u: [app_body(g, u, b"<xml>" + b"a" * MAX_BODY + b"</xml>", 413)], 0),
        "app/over max_body_bytes, chunked": (
            lambda g, u: [Sent("POST", "/callback/app", 413, app_text(g, u).params, None, chunks(MAX_BODY + 1))], 0),
        "app/plaintext billion laughs": (lambda g, u: [app_post(app_signed(g, BILLION_LAUGHS), 400)], 0),
        "app/plaintext XXE": (lambda g, u: [app_post(app_signed(g, XXE), 400)], 0),
        "app/plaintext not XML": (lambda g, u: [app_post(app_signed(g, "hello"), 400)], 0),
        "app/plaintext invalid UTF-8": (lambda g, u: [app_post(app_signed(g, b"<xml>\xff\xfe</xml>"), 400)], 0),
        "app/plaintext deeply nested XML": (lambda g, u: [app_post(app_signed(g, "<xml>" + DEEP_XML[:30_000]), 400)],
                                            0),
        "app/plaintext without MsgType": (
            lambda g, u: [app_post(app_signed(g, f"<xml><FromUserName>{u}</FromUserName></xml>"), 400)], 0),
        "app/wrong receiver id": (
            lambda g, u: [app_post(SignedCallback(*_foreign_corp(g, u)), 403)], 0),
        # What WeCom itself sends: a retry of a delivered message, an event, a type the bot cannot read.
        "app/the same callback twice": (lambda g, u: [app_post(cb := app_text(g, u), 200), app_post(cb, 200)], 1),
        "app/an event": (
            lambda g, u: [app_post(WeComCallbackSigner(g.app).sign_plaintext(
                event_xml(g.app, u, "enter_agent", int(time.time()))), 200)], 0),
        "app/unknown MsgType, twice (queued once for the text-only notice)": (
            lambda g, u: [app_post(cb := app_signed(g, f"<xml><FromUserName>{u}</FromUserName><MsgType>hologram"
                                                       f"</MsgType><MsgId>{u}1</MsgId></xml>"), 200),
                          app_post(cb, 200)], 1),
        "app/unknown bot": (lambda g, u: [Sent("POST", "/callback/nobody", 404, *_query_body(app_text(g, u)))], 0),
        "app/PUT": (lambda g, u: [Sent("PUT", "/callback/app", 405, *_query_body(app_text(g, u)))], 0),
        # WeCom URL verification, GET /callback/app
        "verify/wrong signature": (lambda g, u: [verification(g, 403, msg_signature="0" * 40)], 0),
        "verify/no echostr": (lambda g, u: [verification(g, 400, drop="echostr")], 0),
        "verify/no query": (lambda g, u: [Sent("GET", "/callback/app", 400)], 0),
        "verify/timestamp 4000 digits": (lambda g, u: [verification(g, 403, timestamp=LARGE_INT)], 0),
        "verify/timestamp 1e400": (lambda g, u: [verification(g, 400, timestamp="1e400")], 0),
        "verify/echostr not base64, signed": (
            lambda g, u: [Sent("GET", "/callback/app", 400,
                               {**signed_query(g.app.token.get_secret_value(), "%%%"), "echostr": "%%%"})], 0),
        "verify/the same verification twice": (
            lambda g, u: [Sent("GET", "/callback/app", 200, q := WeComCallbackSigner(g.app).url_verification("e")),
                          Sent("GET", "/callback/app", 200, q)], 0),
        # WeCom AI bot (JSON), POST /callback/ai
        "ai/wrong signature": (
            lambda g, u: [_with_query(ai_signed(g, ai_payload(u)), msg_signature="f" * 40, expect=403)], 0),
        "ai/no query": (lambda g, u: [_with_query(ai_signed(g, ai_payload(u)), drop=True, expect=400)], 0),
        "ai/timestamp 4000 digits": (
            lambda g, u: [_with_query(ai_signed(g, ai_payload(u)), timestamp=LARGE_INT, expect=403)], 0),
        "ai/empty body": (lambda g, u: [ai_body(g, b"")], 0),
        "ai/truncated JSON": (lambda g, u: [ai_body(g, b'{"encrypt": "abc')], 0),
        "ai/XML body": (lambda g, u: [ai_body(g, app_text(g, u).body, content_type="text/xml")], 0),
        "ai/form body": (lambda g, u: [ai_body(g, b"encrypt=abc", content_type=form)], 0),
        "ai/JSON array": (lambda g, u: [ai_body(g, b'["encrypt"]')], 0),
        "ai/invalid UTF-8": (lambda g, u: [ai_body(g, b'{"encrypt": "\xff\xfe"}')], 0),
        "ai/deeply nested JSON": (lambda g, u: [ai_body(g, DEEP_JSON)], 0),
        "ai/deeply nested object": (lambda g, u: [ai_body(g, b'{"a":' * 12_000)], 0),
        "ai/100k levels (over max_body_bytes)": (lambda g, u: [ai_body(g, b"[" * 100_000, 413)], 0),
        "ai/encrypt 1e400": (lambda g, u: [ai_body(g, b'{"encrypt": 1e400}')], 0),
        "ai/encrypt 5000 digits": (lambda g, u: [ai_body(g, b'{"encrypt": ' + HUGE_INT.encode() + b"}")], 0),
        "ai/billion laughs": (lambda g, u: [ai_body(g, BILLION_LAUGHS.encode())], 0),
        "ai/over max_body_bytes": (lambda g, u: [ai_body(g, b'{"encrypt": "' + b"A" * MAX_BODY + b'"}', 413)], 0),
        "ai/plaintext not JSON": (lambda g, u: [ai_signed(g, "hello")], 0),
        "ai/plaintext invalid UTF-8": (lambda g, u: [ai_signed(g, b'{"msgtype": "\xff"}')], 0),
        "ai/plaintext deeply nested": (lambda g, u: [ai_signed(g, "[" * 40_000)], 0),
        "ai/plaintext nested inside a field": (
            lambda g, u: [ai_signed(g, '{"msgtype": "text", "msgid": ' + "[" * 900 + "]" * 900 + "}")], 0),
        "ai/plaintext NaN": (lambda g, u: [ai_signed(g, '{"msgtype": "text", "msgid": NaN}')], 0),
        "ai/plaintext huge number": (lambda g, u: [ai_signed(g, '{"msgtype": "text", "msgid": ' + HUGE_INT + "}")], 0),
        "ai/plaintext 1e400": (lambda g, u: [ai_signed(g, '{"msgtype": "text", "msgid": 1e400}')], 0),
        "ai/text is a string": (lambda g, u: [ai_signed(g, ai_payload(u, text="hi"))], 0),
        "ai/from is a string": (lambda g, u: [ai_signed(g, ai_payload(u, **{"from": u}))], 0),
        "ai/stream is a list": (lambda g, u: [ai_signed(g, {**ai_user, "msgtype": "stream", "stream": ["x"]})], 0),
        "ai/event is a string": (lambda g, u: [ai_signed(g, {"msgtype": "event", "event": "enter_chat"})], 0),
        "ai/mixed items not a list": (
            lambda g, u: [ai_signed(g, ai_payload(u, msgtype="mixed", mixed={"msg_item": 7}))], 0),
        "ai/mixed item not an object": (
            lambda g, u: [ai_signed(g, ai_payload(u, msgtype="mixed", mixed={"msg_item": ["x"]}))], 0),
        "ai/lone surrogate in text": (lambda g, u: [ai_signed(g, ai_payload(u, text={"content": "\ud800"}))], 0),
        "ai/lone surrogate in user": (lambda g, u: [ai_signed(g, ai_payload("\udfff"))], 0),
        "ai/no msgid": (lambda g, u: [ai_signed(g, {**ai_payload(u), "msgid": ""})], 0),
        "ai/the same message twice": (lambda g, u: [s := ai_signed(g, ai_payload(u), 200), s], 1),
        "ai/unknown msgtype (answered at once, not queued)": (
            lambda g, u: [ai_signed(g, ai_payload(u, msgtype="hologram"), 200)], 0),
        # DingTalk HTTP robot, POST /callback/ding-http
        "ding/no headers": (lambda g, u: [ding_post(g, ding_payload(g, u), headers={"x": "y"})], 0),
        "ding/no sign": (lambda g, u: [ding_post(g, ding_payload(g, u), sign="")], 0),
        "ding/wrong sign": (lambda g, u: [ding_post(g, ding_payload(g, u), 403, sign="A" * 44)], 0),
        "ding/sign of another secret": (
            lambda g, u: [ding_post(g, ding_payload(g, u), 403, ding_headers(g, secret="not-the-secret"))], 0),
        "ding/non-ASCII sign": (
            lambda g, u: [ding_post(g, ding_payload(g, u), 403, {**ding_headers(g), "sign": b"\xe9" * 44})], 0),
        "ding/61 minutes old": (
            lambda g, u: [ding_post(g, ding_payload(g, u), 403, ding_headers(g, str(int(time.time() - 3660) * 1000)))],
            0),
        "ding/timestamp not a number": (
            lambda g, u: [ding_post(g, ding_payload(g, u), 400, ding_headers(g, "abc"))], 0),
        "ding/timestamp 1e400": (lambda g, u: [ding_post(g, ding_payload(g, u), 400, ding_headers(g, "1e400"))], 0),
        "ding/timestamp 4000 digits, signed": (
            lambda g, u: [ding_post(g, ding_payload(g, u), 403, ding_headers(g, LARGE_INT))], 0),
        "ding/timestamp 5000 digits, signed": (
            lambda g, u: [ding_post(g, ding_payload(g, u), 400, ding_headers(g, HUGE_INT))], 0),
        "ding/empty body": (lambda g, u: [ding_post(g, b"")], 0),
        "ding/truncated JSON": (lambda g, u: [ding_post(g, json.dumps(ding_payload(g, u)).encode()[:-5])], 0),
        "ding/form body": (lambda g, u: [ding_post(g, urlencode(ding_payload(g, u)).encode(), content_type=form)], 0),
        "ding/JSON array": (lambda g, u: [ding_post(g, b"[1, 2]")], 0),
        "ding/invalid UTF-8": (lambda g, u: [ding_post(g, b'{"msgId": "\xff\xfe"}')], 0),
        "ding/deeply nested JSON": (lambda g, u: [ding_post(g, DEEP_JSON)], 0),
        "ding/nested inside a field": (
            lambda g, u: [ding_post(g, json.dumps(ding_payload(g, u)).encode()[:-1] + b', "x": '
                                    + b"[" * 900 + b"]" * 900 + b"}")], 0),
        "ding/100k levels (over max_body_bytes)": (lambda g, u: [ding_post(g, b"[" * 100_000, 413)], 0),
        "ding/over max_body_bytes": (lambda g, u: [ding_post(g, b"x" * (MAX_BODY + 1), 413)], 0),
        "ding/over max_body_bytes, chunked": (
            lambda g, u: [Sent("POST", "/callback/ding-http", 413, None, ding_headers(g), chunks(MAX_BODY * 2))], 0),
        "ding/msgId 1e400": (lambda g, u: [ding_post(g, _ding_raw(g, u, "msgId", "1e400"))], 0),
        "ding/msgId 5000 digits": (lambda g, u: [ding_post(g, _ding_raw(g, u, "msgId", HUGE_INT))], 0),
        "ding/msgId NaN": (lambda g, u: [ding_post(g, _ding_raw(g, u, "msgId", "NaN"))], 0),
        "ding/text is a string": (lambda g, u: [ding_post(g, ding_payload(g, u, text="hi"))], 0),
        "ding/webhook expiry not a number": (
            lambda g, u: [ding_post(g, ding_payload(g, u, sessionWebhookExpiredTime="soon"))], 0),
        "ding/webhook expiry a list": (lambda g, u: [ding_post(g, ding_payload(g, u, sessionWebhookExpiredTime=[1]))],
                                       0),
        "ding/webhook expiry 4000 digits": (
            lambda g, u: [ding_post(g, _ding_raw(g, u, "sessionWebhookExpiredTime", LARGE_INT))], 0),
        "ding/lone surrogate in text": (lambda g, u: [ding_post(g, ding_payload(g, u, text={"content": "\udc80"}))],
                                        0),
        "ding/lone surrogate in msgId": (lambda g, u: [ding_post(g, ding_payload(g, u, msg_id="\ud800"))], 0),
        "ding/no msgId": (lambda g, u: [ding_post(g, {**ding_payload(g, u), "msgId": ""})], 0),
        "ding/another robot": (lambda g, u: [ding_post(g, ding_payload(g, u, robotCode="someone-else"), 403)], 0),
        "ding/the same message twice": (
            lambda g, u: [ding_post(g, p := ding_payload(g, u), 200, h := ding_headers(g)), ding_post(g, p, 200, h)],
            1),
        "ding/a signature reused with another msgId": (  # past the moment a pair's own pushes share it
            lambda g, u: [ding_post(g, ding_payload(g, u), 200, h := ding_headers(g)),
                          replace(ding_post(g, ding_payload(g, u), 403, h), after_s=SHARE_SIGNATURE_MS / 1000 + 0.2)],
            1),
        "ding/unknownMsgType (queued once for the text-only notice)": (
            lambda g, u: [ding_post(g, ding_payload(g, u, msgtype="unknownMsgType"), 200)], 1),
        "ding/GET": (lambda g, u: [Sent("GET", "/callback/ding-http", 405, None, ding_headers(g))], 0),
        # Web API, /web/web/...
        "web/no key": (lambda g, u: [web_post({"user": u, "text": "hi"}, 401, key=None)], 0),
        "web/wrong key": (lambda g, u: [web_post({"user": u, "text": "hi"}, 401, key=WEB_KEY + "x")], 0),
        "web/basic scheme": (
            lambda g, u: [web_post({"user": u, "text": "hi"}, 401, key=None, authorization=f"Basic {WEB_KEY}")], 0),
        "web/empty body": (lambda g, u: [web_post(b"")], 0),
        "web/truncated JSON": (lambda g, u: [web_post(b'{"user": "a", "text": "hi')], 0),
        "web/form body": (lambda g, u: [web_post(urlencode({"user": u, "text": "hi"}).encode(), content_type=form)],
                          0),
        "web/JSON array": (lambda g, u: [web_post(b'["user"]')], 0),
        "web/invalid UTF-8": (lambda g, u: [web_post(b'{"user": "\xff", "text": "hi"}')], 0),
        "web/deeply nested JSON": (lambda g, u: [web_post(DEEP_JSON)], 0),
        "web/nested inside a field": (
            lambda g, u: [web_post(b'{"user": "a", "text": "x", "msg_id": ' + b"[" * 900 + b"]" * 900 + b"}")], 0),
        "web/100k levels (over max_body_bytes)": (lambda g, u: [web_post(b"[" * 100_000, 413)], 0),
        "web/over max_body_bytes": (lambda g, u: [web_post(b"x" * (MAX_BODY + 1), 413)], 0),
        "web/over max_body_bytes without a key": (lambda g, u: [web_post(b"x" * (MAX_BODY + 1), 413, key=None)], 0),
        "web/no user": (lambda g, u: [web_post({"text": "hi"})], 0),
        "web/text too long": (lambda g, u: [web_post({"user": u, "text": "x" * 8001}, 413)], 0),
        "web/temperature not a number": (lambda g, u: [web_post({"user": u, "text": "hi", "temperature": "hot"})], 0),
        "web/temperature a list": (lambda g, u: [web_post({"user": u, "text": "hi", "temperature": [1]})], 0),
        "web/temperature out of range": (lambda g, u: [web_post({"user": u, "text": "hi", "temperature": 5})], 0),
        "web/temperature 1e400": (lambda g, u: [web_post(b'{"user": "a", "text": "hi", "temperature": 1e400}')], 0),
        "web/temperature NaN": (lambda g, u: [web_post(b'{"user": "a", "text": "hi", "temperature": NaN}')], 0),
        "web/temperature 5000 digits": (
            lambda g, u: [web_post(b'{"user": "a", "text": "hi", "temperature": ' + HUGE_INT.encode() + b"}")], 0),
        "web/lone surrogate in text": (lambda g, u: [web_post({"user": u, "text": "\ud800"})], 0),
        "web/lone surrogate in user": (lambda g, u: [web_post({"user": "\udfff", "text": "hi"})], 0),
        "web/lone surrogate in msg_id": (lambda g, u: [web_post({"user": u, "text": "hi", "msg_id": "\ud800"})], 0),
        "web/the same msg_id twice": (
            lambda g, u: [web_post(p := {"user": u, "text": "hi", "msg_id": u}, 200), web_post(p, 200)], 1),
        "web/unknown bot": (lambda g, u: [Sent("POST", "/web/nobody/chat", 404, None, None, b"{}")], 0),
        "web/not a web bot": (lambda g, u: [Sent("POST", "/web/app/chat", 404, None, None, b"{}")], 0),
        "web/GET chat": (lambda g, u: [Sent("GET", "/web/web/chat", 405)], 0),
        "web/status without a key": (lambda g, u: [Sent("GET", "/web/web/status", 401)], 0),
        "web/status with a wrong key": (
            lambda g, u: [Sent("GET", "/web/web/status", 401, None, {"authorization": "Bearer nope"})], 0),
        # Admin API, public port and admin listener
        "admin/no token": (lambda g, u: [Sent("GET", f"/admin/limits/{u}", 401)], 0),
        "admin/wrong token": (lambda g, u: [Sent("GET", f"/admin/limits/{u}", 401, None, _bearer(ADMIN_TOKEN + "x"))],
                              0),
        "admin/token as basic": (
            lambda g, u: [Sent("GET", f"/admin/limits/{u}", 401, None, {"authorization": f"Basic {ADMIN_TOKEN}"})], 0),
        "admin/token without scheme": (
            lambda g, u: [Sent("GET", f"/admin/limits/{u}", 401, None, {"authorization": ADMIN_TOKEN})], 0),
        "admin/reset without token": (lambda g, u: [Sent("DELETE", f"/admin/limits/{u}", 401)], 0),
        "admin/POST": (lambda g, u: [Sent("POST", f"/admin/limits/{u}", 405, None, _bearer(ADMIN_TOKEN), b"{}")], 0),
        "admin/handoff without token": (lambda g, u: [Sent("POST", "/admin/kf/kf/handoff", 401, None, None, b"{}")], 0),
        "admin/handoff deeply nested JSON": (
            lambda g, u: [Sent("POST", "/admin/kf/kf/handoff", 400, None, _bearer(ADMIN_TOKEN), DEEP_JSON)], 0),
        "admin/handoff over max_body_bytes": (
            lambda g, u: [Sent("POST", "/admin/kf/kf/handoff", 413, None, _bearer(ADMIN_TOKEN), b" " * (MAX_BODY + 1))],
            0),
        "admin/metrics without token": (lambda g, u: [Sent("GET", "/metrics", 404)], 0),
        "admin/readyz with a wrong token": (lambda g, u: [Sent("GET", "/readyz", 404, None, _bearer("nope"))], 0),
        "admin listener/no token": (lambda g, u: [Sent("GET", f"/admin/limits/{u}", 401, admin=True)], 0),
        "admin listener/wrong token": (
            lambda g, u: [Sent("DELETE", f"/admin/limits/{u}", 401, None, _bearer("x"), admin=True)], 0),
        "admin listener/a callback": (
            lambda g, u: [Sent("POST", "/callback/app", 404, *_query_body(app_text(g, u)), admin=True)], 0),
        "admin listener/the web API": (
            lambda g, u: [Sent("POST", "/web/web/chat", 404, None, _bearer(WEB_KEY), b"{}", admin=True)], 0),
        "admin listener/openapi.json": (lambda g, u: [Sent("GET", "/openapi.json", 404, admin=True)], 0),
    }
    return cases


def _query_body(callback: SignedCallback) -> tuple[dict[str, str], None, bytes]:
    return callback.params, None, callback.body


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _with_query(sent: Sent, *, expect: int, drop: bool = False, **params: str) -> Sent:
    query = {} if drop else {**(sent.params or {}), **params}
    return Sent(sent.method, sent.path, expect, query, sent.headers, sent.content)


def _foreign_corp(gw: Gateway, user: str) -> tuple[dict[str, str], bytes]:
    """Correct token and key, encrypted for another corp: the signature checks out, the receiver id does not."""
    app = gw.app
    crypto = WeComCrypto(app.token.get_secret_value(), app.encoding_aes_key.get_secret_value(), "ww-other-corp")
    ts = now_s()
    encrypted, signature = crypto.signed_envelope(text_message_xml(app, user, "hi", "1", int(ts)), ts, "7")
    return {"msg_signature": signature, "timestamp": ts, "nonce": "7"}, app_envelope(encrypted)


def _ding_raw(gw: Gateway, user: str, field: str, literal: str) -> bytes:
    """A DingTalk body with `field` set to a raw JSON literal (a number json.dumps would not write)."""
    payload = {k: v for k, v in ding_payload(gw, user).items() if k != field}
    return json.dumps(payload).encode()[:-1] + f', "{field}": {literal}}}'.encode()


CASES = _cases()


# -- running a case -----------------------------------------------------------------------------------------------


def log_offset(gw: Gateway) -> int:
    return gw.log.stat().st_size


def log_since(gw: Gateway, offset: int) -> str:
    """The gateway's log from `offset` up to a marker request sent now: uvicorn logs an application's exception
    just after its 500 went out, so the marker (a rejected callback, logged with its request id) comes after it."""
    marker = "marker-" + secrets.token_hex(6)
    httpx.post(f"{gw.stack.gateway_url}/callback/app", headers={"x-request-id": marker}, timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with gw.log.open("rb") as file:
            file.seek(offset)
            text = file.read().decode(errors="replace")
        if marker in text:
            return text
        time.sleep(0.02)
    raise AssertionError("the gateway did not log the marker request")


def send(gw: Gateway, sent: Sent) -> httpx.Response:
    base = gw.stack.admin_url if sent.admin else gw.stack.gateway_url
    return httpx.request(sent.method, base + sent.path, params=sent.params, headers=sent.headers,
                         content=sent.content, timeout=10)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_a_4xx_and_changes_nothing(gw: Gateway, user: str, case: str) -> None:
    build, may_add = CASES[case]
    requests = build(gw, user)
    before, offset = gw.stack.entries_added(), log_offset(gw)
    for number, sent in enumerate(requests, 1):
        time.sleep(sent.after_s)
        response = send(gw, sent)
        assert response.status_code == sent.expect, f"request {number}: {response.status_code} {response.text[:300]}"
        assert "root:" not in response.text, "a file entity was expanded into the answer"
        assert not [secret for secret in gw.secrets if secret in response.text]
    assert gw.stack.entries_added() - before == may_add
    log = log_since(gw, offset)
    assert "Traceback" not in log
    assert not [secret for secret in gw.secrets if secret in log]


@pytest.mark.parametrize("path", ["/callback/app", "/callback/ai", "/callback/ding-http", "/web/web/chat"])
def test_a_body_cut_off_on_the_wire_changes_nothing(gw: Gateway, user: str, path: str) -> None:
    """The client announces more than it sends and hangs up: nothing is queued, nothing crashes."""
    query = urlencode(app_text(gw, user).params) if path == "/callback/app" else ""
    headers = {**ding_headers(gw), **_bearer(WEB_KEY)}
    head = (f"POST {path}?{query} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    before, offset = gw.stack.entries_added(), log_offset(gw)
    port = int(gw.stack.gateway_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head + b'{"user": "a", "text": "cut')
        time.sleep(0.2)  # the gateway is reading the body when the client hangs up
    time.sleep(0.2)  # and notices the hang-up
    log = log_since(gw, offset)
    assert gw.stack.entries_added() == before
    assert "Traceback" not in log, log[-2000:]
    assert httpx.get(f"{gw.stack.gateway_url}/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_a_callback_urls_405_names_both_methods_it_serves(gw: Gateway, method: str) -> None:
    """The callback URL serves GET (the URL check) and POST: a 405 there must say so (RFC 9110 §15.5.6)."""
    response = httpx.request(method, f"{gw.stack.gateway_url}/callback/app", timeout=10)
    assert response.status_code == 405
    allowed = {part.strip() for part in response.headers["allow"].split(",")}
    assert {"GET", "POST"} <= allowed, response.headers["allow"]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_bot_with_no_url_check_says_post_is_what_its_url_serves(gw: Gateway, method: str) -> None:
    response = httpx.request(method, f"{gw.stack.gateway_url}/callback/ding-http", headers=ding_headers(gw), timeout=10)
    assert response.status_code == 405 and response.headers.get("allow") == "POST", response.headers


def test_admin_reset_of_a_pattern_clears_no_one(gw: Gateway, user: str) -> None:
    """`who` is an id, not a pattern: a reset of `*` must not clear every user's token budgets."""
    victim = gw.stack.redis
    corp = next(bot["corp_id"] for bot in gw.stack.config["bots"] if bot["id"] == "app")
    key = Keys(gw.stack.namespace).token_budget(f"user:wecom:{corp}:{user}", "d20990101")
    victim.set(key, 123, ex=600)
    for who in ("*", "?*", "[a-z]*", user[:3] + "*"):
        url = f"{gw.stack.gateway_url}/admin/limits/{quote(who, safe='')}"
        response = httpx.delete(url, headers=_bearer(ADMIN_TOKEN), timeout=10)
        assert response.status_code == 400, (who, response.text)
    assert victim.get(key) == b"123"
    bare = httpx.delete(f"{gw.stack.gateway_url}/admin/limits/{user}", headers=_bearer(ADMIN_TOKEN), timeout=10)
    assert bare.status_code == 400 and f"wecom:{corp}:{user}" in bare.json()["message"], bare.text
    assert victim.get(key) == b"123"
    cleared = httpx.delete(f"{gw.stack.gateway_url}/admin/limits/wecom:{user}", headers=_bearer(ADMIN_TOKEN),
                           timeout=10)
    assert cleared.status_code == 200 and cleared.json()["cleared"] >= 1
    assert victim.get(key) is None


def test_the_gateway_log_holds_no_traceback(gw: Gateway) -> None:
    """Over the whole module (a case's own check reads only what it added, after a short settle)."""
    text = gw.log.read_text(errors="replace")
    assert "callback rejected" in text, "the log is not the gateway's"
    assert "Traceback" not in text
