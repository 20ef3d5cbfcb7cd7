"""Fuzzing: every platform adapter's verify, decrypt and parse on arbitrary input (hypothesis), then the gateway's
HTTP API from its OpenAPI schema (schemathesis) against a real gateway process.

An adapter may only ever answer arbitrary input with its declared rejection, `bots.base.CallbackRejected`, and a
message it does accept must survive the queue (serialize to JSON and back, as the worker reads it). The HTTP fuzz
asserts schemathesis's `not_a_server_error` and no traceback in the gateway's log. Each property runs
BOTGW_FUZZ_EXAMPLES examples (200 by default; the API fuzz an eighth of that per run), so that CI stays bounded
and a longer hunt is one variable away: `BOTGW_FUZZ_EXAMPLES=5000 pytest tests/e2e/general/test_fuzz.py`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import struct
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from xml.sax.saxutils import escape

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from wechatpy.crypto.cryptography import WeChatCipher

from bots.base import CallbackRejected, InboundMessage
from bots.dingtalk.adapter import DingTalkRobotAdapter
from bots.dingtalk.config import DingTalkBotConfig
from bots.dingtalk.crypto import sign as ding_sign
from bots.dingtalk.crypto import verify_headers
from bots.dingtalk.models import parse_robot_message
from bots.dingtalk.stream import DingTalkStreamConnection, _frame
from bots.wecom.adapter import WeComAppAdapter
from bots.wecom.aibot import StreamPoll, UnsupportedMessage, WeComAIBotAdapter, WelcomeEvent
from bots.wecom.config import WeComAIBotConfig, WeComAppConfig
from bots.wecom.crypto import WeComCrypto, decode_aes_key
from bots.wecom.crypto import sign as wecom_sign
from bots.wecom.models import parse_app_message
from bots.xml import parse_flat_xml
from gateway.config import Settings
from gateway.edge.app import create_app
from testkit.configs import random_aes_key, write_config
from testkit.processes import free_port
from testkit.services import start_gateway
from testkit.stacks import Stack

EXAMPLES = int(os.environ.get("BOTGW_FUZZ_EXAMPLES", "200"))
API_EXAMPLES = max(10, EXAMPLES // 8)  # schemathesis's examples cost a request and ~20 ms of generation each
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=2),  # an example that takes seconds is a hang in the making
    database=None,  # nothing written into the work tree; a failure prints its example and a reproduce blob
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

AES_KEY, AI_AES_KEY = random_aes_key(), random_aes_key()
APP = WeComAppConfig(id="app", corp_id="wwfuzz", agent_id=1000002, secret="s3cret", token="tok-app",
                     encoding_aes_key=AES_KEY)
AI = WeComAIBotConfig(id="ai", token="tok-ai", encoding_aes_key=AI_AES_KEY)
DING = DingTalkBotConfig(id="ding", mode="http", app_key="dingfuzz", app_secret="ding-secret-" + secrets.token_hex(4))


class NoTokens:
    """The adapters' token store, never used by verify or parse."""

    async def get(self, name: str) -> str | None:
        raise AssertionError("parse fetched a token")


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.AsyncClient]:
    client = httpx.AsyncClient()  # held by the adapters for sending; parse never uses it
    yield client
    asyncio.run(client.aclose())


def queueable(message: InboundMessage) -> None:
    """What the gateway queues, the worker must read back: JSON out, the same message in."""
    assert InboundMessage.model_validate_json(message.model_dump_json()) == message
    assert message.dedup_key.encode()  # the dedup key, like every Redis key, is UTF-8


def rejects_only(call: Any, *args: Any) -> Any:
    """`call(*args)`, with CallbackRejected (a 4xx of the adapter's own choosing) as the one exception allowed."""
    try:
        result = call(*args)
    except CallbackRejected as exc:
        assert 400 <= exc.status < 500, exc.status
        assert exc.reason and " " not in exc.reason  # a metrics label
        event(f"rejected: {exc.reason}")  # --hypothesis-show-statistics shows how deep the examples went
        return None
    event(f"accepted: {type(result).__name__}")
    return result


# -- strategies ---------------------------------------------------------------------------------------------------
# Mostly well-formed platform payloads with one field or another hostile, so that examples get past the first check.

