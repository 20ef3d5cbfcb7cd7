"""Who a bot answers (bots/audience.py): its allow and deny lists and the prefix a group message needs. A refused
message gets nothing back, is counted, and queues nothing."""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx

from bots.dingtalk.config import DingTalkBotConfig
from gateway.queue.scheduler import SHARE_SIGNATURE_MS
from simulator.dingtalk.user import DingTalkUser, robot_payload
from testkit.configs import write_config
from testkit.probes import metric
from testkit.stacks import Stack


def dingtalk_send(stack: Stack, user: str, text: str, group: str) -> None:
    config = DingTalkBotConfig(**next(b for b in stack.config["bots"] if b["id"] == "ding-http"))

    async def go() -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            await DingTalkUser(config, stack.gateway_url, stack.sim_url, http).send(user, text, group=group)

    asyncio.run(go())


def dingtalk_post(stack: Stack, user: str, text: str, group: str, timestamp_ms: int) -> httpx.Response:
    """A DingTalk HTTP callback signed for `timestamp_ms` (a captured timestamp and sign reused)."""
    config = DingTalkBotConfig(**next(b for b in stack.config["bots"] if b["id"] == "ding-http"))

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as http:
            session = {"conversation": group, "user": user, "group": True, "ttl_s": 3600}
            webhook = (await http.post(f"{stack.sim_url}/__sim__/dingtalk/session", json=session)).json()
            payload = robot_payload(config, user, text, conversation=group, group=True, webhook=webhook)
            sender = DingTalkUser(config, stack.gateway_url, stack.sim_url, http)
            return await sender.post_signed(payload, timestamp_ms=timestamp_ms)

    return asyncio.run(go())


def dingtalk_replies(stack: Stack, conversation: str) -> list[dict]:
    url = f"{stack.sim_url}/__sim__/dingtalk/messages"
    return httpx.get(url, params={"conversation": conversation}, timeout=5).json()


def test_denied_users_and_unprefixed_group_messages_get_nothing(stack: Stack, cluster, user: str) -> None:
    denied, outsider_group = "d" + secrets.token_hex(4), f"cid-closed-{user}"
    made = cluster(0.05)
    for bot in made.config["bots"]:
        if bot["id"] == "app":
            bot["deny_users"] = [denied]
        if bot["id"] == "ding-http":
            bot["group_prefix"] = "/ask"
            bot["deny_groups"] = [outsider_group]
    write_config(made.path, made.config)
    made.add_gateway()
    made.add_worker("w1")
    front = made.stack

    front.post_callback(front.signer().text(denied, "/help"))
    front.post_callback(front.signer().text(user, "/help"))
    assert len(front.wait_delivered(user, 1)) == 1, "an allowed user is answered"
    time.sleep(1.0)
    assert front.wait_delivered(denied, 0, timeout=1) == [], "a denied user gets nothing"
    admin = made.procs["gw-" + made.namespace + "-0"].admin_url
    assert metric(admin, "botgw_messages_ignored_total", reason="denied_user") == 1

    group = f"cid-open-{user}"
    dingtalk_send(front, user, "/help without the prefix", group)
    dingtalk_send(front, user, "/ask /help", group)
    dingtalk_send(front, user, "/ask /help", outsider_group)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not dingtalk_replies(front, group):
        time.sleep(0.1)
    time.sleep(1.5)
    answered = dingtalk_replies(front, group)
    assert len(answered) == 1, "only the prefixed group message is answered"
    assert "/reset" in answered[0]["content"], "the prefix is taken off: '/help' was read as the command"
    assert dingtalk_replies(front, outsider_group) == [], "a denied group gets nothing"
    assert metric(admin, "botgw_messages_ignored_total", reason="no_prefix") == 1
    assert metric(admin, "botgw_messages_ignored_total", reason="denied_group") == 1

    # DingTalk signs only the timestamp: the pair of a message the bot ignored is bound to it all the same, so it
    # cannot carry a message the bot would answer (before, an ignored message left its pair free for an hour).
    captured = int(time.time() * 1000)
    replay_group = f"cid-replay-{user}"
    assert dingtalk_post(front, user, "no prefix: ignored", replay_group, captured).status_code == 200
    time.sleep(SHARE_SIGNATURE_MS / 1000 + 0.2)  # past the moment a pair's own pushes share it
    refused = dingtalk_post(front, user, "/ask /help", replay_group, captured)
    assert refused.status_code == 403 and "another message" in refused.text, refused.text
    time.sleep(1.5)
    assert dingtalk_replies(front, replay_group) == [], "the replayed pair's message is not answered"
    assert metric(admin, "botgw_messages_ignored_total", reason="no_prefix") == 2
