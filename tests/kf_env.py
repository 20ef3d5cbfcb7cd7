"""A 微信客服 bot's own stack for end-to-end tests: a gateway, a worker and a simulator of their own (own
namespace) on the session's Redis. Used by tests/e2e/wecom_kf/test_kf.py and tests/e2e/wecom_kf/test_kf_faults.py
(conftest registers the `kf` fixture)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from bots.base import InboundMessage
from bots.wecom_kf.config import WeComKfConfig
from bots.wecom_kf.models import conversation_of, target_of
from gateway.queue.push import enqueue_notice
from gateway.queue.scheduler import Scheduler
from gateway.state.keys import Keys
from simulator.replies import kf_sent
from simulator.wecom_kf.signer import WeComKfCallbackSigner
from testkit.configs import random_aes_key, stack_config, write_config
from testkit.probes import wait_replies
from testkit.processes import BOTGW, Proc, free_port, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import Stack

KFID = "wk-test-support"
HANDOFF_NOTICE = "正在为您转接人工客服，请稍候。"


@dataclass
class Kf:
    """A gateway, its workers and a simulator of their own (own namespace), for one 微信客服 bot."""

    config: dict
    path: object
    gateway_url: str
    sim_url: str
    redis: redis.Redis
    namespace: str
    log_dir: object
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def bot(self) -> WeComKfConfig:
        return WeComKfConfig(**self.config["bots"][0])

    def sim(self, method: str, path: str, **kwargs: object) -> object:
        response = httpx.request(method, f"{self.sim_url}{path}", timeout=30, **kwargs)
        response.raise_for_status()
        return response.json()

    def callback(self, token: str, to: str = "") -> httpx.Response:
        """WeCom calls back that there is something to pull, at the Kefu bot's URL (or the shared app's, `to`)."""
        signed = WeComKfCallbackSigner(self.bot).kf_msg_or_event(token, KFID)
        return httpx.post(f"{self.gateway_url}/callback/{to or self.bot.id}", params=signed.params,
                          content=signed.body, timeout=10)  # fmt: skip

    def write(self, customer: str, text: str, *, callback: bool = True, **extra: object) -> str:
        """The customer writes; WeCom calls back (unless told not to). Returns the callback Token."""
        body = {"open_kfid": KFID, "external_userid": customer, "text": text, **extra}
        token = self.sim("POST", "/__sim__/kf/customer", json=body)["token"]
        if callback:
            assert self.callback(token).status_code == 200
        return token

    def event(self, customer: str, event_type: str, **fields: object) -> dict:
        body = {"open_kfid": KFID, "external_userid": customer, "event_type": event_type, **fields}
        return self.sim("POST", "/__sim__/kf/event", json=body)

    def sent(self, customer: str) -> list[dict]:
        return self.sim("GET", "/__sim__/kf/sent", params={"external_userid": customer})

    def wait_sent(self, customer: str, count: int, timeout: float = 60, settle: float = 1.0) -> list[dict]:
        return wait_replies(lambda http: kf_sent(http, self.sim_url, customer), count, timeout, settle, customer)

    def session(self, customer: str) -> dict:
        return self.sim("GET", "/__sim__/kf/session", params={"open_kfid": KFID, "external_userid": customer})

    def stats(self) -> dict:
        return self.sim("GET", "/__sim__/kf/stats")

    def calls(self, endpoint: str) -> int:
        """How often botgw called a Kefu endpoint (sync_msg, send_msg, service_state_get, …)."""
        return int(self.stats().get(f"{endpoint}_calls", 0))

    def memory(self, customer: str) -> list[dict]:
        lane = f"wecom-kf:{self.bot.id}:{conversation_of(KFID, customer)}:{customer}"
        return [json.loads(item) for item in self.redis.lrange(Keys(self.namespace).memory(lane), 0, -1)]

    def enqueue_notice(self, customer: str, text: str) -> None:
        """A ready answer for the customer (no engine), queued in their conversation as any answer is."""
        message = InboundMessage(
            platform="wecom-kf", bot_id=self.bot.id, msg_id=secrets.token_hex(8),
            conversation_id=conversation_of(KFID, customer), sender_id=customer, text="",
            reply_to=target_of(KFID, customer),
        )  # fmt: skip

        async def put() -> None:
            client = AsyncRedis.from_url(self.config["redis_url"])
            await enqueue_notice(Scheduler(client, Keys(self.namespace)), message, text)
            await client.aclose()

        asyncio.run(put())

    def worker_log(self) -> str:
        return "\n".join(proc.tail(400) for name, proc in self.procs.items() if name.startswith("worker"))


@pytest.fixture(scope="module")
def kf(stack: Stack) -> Iterator[Kf]:
    namespace = "k" + secrets.token_hex(4)
    sim_port, port = free_port(), free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    bot = {
        "id": "kefu", "platform": "wecom-kf", "corp_id": "wwkf" + secrets.token_hex(5),
        "secret": secrets.token_urlsafe(24), "token": secrets.token_hex(8), "encoding_aes_key": random_aes_key(),
        "api_base": sim_url, "open_kfids": [KFID], "welcome_text": "欢迎光临，我是智能客服。", "app": "staff",
    }  # fmt: skip
    # One self-built app serves the employees and 微信客服: its callback URL receives the Kefu callbacks too.
    staff = {"id": "staff", "platform": "wecom", "agent_id": 1000002, "api_base": sim_url,
             **{key: bot[key] for key in ("corp_id", "secret", "token", "encoding_aes_key")}}  # fmt: skip
    config = stack_config(stack.config["redis_url"], stack.config["engine"]["base_url"], sim_url, namespace)
    config["bots"] = [bot, staff]
    config["worker"] = {**config["worker"], "concurrency": 16}
    config["limits"] = {"per_user": "100/minute"}
    path = write_config(stack.log_dir / f"{namespace}.yaml", config)
    sim = Proc([*BOTGW, "sim", "serve", "--config", str(path), "--port", str(sim_port)], stack.log_dir / "kf-sim.log")
    wait_http(f"{sim_url}/__sim__/healthz", 30, sim)
    env = Kf(config, path, f"http://127.0.0.1:{port}", sim_url, stack.redis, namespace, stack.log_dir, {"sim": sim})
    env.procs["gateway"] = start_gateway(path, port, stack.log_dir, f"gw-{namespace}")
    env.procs["worker-1"] = start_worker(path, stack.log_dir, f"{namespace}-w1")
    yield env
    for proc in env.procs.values():
        proc.stop()


def customer() -> str:
    return "wm" + secrets.token_hex(6)
