"""The world a model run acts on: a real redis-server, the simulator and a gateway as processes, and workers in
this process whose Redis, platform HTTP and engine calls all pass a fault context (tests/model/faults.py).

Workers run in process so that a fault can kill one at an exact call: a killed worker's every later call dies
too, nothing is released, and a fresh worker takes its place; the dead one's lease expires and is taken over.
Windows are short (lease 0.8 s, merge 0.5 s) so that time passing is seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from redis.asyncio import Redis

from bots.dingtalk.config import DingTalkBotConfig
from bots.registry import build_adapters
from bots.wecom.config import WeComAppConfig
from bots.wecom_kf.config import WeComKfConfig
from bots.wecom_kf.models import handoff_for
from engine.pool import EnginePool
from gateway.config import Settings, load_settings
from gateway.queue.push import enqueue_handoff
from gateway.queue.scheduler import Scheduler
from gateway.runtime import HTTP_TIMEOUT, Runtime
from gateway.state.keys import Keys
from gateway.state.tokens import RedisTokenStore
from gateway.worker.loop import Worker
from simulator.dingtalk.user import DingTalkUser
from simulator.wecom.signer import WeComCallbackSigner
from simulator.wecom_kf.signer import WeComKfCallbackSigner
from testkit.configs import dingtalk_bot, random_aes_key, stack_config, write_config
from testkit.fakes.stub_engine import create_app
from testkit.processes import Proc, free_port
from testkit.services import start_gateway, start_simulator
from tests.model.faults import (
    EngineTransport,
    FaultContext,
    FaultPlan,
    FaultyTransport,
    FaultyWindows,
    Killed,
    faulty_redis,
)

KFID = "wk-model"
LIMIT = 6  # messages a person may send a minute (per_user)
LEASE_MS = 800
MERGE_WINDOW_S = 0.5
WORKERS = 2


def model_config(redis_url: str, sim_url: str, namespace: str) -> dict:
    """The stack's config (tests/conftest.py) with one bot per platform under test and short windows."""
    config = stack_config(redis_url, "http://engine.model", sim_url, namespace)
    app, ding = config["bots"][0], dingtalk_bot("ding", "http", sim_url)
    kefu = {
        "id": "kefu", "platform": "wecom-kf", "corp_id": "wwkf" + secrets.token_hex(5),
        "secret": secrets.token_urlsafe(24), "token": secrets.token_hex(8), "encoding_aes_key": random_aes_key(),
        "api_base": sim_url, "open_kfids": [KFID], "welcome_text": "欢迎光临", "merge_window_s": MERGE_WINDOW_S,
    }  # fmt: skip
    config["bots"] = [app, ding, kefu]
    config["limits"] = {"per_user": f"{LIMIT}/minute"}
    config["log_level"] = "WARNING"
    config["worker"] = {"claim_idle_ms": LEASE_MS, "backoff_base_s": 0.1, "backoff_max_s": 0.8, "block_ms": 200,
                        "max_send_attempts": 6, "concurrency": 8, "drain_s": 1.0}  # fmt: skip
    return config


@dataclass
class Services:
    """The processes a run talks to: the simulator and a gateway, sharing one namespace (one per session)."""

    config: dict
    path: Path
    settings: Settings
    sim_url: str
    gateway_url: str
    procs: list[Proc]

    @classmethod
    def start(cls, redis_url: str, log_dir: Path) -> Services:
        sim_port, gw_port = free_port(), free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        config = model_config(redis_url, sim_url, "m" + secrets.token_hex(4))
        path = write_config(log_dir / "model.yaml", config)
        procs = [start_simulator(path, sim_port, log_dir)]
        procs.append(start_gateway(path, gw_port, log_dir, name="model-gateway"))
        return cls(config, path, load_settings(path), sim_url, f"http://127.0.0.1:{gw_port}", procs)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


@dataclass
class WorkerHandle:
    """One in-process worker and what it was built from."""

    faults: FaultContext
    worker: Worker
    runtime: Runtime
    stop: asyncio.Event
    task: asyncio.Task[None]

    def kill(self) -> None:
        """Die where it stands: no release, no drain; every later call of it fails."""
        self.faults.dead = True
        for _, task in list(self.worker._held.values()):
            task.cancel()
        self.task.cancel()

    async def close(self) -> None:
        if not self.faults.dead:
            self.stop.set()
            with contextlib.suppress(Exception, Killed, asyncio.CancelledError):
                await asyncio.wait_for(self.task, 10)
        self.faults.dead = True  # whatever of it still runs dies at its next call
        with contextlib.suppress(Exception, Killed):
            await self.runtime.engine.aclose()
        with contextlib.suppress(Exception, Killed):
            await self.runtime.http.aclose()


async def start_worker(services: Services, plan: FaultPlan, name: str, engine_app: object) -> WorkerHandle:
    """A Worker over a runtime whose every side effect passes `plan` (what gateway.runtime.open_runtime builds,
    with the clients wrapped)."""
    settings = services.settings
    faults = FaultContext(plan, name)
    client = faulty_redis(settings.redis_url, faults)
    http = httpx.AsyncClient(transport=FaultyTransport(faults), timeout=HTTP_TIMEOUT)
    engine_http = httpx.AsyncClient(transport=EngineTransport(faults, engine_app), timeout=10)
    keys = Keys(settings.namespace)
    tokens = RedisTokenStore(client, keys)
    engine = EnginePool(settings.engine, engine_http)
    adapters = build_adapters(settings.bots, http, tokens)
    runtime = Runtime(settings, client, http, keys, Scheduler(client, keys), engine, adapters)
    await engine.start()
    worker = Worker(runtime, name)
    # The `limits` library's own connections: a message window and a send pacing are side effects too.
    delivery = worker.services.delivery
    delivery.pacer = FaultyWindows(delivery.pacer, faults, "pacing")  # type: ignore[assignment]
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop), name=name)
    return WorkerHandle(faults, worker, runtime, stop, task)


