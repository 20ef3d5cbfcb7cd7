"""The page is botgw's (webchat/page.py, webchat/serve.py): its name, a sign-in form that asks for a user name
(用户名 in Chinese), a Readme with the real chat commands and no links to Chainlit's community, nothing written into
the cwd; and a password hash that cannot be checked (botgw.env.example's placeholder) refused at start with one line
that names the key and says how to make one, never the hash."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from bots.web.config import WebBotConfig, hash_password, hash_problem
from gateway.config import ConfigError, load_settings
from gateway.pipeline.commands import parse_command
from gateway.texts import HELP_TEXT
from testkit.browser import CHROMIUM, chromium_browser
from testkit.processes import BOTGW, ROOT, child_env, free_port, wait_http
from webchat.page import README, toml_string, write_app_root
from webchat.passwords import PasswordSignIn

PASSWORD = "page-test-" + secrets.token_hex(8)
TITLE = "团队助手 Team"
CHAINLIT_DIR = ROOT / ".venv/lib/python3.11/site-packages/chainlit"
COMMUNITY = re.compile(r"discord|chainlit\.io|github\.com/chainlit|chainlit-cloud|Hi there, Developer", re.I)


def placeholder_hash() -> str:
    """The value botgw.env.example ships for WEB_USER_PASSWORD_HASH (read from it: the test follows the file)."""
    line = next(line for line in (ROOT / "botgw.env.example").read_text().splitlines()
                if line.startswith("WEB_USER_PASSWORD_HASH="))
    return line.split("=", 1)[1].strip("'\"")


def web_config(path: Path, password_hash: str, **bot: object) -> Path:
    config = {"bots": [{"id": "web", "platform": "web", "api_key": "key-" + secrets.token_hex(12),
                        "users": [{"name": "alice", "password_hash": password_hash}], **bot}]}
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


# A password hash that cannot be checked is refused at start


def test_the_placeholder_is_refused_by_the_configuration(tmp_path: Path) -> None:
    placeholder = placeholder_hash()
    assert placeholder.startswith("scrypt$"), "not the placeholder this test is about"
    with pytest.raises(ConfigError) as refused:
        load_settings(web_config(tmp_path / "botgw.yaml", placeholder))
    message = str(refused.value)
    assert "bots.web.users.0.password_hash: not a usable password hash (user alice)" in message
    assert "botgw web-password" in message
    assert placeholder not in message and "REPLACE" not in message, "the value was shown"


def test_the_placeholder_from_the_environment_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As deploy/botgw.yaml takes it: `password_hash: ${WEB_USER_PASSWORD_HASH}` with botgw.env.example's value."""
    monkeypatch.setenv("WEB_USER_PASSWORD_HASH", placeholder_hash())
    path = tmp_path / "botgw.yaml"
    path.write_text(web_config(tmp_path / "x.yaml", "x").read_text().replace(
        "password_hash: x", "password_hash: ${WEB_USER_PASSWORD_HASH}"))
    with pytest.raises(ConfigError, match=r"users\.0\.password_hash: not a usable password hash"):
        load_settings(path)


