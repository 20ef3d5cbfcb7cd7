"""Configuration: YAML, BOTGW_* over it, ${VAR} secrets, clear errors, secrets never printed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.config import ConfigError, load_settings

BOT = """
bots:
  - id: app
    platform: wecom
    corp_id: ww1
    agent_id: 1000002
    secret: ${TEST_WECOM_SECRET}
    token: tok
    encoding_aes_key: kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR
"""
KEFU = """
  - id: kefu
    platform: wecom-kf
    corp_id: ww1
    secret: kefu-secret-value
    token: kftok
    encoding_aes_key: kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "botgw.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_yaml_env_override_and_secret_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_WECOM_SECRET", "s3cr3t-value")
    monkeypatch.setenv("BOTGW_ENGINE__BASE_URL", "http://engine:9000")
    path = write(tmp_path, "redis_url: redis://r:1/0\nengine:\n  model: m1\n" + BOT)
    settings = load_settings(path)
    assert settings.engine.base_url == "http://engine:9000" and settings.engine.model == "m1"
    assert settings.redis_url == "redis://r:1/0"
    bot = settings.bot("app")
    assert bot.secret.get_secret_value() == "s3cr3t-value"
    assert bot.api_base == "https://qyapi.weixin.qq.com" and bot.replay_window_s == 3600
    assert "s3cr3t-value" not in repr(settings) and "s3cr3t-value" not in str(settings.model_dump())


def test_missing_secret_variable_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_WECOM_SECRET", raising=False)
    with pytest.raises(ConfigError, match="TEST_WECOM_SECRET"):
        load_settings(write(tmp_path, BOT))


def test_bad_aes_key_and_unknown_keys_are_refused_without_echoing_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_WECOM_SECRET", "x")
    bad_key = "Sh0rtButSecretAesKeyValue"
    with pytest.raises(ConfigError, match="encoding_aes_key") as refused:
        load_settings(write(tmp_path, BOT.replace("kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR", bad_key)))
    assert bad_key not in str(refused.value)
    with pytest.raises(ConfigError, match="reddis_url") as refused:
        load_settings(write(tmp_path, "reddis_url: redis://:hunter2-password@r:1/0\n"))
    assert "hunter2" not in str(refused.value)
    mistyped = BOT.replace("secret: ${TEST_WECOM_SECRET}", "secrett: the-real-app-secret-123")
    with pytest.raises(ConfigError) as refused:
        load_settings(write(tmp_path, mistyped))
    assert "secrett" in str(refused.value) and "the-real-app-secret-123" not in str(refused.value)


def test_cli_prints_config_errors_without_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "engine:\n  api_key: 12345\n  max_tokens: not-a-number-secret-ish\n")
    assert main(["worker", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "engine.max_tokens" in err and "not-a-number-secret-ish" not in err


def test_engine_base_url_takes_the_openai_form(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "engine:\n  base_url: http://127.0.0.1:8000/v1/\n"))
    assert settings.engine.urls() == ["http://127.0.0.1:8000"]
    settings = load_settings(write(tmp_path, "engine:\n  endpoints: [http://a:8000/v1, http://b:8000]\n"))
    assert settings.engine.urls() == ["http://a:8000", "http://b:8000"]


def test_missing_file_and_unknown_bot(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="no bot"):
        load_settings(write(tmp_path, "namespace: x\n")).bot("app")


def test_dedup_outlives_replay_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_WECOM_SECRET", "x")
    settings = load_settings(write(tmp_path, BOT.replace("token: tok", "token: tok\n    replay_window_s: 86400")))
    assert settings.effective_dedup_ttl_s() >= 2 * 86400


def test_web_passwords_are_salted_and_slow_and_sha256_is_refused(tmp_path: Path) -> None:
    import hashlib

    from bots.web.config import WebBotConfig, hash_password

    first, second = hash_password("correct horse"), hash_password("correct horse")
    assert first != second and first.startswith("scrypt$"), "salted: the same password hashes differently"
    bot = WebBotConfig(id="web", api_key="k", users=[{"name": "alice", "password_hash": first}])
    assert bot.user("alice", "correct horse") is not None and bot.user("alice", "wrong horse") is None
    old = hashlib.sha256(b"correct horse").hexdigest()
    config = f"bots:\n  - {{id: web, platform: web, api_key: k, users: [{{name: a, password_sha256: {old}}}]}}\n"
    with pytest.raises(ConfigError, match="no longer accepted") as refused:
        load_settings(write(tmp_path, config))
    assert old not in str(refused.value)


def test_web_password_command_prints_a_hash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from bots.web.config import WebUser

    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret pass\n"))
    assert main(["web-password"]) == 0
    printed = capsys.readouterr().out.strip()
    assert WebUser(name="x", password_hash=printed).check("s3cret pass")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:6379", "redis_url must start with one of"),
        (":s3cret-pw@10.0.0.1:6379/0", "it has no scheme"),  # no "://": the value was echoed whole
        ("redis//:s3cret-pw@h:6379", "it has no scheme"),
        ("redis+cluster://nohostport", "must be host:port"),
        ("redis+cluster://:s3cret-pw@", "names no host:port"),
        ("redis+cluster://a:7000/3", "only database 0"),
        ("redis+sentinel://a:26379", "service_name"),
        ("redis+sentinel://a:26379/primary/x", "service_name"),
    ],
)
def test_a_redis_url_that_cannot_work_fails_at_start_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, says: str
) -> None:
    """Before any connection: the command exits 2 with one line saying what is wrong, and no password."""
    assert main(["worker", "--config", str(write(tmp_path, f"redis_url: '{url}'\n"))]) == 2
    err = capsys.readouterr().err
    assert says in err and "s3cret-pw" not in err and "Traceback" not in err, err


