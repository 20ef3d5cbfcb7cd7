"""The processes' activity counters for the console's overview (gateway/state/pulse.py) against a real redis-server:
counting costs no Redis command, several processes add up, the latest answer wins whichever process flushes last,
a token error and a refused callback are kept with their words, a process that stops or goes silent drops out, and
a flush that could not reach Redis loses nothing."""

from __future__ import annotations

import secrets

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.state.keys import Keys
from gateway.state.pulse import PROCESS_STALE_S, Pulse, read_pulse
from testkit.processes import free_port


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


async def _commands(redis: Redis) -> int:
    return int((await redis.info("stats"))["total_commands_processed"])


async def test_counting_costs_no_redis_command_and_processes_add_up(redis: Redis) -> None:
    keys = Keys("p" + secrets.token_hex(4))
    start = 1_700_000_000.0 - 1_700_000_000.0 % 60 + 10  # 10 s into a minute
    clock = Clock(start)
    gateway, worker = Pulse(clock), Pulse(clock)
    before = await _commands(redis)
    for _ in range(50):
        gateway.callback("app")
    for _ in range(7):
        worker.answered("app")
    worker.answered("ding")
    worker.failed("app")
    assert await _commands(redis) - before == 1, "counting on the message's path sent commands to Redis"
    await gateway.flush(redis, keys)
    clock.at += 60  # the next minute
    gateway.callback("app")
    worker.answered("app")
    await worker.flush(redis, keys)
    await gateway.flush(redis, keys)
    activity = await read_pulse(redis, keys, minutes=15, now=clock.at)
    assert activity.series("callback", "app")[-2:] == [50, 1]
    assert activity.series("answer", "app")[-2:] == [7, 1] and activity.total("answer", "ding") == 1
    assert activity.series("answer")[-2:] == [8, 1], "the answers of every bot per minute"
    assert activity.total("failed", "app") == 1 and activity.total("callback", "app", minutes=1) == 1
    assert activity.last_at("answer", "app") == clock.at and activity.last_at("callback", "ding") is None
    ttl = await redis.ttl(f"{keys.pulse}:min:{int(start // 60)}")
    assert 0 < ttl <= 120 * 60, "a minute's counts must expire"


async def test_the_latest_answer_wins_whichever_process_flushes_last(redis: Redis) -> None:
    keys = Keys("p" + secrets.token_hex(4))
    early, late = Pulse(Clock(1000.0)), Pulse(Clock(2000.0))
    early.answered("app")
    late.answered("app")
    await late.flush(redis, keys)
    await early.flush(redis, keys)  # an older fact arrives last
    activity = await read_pulse(redis, keys, now=2001.0)
    assert activity.last_at("answer", "app") == 2000.0


async def test_token_errors_refusals_and_processes(redis: Redis) -> None:
    keys = Keys("p" + secrets.token_hex(4))
    clock = Clock(5000.0)
    worker, stream = Pulse(clock), Pulse(clock)
    worker.role, stream.role = "worker", "stream"
    said = "not allow to access from your ip, hint: [x], from ip: 203.0.113.9 " + "x" * 700
    worker.token_error("app", 60020, said)
    worker.rejected("ding-http", "bad_signature")
    connected = {"up": True}
    stream.watch_connection("ding-stream", lambda: connected["up"])
    await worker.flush(redis, keys)
    await stream.flush(redis, keys)
    activity = await read_pulse(redis, keys, now=clock.at)
    error = activity.token_errors["app"]
    assert error["code"] == "60020" and error["message"].startswith("not allow") and len(error["message"]) == 500
    assert activity.rejections["ding-http"]["reason"] == "bad_signature"
    assert activity.total("rejected", "ding-http") == 1
    assert sorted(p["role"] for p in activity.processes) == ["stream", "worker"]
    held = next(p for p in activity.processes if p["role"] == "stream")["streams"]["ding-stream"]
    assert held == {"connected": True, "since": 5000.0}
    connected["up"] = False
    clock.at += 10
    await stream.flush(redis, keys)
    activity = await read_pulse(redis, keys, now=clock.at)
    held = next(p for p in activity.processes if p["role"] == "stream")["streams"]["ding-stream"]
    assert held == {"connected": False, "since": 5010.0}, "the link's loss and since when"
    await stream.flush(redis, keys, leaving=True)  # a process that stops takes itself out
    activity = await read_pulse(redis, keys, now=clock.at)
    assert [p["role"] for p in activity.processes] == ["worker"]
    activity = await read_pulse(redis, keys, now=clock.at + PROCESS_STALE_S + 1)  # silent too long: gone
    assert activity.processes == []


async def test_a_flush_that_cannot_reach_redis_loses_nothing(redis: Redis) -> None:
    keys = Keys("p" + secrets.token_hex(4))
    clock = Clock(9000.0)
    pulse = Pulse(clock)
    pulse.callback("app")
    pulse.answered("app")
    pulse.token_error("app", 40001, "invalid credential")
    away = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    with pytest.raises((RedisError, OSError)):
        await pulse.flush(away, keys)
    await away.aclose()
    pulse.callback("app")  # counted while Redis was away
    await pulse.flush(redis, keys)
    activity = await read_pulse(redis, keys, now=clock.at)
    assert activity.total("callback", "app") == 2 and activity.total("answer", "app") == 1
    assert activity.token_errors["app"]["code"] == "40001" and activity.last_at("answer", "app") == 9000.0