words = st.one_of(st.text(max_size=20), st.sampled_from(["text", "stream", "event", "mixed", "1", "u1"]))
names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=12)
surrogates = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=10**300, max_value=10**4000),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, words, surrogates),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(words, children, max_size=4),
    max_leaves=12,
)
timestamps = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**13).map(str),
    st.integers(min_value=0, max_value=10**4000).map(str),
    st.sampled_from(["", "1e400", "NaN", " 1 ", "1_000", "\u0661\u0662", str(int(time.time()))]),
    st.text(max_size=12),
)


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """Usually `strategy`, one time in eight any JSON value in its place."""
    return st.one_of(*[strategy] * 7, json_values)


def shaped(required: dict[str, st.SearchStrategy], optional: dict[str, st.SearchStrategy] | None = None,
           stray: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with the platform's keys (each maybe hostile) and up to `stray` keys it does not know."""
    fields = st.fixed_dictionaries({k: maybe(v) for k, v in required.items()},
                                   optional={k: maybe(v) for k, v in (optional or {}).items()})
    return st.tuples(fields, st.dictionaries(names, maybe(words), max_size=stray)).map(lambda t: {**t[1], **t[0]})


ai_payloads = shaped(
    {"msgtype": st.sampled_from(["text", "voice", "mixed", "text", "stream", "event", "image", ""]),
     "msgid": names, "from": shaped({"userid": names})},
    {"chattype": st.sampled_from(["single", "group"]), "chatid": names, "response_url": words,
     "text": shaped({"content": words}), "voice": shaped({"content": words}),
     "mixed": shaped({"msg_item": st.lists(shaped({"msgtype": st.just("text"), "text": shaped({"content": words})}),
                                           max_size=3)}),
     "stream": shaped({"id": names}), "event": shaped({"eventtype": st.sampled_from(["enter_chat", "other"])})},
    stray=2,
)
ding_payloads = shaped(
    {"msgtype": st.sampled_from(["text", "picture", "richText", "unknownMsgType", ""]), "msgId": names,
     "senderStaffId": names, "conversationId": names, "robotCode": st.just(DING.robot)},
    {"senderId": names, "conversationType": st.sampled_from(["1", "2", 2]), "text": shaped({"content": words}),
     "isInAtList": st.booleans(), "sessionWebhook": words,
     "sessionWebhookExpiredTime": st.integers(min_value=0, max_value=2**53)},
    stray=2,
)


def json_texts(objects: st.SearchStrategy) -> st.SearchStrategy[str]:
    """JSON text as a platform sends it (half the time), as no platform should (NaN, deep nesting), or not JSON."""
    hostile = st.one_of(
        json_values.map(json.dumps),
        st.integers(min_value=1, max_value=3000).map(lambda depth: "[" * depth + "]" * depth),
        st.integers(min_value=1, max_value=3000).map(lambda depth: '{"a":' * depth + "1" + "}" * depth),
        objects.map(json.dumps).flatmap(lambda text: st.integers(0, len(text)).map(lambda cut: text[:cut])),
        st.text(max_size=60),
    )
    return st.one_of(objects.map(json.dumps), hostile)  # json.dumps: a lone surrogate as its \\u escape


XML_TAGS = ["ToUserName", "FromUserName", "CreateTime", "MsgType", "Content", "MsgId", "AgentID", "Event",
            "Encrypt", "Recognition"]
xml_hostile = st.sampled_from([
    '<?xml version="1.0" encoding="utf-16"?>', '<?xml version="1.0" encoding="hex"?>',
    '<!DOCTYPE x [<!ENTITY a "b">]>', '<!DOCTYPE x SYSTEM "file:///etc/passwd">', "&a;", "&#0;", "&#x110000;",
    "<a b='1' b='2'/>", "\x00", "\ufeff", "<", "]]>", "<![CDATA[", "</xml>",
])


def render_xml(fields: list[tuple[str, str, bool]], hostile: str | None, at: int) -> str:
    """A WeCom-like document of `fields` (CDATA or escaped), with a hostile fragment put in at `at` if any."""
    body = "".join(f"<{tag}>{f'<![CDATA[{v}]]>' if cdata else escape(v)}</{tag}>" for tag, v, cdata in fields)
    text = f"<xml>{body}</xml>"
    cut = at % (len(text) + 1)
    return text if hostile is None else text[:cut] + hostile + text[cut:]


xml_messages = st.fixed_dictionaries(
    {"MsgType": st.sampled_from(["text", "voice", "event", "image", "hologram", ""]), "FromUserName": names},
    optional={"Content": words, "MsgId": names, "CreateTime": timestamps, "Recognition": words, "Event": words},
)
xml_fields = st.one_of(
    st.tuples(xml_messages, st.dictionaries(names, words, max_size=2)).map(lambda t: [*t[0].items(), *t[1].items()]),
    st.lists(st.tuples(st.sampled_from(XML_TAGS) | names, st.one_of(words, names)), max_size=8),
)
xml_texts = st.one_of(
    st.builds(
        render_xml,
        st.tuples(xml_fields, st.booleans()).map(lambda t: [(tag, value, t[1]) for tag, value in t[0]]),
        st.one_of(st.none(), st.none(), xml_hostile),
        st.integers(min_value=0),
    ),
    st.text(max_size=60),
)
xml_bodies = st.one_of(xml_texts.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=200))
queries = st.dictionaries(st.sampled_from(["msg_signature", "timestamp", "nonce", "echostr"]) | st.text(max_size=4),
                          st.one_of(timestamps, words, surrogates), max_size=5)


