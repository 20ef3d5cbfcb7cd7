"""The page's settings (webchat/bot_settings.py): its own web bot and the bots its `web_login` signs in through,
`${VAR}` expanded inside those entries only, errors worded as the whole configuration's. The page is the process
most exposed to the internet: it must not hold the other bots' secrets, nor need their variables set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bots.web.config import WebBotConfig
from bots.wecom.config import WeComAppConfig
from gateway.config import ConfigError, load_settings
from testkit.processes import ROOT, child_env
from webchat.bot_settings import load_page_settings

AES = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR"
UNSET = "PAGE_TEST_NEVER_SET_SECRET"


def page_config(path: Path, **web: object) -> Path:
    """A web bot signing in through the WeCom app, and two bots the page has nothing to do with, whose secrets are
    `${VAR}`s that are not set here."""
    bots = [
        {"id": "web", "platform": "web", "api_key": "${PAGE_TEST_API_KEY}", "web_login": {"wecom": {"bot": "app"}},
         **web},
        {"id": "app", "platform": "wecom", "corp_id": "ww1", "agent_id": 1000002, "secret": "app-secret",
         "token": "tok", "encoding_aes_key": AES},
        {"id": "robot", "platform": "wecom-webhook", "key": f"${{{UNSET}}}"},
        {"id": "ding", "platform": "dingtalk", "mode": "http", "app_key": "dk", "app_secret": f"${{{UNSET}}}"},
    ]  # fmt: skip
    path.write_text(yaml.safe_dump({"redis_url": "redis://127.0.0.1:1/0", "bots": bots}), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGE_TEST_API_KEY", "page-api-key")
    monkeypatch.delenv(UNSET, raising=False)


def test_other_bots_with_unset_variables_do_not_stop_the_page(tmp_path: Path) -> None:
    path = page_config(tmp_path / "botgw.yaml")
    with pytest.raises(ConfigError, match=UNSET):
        load_settings(path)  # what the page used to load: the whole configuration
    page = load_page_settings(path, "web")
    assert isinstance(page.web, WebBotConfig) and page.web.api_key.get_secret_value() == "page-api-key"
    assert [bot.id for bot in page.bots] == ["web", "app"], "only the page's bot and the one it signs in through"
    assert isinstance(page.sign_in_bots[0], WeComAppConfig)


def test_errors_are_worded_as_the_whole_configurations(tmp_path: Path) -> None:
    path = page_config(tmp_path / "botgw.yaml", titel="x")
    with pytest.raises(ConfigError, match=r"^invalid configuration: bots\.web\.titel: unknown key; did you mean title"):
        load_page_settings(path, "web")
    with pytest.raises(ConfigError, match=r"no bot with id 'page' in the configuration \(its bots: web, app, robot"):
        load_page_settings(path, "page")
    with pytest.raises(ConfigError, match="bot 'app' is not a web bot"):
        load_page_settings(path, "app")
    with pytest.raises(ConfigError, match="does not exist"):
        load_page_settings(tmp_path / "missing.yaml", "web")


def test_a_page_process_settings_hold_no_other_bot(tmp_path: Path) -> None:
    """As the page process reads them: from BOTGW_CONFIG and BOTGW_WEB_BOT, the variables `botgw web` sets."""
    path = page_config(tmp_path / "botgw.yaml")
    code = "from webchat.bot_settings import page_settings\nprint(' '.join(bot.id for bot in page_settings().bots))"
    env = child_env({"BOTGW_CONFIG": str(path), "BOTGW_WEB_BOT": "web", "PAGE_TEST_API_KEY": "page-api-key"})
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["web", "app"]


def test_the_page_refuses_what_the_gateway_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page loads only its bots, but their checks all run: a short signing secret would let anyone who guesses
    it forge sessions carrying company members' identities; a DingTalk login needs the organisation's corp_id."""
    short = page_config(tmp_path / "short.yaml", auth_secret="changeme")
    with pytest.raises(ConfigError, match=r"bots\.web\.auth_secret is shorter than 32 characters"):
        load_page_settings(short, "web")
    empty = page_config(tmp_path / "empty.yaml", trusted_header_secret=" ")
    with pytest.raises(ConfigError, match=r"trusted_header_secret is empty"):
        load_page_settings(empty, "web")
    monkeypatch.setenv(UNSET, "a secret the page needs when it signs people in through that bot")
    ding = page_config(tmp_path / "ding.yaml", web_login={"dingtalk": {"bot": "ding"}})
    with pytest.raises(ConfigError, match=r"bots\.web\.web_login\.dingtalk: bots\.ding\.corp_id must be set"):
        load_page_settings(ding, "web")
    wrong = page_config(tmp_path / "wrong.yaml", web_login={"wecom": {"bot": "robot"}})
    with pytest.raises(ConfigError, match=r"web_login\.wecom\.bot must name a 'wecom' bot"):
        load_page_settings(wrong, "web")