@pytest.mark.parametrize(("stored", "why"), [
    ("scrypt$16384$8$1$REPLACE$REPLACE", "not base64"),
    ("bcrypt$16384$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "scrypt$N$r$p"),
    ("scrypt$16384$8$c2FsdHNhbHQ=$aGFzaA==", "scrypt$N$r$p"),
    ("scrypt$16k$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "whole numbers"),
    ("scrypt$١٦$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "whole numbers"),
    ("scrypt$10000$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "out of range"),
    ("scrypt$16384$8$0$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "out of range"),
    ("scrypt$16384$8$999$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "out of range"),
    ("scrypt$32768$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "MiB"),
    ("scrypt$16384$8$1$c2FsdHNhbHRzYWx0c2FsdA$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "not base64"),
    ("scrypt$16384$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2g=", "too short"),
    ("scrypt$16384$8$1$c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=", "too short"),
    ("scrypt$16384$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=\n", "not base64"),
])
def test_malformed_hashes_are_named_not_quoted(stored: str, why: str) -> None:
    problem = hash_problem(stored)
    assert problem is not None and why in problem
    assert stored.split("$")[-1].strip() not in problem


def test_hashes_botgw_makes_are_accepted() -> None:
    assert hash_problem(hash_password(PASSWORD)) is None
    user = WebBotConfig(id="web", api_key="k", users=[{"name": "alice", "password_hash": hash_password(PASSWORD)}])
    assert user.user("alice", PASSWORD) is not None and user.user("alice", "wrong") is None


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Error:" not in result.stderr.replace("configuration error:", "")
    return result.stderr


def test_botgw_web_refuses_the_placeholder_with_one_line(tmp_path: Path) -> None:
    path = web_config(tmp_path / "botgw.yaml", placeholder_hash())
    result = subprocess.run([*BOTGW, "web", "--config", str(path), "--app-root", str(tmp_path / "root")],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=child_env())
    stderr = one_line_error(result)
    assert "bots.web.users.0.password_hash: not a usable password hash" in stderr and "botgw web-password" in stderr
    assert "REPLACE" not in stderr
    assert not (tmp_path / "root").exists(), "the page got as far as its files"

    serve = subprocess.run([sys.executable, "-m", "webchat.serve"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env=child_env({"BOTGW_CONFIG": str(path)}))
    assert "users.0.password_hash" in one_line_error(serve) and "REPLACE" not in serve.stderr


@pytest.mark.parametrize("stored", [
    "scrypt$16384$8$1$REPLACE$REPLACE",  # changed behind the configuration's back
    "scrypt$65536$8$1$c2FsdHNhbHRzYWx0c2FsdA==$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=",  # hashlib refuses
])
def test_a_hash_that_fails_at_sign_in_is_one_warning(stored: str, caplog: pytest.LogCaptureFixture) -> None:
    bot = WebBotConfig(id="web", api_key="k", users=[{"name": "alice", "password_hash": hash_password(PASSWORD)}])
    bot.users[0].password_hash = stored  # pydantic does not validate assignments: as a hash edited in memory

    async def attempt() -> object:
        return await PasswordSignIn(bot).check("alice", PASSWORD)

    with caplog.at_level(logging.WARNING, logger="botgw.web"):
        assert asyncio.run(attempt()) is None
    records = [record for record in caplog.records if record.name == "botgw.web"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING and not records[0].exc_info
    text = records[0].getMessage()
    assert "botgw web-password" in text and "'web'" in text and "'alice'" in text
    assert stored.split("$")[4] not in text and PASSWORD not in text


# botgw's Chainlit files


def test_the_readme_lists_exactly_the_chat_commands() -> None:
    listed = set(re.findall(r"`(/[a-z]+)`", README))
    helped = set(re.findall(r"^(/[a-z]+)\s", HELP_TEXT, re.M))
    assert listed == helped == {"/help", "/reset"}
    assert all(parse_command(command) for command in listed)
    assert not COMMUNITY.search(README) and "http" not in README


def test_the_app_root_gets_botgw_s_files_over_chainlit_s(tmp_path: Path) -> None:
    (tmp_path / ".chainlit").mkdir()
    (tmp_path / ".chainlit/config.toml").write_text("[UI]\nname = 'Assistant'\n")
    (tmp_path / "chainlit.md").write_text("# Welcome to Chainlit! Hi there, Developer!")
    (tmp_path / "chainlit_zh-CN.md").write_text("# 欢迎使用 Chainlit!")
    bot = WebBotConfig(id="web", api_key="k", title="back\\slash 名字 #1 [x]")
    write_app_root(tmp_path, CHAINLIT_DIR, "2.12.0", bot, "/chat", "https://bot.example.com")

    config = tomllib.loads((tmp_path / ".chainlit/config.toml").read_text())
    assert config["UI"]["name"] == "back\\slash 名字 #1 [x]"
    assert config["UI"]["custom_meta_url"] == "https://bot.example.com/chat/"
    uploads = config["features"]["spontaneous_file_upload"]
    assert uploads["enabled"] is True and uploads["max_files"] == 4 and uploads["max_size_mb"] == 10
    assert uploads["accept"]["image/jpeg"] == [".jpg", ".jpeg"] and ".docx" in str(uploads["accept"])
    assert config["meta"]["generated_by"] == "2.12.0"
    assert (tmp_path / "chainlit.md").read_text() == README
    assert not (tmp_path / "chainlit_zh-CN.md").exists(), "a stock translated Readme would be shown instead"
    assert {path.name for path in (tmp_path / "public").iterdir()} == {"logo_light.svg", "logo_dark.svg",
                                                                      "favicon.svg"}

    shipped = sorted(path.name for path in (CHAINLIT_DIR / "translations").glob("*.json"))
    assert sorted(path.name for path in (tmp_path / ".chainlit/translations").iterdir()) == shipped
    for name in shipped:
        translation = json.loads((tmp_path / ".chainlit/translations" / name).read_text())
        stock = json.loads((CHAINLIT_DIR / "translations" / name).read_text())
        login = translation["auth"]["login"]
        assert login["form"]["email"]["label"] != stock["auth"]["login"]["form"]["email"]["label"], name
        assert login["form"]["email"]["placeholder"] == "", name
        assert login["errors"]["Too Many Requests"] == login["errors"]["too many requests"], name
        assert translation.keys() == stock.keys(), f"{name}: the frontend needs whole files"
    chinese = json.loads((tmp_path / ".chainlit/translations/zh-CN.json").read_text())["auth"]["login"]["form"]
    assert (chinese["email"]["label"], chinese["password"]["label"]) == ("用户名", "密码")


def test_toml_strings_round_trip() -> None:
    for value in ["botgw", 'say "hi"', "back\\slash", "tab\there", "emoji 🤖", "del\x7f", "团队助手"]:
        assert tomllib.loads(f"v = {toml_string(value)}")["v"] == value


def test_titles_that_would_break_the_html_are_refused() -> None:
    for title in ["<script>", "a & b", 'say "x"', "", "x" * 65, "line\nbreak"]:
        with pytest.raises(ValueError, match="title"):
            WebBotConfig(id="web", api_key="k", title=title)


# The served page


@dataclass
class Page:
    url: str
    cwd: Path
    home: Path
    app_root: Path
    log: Path


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """`botgw web` started from an empty directory (its cwd) with a HOME of its own, over an app root that holds
    Chainlit's stock Readme; no gateway is needed to sign in and read the page's settings."""
    base = tmp_path_factory.mktemp("page")
    cwd, home, app_root = base / "cwd", base / "home", base / "app-root"
    for folder in (cwd, home, app_root):
        folder.mkdir()
    (app_root / "chainlit.md").write_text("# Welcome to Chainlit! 🚀🤖\nHi there, Developer! 👋")
    (cwd / ".env").write_text("LITERAL_API_KEY=from-the-cwd\n")  # Chainlit would read it from the cwd
    # Chainlit does read the app root's (CHAINLIT_ENV_FILE), at its import: after botgw had dropped the variable.
    (app_root / ".env").write_text("LITERAL_API_KEY=from-the-app-root\nDATABASE_URL=postgresql://u:pw@db/x\n")
    path = web_config(base / "botgw.yaml", hash_password(PASSWORD), title=TITLE)
    port = free_port()
    log = base / "web.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([*BOTGW, "web", "--config", str(path), "--port", str(port),
                                 "--app-root", str(app_root)], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env=child_env({"HOME": str(home)}), start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/", 120)
        yield Page(f"http://127.0.0.1:{port}", cwd, home, app_root, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_the_page_writes_nothing_into_its_cwd(page: Page) -> None:
    assert sorted(path.name for path in page.cwd.iterdir()) == [".env"], "Chainlit made files in the cwd"
    assert not any(page.home.iterdir()), "the page wrote into HOME rather than its --app-root"
    assert (page.app_root / ".chainlit/config.toml").is_file() and (page.app_root / ".files").is_dir()
    said = page.log.read_text()
    assert "from-the-cwd" not in said and "Loaded .env" not in said, "Chainlit read the cwd's .env"
    assert "from-the-app-root" not in said and "u:pw" not in said, "a value of the app root's .env in the log"
    ignored = [line for line in said.splitlines() if "the page ignores" in line]
    assert len(ignored) == 2 and all(name in said for name in ("LITERAL_API_KEY", "DATABASE_URL")), said


def test_the_sign_in_form_asks_for_a_user_name(page: Page) -> None:
    labels = {}
    for language in ("zh-CN", "en-US", "de-DE"):
        answer = httpx.get(f"{page.url}/project/translations", params={"language": language}, timeout=10)
        form = answer.json()["translation"]["auth"]["login"]["form"]
        labels[language] = (form["email"]["label"], form["password"]["label"])
    assert labels == {"zh-CN": ("用户名", "密码"), "en-US": ("Username", "Password"), "de-DE": ("Username", "Passwort")}


def test_the_page_is_named_after_the_bot_with_botgw_s_readme(page: Page) -> None:
    html = httpx.get(f"{page.url}/", timeout=10).text
    assert f"<title>{TITLE}</title>" in html
    assert not COMMUNITY.search(html), COMMUNITY.search(html)

    with httpx.Client(base_url=page.url, timeout=30) as client:
        assert client.get("/project/settings").status_code == 401
        signed_in = client.post("/login", files={"username": (None, "alice"), "password": (None, PASSWORD)})
        assert signed_in.status_code == 200, signed_in.text
        for language in ("zh-CN", "en-US"):
            settings = client.get("/project/settings", params={"language": language})
            assert settings.status_code == 200
            body = settings.json()
            assert body["ui"]["name"] == TITLE and body["ui"]["github"] is None and not body["ui"]["header_links"]
            assert body["markdown"] == README, "not botgw's Readme (Chainlit's stock one was in the app root)"
            assert body["dataPersistence"] is False, "Chainlit got a data layer (from the cwd's or app root's .env?)"
            assert not COMMUNITY.search(settings.text), COMMUNITY.search(settings.text)
        logo = client.get("/logo", params={"theme": "light"})
        assert logo.status_code == 200 and ">botgw</text>" in logo.text


def test_the_sign_in_label_in_a_chinese_browser(page: Page) -> None:
    if not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed: run `make test`, which installs it")
    with chromium_browser() as browser:
        for locale, label, password in (("zh-CN", "用户名", "密码"), ("en-US", "Username", "Password")):
            tab = browser.new_context(locale=locale).new_page()  # type: ignore[attr-defined]
            tab.goto(page.url, wait_until="networkidle")
            tab.wait_for_selector("label[for=email]", timeout=15000)
            assert tab.inner_text("label[for=email]").strip() == label
            assert password in tab.inner_text("form")
            assert tab.get_attribute("input#email", "placeholder") == ""
            tab.close()