def wrap(encoding_aes_key: str, message: bytes, receive_id: bytes, declared: int | None = None) -> str:
    """WeCom's envelope around arbitrary bytes, with a length field that may lie."""
    body = secrets.token_bytes(16) + struct.pack(">I", len(message) if declared is None else declared)
    body += message + receive_id
    pad = 32 - len(body) % 32
    return base64.b64encode(WeChatCipher(decode_aes_key(encoding_aes_key)).encrypt(body + bytes([pad]) * pad)).decode()


def signed_query(token: str, encrypted: str) -> dict[str, str]:
    ts, nonce = str(int(time.time())), "42"
    return {"msg_signature": wecom_sign(token, ts, nonce, encrypted), "timestamp": ts, "nonce": nonce}


# -- WeCom crypto -------------------------------------------------------------------------------------------------

CRYPTO = WeComCrypto(APP.token.get_secret_value(), AES_KEY, APP.corp_id)


@FUZZ
@given(signature=words | surrogates, timestamp=timestamps, nonce=words | surrogates, payload=words | surrogates)
def test_wecom_verify_only_rejects(signature: str, timestamp: str, nonce: str, payload: str) -> None:
    rejects_only(CRYPTO.verify, signature, timestamp, nonce, payload)


@FUZZ
@given(encrypted=st.one_of(st.text(max_size=80), st.binary(max_size=120).map(lambda b: base64.b64encode(b).decode())))
def test_wecom_decrypt_of_any_text_only_rejects(encrypted: str) -> None:
    assert rejects_only(CRYPTO.decrypt, encrypted) is None or encrypted  # a random string never decrypts to a message


