"""botgw on a real Redis Cluster (three masters on loopback): the message path, dedup, memory, limits, budgets
and streams, with gateways and workers as separate processes; and on a Sentinel-watched primary that fails
over in the middle of a conversation.

The tests imported below run here a second time, with `cluster` (this module's fixture) putting their
gateways and workers on the Redis Cluster instead of the single server: the same assertions, a different
Redis. Every script would fail there with CROSSSLOT if its keys did not share a hash slot.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from redis.cluster import key_slot

from gateway.state.keys import Keys
from testkit.configs import write_config
from testkit.fakes.stub_engine import answer_for
from testkit.processes import BOTGW
from testkit.redis_servers import SentinelSetup
from testkit.stacks import Cluster, Stack, stub_requests
from tests.e2e.general.test_durability import (  # noqa: F401 - collected here again, on the cluster
    test_the_same_callback_at_two_gateways_at_once_is_one_entry_and_one_answer,
    test_worker_killed_while_generating_reply_delivered_once,
)
from tests.e2e.general.test_worker import (  # noqa: F401
    test_budgets_hold_across_two_gateways_and_two_workers,
    test_over_limit_ai_bot_streams_are_finished_with_the_notice,
)
from tests.e2e.wecom.test_wecom_ai import test_duplicate_first_callback_one_stream_one_engine_call  # noqa: F401


@pytest.fixture
def cluster(stack: Stack, redis_cluster_url: str) -> Iterator[Callable[..., Cluster]]:
    """conftest's `cluster`, on the Redis Cluster."""
    made: list[Cluster] = []

    def make(delay_s: float = 0.5, **overrides: object) -> Cluster:
        made.append(Cluster(stack, delay_s, redis_url=redis_cluster_url, **overrides))
        return made[-1]

    yield make
    for item in made:
        item.close()


def test_the_keys_each_script_touches_share_one_slot() -> None:
    """The names, as keys.py builds them: what the scripts touch together lands in one slot."""
    keys = Keys("botgw")
    together = [
        # the scheduler (enqueue, take, release, sweep, renew, absorb) with dedup and signature bindings
        [keys.scheduler_ready, keys.scheduler_lanes, keys.scheduler_wake, keys.scheduler_stats, keys.scheduler_leases,
         keys.lane("wecom:app:u1:u1"), keys.lease("wecom:app:u2:u2"), keys.active_lanes("u3"), keys.dead_letters,
         keys.dedup("wecom:app:m1"), keys.signature_binding("ding", "sig")],
        # a reply record's commit, fenced by the lease, with the conversation's memory; a stream's update
        [keys.lease("x"), keys.reply("wecom:app:m1"), keys.memory("wecom:app:u1:u1"), keys.stream("s1"),
         keys.active_streams("ai", "u1")],
        # what a lease fences besides: the 微信客服 quota slot with the record's begin mark, the holder, the cursor
        [keys.lease("x"), keys.reply_quota("wecom-kf:kefu:c:u"), keys.reply("wecom-kf:kefu:m1"),
         keys.conversation_owner("wecom-kf:kefu:c:u"), keys.pull_cursor("kefu", "wk1")],
        # one user's and their group's token budgets, checked by one script
        [keys.token_budget("user:u1", "d20261201"), keys.token_budget("group:g1", "m202612011200"),
         keys.message_window("user:u1", "20-60"), keys.message_window("group:g1", "300-86400")],
    ]  # fmt: skip
    for names in together:
        assert len({key_slot(name.encode()) for name in names}) == 1, names
    spread = {key_slot(keys.token(f"app{i}").encode()) for i in range(20)}
    assert len(spread) > 10, "keys that no script shares are not all forced into one slot"