def test_the_redis_url_forms_open_the_right_client() -> None:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    from gateway.state.redis_client import limits_storage, open_redis

    assert isinstance(open_redis("redis+cluster://a:7000,b:7001"), RedisCluster)
    sentinel = open_redis("redis+sentinel://:pw@a:26379,b:26379/primary/2")
    assert isinstance(sentinel, Redis) and sentinel.connection_pool.service_name == "primary"
    assert sentinel.connection_pool.connection_kwargs["db"] == 2
    assert type(open_redis("redis://a:6379/1")) is Redis
    assert limits_storage("redis+sentinel://a:26379/primary/2") == (
        "async+redis+sentinel://a:26379/primary", {"use_replicas": False, "db": 2}
    )
    assert limits_storage("redis://a:6379/0") == ("async+redis://a:6379/0", {})


def test_a_redis_that_never_answers_at_start_is_one_clear_line_with_its_address_without_the_password() -> None:
    import asyncio

    from gateway.state.redis_client import RedisUnavailable, check_redis, open_redis
    from testkit.processes import free_port

    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"  # nothing listens there

    async def check() -> None:
        redis = open_redis(url, socket_connect_timeout=0.2)
        try:
            await check_redis(redis, url, wait_s=1.0)
        finally:
            await redis.aclose()

    with pytest.raises(RedisUnavailable, match="did not answer for 1 s") as refused:
        asyncio.run(check())
    assert "s3cret-pw" not in str(refused.value) and url.split("@")[1].split("/")[0] in str(refused.value)