@FUZZ
@given(blocks=st.binary(min_size=16, max_size=160))
def test_wecom_decrypt_of_any_cipher_block_only_rejects(blocks: bytes) -> None:
    """Whole AES blocks of anything: padding, length field and receiver id are all checked, none crashes."""
    raw = blocks[: len(blocks) // 16 * 16]
    rejects_only(CRYPTO.decrypt, base64.b64encode(WeChatCipher(decode_aes_key(AES_KEY)).encrypt(raw)).decode())


@FUZZ
@given(
    message=st.text(max_size=40).map(str.encode) | st.binary(max_size=100),
    receiver=st.sampled_from([APP.corp_id.encode(), b""]) | st.binary(max_size=20),
    declared=st.none() | st.integers(0, 2**32 - 1),
)
def test_wecom_decrypt_of_any_plaintext_only_rejects(message: bytes, receiver: bytes, declared: int | None) -> None:
    result = rejects_only(CRYPTO.decrypt, wrap(AES_KEY, message, receiver, declared))
    if result is not None:
        assert declared in (None, len(message)) and receiver == APP.corp_id.encode()
        assert result == message.decode()


@FUZZ
@given(text=st.text())
def test_wecom_encrypt_then_decrypt_is_the_identity(text: str) -> None:
    assert CRYPTO.decrypt(CRYPTO.encrypt(text)) == text


# -- WeCom app: XML, the inner message, the adapter ---------------------------------------------------------------


@FUZZ
@given(data=st.one_of(xml_bodies, xml_texts))
def test_parse_flat_xml_only_rejects(data: bytes | str) -> None:
    fields = rejects_only(parse_flat_xml, data)
    assert fields is None or all(isinstance(v, str) for v in fields.values())


@FUZZ
@given(plaintext=xml_texts)
def test_parse_app_message_only_rejects(plaintext: str) -> None:
    message = rejects_only(parse_app_message, "app", plaintext, time.time())
    if message is not None:
        queueable(message)


@pytest.fixture(scope="module")
def app_adapter(http: httpx.AsyncClient) -> WeComAppAdapter:
    return WeComAppAdapter(APP, http, NoTokens())  # type: ignore[arg-type]


@FUZZ
@given(query=queries, body=xml_bodies)
def test_app_adapter_on_unsigned_input_only_rejects(app_adapter: WeComAppAdapter, query: dict, body: bytes) -> None:
    assert rejects_only(app_adapter.parse, query, body, time.time()) is None  # nothing unsigned gets through
    assert rejects_only(app_adapter.handshake, query, time.time()) is None


@FUZZ
@given(plaintext=xml_bodies)
def test_app_adapter_on_signed_input_only_rejects(app_adapter: WeComAppAdapter, plaintext: bytes) -> None:
    """Past the signature, whatever the inner bytes: a message, an ignored event, or a rejection."""
    encrypted = wrap(AES_KEY, plaintext, APP.corp_id.encode())
    envelope = f"<xml><Encrypt><![CDATA[{encrypted}]]></Encrypt></xml>".encode()
    message = rejects_only(app_adapter.parse, signed_query(APP.token.get_secret_value(), encrypted), envelope,
                           time.time())
    if message is not None:
        queueable(message)


# -- WeCom AI bot -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ai_adapter(http: httpx.AsyncClient) -> WeComAIBotAdapter:
    return WeComAIBotAdapter(AI, http)


@FUZZ
@given(query=queries, body=st.one_of(json_texts(ai_payloads).map(str.encode), st.binary(max_size=100)))
def test_aibot_on_unsigned_input_only_rejects(ai_adapter: WeComAIBotAdapter, query: dict, body: bytes) -> None:
    assert rejects_only(ai_adapter.parse, query, body, time.time()) is None
    assert rejects_only(ai_adapter.handshake, query, time.time()) is None


@FUZZ
@given(plaintext=json_texts(ai_payloads))
def test_aibot_on_signed_input_only_rejects(ai_adapter: WeComAIBotAdapter, plaintext: str) -> None:
    encrypted = wrap(AI_AES_KEY, plaintext.encode(), b"")
    body = json.dumps({"encrypt": encrypted}).encode()
    event = rejects_only(ai_adapter.parse, signed_query(AI.token.get_secret_value(), encrypted), body, time.time())
    assert event is None or isinstance(event, InboundMessage | StreamPoll | WelcomeEvent | UnsupportedMessage)
    if isinstance(event, InboundMessage):
        queueable(event)


# -- DingTalk: HTTP headers and body, the message, Stream frames --------------------------------------------------

SECRET = DING.app_secret.get_secret_value()
headers_dicts = st.dictionaries(st.sampled_from(["timestamp", "sign"]) | st.text(max_size=4),
                                st.one_of(timestamps, words, surrogates), max_size=3)


@FUZZ
@given(headers=headers_dicts, window=st.sampled_from([0, 3600]))
def test_dingtalk_verify_headers_only_rejects(headers: dict[str, str], window: int) -> None:
    assert rejects_only(verify_headers, headers, SECRET, time.time(), window) is None


@pytest.fixture(scope="module")
def ding_adapter(http: httpx.AsyncClient) -> DingTalkRobotAdapter:
    return DingTalkRobotAdapter(DING, http, NoTokens())  # type: ignore[arg-type]


@FUZZ
@given(body=st.one_of(json_texts(ding_payloads).map(lambda t: t.encode("utf-8", "surrogatepass")),
                      st.binary(max_size=100)))
def test_dingtalk_on_signed_input_only_rejects(ding_adapter: DingTalkRobotAdapter, body: bytes) -> None:
    """The sign covers only the timestamp: whoever holds one valid pair chooses the body. It must not crash us."""
    ts = str(int(time.time() * 1000))
    message = rejects_only(ding_adapter.parse, {"timestamp": ts, "sign": ding_sign(ts, SECRET)}, body, time.time())
    if message is not None:
        queueable(message)


@FUZZ
@given(payload=ding_payloads)
def test_parse_robot_message_only_rejects(payload: dict[str, Any]) -> None:
    rejects_only(parse_robot_message, "ding", payload, time.time())


@FUZZ
@given(raw=st.one_of(json_texts(st.dictionaries(words, json_values)), st.binary(max_size=100)))
def test_stream_frame_decoding_never_raises(raw: str | bytes) -> None:
    frame = _frame(raw)
    assert frame is None or isinstance(frame, dict)


stream_frames = shaped({
    "type": st.sampled_from(["SYSTEM", "CALLBACK", "EVENT", ""]),
    "headers": shaped({"topic": st.sampled_from(["ping", "disconnect", "/v1.0/im/bot/messages/get", "*"]),
                       "messageId": names}),
    "data": st.one_of(json_texts(ding_payloads), ding_payloads, json_texts(shaped({"opaque": words}))),
})


@FUZZ
@given(frame=stream_frames)
def test_stream_frame_routing_always_acks(frame: dict[str, Any]) -> None:
    """Any decoded frame gets an ack (or the reconnect), and only a readable robot message reaches the queue."""
    queued: list[InboundMessage] = []

    async def sink(message: InboundMessage) -> None:
        queued.append(message)

    connection = DingTalkStreamConnection(DING, None, sink)  # type: ignore[arg-type]
    reply = asyncio.run(asyncio.wait_for(connection._route(frame), timeout=5))
    headers = frame["headers"] if isinstance(frame.get("headers"), dict) else {}
    if reply == "disconnect":
        assert frame["type"] == "SYSTEM" and headers["topic"] == "disconnect"
        return
    ack = json.loads(reply)
    event(f"ack {ack['code']}, {len(queued)} queued")
    assert ack["code"] in (200, 400) and ack["headers"]["contentType"] == "application/json"
    robot_message = frame.get("type") == "CALLBACK" and headers.get("topic") == "/v1.0/im/bot/messages/get"
    assert len(queued) == (1 if robot_message and ack["code"] == 200 else 0)
    for message in queued:
        queueable(message)


# -- the HTTP API from its OpenAPI schema (schemathesis) ----------------------------------------------------------

WEB_KEY = "web-key-" + secrets.token_hex(8)
ADMIN_TOKEN = "adm-" + secrets.token_hex(12)
BOT_IDS = ["app", "ai", "ding-http", "ding-stream", "robot", "web", "nobody"]


def described(schema: dict[str, Any]) -> dict[str, Any]:
    """The served schema, plus what the routes read by hand (query, platform headers, bodies), so that the fuzzer
    sends what the platforms send and not only path parameters."""

    def parameter(name: str, where: str, schema: dict | None = None) -> dict:
        return {"name": name, "in": where, "required": False, "schema": schema or {"type": "string"}}

    auth = parameter("authorization", "header")
    bot_id = {"name": "bot_id", "in": "path", "required": True, "schema": {"type": "string", "enum": BOT_IDS}}
    wecom_query = [parameter(name, "query") for name in ("msg_signature", "timestamp", "nonce")]
    json_body = {"type": "object", "properties": {
        "encrypt": {"type": "string"}, "msgtype": {"type": "string"}, "msgId": {"type": "string"},
        "senderStaffId": {"type": "string"}, "conversationId": {"type": "string"},
        "text": {"type": "object", "properties": {"content": {"type": "string"}}},
        "sessionWebhookExpiredTime": {"type": "number"}, "user": {"type": "string"},
        "temperature": {"type": "number"}, "msg_id": {"type": "string"},
    }}
    bodies = {"required": False, "content": {"application/json": {"schema": json_body},
                                             "text/plain": {"schema": {"type": "string"}}}}
    paths = schema["paths"]
    # The callback URL is a plain Starlette route (gateway/edge/routes.py CALLBACK_ROUTE), not in the schema.
    callback = paths.setdefault("/callback/{bot_id}", {})
    callback["get"] = {"parameters": [bot_id, *wecom_query, parameter("echostr", "query")],
                       "responses": {"200": {"description": "the decrypted echostr"}}}
    callback["post"] = {"parameters": [
        bot_id, *wecom_query, parameter("timestamp", "header"), parameter("sign", "header")],
        "requestBody": bodies, "responses": {"200": {"description": "acknowledged"}}}
    paths["/web/{bot_id}/chat"]["post"]["parameters"] = [bot_id, auth]
    paths["/web/{bot_id}/chat"]["post"]["requestBody"] = bodies
    paths["/web/{bot_id}/status"]["get"]["parameters"] = [bot_id, auth]
    for method in ("get", "delete"):
        paths["/admin/limits/{who}"][method]["parameters"].append(auth)
    return schema


SERVED = create_app(Settings(bots=[])).openapi()  # the same app object `botgw serve` builds; nothing is started
DESCRIBED = described(json.loads(json.dumps(SERVED)))
SCHEMA = schemathesis.openapi.from_dict(DESCRIBED)
OPERATIONS = [f"{method.upper()} {path}" for path, item in DESCRIBED["paths"].items() for method in item]


def api_runs() -> Iterator[Any]:
    """Operation × generation mode × keys × listener, where each makes a difference: negative cases only where
    there is something to break, the right keys only where a key is checked, the admin listener (without keys:
    it serves operators' routes without the guard's token check) only for the routes it serves; it answers every
    other path 404 before routing."""
    for label in OPERATIONS:
        method, path = label.split(" ", 1)
        operation = DESCRIBED["paths"][path][method.lower()]
        constrained = [p for p in operation.get("parameters", []) if p["in"] == "query" or "enum" in p["schema"]]
        modes = list(GenerationMode) if constrained or "requestBody" in operation else [GenerationMode.POSITIVE]
        operator = path.startswith("/admin/") or path in ("/metrics", "/readyz", "/healthz")
        keyed = path.startswith(("/admin/", "/web/")) or path in ("/metrics", "/readyz")
        runs = [("none", "public")] + [("right", "public")] * keyed + [("none", "admin")] * operator
        for keys, listener in runs:
            for mode in modes:
                yield pytest.param(label, mode, keys, listener, id=f"{label} {mode.value} {keys}-keys {listener}")


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Stack]:
    """A gateway of its own (namespace, web bot, admin token), no worker: what the fuzz queues stays queued."""
    namespace = "f" + secrets.token_hex(4)
    web = {"id": "web", "platform": "web", "api_key": WEB_KEY, "answer_timeout_s": 0.05}
    config = {**stack.config, "namespace": namespace, "admin": {"token": ADMIN_TOKEN},
              "bots": [*stack.config["bots"], web]}
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    port = free_port()
    own = Stack(config, path, f"http://127.0.0.1:{port}", stack.sim_url, stack.redis, namespace, stack.log_dir)
    own.procs["gateway"] = start_gateway(path, port, stack.log_dir, name=f"gw-fuzz-{namespace}")
    yield own
    own.procs["gateway"].stop()


