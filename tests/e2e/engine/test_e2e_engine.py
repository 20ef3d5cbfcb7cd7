"""End to end through the real vLLM CPU engine (tiny ERNIE-4.5 MoE, temperature 0):
simulator callback → gateway → Redis Stream → worker → vLLM → simulated WeCom."""

from __future__ import annotations

import json

import httpx

from bots.markdown import to_text
from gateway.state.keys import Keys
from testkit.configs import ENGINE_MODEL, SYSTEM_PROMPT
from testkit.fakes.stub_engine import answer_for
from testkit.stacks import Stack


def engine_answer(engine_url: str, messages: list[dict[str, str]], max_tokens: int) -> str:
    """What vLLM itself says for this conversation, asked directly."""
    response = httpx.post(
        f"{engine_url}/v1/chat/completions",
        json={"model": ENGINE_MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0},
        timeout=60,
    )
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def memory_turns(stack: Stack, user: str) -> list[dict]:
    corp = stack.config["bots"][0]["corp_id"]
    key = Keys(stack.namespace).memory(f"dm:wecom:{corp}:{user}")  # a member's one-to-one memory is theirs
    return [json.loads(item) for item in stack.redis.lrange(key, 0, -1)]


def test_answer_is_the_engines_and_memory_carries_the_first_turn(stack: Stack, live_engine: str, user: str) -> None:
    max_tokens = stack.config["engine"]["max_tokens"]
    signer = stack.signer()
    system = {"role": "system", "content": SYSTEM_PROMPT}

    assert stack.post_callback(signer.text(user, "What is the capital of France?")).status_code == 200
    first = stack.wait_delivered(user, 1)[0]["content"]
    q1 = {"role": "user", "content": "What is the capital of France?"}
    expected_first = engine_answer(live_engine, [system, q1], max_tokens)
    assert first == to_text(expected_first), "the WeCom app shows text: the answer's Markdown made readable"

    assert stack.post_callback(signer.text(user, "And of Italy?")).status_code == 200
    second = stack.wait_delivered(user, 2)[1]["content"]
    q2 = {"role": "user", "content": "And of Italy?"}
    answered = {"role": "assistant", "content": expected_first}  # memory keeps what the engine wrote
    with_history = engine_answer(live_engine, [system, q1, answered, q2], max_tokens)
    without_history = engine_answer(live_engine, [system, q2], max_tokens)
    assert second == to_text(with_history)
    # The tiny model must tell the two prompts apart, or this test would prove nothing.
    assert with_history != without_history

    turns = memory_turns(stack, user)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
    assert turns[0]["content"] == q1["content"] and turns[1]["content"] == expected_first
    assert all(t["tokens"] > 0 for t in turns)

    assert stack.post_callback(signer.text(user, "/reset")).status_code == 200
    assert "forgotten" in stack.wait_delivered(user, 3)[2]["content"]
    assert memory_turns(stack, user) == []

    assert stack.post_callback(signer.text(user, "And of Italy?")).status_code == 200
    assert stack.wait_delivered(user, 4)[3]["content"] == to_text(without_history)


def test_duplicate_deliveries_call_the_engine_once(cluster, user: str) -> None:
    """WeCom's retries of one callback: one answer, and the engine (a stub that counts this test's requests
    alone) asked once."""
    c = cluster(0.3)
    c.add_gateway()
    c.add_worker("w")
    callback = c.stack.signer().text(user, "Tell me a story")
    assert [c.stack.post_callback(callback).status_code for _ in range(4)] == [200] * 4
    c.stack.wait_delivered(user, 1, settle=2.0)
    assert c.stack.texts(user) == [answer_for("Tell me a story")]
    assert [r["user"] for r in c.engine_requests()] == ["Tell me a story"]


def test_readyz_reports_redis_and_engine(stack: Stack, live_engine: str) -> None:
    body = httpx.get(f"{stack.admin_url}/readyz", timeout=10).json()
    assert (body["ready"], body["redis"], body["engine"], body["model"]) == (True, True, True, ENGINE_MODEL)
    assert body["engines"] == {live_engine: "ready"}


def test_message_longer_than_the_context_window_gets_a_clear_reply(stack: Stack, live_engine: str, user: str) -> None:
    signer = stack.signer()
    long_text = "请详细解释企业微信机器人的每一个配置步骤。" * 300  # about 6,000 tokens, the tiny engine holds 2,048
    assert stack.post_callback(signer.text(user, long_text)).status_code == 200
    reply = stack.wait_delivered(user, 1, settle=0.5)[0]["content"]
    assert "too long" in reply and "太长" in reply, reply
    assert memory_turns(stack, user) == [], "a refused message is not remembered"
    assert stack.post_callback(signer.text(user, "What is the capital of France?")).status_code == 200
    second = stack.wait_delivered(user, 2, settle=0.5)[1]["content"]
    system = {"role": "system", "content": SYSTEM_PROMPT}
    q = {"role": "user", "content": "What is the capital of France?"}
    assert second == to_text(engine_answer(live_engine, [system, q], stack.config["engine"]["max_tokens"]))