def test_a_redis_that_refuses_the_password_is_one_clear_line_at_once(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import time

    import redis as redis_py

    from testkit.processes import free_port

    port = free_port()
    binary = shutil.which("redis-server") or "redis-server"
    args = [binary, "--port", str(port), "--save", "", "--requirepass", "right-pw1"]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                redis_py.Redis(port=port, password="right-pw1").ping()
                break
            except redis_py.ConnectionError:
                time.sleep(0.05)
        for url in (f"redis://127.0.0.1:{port}/0", f"redis://:wrong-pw1@127.0.0.1:{port}/0"):
            started = time.monotonic()
            config = write(tmp_path, f"redis_url: '{url}'\n")
            command = [sys.executable, "-m", "gateway.cli", "worker", "--config", str(config)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
            assert done.returncode == 3 and "refused the credentials" in done.stderr, done.stderr[-1500:]
            assert f"127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
            assert "wrong-pw1" not in done.stderr and time.monotonic() - started < 15, "no 30 s wait for a password"
    finally:
        server.terminate()
        server.wait(10)


def test_a_kefu_bot_whose_app_is_not_a_wecom_bot_is_refused_at_start() -> None:
    from gateway.config import Settings

    kefu = {"id": "kefu", "platform": "wecom-kf", "corp_id": "ww1", "secret": "s" * 24, "token": "t" * 8,
            "encoding_aes_key": "a" * 43, "app": "robot"}  # fmt: skip
    robot = {"id": "robot", "platform": "wecom-webhook", "key": "k" * 24}
    with pytest.raises(ValueError, match=r"bots\.kefu\.app must name a bot of platform 'wecom'"):
        Settings(bots=[kefu, robot])
    with pytest.raises(ValueError, match="no such bot 'staff'"):
        Settings(bots=[{**kefu, "app": "staff"}])
    staff = {"id": "staff", "platform": "wecom", "agent_id": 1, **{k: kefu[k] for k in ("corp_id", "secret", "token")},
             "encoding_aes_key": "b" * 43}  # fmt: skip
    with pytest.raises(ValueError, match=r"bots\.kefu\.encoding_aes_key must be the app's own") as refused:
        Settings(bots=[{**kefu, "app": "staff"}, staff])
    assert "b" * 43 not in str(refused.value) and "a" * 43 not in str(refused.value)
    twice = {**kefu, "id": "kefu2", "app": "staff"}
    with pytest.raises(ValueError, match=r"already serves bots\.kefu"):
        Settings(bots=[{**kefu, "app": "staff"}, twice, {**staff, "encoding_aes_key": kefu["encoding_aes_key"]}])


@pytest.mark.parametrize(
    ("yaml_text", "line"),
    [
        ("engine:\n  max_token: 100\n", "engine.max_token: unknown key; did you mean max_tokens?"),
        ("memory:\n  token_budgt: 100\n", "memory.token_budgt: unknown key; did you mean token_budget?"),
        ("worker:\n  concurency: 4\n", "worker.concurency: unknown key; did you mean concurrency?"),
        ("admin:\n  tokn: a-long-enough-admin-token-value\n", "admin.tokn: unknown key; did you mean token?"),
        ("knowledge:\n  allow_missing_base: true\n", "knowledge.allow_missing_base: unknown key; did you mean "
         "allow_missing_bases?"),
    ],
)
def test_a_mistyped_key_in_any_section_is_named_with_the_nearest_valid_one(
    yaml_text: str, line: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(write(tmp_path, yaml_text))
    assert line in str(refused.value)
    assert "a-long-enough-admin-token-value" not in str(refused.value)


def test_a_mistyped_key_from_the_environment_or_in_a_bot_is_named_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_WECOM_SECRET", "x")
    monkeypatch.setenv("BOTGW_ENGINE__MAX_TOKEN", "100")
    with pytest.raises(ConfigError, match=r"engine\.max_token: unknown key; did you mean max_tokens\?"):
        load_settings(write(tmp_path, BOT))
    monkeypatch.delenv("BOTGW_ENGINE__MAX_TOKEN")
    with pytest.raises(ConfigError, match=r"bots\.app\.agentid: unknown key; did you mean agent_id\?"):
        load_settings(write(tmp_path, BOT.replace("agent_id:", "agentid:")))


def test_every_section_of_the_settings_refuses_unknown_keys() -> None:
    """A new section that forgets extra="forbid" would let its typos pass silently: every model reachable from
    Settings is checked."""
    from pydantic import BaseModel

    from gateway.config import Settings, _models_in

    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [Settings]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        assert model.model_config.get("extra") == "forbid", f"{model.__name__} accepts unknown keys"
        for field in model.model_fields.values():
            todo.extend(_models_in(field.annotation))
    assert len(seen) > 20


def test_cross_references_are_checked_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_WECOM_SECRET", "x")
    with pytest.raises(ConfigError, match=r"alert_bot must name a 'wecom-webhook' group robot \(found a 'wecom' bot"):
        load_settings(write(tmp_path, "alert_bot: app\n" + BOT))
    kefu = KEFU + "    open_kfids: [wk1]\n"
    with pytest.raises(ConfigError, match=r"bots\.kefu\.handoff\.servicer"):
        load_settings(write(tmp_path, BOT + kefu + "    handoff: {servicer: 张三 the agent}\n"))
    with pytest.raises(ConfigError, match="accounts names wk2, which open_kfids does not serve"):
        load_settings(write(tmp_path, BOT + kefu + "    accounts: {wk2: {welcome_text: hi}}\n"))
    settings = load_settings(write(tmp_path, BOT + kefu + "    handoff: {servicer: zhang.san@corp}\n"))
    assert settings.bot("kefu").handoff.servicer == "zhang.san@corp"
    with pytest.raises(ConfigError, match=r"no bot with id 'nosuch' in the configuration \(its bots: app, kefu\)"):
        settings.bot("nosuch")


def test_a_missing_knowledge_base_stops_a_worker_and_is_shown_by_config_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from gateway.base_check import check_bases

    text = f"""
redis_url: redis://:the-redis-password@127.0.0.1:1/0
knowledge: {{store: {{path: {tmp_path / "store"}}}}}
bots:
  - id: robot
    platform: wecom-webhook
    key: robot-key-value
""" + KEFU + "    knowledge: {bases: [xinghee]}\n"
    path = write(tmp_path, text)
    assert main(["worker", "--config", str(path)]) == 2, "a worker must not start answering 没有找到 to everyone"
    err = capsys.readouterr().err
    assert "'xinghee' (named by bots.kefu.knowledge)" in err and "knowledge.allow_missing_bases" in err, err
    assert main(["config", "check", "--config", str(path)]) == 2
    shown = capsys.readouterr()
    assert "'xinghee'" in shown.err and "redis_url: redis://***@127.0.0.1:1/0" in shown.out, shown
    for secret in ("the-redis-password", "robot-key-value", "kefu-secret-value", "kWxPEV2UE"):
        assert secret not in shown.out + shown.err
    allowed = load_settings(path)
    allowed.knowledge.allow_missing_bases = True
    asyncio.run(check_bases(allowed, strict=True))  # a warning only, no refusal
    asyncio.run(check_bases(load_settings(path), strict=False))  # a gateway warns, and starts


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pa@ss-word-tail@127.0.0.1:6379/0", "redis://***@127.0.0.1:6379/0"),
        ("redis+sentinel://:pw1@h:1,h2:2/svc?sentinel_password=pw2", "redis+sentinel://***@h:1,h2:2/svc?sentinel_password=***"),
        ("http://e4/v1?Password=X&token=TOK&model=m", "http://e4/v1?Password=***&token=***&model=m"),
        ("http://u:pw/with-slash@e2:8000", "http://(address hidden: the password in the URL holds / ? # or @)"),
        ("redis://:pa?ss@h:6379/0", "redis://(address hidden: the password in the URL holds / ? # or @)"),
        ("rediss://user:secret@h", "rediss://***@h"),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ],
)
def test_a_url_shown_in_a_message_carries_no_credentials(url: str, shown: str) -> None:
    from bots.urls import redact_url
    from gateway.state.redis_client import redis_address

    assert redact_url(url) == shown
    address = redis_address(url)
    for secret in ("pa@ss", "ss-word", "pw", "TOK", "secret", "pa?ss"):
        assert secret not in address and secret not in redact_url(url)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("bots: 5\n", "bots: Input should be a valid list"),
        ("1: 2\n", "top-level keys are names: '1' is not one"),
        ("true: 1\n", "top-level keys are names: 'True' is not one"),
        ("bots:\n  - {id: [1], platform: wecom-webhook, key: robot-key-value}\n", "bots.0.id: Input should be a valid"),
        ("bots:\n  - {id: a, platform: wecom-webhook, key: k1}\n  - {id: a, platform: wecom-webhook, key: k2}\n",
         "bot ids must be unique: a more than once"),
        ("bots:\n  - {id: a, platform: wecom-webhook, key: k1}\n  - x\n  - {id: b, platform: wecom-webhook, key: k, "
         "keey: 2}\n", "bots.b.keey: unknown key; did you mean key?"),
    ],
)
def test_odd_shapes_of_configuration_are_one_line_not_a_crash(
    text: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "check", "--config", str(write(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and "robot-key-value" not in err, err


def test_a_mistyped_botgw_environment_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "admin:\n  token: ${BOTGW_ADMIN_TOKEN}\n")
    monkeypatch.setenv("BOTGW_ADMIN_TOKEN", "a-long-enough-admin-token-value")  # named by the file: a value
    monkeypatch.setenv("BOTGW_ENGINE_PYTHON", "/usr/bin/python3")  # a tool's own
    assert load_settings(path).admin.token is not None
    monkeypatch.setenv("BOTGW_ENGNE__MAX_TOKENS", "5")
    with pytest.raises(ConfigError, match=r"BOTGW_ENGNE__MAX_TOKENS: not a setting; did you mean "
                                          r"BOTGW_ENGINE__MAX_TOKENS\?"):
        load_settings(path)
    monkeypatch.delenv("BOTGW_ENGNE__MAX_TOKENS")
    monkeypatch.setenv("BOTGW_REDIS_UR", "redis://h:1/0")
    with pytest.raises(ConfigError, match="BOTGW_REDIS_UR: not a setting; did you mean BOTGW_REDIS_URL"):
        load_settings(path)


def test_wecom_refuses_a_replay_window_of_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WeCom window that is off let a callback captured once be answered again after its dedup had passed (a
    review): refused at start, saying why."""
    monkeypatch.setenv("TEST_WECOM_SECRET", "s3cr3t-value")
    for zero in ("0", "0.0", "false", '"+0"', "-1"):  # the number read, however written (a review)
        with pytest.raises(ConfigError, match=r"bots\.app\.replay_window_s.*answered again"):
            load_settings(write(tmp_path, BOT + f"    replay_window_s: {zero}\n"))
    assert load_settings(write(tmp_path, BOT + "    replay_window_s: 60\n")).bot("app").replay_window_s == 60


def test_every_yaml_example_in_the_docs_parses() -> None:
    """Operators copy the README's and docs' examples: each YAML block must parse (an unquoted ${VAR} inside
    {...} did not, found by a review)."""
    root = Path(__file__).resolve().parents[2]
    broken = []
    for doc in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for block in re.finditer(r"```ya?ml\n(.*?)```", text, re.S):
            try:
                yaml.safe_load(block.group(1))
            except yaml.YAMLError as exc:
                broken.append(f"{doc.name}:{text[: block.start()].count(chr(10)) + 1}: {str(exc).splitlines()[0]}")
    assert not broken, broken


def test_an_unquoted_reference_in_a_flow_mapping_is_explained(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r'must be quoted: key: "\$\{VAR\}"'):
        load_settings(write(tmp_path, "admin: {token: ${BOTGW_ADMIN_TOKEN}, port: 8081}\n"))


def test_dingtalk_refuses_a_replay_window_of_zero(tmp_path: Path) -> None:
    """DingTalk's sign covers only the timestamp, so with no window one captured pair would carry any message for
    ever: refused at start, saying why."""
    ding = """
bots:
  - id: ding
    platform: dingtalk
    mode: http
    app_key: k
    app_secret: s
    replay_window_s: 0
"""
    with pytest.raises(ConfigError, match=r"bots\.ding\.replay_window_s.*signs only the timestamp"):
        load_settings(write(tmp_path, ding))
    assert load_settings(write(tmp_path, ding.replace("replay_window_s: 0", "replay_window_s: 60"))).bots


def test_an_example_files_placeholder_is_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """botgw.env.example's admin token is 29 characters: it passed the length check, and opened /admin/* on the
    public port to anyone who had read the repository (found by a review). Named, never shown."""
    monkeypatch.setenv("TEST_WECOM_SECRET", "change-me")
    with pytest.raises(ConfigError, match=r"bots\.app\.secret is still the example's placeholder"):
        load_settings(write(tmp_path, BOT))
    monkeypatch.setenv("TEST_WECOM_SECRET", "s3cr3t-value")
    with pytest.raises(ConfigError, match=r"admin\.token is still the example's placeholder"):
        load_settings(write(tmp_path, "admin:\n  token: change-me-openssl-rand-hex-24\n" + BOT))
    with pytest.raises(ConfigError, match=r"redis_url's password is still the example's placeholder") as refused:
        load_settings(write(tmp_path, "redis_url: redis://:change-me-openssl-rand-hex-24@redis:6379/0\n" + BOT))
    assert "rand-hex" not in str(refused.value)


def test_a_redis_url_whose_port_cannot_be_read_is_a_configuration_error_without_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A password holding '/' made the port unreadable: redis-py failed on it later, as an "unexpected" error whose
    --debug traceback showed part of the password (found by a review)."""
    monkeypatch.setenv("TEST_WECOM_SECRET", "s3cr3t-value")
    with pytest.raises(ConfigError, match="percent-encoded") as refused:
        load_settings(write(tmp_path, "redis_url: redis://:top/secret@h:1/0\n" + BOT))
    assert "top" not in str(refused.value) and "secret@" not in str(refused.value)
    assert load_settings(write(tmp_path, "redis_url: redis://:top%2Fsecret@h:1/0\n" + BOT)).redis_url


def test_an_outside_corporations_ai_bot_user_can_be_named() -> None:
    """An AI bot's user of another corporation is `<corp>/<userid>` there (bots/wecom/aibot.py): operators could not
    name them (no bot of that tenant), and the short form named someone of the bot's own corporation (a review)."""
    from gateway.state.identities import IdentityError, qualify

    tenants = {"wecom": ["wwMINE"], "web": ["web"]}
    assert qualify("wecom:wwOTHER:wwOTHER/alice", tenants) == "wecom:wwOTHER:wwOTHER/alice"
    assert qualify("wecom:wwOTHER/alice", tenants) == "wecom:wwOTHER:wwOTHER/alice"
    assert qualify("wecom:alice", tenants) == "wecom:wwMINE:alice"
    with pytest.raises(IdentityError, match="no wecom bot of tenant 'wwOTHER'"):
        qualify("wecom:wwOTHER:alice", tenants)  # an outsider is only ever named with their corporation
    assert qualify("web:a/b", tenants) == "web:web:a/b"  # other families' ids are read as they were