def test_the_fuzzed_schema_covers_every_served_route_and_is_not_itself_served(api: Stack) -> None:
    every_kind = {"/web/{bot_id}/chat", "/admin/limits/{who}", "/admin/kb/{kb}/documents"}
    assert every_kind <= SERVED["paths"].keys() and len(OPERATIONS) >= 8, sorted(SERVED["paths"])
    # The callback URL, a plain Starlette route outside the schema, is fuzzed as described by hand.
    assert {"GET /callback/{bot_id}", "POST /callback/{bot_id}"} <= set(OPERATIONS)
    for base in (api.gateway_url, api.admin_url):  # it would list every admin route (issue 19)
        assert httpx.get(f"{base}/openapi.json", timeout=10).status_code == 404


@pytest.mark.parametrize(("operation", "mode", "keys", "listener"), list(api_runs()))
def test_no_input_gets_a_server_error(api: Stack, operation: str, mode: GenerationMode, keys: str,
                                      listener: str) -> None:
    """Schemathesis cases for one operation, positive or negative, with the right web and admin keys or without,
    to the public port or the admin listener: never a 5xx (a /readyz that is not ready says 503, by design)."""
    api_operation = SCHEMA.find_operation_by_label(operation)
    assert api_operation is not None
    key = ADMIN_TOKEN if "/admin/" in operation or operation.endswith(("/metrics", "/readyz")) else WEB_KEY
    fixed = {"authorization": f"Bearer {key}"} if keys == "right" else None
    base_url = api.admin_url if listener == "admin" else api.gateway_url
    offset = api.procs["gateway"].log_path.stat().st_size

    @settings(max_examples=API_EXAMPLES, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(case=api_operation.as_strategy(generation_mode=mode, headers=fixed))
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(base_url=base_url, timeout=10)  # a hang fails the example instead of the suite
        if operation == "GET /readyz" and response.status_code == 503:
            assert response.json()["ready"] is False
            return
        case.validate_response(response, checks=[not_a_server_error])

    fuzz()
    time.sleep(0.3)  # uvicorn logs an application's exception just after the 500
    with api.procs["gateway"].log_path.open("rb") as log:
        log.seek(offset)
        assert b"Traceback" not in log.read()
