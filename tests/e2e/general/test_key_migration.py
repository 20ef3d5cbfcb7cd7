"""An upgrade from the key names before hash tags: botgw refuses to start on them, `botgw migrate-keys` moves
them, and the queue, memory and dedup marks carry over."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

from testkit.fakes.stub_engine import answer_for
from testkit.processes import BOTGW, wait_for
from testkit.stacks import Cluster, stub_requests


def _back_to_old_names(c: Cluster) -> int:
    """Rename the namespace's keys as a release before hash tags named them (`<ns>:…`)."""
    redis, ns = c.stack.redis, c.namespace
    moved = 0
    for prefix in ("{" + ns + "}:", "{" + ns + ":budget}:"):
        for key in list(redis.scan_iter(match=prefix.replace("{", "[{]") + "*")):
            old = f"{ns}:" + key.decode()[len(prefix) :]
            redis.rename(key, old)
            moved += 1
            if old.startswith(f"{ns}:stream:") and redis.hget(old, "active"):
                redis.hset(old, "active", f"{ns}:" + redis.hget(old, "active").decode()[len(prefix) :])
    return moved


def test_an_upgrade_refuses_the_old_names_then_migrate_keys_carries_everything_over(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.1)
    c.add_gateway()
    c.add_worker("old")
    stack = c.stack
    first = stack.signer().text(user, "remember the number 42")
    assert stack.post_callback(first).status_code == 200
    stack.wait_delivered(user, 1, settle=0.5)
    c.procs["old"].stop()
    assert stack.post_callback(stack.signer().text(user, "which number was it")).status_code == 200
    assert stack.queue_depth() == 1  # queued, with no worker to answer it
    c.procs[next(name for name in c.procs if name.startswith("gw-"))].stop()
    assert _back_to_old_names(c) > 5
    assert stack.queue_depth() == 0  # what a new release would see without the move

    config = ["--config", str(c.path)]
    refused = subprocess.run([*BOTGW, "worker", *config], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "botgw migrate-keys" in refused.stderr, refused.stderr[-2000:]

    dry = subprocess.run([*BOTGW, "migrate-keys", *config, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert json.loads(dry.stdout)["moved"] > 5 and stack.queue_depth() == 0, dry.stderr
    done = subprocess.run([*BOTGW, "migrate-keys", *config], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["moved"] == json.loads(dry.stdout)["moved"]
    for moved in ("sched", "mem", "reply", "dedup", "tok"):  # the rest (pacing, tokens, …) keep their names
        assert list(stack.redis.scan_iter(match=f"{c.namespace}:{moved}:*")) == [], f"old {moved} keys are left"
    assert stack.queue_depth() == 1

    stack.gateway_url = c.add_gateway()  # the upgraded release's gateway
    c.add_worker("new")
    stack.wait_delivered(user, 2, settle=1.0)
    assert stack.texts(user) == [answer_for("remember the number 42"), answer_for("which number was it")]
    second = next(r for r in stub_requests(c.engine_url) if r["user"] == "which number was it")
    assert second["history"] == ["remember the number 42", answer_for("remember the number 42")], "memory moved"
    added = stack.entries_added()
    assert stack.post_callback(first).status_code == 200  # WeCom's late retry of the first message
    wait_for(lambda: stack.queue_depth() == 0, 10, "the queue to settle")
    assert stack.entries_added() == added, "the dedup mark moved too: the retry is a duplicate"

    # An old name left over once the new release ran (migrate-keys reports it as kept): no reason to stay down.
    stack.redis.hset(f"{c.namespace}:sched:stats", "enqueued", 1)
    dry = subprocess.run([*BOTGW, "migrate-keys", *config, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert json.loads(dry.stdout)["kept_existing"] == 1 and json.loads(dry.stdout)["moved"] == 0, dry.stdout
    c.add_worker("after-leftover")
