"""Configuration: YAML, BOTGW_* over it, ${VAR} secrets, clear errors, secrets never printed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

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


def test_bad_aes_key_and_unknown_keys_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_WECOM_SECRET", "x")
    with pytest.raises(ValidationError, match="encoding_aes_key"):
        load_settings(write(tmp_path, BOT.replace("kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR", "short")))
    with pytest.raises(ValidationError, match="reddis_url"):
        load_settings(write(tmp_path, "reddis_url: x\n"))


def test_missing_file_and_unknown_bot(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="no bot"):
        load_settings(write(tmp_path, "namespace: x\n")).bot("app")


def test_dedup_outlives_replay_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_WECOM_SECRET", "x")
    settings = load_settings(write(tmp_path, BOT.replace("token: tok", "token: tok\n    replay_window_s: 86400")))
    assert settings.effective_dedup_ttl_s() >= 2 * 86400
