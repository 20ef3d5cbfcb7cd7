"""Identities that cannot collide (issue 19): every per-person key is `<family>:<tenant>:<user>`, a page signed in
through WeCom is that WeCom member, bare ids are refused at start, migrate-keys carries counters over; and no
empty or short credential starts a process. Against running gateways, workers and the real Redis."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.state.keys import Keys
from simulator.wecom.signer import SignedCallback
from testkit.configs import stack_config, write_config
from testkit.processes import BOTGW
from testkit.stacks import Cluster

WEB_KEY = "web-key-" + secrets.token_hex(8)
ADMIN_TOKEN = "admin-" + secrets.token_hex(16)


def _with_page(c: Cluster) -> str:
    """The cluster's config with a web page whose WeCom sign-in is the stack's app; its gateway's URL."""
    c.config["bots"].append({"id": "web", "platform": "web", "api_key": WEB_KEY,
                             "users": [{"name": "someone", "password": "a-long-enough-password"}],
                             "web_login": {"wecom": {"bot": "app"}}})
    c.config["admin"] = {"token": ADMIN_TOKEN}
    write_config(c.path, c.config)
    gateway = c.add_gateway()
    c.add_worker("a")
    return gateway


def ask_page(gateway: str, user: str, text: str, login: str = "password") -> str:
    """One question on the page's API; the answer's text (the `done` event)."""
    body = {"user": user, "text": text, "login": login}
    headers = {"Authorization": f"Bearer {WEB_KEY}"}
    with httpx.stream("POST", f"{gateway}/web/web/chat", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:") and (event := json.loads(line[5:])).get("done"):
                return str(event["text"])
    raise AssertionError("the answer never finished")


def post(gateway: str, callback: SignedCallback) -> int:
    return httpx.post(f"{gateway}/callback/app", params=callback.params, content=callback.body, timeout=10).status_code


def _corp(c: Cluster) -> str:
    return next(bot["corp_id"] for bot in c.config["bots"] if bot["id"] == "app")


def test_a_page_user_and_a_wecom_member_of_the_same_name_share_no_limit(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.05, limits={"per_user": "1/minute"})
    gateway = _with_page(c)
    signer = c.stack.signer()
    assert post(gateway, signer.text(user, "first")) == 200
    assert c.stack.wait_delivered(user, 1)[0]["content"] == "answer to: first"
    # the page's own user of the same bare name is another person: their window is their own
    assert ask_page(gateway, user, "from the page") == "answer to: from the page"
    assert post(gateway, signer.text(user, "second")) == 200
    texts = [m["content"] for m in c.stack.wait_delivered(user, 2)]
    assert "1/minute" in texts[1], texts  # the member's own window is full: the limit itself still holds
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    member = httpx.get(f"{gateway}/admin/limits/wecom:{user}", headers=headers, timeout=5).json()
    page = httpx.get(f"{gateway}/admin/limits/web:{user}", headers=headers, timeout=5).json()
    assert member[f"user:wecom:{_corp(c)}:{user}"]["messages"][0]["used"] == 1
    assert page[f"user:web:web:{user}"]["messages"][0]["used"] == 1
    bare = httpx.get(f"{gateway}/admin/limits/{user}", headers=headers, timeout=5)
    assert bare.status_code == 400 and f"wecom:{_corp(c)}:{user}" in bare.json()["message"]


def test_the_page_signed_in_through_wecom_shares_the_members_memory_and_a_password_user_does_not(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.05)
    gateway = _with_page(c)
    said = "remember the number " + secrets.token_hex(3)
    assert post(gateway, c.stack.signer().text(user, said)) == 200
    c.stack.wait_delivered(user, 1)
    assert ask_page(gateway, user, "which number, member?", login="wecom") == "answer to: which number, member?"
    assert ask_page(gateway, user, "which number, stranger?") == "answer to: which number, stranger?"
    requests = {r["user"]: r for r in c.engine_requests()}
    assert said in requests["which number, member?"]["history"], "the page did not see the member's WeCom memory"
    assert said not in requests["which number, stranger?"]["history"], "a password user read the member's memory"
    refused = httpx.post(f"{gateway}/web/web/chat", json={"user": user, "text": "x", "login": "dingtalk"},
                         headers={"Authorization": f"Bearer {WEB_KEY}"}, timeout=10)
    assert refused.status_code == 400, "a sign-in the page does not offer was believed"


def test_one_to_one_memory_kept_per_bot_before_the_upgrade_is_adopted(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.05)
    keys = Keys(c.namespace)
    old = keys.memory(f"wecom:app:{user}:{user}")  # the name a one-to-one memory had before it followed the person
    for turn in ({"role": "user", "content": "my badge is 7731", "tokens": 5},
                 {"role": "assistant", "content": "noted", "tokens": 2}):
        c.stack.redis.rpush(old, json.dumps(turn))
    gateway = c.add_gateway()
    c.add_worker("a")
    assert post(gateway, c.stack.signer().text(user, "badge?")) == 200
    c.stack.wait_delivered(user, 1)
    request = next(r for r in c.engine_requests() if r["user"] == "badge?")
    assert "my badge is 7731" in request["history"]
    assert not c.stack.redis.exists(old)
    assert c.stack.redis.llen(keys.memory(f"dm:wecom:{_corp(c)}:{user}")) == 4


def test_migrate_keys_carries_bare_counters_over_to_every_identity_they_could_be(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.05, limits={"user": {"tokens_per_day": 5000}})
    keys, redis = Keys(c.namespace), c.stack.redis
    day = time.strftime("d%Y%m%d", time.gmtime(time.time() + 8 * 3600))  # Asia/Shanghai, the default zone
    redis.set(keys.token_budget(f"user:{user}", day), 1234, ex=3600)
    window = keys.message_window(f"user:{user}", "20-60")
    redis.zadd(window, {"m1": time.time() * 1000})
    done = subprocess.run([*BOTGW, "migrate-keys", "--config", str(c.path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["counters_qualified"] >= 2
    assert not redis.exists(keys.token_budget(f"user:{user}", day)) and not redis.exists(window)
    member = f"wecom:{_corp(c)}:{user}"
    assert redis.zcard(keys.message_window(f"user:{member}", "20-60")) == 1
    shown = subprocess.run([*BOTGW, "limits", "show", "--config", str(c.path), f"wecom:{user}"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)[f"user:{member}"]["tokens_per_day"]["used"] == 1234
    dingtalk = f"dingtalk:ding-http:{user}"  # a DingTalk user of that id kept what was used too: nobody gained
    assert int(redis.get(keys.token_budget(f"user:{dingtalk}", day)) or 0) == 1234
    bare = subprocess.run([*BOTGW, "limits", "show", "--config", str(c.path), user], capture_output=True, text=True,
                          timeout=60)
    assert bare.returncode == 2 and f"wecom:{_corp(c)}:{user}" in bare.stderr


# -- refused at start ----------------------------------------------------------------------------------------------


def _start(tmp_path: Path, config: dict, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "botgw.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return subprocess.run([*BOTGW, "serve", "--config", str(path), "--port", "0"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def _base() -> dict:
    config = stack_config("redis://127.0.0.1:1/0", "http://127.0.0.1:1", "http://127.0.0.1:1", "nsx")
    config["bots"].append({"id": "web", "platform": "web", "api_key": WEB_KEY})
    return config


@pytest.mark.parametrize(
    ("change", "env", "key"),
    [
        (lambda c: c.update(admin={"token": ""}), {}, "admin.token"),
        (lambda c: c.update(admin={"token": "${BOTGW_TEST_ADMIN}"}), {"BOTGW_TEST_ADMIN": ""}, "admin.token"),
        (lambda c: c.update(admin={"token": ADMIN_TOKEN}), {"BOTGW_ADMIN__TOKEN": "   "}, "admin.token"),
        (lambda c: c.update(admin={"token": "sixteen-chars-xx"}), {}, "admin.token"),
        (lambda c: c["bots"][-1].update(api_key=" "), {}, "bots.web.api_key"),
        (lambda c: c["bots"][0].update(secret=""), {}, "bots.app.secret"),
        (lambda c: c["bots"][3].update(app_secret="\t"), {}, "bots.ding-http.app_secret"),
        (lambda c: c["bots"][-1].update(auth_secret="sixteen-chars-xx"), {}, "bots.web.auth_secret"),
    ],
    ids=["admin empty", "admin from an empty variable", "admin override blank", "admin short", "web api_key",
         "wecom secret", "dingtalk secret", "page signing secret short"],
)
def test_an_empty_or_short_credential_stops_the_start_naming_the_key(
    tmp_path: Path, change: Callable[[dict], None], env: dict[str, str], key: str
) -> None:
    config = _base()
    change(config)
    started = _start(tmp_path, config, env)
    assert started.returncode == 2, started.stderr
    lines = [line for line in started.stderr.splitlines() if line.strip()]
    assert any(key in line for line in lines), started.stderr
    assert "sixteen-chars-xx" not in started.stderr and "Traceback" not in started.stderr


def test_a_bare_id_in_limits_stops_the_start_with_the_qualified_forms(tmp_path: Path) -> None:
    config = _base()
    corp = config["bots"][0]["corp_id"]
    config["limits"] = {"users": {"zhangsan": {"messages": "100/minute"}}}
    started = _start(tmp_path, config)
    assert started.returncode == 2
    assert "limits.users" in started.stderr and f"wecom:{corp}:zhangsan" in started.stderr
    assert "web:web:zhangsan" in started.stderr, started.stderr
    config["limits"] = {"groups": {"wecom:wwsomeoneelse:chat1": {"messages": "1/minute"}}}
    started = _start(tmp_path, config)
    assert started.returncode == 2 and "wwsomeoneelse" in started.stderr


def test_a_page_users_memory_is_never_adopted_by_a_member_of_the_same_name_nor_brought_back_after_reset(
    cluster: Callable[..., Cluster], user: str
) -> None:
    c = cluster(0.05)
    keys = Keys(c.namespace)
    page_memory = keys.memory(f"web:web:{user}:{user}")  # a page user's, of the same bare name as the member
    app_memory = keys.memory(f"wecom:app:{user}:{user}")  # the member's own, kept per bot before the upgrade
    for key, said in ((page_memory, "page user: my PIN is 4242"), (app_memory, "app era: my diagnosis is X")):
        c.stack.redis.rpush(key, json.dumps({"role": "user", "content": said, "tokens": 6}))
        c.stack.redis.rpush(key, json.dumps({"role": "assistant", "content": "ok", "tokens": 1}))
    gateway = _with_page(c)
    assert ask_page(gateway, user, "what do you know, member?", login="wecom") == "answer to: what do you know, member?"
    assert post(gateway, c.stack.signer().text(user, "/reset")) == 200
    c.stack.wait_delivered(user, 1)
    c.stack.redis.rpush(app_memory, json.dumps({"role": "user", "content": "app era again", "tokens": 3}))
    assert post(gateway, c.stack.signer().text(user, "after the reset")) == 200
    c.stack.wait_delivered(user, 2)
    requests = {r["user"]: r for r in c.engine_requests()}
    assert "page user: my PIN is 4242" not in requests["what do you know, member?"]["history"]
    # adopted once, at the person's first message after the upgrade (here on the page, which had none for them)
    assert "app era: my diagnosis is X" not in requests["what do you know, member?"]["history"]
    assert requests["after the reset"]["history"] == [], "a /reset was undone by an old memory adopted after it"
    assert c.stack.redis.llen(page_memory) == 2, "the page user lost their memory"


def test_qualify_takes_ids_that_hold_colons_with_their_tenant_and_refuses_a_mistyped_tenant() -> None:
    from gateway.state.identities import IdentityError, qualify

    tenants = {"wecom": ["ww1"], "dingtalk": ["c1", "c2"]}
    assert qualify("wecom:zs", tenants) == "wecom:ww1:zs"
    assert qualify("dingtalk:c1:$:LWCP_v1:$x", tenants) == "dingtalk:c1:$:LWCP_v1:$x"
    for wrong in ("zs", "dingtalk:zs", "wecom:ww2:zs", "wecom:$:LWCP", "nope:zs"):
        with pytest.raises(IdentityError):
            qualify(wrong, tenants)


def test_a_reset_clears_the_one_identity_named_not_another_that_starts_with_it(stack: object) -> None:
    import asyncio

    from redis.asyncio import Redis

    from gateway.state.limits import Budgets, LimitSettings

    keys = Keys("r" + secrets.token_hex(4))
    url = stack.config["redis_url"]  # type: ignore[attr-defined]

    async def run() -> tuple[int, bool, bool]:
        redis = Redis.from_url(url)
        try:
            budgets = Budgets(redis, url, keys, LimitSettings(user={"tokens_per_day": 100}))
            mine, other = "dingtalk:c1:$", "dingtalk:c1:$:LWCP_v1:$x"
            await redis.set(keys.token_budget(f"user:{mine}", "d20991231"), 5)
            await redis.set(keys.token_budget(f"user:{other}", "d20991231"), 7)
            cleared = await budgets.reset(mine)
            return cleared, bool(await redis.exists(keys.token_budget(f"user:{mine}", "d20991231"))), bool(
                await redis.exists(keys.token_budget(f"user:{other}", "d20991231")))
        finally:
            await redis.aclose()

    cleared, mine_left, other_left = asyncio.run(run())
    assert cleared >= 1 and not mine_left and other_left
