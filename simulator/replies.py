"""Waiting for a bot's replies at the simulator: poll what the simulated platform delivered until it stops changing.

An answer may come in pieces (a long answer split to the platform's byte cap, a notice and then the answer), so
"the first reply arrived" is not "the bot is done": a reader waits until nothing new came for a quiet while. One
loop for `botgw sim`, the tests and the benchmarks, and one fetcher per platform for the simulator's control
routes (what it delivered to a person), so that none of them polls in a loop of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


async def wait_until_quiet(
    fetch: Callable[[], Awaitable[list[T]]],
    timeout_s: float,
    quiet_s: float = 1.0,
    interval_s: float = 0.1,
    at_least: int = 1,
    done_early: Callable[[list[T]], bool] | None = None,
) -> list[T]:
    """Poll `fetch` until it has shown `at_least` items and then the same items for `quiet_s`, or `done_early(items)`
    says nothing more will come. What was seen last, also after `timeout_s`: the caller judges a short list."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen = await fetch()
    changed_at = loop.time()
    while loop.time() < deadline:
        if len(seen) >= at_least and loop.time() - changed_at >= quiet_s:
            break
        if done_early is not None and done_early(seen):
            break
        await asyncio.sleep(interval_s)
        items = await fetch()
        if items != seen:
            seen, changed_at = items, loop.time()
    return seen


async def _get(http: httpx.AsyncClient, url: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return (await http.get(url, params={key: value for key, value in params.items() if value is not None})).json()


async def wecom_messages(
    http: httpx.AsyncClient, sim_url: str, user: str | None = None, since: float | None = None
) -> list[dict[str, Any]]:
    """What the simulated WeCom app API delivered (message/send), to `user` or to everyone, at or after `since`."""
    return await _get(http, f"{sim_url}/__sim__/wecom/messages", {"touser": user, "since": since})


async def dingtalk_messages(
    http: httpx.AsyncClient, sim_url: str, conversation: str | None = None
) -> list[dict[str, Any]]:
    """What a DingTalk robot said (sessionWebhook or OpenAPI), in one conversation or in all."""
    return await _get(http, f"{sim_url}/__sim__/dingtalk/messages", {"conversation": conversation})


async def kf_sent(
    http: httpx.AsyncClient, sim_url: str, customer: str, since: float | None = None
) -> list[dict[str, Any]]:
    """What the simulated 微信客服 delivered to `customer` (kf/send_msg, send_msg_on_event), at or after `since`."""
    return await _get(http, f"{sim_url}/__sim__/kf/sent", {"external_userid": customer, "since": since})