@dataclass
class Platforms:
    """How the people of a run reach botgw (through the simulator and the gateway, as the platforms do) and
    what the simulator recorded as delivered to them."""

    services: Services
    http: httpx.AsyncClient
    redis: Redis  # a client without faults: the operator's and the checker's
    keys: Keys = field(init=False)

    def __post_init__(self) -> None:
        self.keys = Keys(self.services.settings.namespace)
        bots = {bot["id"]: bot for bot in self.services.config["bots"]}
        self.app = WeComAppConfig(**bots["app"])
        self.kefu = WeComKfConfig(**bots["kefu"])
        self.ding = DingTalkUser(DingTalkBotConfig(**bots["ding"]), self.services.gateway_url,
                                 self.services.sim_url, self.http)  # fmt: skip

    async def _sim(self, method: str, path: str, **kwargs: object) -> object:
        response = await self.http.request(method, f"{self.services.sim_url}{path}", **kwargs)  # type: ignore[arg-type]
        response.raise_for_status()
        return response.json()

    async def _callback(self, bot_id: str, params: dict, body: bytes | str) -> None:
        url = f"{self.services.gateway_url}/callback/{bot_id}"
        response = await self.http.post(url, params=params, content=body)
        assert response.status_code == 200, f"the gateway refused a callback: {response.status_code}"

    async def app_text(self, user: str, text: str) -> None:
        signed = WeComCallbackSigner(self.app).text(user, text)
        await self._callback(self.app.id, signed.params, signed.body)

    async def ding_text(self, user: str, text: str) -> None:
        await self.ding.send(user, text)

    async def _kf_callback(self, token: str) -> None:
        signed = WeComKfCallbackSigner(self.kefu).kf_msg_or_event(token, KFID)
        await self._callback(self.kefu.id, signed.params, signed.body)

    async def kf_write(self, customer: str, text: str, *, image: bool = False) -> None:
        body = {"open_kfid": KFID, "external_userid": customer, "text": text, **({"msgtype": "image"} if image else {})}
        answer = await self._sim("POST", "/__sim__/kf/customer", json=body)
        await self._kf_callback(answer["token"])  # type: ignore[index]

    async def kf_agent(self, customer: str, text: str) -> None:
        body = {"open_kfid": KFID, "external_userid": customer, "servicer_userid": "agent-li", "text": text}
        answer = await self._sim("POST", "/__sim__/kf/agent", json=body)
        await self._kf_callback(answer["token"])  # type: ignore[index]

    async def kf_event(self, customer: str, event_type: str, **fields: object) -> dict:
        body = {"open_kfid": KFID, "external_userid": customer, "event_type": event_type, **fields}
        answer = await self._sim("POST", "/__sim__/kf/event", json=body)
        await self._kf_callback(answer["token"])  # type: ignore[index]
        return answer  # type: ignore[return-value]

    async def kf_operator_handoff(self, customer: str) -> None:
        """What `botgw kf handoff` queues."""
        message = handoff_for(self.services.settings.bot("kefu"), KFID, customer)
        await enqueue_handoff(Scheduler(self.redis, self.keys), message, self.services.settings.memory.group)

    async def delivered(self, platform: str, user: str) -> list[dict]:
        """What the person saw, in order: {content, via?, at}; the invisible repeat marks removed."""
        if platform == "app":
            items = await self._sim("GET", "/__sim__/wecom/messages", params={"touser": user})
        elif platform == "ding":
            items = await self._sim("GET", "/__sim__/dingtalk/messages", params={"conversation": f"cid-single-{user}"})
        else:
            items = await self._sim("GET", "/__sim__/kf/sent", params={"external_userid": user})
        marks = str.maketrans("", "", "\u200b\u200c\u2060\u200d")
        return [{**item, "content": str(item.get("content", "")).translate(marks)} for item in items]  # type: ignore[union-attr]

    async def kf_session(self, customer: str) -> dict:
        params = {"open_kfid": KFID, "external_userid": customer}
        return await self._sim("GET", "/__sim__/kf/session", params=params)  # type: ignore[return-value]

    async def kf_refusals(self) -> dict[str, int]:
        return (await self._sim("GET", "/__sim__/kf/stats"))["refusals"]  # type: ignore[index]


@contextlib.asynccontextmanager
async def platforms(services: Services) -> AsyncIterator[Platforms]:
    http = httpx.AsyncClient(timeout=30)
    client = Redis.from_url(services.settings.redis_url)
    try:
        yield Platforms(services, http, client)
    finally:
        await http.aclose()
        await client.aclose()


def engine_app() -> object:
    """The stub engine (answers "answer to: <the last user message>"), quick, one app shared by all workers."""
    return create_app("ernie-tiny", 0.05, 2048)