def test_memory_and_dedup_on_the_cluster(cluster: Callable[..., Cluster], user: str) -> None:
    """Two questions: the second is asked with the first exchange in its history; the first's callback
    replayed is not queued again."""
    c = cluster(0.1)
    c.add_gateway()
    c.add_worker("a")
    stack = c.stack
    first = stack.signer().text(user, "what is the capital of France")
    assert stack.post_callback(first).status_code == 200
    stack.wait_delivered(user, 1, settle=0.5)
    added = stack.entries_added()
    assert stack.post_callback(first).status_code == 200  # WeCom's retry of the same delivery
    assert stack.entries_added() == added, "a replayed callback is a duplicate on the cluster too"
    assert stack.post_callback(stack.signer().text(user, "and of Spain")).status_code == 200
    stack.wait_delivered(user, 2, settle=1.0)
    assert stack.texts(user) == [answer_for("what is the capital of France"), answer_for("and of Spain")]
    second = next(r for r in stub_requests(c.engine_url) if r["user"] == "and of Spain")
    assert second["history"] == ["what is the capital of France", answer_for("what is the capital of France")]
    corp = stack.config["bots"][0]["corp_id"]
    assert stack.redis.llen(stack.keys.memory(f"dm:wecom:{corp}:{user}")) == 4  # the member's own memory


def test_a_plain_url_at_a_cluster_node_fails_at_start(stack: Stack, redis_cluster_url: str, log_dir) -> None:  # type: ignore[no-untyped-def]
    """`redis://node` of a cluster would answer MOVED for most keys: the worker refuses to start, saying what to
    write instead."""
    credentials, _, nodes = redis_cluster_url.removeprefix("redis+cluster://").rpartition("@")
    plain = f"redis://{credentials}@{nodes.split(',')[0]}/0"
    config = write_config(log_dir / "plain-url-at-cluster.yaml", {**stack.config, "redis_url": plain})
    done = subprocess.run([*BOTGW, "worker", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "redis+cluster://" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert credentials.lstrip(":") not in done.stderr


def test_unsafe_redis_settings_are_warned_about_at_start(stack: Stack, cluster: Callable[..., Cluster]) -> None:
    """The tests' single server runs without persistence: its gateway says so. The cluster's nodes run with AOF
    and noeviction: their gateway does not."""
    httpx.get(f"{stack.admin_url}/readyz", timeout=5)
    assert "Redis persistence is off" in stack.procs["gateway"].log_path.read_text()
    c = cluster(0.1)
    c.add_gateway()
    log = c.stack.procs["gateway"].log_path.read_text()
    assert "maxmemory-policy" not in log and "persistence is off" not in log and "AOF is off" not in log


def test_a_sentinel_failover_mid_conversation_loses_nothing(
    stack: Stack, redis_sentinel: SentinelSetup, user: str
) -> None:
    """A question, a failover (the replica becomes the primary), a second question: both answered once, and
    the second asked with the first exchange, which the new primary had from replication."""
    c = Cluster(stack, 0.1, redis_url=redis_sentinel.url)
    try:
        c.add_gateway()
        c.add_worker("a")
        stack_ = c.stack
        assert stack_.post_callback(stack_.signer().text(user, "before the failover")).status_code == 200
        stack_.wait_delivered(user, 1, settle=0.5)
        time.sleep(0.5)  # replication is asynchronous: what the primary took in its last moment can be lost
        redis_sentinel.fail_over()
        deadline = time.monotonic() + 30
        while (response := stack_.post_callback(stack_.signer().text(user, "after the failover"))).status_code != 200:
            assert time.monotonic() < deadline, f"the gateway did not follow the new primary: {response.status_code}"
            time.sleep(0.5)
        stack_.wait_delivered(user, 2, timeout=60, settle=1.5)
        assert stack_.texts(user) == [answer_for("before the failover"), answer_for("after the failover")]
        second = next(r for r in stub_requests(c.engine_url) if r["user"] == "after the failover")
        assert second["history"] == ["before the failover", answer_for("before the failover")]
    finally:
        c.close()
