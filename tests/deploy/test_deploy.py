"""The deploy artefacts, checked with the real tools (scripts/install_ops_tools.sh installs them; a missing
tool fails these tests, it does not skip them):

- docker-compose.yml, alone and with deploy/compose.cpu.yml or deploy/caddy/compose.tls.yml: the Docker Compose
  v2 CLI's `config` (the compose specification's schema, interpolation, merging; no engine needed); every image
  pinned, only the reverse proxy published (plain HTTP on loopback, or HTTPS alone), secrets only from the
  environment and each service only the ones it uses (.env for compose, botgw.env for botgw), only the secrets of
  the configured bots required; the web page trusts X-Forwarded-For from the proxy's fixed address alone;
  deploy/caddy: `caddy validate`, the routes `caddy adapt` makes of it, and what a running Caddy sends upstream;
- deploy/k8s: every overlay rendered by `kubectl kustomize` and validated against the Kubernetes 1.37 schemas
  (kubernetes-validate, strict); the CRDs: KEDA ScaledObject and LeaderWorkerSet against schemas here, the
  LeaderWorkerSet's pod templates against Kubernetes' PodTemplate schema, the Prometheus Operator's
  ServiceMonitor, PodMonitor and PrometheusRule against the JSON schemas in deploy/k8s/schemas (generated from the
  Operator's CRDs, see its generate.py); the labels the monitors give the series are the ones the alert rules,
  KEDA's query and compose's Prometheus use;
- deploy/Dockerfile: hadolint; its ENTRYPOINT is the console script;
- across all of them: every botgw command they run parses with botgw's own CLI parser, the configuration
  files load with the environment the deployment gives them, and every vLLM command line is the launcher's
  profile (engine/launcher.py).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from engine import launcher
from gateway.cli import build_parser
from gateway.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
OPS_BIN = Path(os.environ.get("BOTGW_OPS_VENV", "~/.cache/botgw/ops-venv")).expanduser() / "bin"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_CPU = ROOT / "deploy" / "compose.cpu.yml"
COMPOSE_TLS = ROOT / "deploy" / "caddy" / "compose.tls.yml"
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
TEMPLATE_IN_CONTAINER = "/etc/botgw/templates/ernie45.jinja"
TLS_TARGETS = {("proxy", 80), ("proxy", 443)}  # published beyond loopback, with compose.tls.yml only
CADDY = ROOT / "deploy" / "caddy"
COMPOSE_REQUIRED = {"REDIS_PASSWORD", "QDRANT_API_KEY", "GRAFANA_ADMIN_PASSWORD"}  # compose's own services need them
TLS_REQUIRED = {"PUBLIC_HOST", "ACME_EMAIL"}  # compose.tls.yml's proxy needs them
BOTGW_SERVICES = {"gateway", "worker", "dingtalk-stream", "web"}
FROM_COMPOSE_ENV = {"REDIS_PASSWORD", "QDRANT_API_KEY"}  # .env values the botgw services get by name
SECRET_KEYS = {"secret", "token", "encoding_aes_key", "api_key", "app_secret", "password", "password_hash",
               "auth_secret", "key"}


def tool(name: str) -> str:
    path = OPS_BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} is not installed at {path}: run `bash scripts/install_ops_tools.sh`")
    return str(path)


def run(argv: list[str], cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def profile_args(profile: launcher.EngineProfile) -> list[str]:
    """What follows `vllm serve` in a container for a profile (the template's path inside the container)."""
    return launcher.serve_args(profile, host="0.0.0.0", port=8000, chat_template=TEMPLATE_IN_CONTAINER)


def serve_model(args: list[str]) -> str:
    """The model of a `vllm serve` argument list: the positional first argument."""
    assert args and not args[0].startswith("-"), f"vllm serve without a positional model: {args[:3]}"
    return args[0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def assert_pinned(image: str) -> None:
    name, _, tag = image.rpartition(":")
    assert name and "/" not in tag, f"{image}: no tag"
    assert tag != "latest" and re.search(r"\d", tag), f"{image}: not pinned to a version"


@functools.cache
def checked_vllm_version() -> str:
    """The vLLM whose parser checks the launcher's profiles (tests/e2e/engine/test_engine_profiles.py runs it in the
    engine venv): what scripts/install.sh pins, and what that venv has installed; the two must agree."""
    install = (ROOT / "scripts" / "install.sh").read_text()
    pin = re.search(r"VLLM_PACKAGE=\$\{BOTGW_VLLM_PACKAGE:-([\w.-]+)==([\w.]+)\}", install)
    assert pin, "scripts/install.sh pins no VLLM_PACKAGE as name==version"
    package, version = pin.groups()
    probe = f"import importlib.metadata as m; print(m.version({package!r}))"
    installed = run([launcher.default_engine_python(), "-c", probe])
    assert installed.returncode == 0, f"the engine venv has no {package}: {installed.stderr[-500:]}"
    found = installed.stdout.strip()
    assert found == version, f"the engine venv has {package} {found}, but scripts/install.sh pins {version}"
    return version


def assert_checked_vllm(images: list[str], where: str) -> None:
    """Every vLLM image runs the version whose parser accepted its flags (a newer or older vLLM may refuse them)."""
    vllm = [image for image in images if "vllm" in image.rpartition(":")[0].rpartition("/")[2]]
    assert vllm, f"{where}: no vLLM image found"
    wanted = "v" + checked_vllm_version()
    tags = {image.rpartition(":")[2] for image in vllm}
    assert tags == {wanted}, f"{where}: {vllm}; the flags were checked on {wanted}"


# --- docker compose ------------------------------------------------------------------------------------------

VARIANTS = {"gpu": [COMPOSE], "cpu": [COMPOSE, COMPOSE_CPU], "tls": [COMPOSE, COMPOSE_TLS]}


def compose_project(where: Path, env: str, botgw_yaml: str | None = None, botgw_env: str | None = None) -> Path:
    """A compose project directory as an operator has it: the repository's files, `.env` (which compose reads for
    interpolation) and `botgw.env` (which env_file hands to the botgw services). Never the checkout's own."""
    where.mkdir(parents=True, exist_ok=True)
    for name in ("engine", "deploy"):
        (where / name).symlink_to(ROOT / name)
    if botgw_yaml is not None:  # a deployment's own deploy/botgw.yaml
        (where / "deploy").unlink()
        (where / "deploy").mkdir()
        for item in (ROOT / "deploy").iterdir():
            if item.name != "botgw.yaml":
                (where / "deploy" / item.name).symlink_to(item)
        (where / "deploy" / "botgw.yaml").write_text(botgw_yaml)
    (where / ".env").write_text(env)
    if botgw_env is not None:
        (where / "botgw.env").write_text(botgw_env)
    return where


def compose_config(files: list[Path], *extra: str, project: Path = ROOT) -> subprocess.CompletedProcess[str]:
    argv = [tool("docker-compose"), "--project-directory", str(project)]
    if not (project / ".env").exists():
        argv += ["--env-file", str(ROOT / ".env.example")]
    for file in files:
        argv += ["-f", str(file)]
    return run([*argv, "--profile", "embed", "config", "--format", "json", *extra], cwd=project)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered_compose(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    project = compose_project(tmp_path_factory.mktemp("compose") / "botgw", operator_env(),
                              botgw_env=operator_env(BOTGW_ENV_EXAMPLE))
    proc = compose_config(VARIANTS[request.param], project=project)
    assert proc.returncode == 0, f"docker compose config ({request.param}):\n{proc.stderr}"
    return request.param, json.loads(proc.stdout)


def test_compose_validator_rejects_a_wrong_file(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yml"
    bad.write_text("services:\n  app:\n    image: redis:7.4.2\n    restart: sometimes\n    healthchek: {}\n")
    proc = compose_config([bad])
    assert proc.returncode != 0 and "healthchek" in proc.stderr


def test_compose_needs_the_secrets_from_env(tmp_path: Path) -> None:
    """No default stands in for a secret: without .env the file does not render."""
    empty = tmp_path / "empty.env"
    empty.write_text("")
    argv = [tool("docker-compose"), "--env-file", str(empty), "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    proc = run([*argv, "config", "-q"], cwd=tmp_path)
    assert proc.returncode != 0 and "REDIS_PASSWORD" in proc.stderr


ENV_EXAMPLE = ROOT / ".env.example"
BOTGW_ENV_EXAMPLE = ROOT / "botgw.env.example"


def filled(key: str, value: str) -> str:
    """An example file's value as an operator fills it in: a `change-me…` placeholder becomes a real secret (botgw
    refuses the placeholders at start, as it should)."""
    return hashlib.sha256(key.encode()).hexdigest()[:48] if value.startswith("change-me") else value


def _example_env(drop: tuple[str, ...] = (), file: Path = ENV_EXAMPLE) -> dict[str, str]:
    """An example env file's values as an operator fills them in: secrets for the placeholders, the web user's
    hash made by `botgw web-password` (botgw refuses the examples' placeholders at start, as it should)."""
    from bots.web.config import hash_password

    env = {}
    for line in file.read_text().splitlines():
        if line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            if not key.startswith(drop):
                env[key] = filled(key, value)
    if "WEB_USER_PASSWORD_HASH" in env:
        env["WEB_USER_PASSWORD_HASH"] = f"'{hash_password('a password')}'"
    return env


def operator_env(file: Path = ENV_EXAMPLE) -> str:
    return "".join(f"{key}={value}\n" for key, value in _example_env(file=file).items())


def test_compose_requires_only_what_its_own_services_use(tmp_path: Path) -> None:
    """The bots' secrets are botgw's business (deploy/botgw.yaml): compose requires only its own services' ones."""
    required = set()
    for file in (COMPOSE, COMPOSE_CPU):
        required |= set(re.findall(r"\$\{(\w+):\?", file.read_text()))
    assert required == COMPOSE_REQUIRED
    assert set(re.findall(r"\$\{(\w+):\?", COMPOSE_TLS.read_text())) == TLS_REQUIRED
    minimal = "".join(f"{key}=x{key.lower()}\n" for key in sorted(COMPOSE_REQUIRED))
    proc = compose_config([COMPOSE], project=compose_project(tmp_path / "p", minimal))
    assert proc.returncode == 0, proc.stderr
    for key in COMPOSE_REQUIRED:  # and each of them is really required
        rest = "".join(f"{k}=x\n" for k in sorted(COMPOSE_REQUIRED - {key}))
        proc = compose_config([COMPOSE], project=compose_project(tmp_path / key, rest))
        assert proc.returncode != 0 and key in proc.stderr


def test_compose_a_wecom_only_deployment_needs_no_other_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/botgw.yaml without the DingTalk and web bots, botgw.env without their lines: it renders, the services
    get botgw.env through env_file (an override too), and botgw loads; leaving out a WeCom secret stops botgw naming
    it."""
    from gateway.config import ConfigError

    config = yaml.safe_load((ROOT / "deploy" / "botgw.yaml").read_text())
    config["bots"] = [bot for bot in config["bots"] if bot["platform"] == "wecom"]
    env = _example_env(drop=("DINGTALK_", "WEB_"), file=BOTGW_ENV_EXAMPLE)
    env["BOTGW_ENGINE__MAX_TOKENS"] = "777"
    botgw_env = "".join(f"{key}={value}\n" for key, value in env.items())
    project = compose_project(tmp_path / "p", operator_env(), botgw_yaml=yaml.safe_dump(config), botgw_env=botgw_env)
    proc = compose_config([COMPOSE], project=project)
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    for name in sorted(BOTGW_SERVICES):
        environment = services[name]["environment"]
        assert environment["WECOM_SECRET"] == env["WECOM_SECRET"] and environment["BOTGW_ENGINE__MAX_TOKENS"] == "777"
        assert not any(key.startswith("DINGTALK_") for key in environment)
    gateway = services["gateway"]
    mount = next(v for v in gateway["volumes"] if v["target"] == "/etc/botgw/botgw.yaml")
    with monkeypatch.context() as patch:
        for key, value in gateway["environment"].items():
            patch.setenv(key, str(value).replace("$$", "$"))
        settings = load_settings(mount["source"])
        assert [bot.platform for bot in settings.bots] == ["wecom"] and settings.engine.max_tokens == 777
        patch.delenv("WECOM_SECRET")
        with pytest.raises(ConfigError, match="WECOM_SECRET"):
            load_settings(mount["source"])


def test_compose_services_images_ports(rendered_compose: tuple[str, dict]) -> None:
    variant, config = rendered_compose
    services = config["services"]
    expected = {"vllm", "vllm-embed", "redis", "qdrant", "gateway", "worker", "dingtalk-stream", "web",
                "prometheus", "grafana", "proxy"}
    assert set(services) == expected
    for name, service in services.items():
        assert_pinned(service["image"])
        assert "latest" not in service["image"]
        assert service.get("restart") == "unless-stopped", name
        assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
    published = {(n, int(p["target"])) for n, s in services.items() for p in s.get("ports", [])
                 if p.get("host_ip") != "127.0.0.1"}
    # plain HTTP only on loopback (a TLS terminator on the host); HTTPS alone with compose.tls.yml, never both
    assert published == (TLS_TARGETS if variant == "tls" else set())
    proxy_ports = {(p.get("host_ip"), int(p["target"]), str(p["published"])) for p in services["proxy"]["ports"]}
    if variant == "tls":
        assert proxy_ports == {("0.0.0.0", 80, "80"), ("0.0.0.0", 443, "443")}
    else:
        assert proxy_ports == {("127.0.0.1", 8080, "8080")}
    for name in ("worker", "gateway"):
        assert "container_name" not in services[name] and not services[name].get("ports"), f"{name} must scale"
    assert services["vllm-embed"]["profiles"] == ["embed"]
    assert not services["proxy"].get("profiles")
    gpu = services["vllm"].get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    if variant != "cpu":
        assert gpu and gpu[0]["capabilities"] == ["gpu"]
    else:
        assert not gpu, "the CPU override must drop the GPU reservation"
    redis = " ".join(services["redis"]["command"])
    for option in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction", "--requirepass"):
        assert option in redis
    for mount in (v for s in services.values() for v in s.get("volumes", []) if v["type"] == "bind"):
        assert Path(mount["source"]).exists(), f"bind mount {mount['source']} does not exist"


def test_compose_vllm_images_are_the_checked_version(rendered_compose: tuple[str, dict]) -> None:
    variant, config = rendered_compose
    assert_checked_vllm([service["image"] for service in config["services"].values()], f"compose ({variant})")


def test_compose_vllm_runs_the_launcher_profile(rendered_compose: tuple[str, dict]) -> None:
    variant, config = rendered_compose
    vllm = config["services"]["vllm"]
    assert vllm["entrypoint"] == ["vllm", "serve"]  # not the deprecated python -m vllm.entrypoints.openai.api_server
    assert config["services"]["vllm-embed"]["entrypoint"] == ["vllm", "serve"]
    profile = launcher.get_profile("ernie-0.3b-cpu" if variant == "cpu" else "ernie-0.3b-gpu")
    assert vllm["command"] == profile_args(profile)
    for key, value in profile.env.items():
        assert vllm["environment"][key] == value
    template = next(v for v in vllm["volumes"] if v["target"] == TEMPLATE_IN_CONTAINER)
    assert Path(template["source"]).resolve() == launcher.CHAT_TEMPLATE
    embed = config["services"]["vllm-embed"]["command"]
    assert serve_model(embed) == "BAAI/bge-m3" and flag(embed, "--runner") == "pooling"


def test_compose_botgw_commands_parse_and_config_loads(
    rendered_compose: tuple[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, config = rendered_compose
    services = config["services"]
    vllm_args = services["vllm"]["command"]
    botgw_services = {n: s for n, s in services.items() if s["image"].startswith("botgw:")}
    assert set(botgw_services) == {"gateway", "worker", "dingtalk-stream", "web"}
    for name, service in botgw_services.items():
        args = build_parser().parse_args(service["command"])
        assert args.command == name.replace("gateway", "serve")
        assert args.config == "/etc/botgw/botgw.yaml"
        mount = next(v for v in service["volumes"] if v["target"] == "/etc/botgw/botgw.yaml")
        with monkeypatch.context() as patch:  # each service with its own environment only
            for key, value in service["environment"].items():
                patch.setenv(key, str(value).replace("$$", "$"))
            settings = load_settings(mount["source"])
        assert settings.engine.model == flag(vllm_args, "--served-model-name")
        if name in ("gateway", "worker"):  # the processes that call the engine
            assert settings.engine.max_in_flight == int(flag(vllm_args, "--max-num-seqs")), name
        for url in (settings.redis_url, settings.engine.base_url, settings.knowledge.store.qdrant_url,
                    settings.bot("web").gateway_url):
            assert urlsplit(url).hostname in services, f"{url} names no compose service"
        assert settings.admin.host == "0.0.0.0" and settings.admin.token is not None
        assert settings.worker.metrics_port == 9101  # deploy/healthcheck.py's default and Prometheus's target
        if name == "web":
            assert build_parser().parse_args(service["command"]).port == 8100
        if name == "dingtalk-stream":  # deploy/prometheus/prometheus.yml scrapes it there
            assert build_parser().parse_args(service["command"]).metrics_port == 9102


# --- the reverse proxy (Caddy) ---------------------------------------------------------------------------------

def caddy() -> str:
    path = shutil.which("caddy")
    if not path:
        pytest.fail("caddy is not installed: `apt-get install caddy` (Debian's package; scripts/install_ops_tools.sh)")
    return path


CADDY_ENV = {"PUBLIC_HOST": "bot.example.com", "ACME_EMAIL": "ops@example.com"}


def caddy_run(command: str, config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`caddy validate|adapt` as the container runs it, from another directory (imports are relative to the file)."""
    env = {**os.environ, **CADDY_ENV, "HOME": str(cwd), "XDG_DATA_HOME": str(cwd), "XDG_CONFIG_HOME": str(cwd)}
    return subprocess.run([caddy(), command, "--config", str(config), "--adapter", "caddyfile"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def _caddy_routes(routes: list[dict], paths: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[dict]]:
    """The handlers of an adapted Caddy config by the path matchers above them, subroutes unwrapped."""
    found: dict[tuple[str, ...], list[dict]] = {}
    for route in routes:
        here = paths + tuple(p for m in route.get("match", []) for p in m.get("path", []))
        for handler in route.get("handle", []):
            if handler["handler"] == "subroute":
                for key, handlers in _caddy_routes(handler.get("routes", []), here).items():
                    found.setdefault(key, []).extend(handlers)
            else:
                found.setdefault(here, []).append(handler)
    return found


@pytest.mark.parametrize("name", ["Caddyfile", "Caddyfile.tls"])
def test_caddy_configs_are_valid_and_route_callbacks_to_every_gateway(name: str, tmp_path: Path) -> None:
    assert caddy_run("validate", CADDY / name, tmp_path).returncode == 0
    adapted = caddy_run("adapt", CADDY / name, tmp_path)
    assert adapted.returncode == 0, adapted.stderr
    server = next(iter(json.loads(adapted.stdout)["apps"]["http"]["servers"].values()))
    routes = _caddy_routes(server["routes"])
    callback = {h["handler"]: h for h in routes[("/callback/*",)]}
    assert callback["reverse_proxy"]["dynamic_upstreams"] == {**callback["reverse_proxy"]["dynamic_upstreams"],
                                                             "source": "a", "name": "gateway", "port": "8080"}
    assert callback["request_body"]["max_size"] == 64 * 1024
    page = {h["handler"]: h for h in routes[()]}
    assert page["reverse_proxy"]["upstreams"] == [{"dial": "web:8100"}]
    if name == "Caddyfile":
        assert server["listen"] == [":8080"]
    else:
        assert server["listen"] == [":443"]
        hosts = [h for r in server["routes"] for m in r.get("match", []) for h in m.get("host", [])]
        assert hosts == [CADDY_ENV["PUBLIC_HOST"]]


def test_caddy_validation_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Caddyfile"
    bad.write_text(":8080 {\n\treverse_proxi web:8100\n}\n")
    proc = caddy_run("validate", bad, tmp_path)
    assert proc.returncode != 0 and "reverse_proxi" in proc.stderr


class _Echo(BaseHTTPRequestHandler):
    """An upstream that answers with the X-Forwarded-* headers it received."""

    def do_GET(self) -> None:
        body = json.dumps({k: v for k, v in self.headers.items() if k.lower().startswith("x-forwarded")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_caddy_sends_the_client_address_and_drops_a_forged_one(tmp_path: Path) -> None:
    """routes.caddy run by a real Caddy (the page's upstream pointed at a local echo server): the page gets
    X-Forwarded-For with the address of the client that connected, never the one the client wrote itself."""
    import urllib.request

    upstream = HTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    routes = (CADDY / "routes.caddy").read_text()
    assert "reverse_proxy web:8100" in routes
    (tmp_path / "routes.caddy").write_text(
        routes.replace("reverse_proxy web:8100", f"reverse_proxy 127.0.0.1:{upstream.server_address[1]}"))
    port = _free_port()
    site = f"http://127.0.0.1:{port} {{\n\timport routes.caddy\n}}\n"
    (tmp_path / "Caddyfile").write_text(f"{{\n\tadmin off\n}}\n\n{site}")
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    proc = subprocess.Popen([caddy(), "run", "--config", str(tmp_path / "Caddyfile"), "--adapter", "caddyfile"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        import time

        deadline, seen = time.monotonic() + 20, None
        while seen is None:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"X-Forwarded-For": "203.0.113.9"})
            try:
                with urllib.request.urlopen(request, timeout=2) as answer:
                    seen = json.loads(answer.read())
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "caddy did not serve"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        upstream.shutdown()
        upstream.server_close()
    headers = {k.lower(): v for k, v in seen.items()}
    assert headers.get("x-forwarded-for") == "127.0.0.1", headers  # the peer, and the forged entry dropped


def test_compose_proxy_serves_the_caddy_configs(rendered_compose: tuple[str, dict]) -> None:
    variant, config = rendered_compose
    service = config["services"]["proxy"]
    file = "Caddyfile.tls" if variant == "tls" else "Caddyfile"
    mount = next(v for v in service["volumes"] if v["target"].rstrip("/") == "/etc/caddy")
    assert Path(mount["source"]).resolve() == CADDY.resolve() and mount.get("read_only")
    assert service["command"][:4] == ["caddy", "run", "--config", f"/etc/caddy/{file}"]
    if variant == "tls":
        assert set(service["environment"]) == TLS_REQUIRED and all(service["environment"].values())
        assert {v["target"] for v in service["volumes"]} >= {"/data", "/config"}  # the certificates are kept
    else:
        assert not service.get("environment")
    assert {"gateway", "web"} <= set(service["depends_on"])


def _compose_network(config: dict) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """The compose network's subnet and the range Docker hands out addresses from."""
    (ipam,) = config["networks"]["default"]["ipam"]["config"]
    return ipaddress.ip_network(ipam["subnet"]), ipaddress.ip_network(ipam["ip_range"])


def test_web_page_trusts_exactly_the_compose_proxy() -> None:
    """deploy/botgw.yaml's web bot believes X-Forwarded-For from the proxy's fixed address in docker-compose.yml
    and from nothing else: not the rest of the subnet, from whose ip_range Docker numbers the other containers."""
    compose = yaml.safe_load(COMPOSE.read_text())
    subnet, dynamic = _compose_network(compose)
    assert dynamic.subnet_of(subnet)
    proxy = ipaddress.ip_address(compose["services"]["proxy"]["networks"]["default"]["ipv4_address"])
    assert proxy in subnet and proxy not in dynamic and proxy != next(subnet.hosts())  # .1 is the bridge's
    assert compose["networks"]["default"].get("enable_ipv6") is False
    web = next(b for b in yaml.safe_load((ROOT / "deploy" / "botgw.yaml").read_text())["bots"] if b["id"] == "web")
    assert [ipaddress.ip_network(n, strict=False) for n in web["trusted_proxies"]] == \
        [ipaddress.ip_network(f"{proxy}/32")]
    assert not web.get("trusted_header")  # trusting the proxy names the client, it signs nobody in


def test_compose_proxy_keeps_its_address_and_the_page_trusts_it(
    rendered_compose: tuple[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    variant, config = rendered_compose
    subnet, dynamic = _compose_network(config)
    proxy = config["services"]["proxy"]["networks"]["default"]["ipv4_address"]
    web = config["services"]["web"]
    mount = next(v for v in web["volumes"] if v["target"] == "/etc/botgw/botgw.yaml")
    with monkeypatch.context() as patch:
        for key, value in web["environment"].items():
            patch.setenv(key, str(value).replace("$$", "$"))
        bot = load_settings(mount["source"]).bot("web")
    assert bot.trusts_proxy(proxy), variant
    assert not any(bot.trusts_proxy(str(a)) for a in (next(dynamic.hosts()), subnet.broadcast_address - 1))
    assert not bot.trusts_proxy("203.0.113.9")


def test_compose_tls_requires_its_host_and_email(tmp_path: Path) -> None:
    """compose.tls.yml without PUBLIC_HOST (or ACME_EMAIL) does not render, naming it; without compose.tls.yml
    neither is needed."""
    for key in sorted(TLS_REQUIRED):
        for value in ("", None):  # empty or absent
            env = {k: v for k, v in _example_env().items() if k != key}
            if value is not None:
                env[key] = value
            project = compose_project(tmp_path / f"{key}-{value is None}",
                                      "".join(f"{k}={v}\n" for k, v in env.items()))
            proc = compose_config([COMPOSE, COMPOSE_TLS], project=project)
            assert proc.returncode != 0 and key in proc.stderr, proc.stderr
            assert compose_config([COMPOSE], project=project).returncode == 0
            assert compose_config([COMPOSE, COMPOSE_CPU], project=project).returncode == 0


def test_compose_plain_proxy_binds_where_the_operator_says(tmp_path: Path) -> None:
    env = {**_example_env(), "PROXY_BIND": "0.0.0.0", "PROXY_PORT": "8888"}
    project = compose_project(tmp_path / "p", "".join(f"{k}={v}\n" for k, v in env.items()))
    plain = json.loads(compose_config([COMPOSE], project=project).stdout)["services"]["proxy"]["ports"]
    assert [(p["host_ip"], str(p["published"]), p["target"]) for p in plain] == [("0.0.0.0", "8888", 8080)]
    tls = json.loads(compose_config([COMPOSE, COMPOSE_TLS], project=project).stdout)["services"]["proxy"]["ports"]
    assert sorted(p["target"] for p in tls) == [80, 443]  # the plain port is replaced, not added to
    without = {k: v for k, v in _example_env().items() if not k.startswith("PROXY_")}
    project = compose_project(tmp_path / "default", "".join(f"{k}={v}\n" for k, v in without.items()))
    plain = json.loads(compose_config([COMPOSE], project=project).stdout)["services"]["proxy"]["ports"]
    assert [(p["host_ip"], str(p["published"])) for p in plain] == [("127.0.0.1", "8080")]


def test_compose_each_service_gets_only_the_secrets_it_uses(tmp_path: Path) -> None:
    """Every value of .env and botgw.env made distinct, then found in the rendered environments: compose's own
    values only in the services that use them, botgw.env's only in the botgw services, nothing of Grafana's or
    HF_TOKEN in botgw's, and BOTGW_IMAGE in no container."""
    dotenv = {key: f"dotenv-{key.lower()}" for key in _example_env()}
    dotenv.update({"PROXY_BIND": "127.0.0.1", "PROXY_PORT": "8080", "REDIS_MAXMEMORY": "0", "PROMETHEUS_PORT": "9090",
                   "GRAFANA_PORT": "3000", "VLLM_GPU_MEMORY_UTILIZATION": "0.9",
                   "VLLM_EMBED_GPU_MEMORY_UTILIZATION": "0.08", "BOTGW_IMAGE": "botgw:0.1.0"})
    botgw_env = {key: f"botgwenv-{key.lower()}" for key in _example_env(file=BOTGW_ENV_EXAMPLE)}
    project = compose_project(tmp_path / "p", "".join(f"{k}={v}\n" for k, v in dotenv.items()),
                              botgw_env="".join(f"{k}={v}\n" for k, v in botgw_env.items()))
    expected = {  # .env variable -> the services whose environment holds it
        "REDIS_PASSWORD": {"redis"} | BOTGW_SERVICES, "QDRANT_API_KEY": {"qdrant"} | BOTGW_SERVICES,
        "GRAFANA_ADMIN_PASSWORD": {"grafana"}, "GRAFANA_ADMIN_USER": {"grafana"},
        "HF_TOKEN": {"vllm", "vllm-embed"}, "PUBLIC_HOST": set(), "ACME_EMAIL": set(),
    }
    for files, tls in (([COMPOSE], False), ([COMPOSE, COMPOSE_TLS], True), ([COMPOSE, COMPOSE_CPU], False)):
        proc = compose_config(files, project=project)
        assert proc.returncode == 0, proc.stderr
        services = json.loads(proc.stdout)["services"]
        holders: dict[str, set[str]] = {}
        for name, service in services.items():
            assert "env_file" not in service or name in BOTGW_SERVICES
            for value in (service.get("environment") or {}).values():
                holders.setdefault(str(value), set()).add(name)
        for key, where in expected.items():
            if key in ("PUBLIC_HOST", "ACME_EMAIL") and tls:
                where = {"proxy"}
            assert holders.get(dotenv[key], set()) == where, f"{key} reaches {holders.get(dotenv[key])}"
        for key, value in botgw_env.items():
            assert holders.get(value) == BOTGW_SERVICES, f"botgw.env's {key} reaches {holders.get(value)}"
        for name in BOTGW_SERVICES:
            environment = services[name]["environment"]
            assert set(environment) - set(botgw_env) <= FROM_COMPOSE_ENV | {"BOTGW_ENGINE__MAX_IN_FLIGHT"}, name
            assert not {"BOTGW_IMAGE", "HF_TOKEN", "GRAFANA_ADMIN_PASSWORD", "PUBLIC_HOST"} & set(environment)


def _commented_variables(file: Path) -> set[str]:
    defined, commented = set(), False
    for line in file.read_text().splitlines():
        if not line.strip():
            commented = False
        elif line.lstrip().startswith("#"):
            commented = True
        else:
            name = line.split("=", 1)[0].strip()
            assert commented, f"{file.name}: {name} has no comment"
            defined.add(name)
    return defined


def _interpolated(*files: Path) -> set[str]:
    used = set()
    for file in files:
        text = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in file.read_text().splitlines())
        used |= set(re.findall(r"(?<!\$)\$\{(\w+)", text))
    return used


def test_env_examples_name_every_variable_with_a_comment() -> None:
    """.env.example: what the compose files interpolate, no more; botgw.env.example: what deploy/botgw.yaml names
    and the .env values compose does not hand over, plus BOTGW_* settings overrides."""
    from gateway.config import Settings

    dotenv, botgw_env = _commented_variables(ENV_EXAMPLE), _commented_variables(BOTGW_ENV_EXAMPLE)
    assert dotenv == _interpolated(COMPOSE, COMPOSE_CPU, COMPOSE_TLS)
    named = _interpolated(ROOT / "deploy" / "botgw.yaml")
    overrides = {name for name in botgw_env if name.startswith("BOTGW_")} - named
    assert botgw_env - overrides == named - FROM_COMPOSE_ENV
    for name in overrides:  # botgw refuses a BOTGW_ variable that names no setting (and that the file does not name)
        assert name.removeprefix("BOTGW_").split("__")[0].lower() in Settings.model_fields, name
    # botgw's prefix only for what compose alone reads (the image); PUBLIC_HOST is the proxy's
    assert {name for name in dotenv if name.startswith("BOTGW_")} == {"BOTGW_IMAGE"}
    assert not dotenv & botgw_env
    assert "BOTGW_HOST" not in CADDY.joinpath("Caddyfile.tls").read_text() + COMPOSE.read_text()


def test_botgw_env_is_not_committed() -> None:
    assert not (ROOT / "botgw.env").exists() or "botgw.env" in (ROOT / ".gitignore").read_text().split()


def _secret_values(node: object, path: str = "") -> list[tuple[str, str]]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            lowered = str(key).lower()
            if isinstance(value, str) and (lowered in SECRET_KEYS or re.search(r"(secret|password|token)", lowered)):
                found.append((f"{path}.{key}", value))
            found += _secret_values(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += _secret_values(item, f"{path}[{index}]")
    return found


@pytest.mark.parametrize("relpath", ["docker-compose.yml", "deploy/compose.cpu.yml", "deploy/botgw.yaml",
                                     "deploy/k8s/base/botgw.yaml"])
def test_no_secret_values_in_yaml(relpath: str) -> None:
    data = yaml.safe_load((ROOT / relpath).read_text().replace("!reset", ""))
    for where, value in _secret_values(data):
        assert re.fullmatch(r"\$\{\w+(:\?[^}]*|:-)?\}", value), f"{relpath}{where} holds a value, not ${{VAR}}"


# --- Dockerfile ----------------------------------------------------------------------------------------------

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def test_hadolint_passes() -> None:
    proc = run([tool("hadolint"), str(DOCKERFILE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nCMD botgw\n")
    proc = run([tool("hadolint"), str(bad)])
    assert proc.returncode != 0 and "DL3007" in proc.stdout


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_entrypoint_and_image_shape() -> None:
    instructions = _instructions()
    froms = [arg for op, arg in instructions if op == "FROM"]
    assert all(re.fullmatch(r"python:3\.11\.\d+-slim-bookworm( AS \w+)?", f) for f in froms), froms
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM"):]
    entrypoint = json.loads(next(arg for op, arg in final if op == "ENTRYPOINT"))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["botgw"] and "botgw" in scripts
    assert build_parser().parse_args(json.loads(next(arg for op, arg in final if op == "CMD"))).command == "serve"
    user = next(arg for op, arg in final if op == "USER")
    assert user.split(":")[0] not in ("root", "0")
    assert any(op == "HEALTHCHECK" for op, _ in final)
    build = "\n".join(arg for op, arg in instructions if op == "RUN")
    assert "rm -rf simulator" in build


def test_dockerignore_leaves_out_simulator_tests_bench() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "an allow-list: everything else stays out"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert not allowed & {"tests", "bench", "simulator", ".env"}
    assert "simulator/" in lines
    for op, arg in _instructions():
        if op == "COPY" and "--from" not in arg:
            for source in arg.split()[:-1]:
                assert source.rstrip("/") in allowed, f"COPY {source} is not in the build context"


def test_image_commands_do_not_import_the_simulator() -> None:
    """The image has no simulator: what its commands import must not need it."""
    code = (
        "import sys, gateway.cli, gateway.edge.app, gateway.worker.loop, gateway.runtime, gateway.edge.stream_mode, "
        "bots.web.config, knowledge.commands, engine.launcher\n"
        "gateway.cli.build_parser()\n"
        "print([m for m in sys.modules if m.startswith('simulator')])"
    )
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    import ast

    for path in [*ROOT.glob("gateway/**/*.py"), *ROOT.glob("bots/**/*.py"), *ROOT.glob("engine/**/*.py"),
                 *ROOT.glob("knowledge/**/*.py"), *ROOT.glob("webchat/**/*.py")]:
        if "simulator" in path.parts:
            continue
        for node in ast.parse(path.read_text()).body:  # module level only: sim commands import lazily
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("simulator") for n in names), f"{path} imports the simulator"


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path in ("/healthz", "/metrics", "/") else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_healthcheck_script(tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = str(server.server_address[1])
    script = [sys.executable, str(ROOT / "deploy" / "healthcheck.py")]
    try:
        assert run([*script, "serve", "--config", "x", "--port", port]).returncode == 0
        assert run([*script, "web", "--port", port]).returncode == 0
        assert run([*script, "dingtalk-stream", "--config", "x", "--metrics-port", port]).returncode == 0
        env_ok = subprocess.run([*script, "worker"], env={**os.environ, "BOTGW_WORKER__METRICS_PORT": port},
                                capture_output=True, timeout=20)
        assert env_ok.returncode == 0
        # the port in the worker's config file, without the environment's (it was 9101 whatever the file said)
        (tmp_path / "own.yaml").write_text(f"worker:\n  metrics_port: {port}\n")
        assert run([*script, "worker", "--config", str(tmp_path / "own.yaml")]).returncode == 0
    finally:
        server.shutdown()
        server.server_close()
    assert run([*script, "worker", "--config", str(tmp_path / "own.yaml")]).returncode == 1  # nothing listens
    (tmp_path / "none.yaml").write_text("worker:\n  concurrency: 4\n")  # no metrics port: alive is healthy
    assert run([*script, "worker", "--config", str(tmp_path / "none.yaml")]).returncode == 0
    assert run([*script, "serve", "--port", port]).returncode == 1  # nothing listens any more
    assert run([*script, "dingtalk-stream", "--metrics-port", port]).returncode == 1
    assert run([*script, "kb", "list"]).returncode == 0


# --- Kubernetes ----------------------------------------------------------------------------------------------

# The two CRDs, reduced to what these manifests use (strict: a misspelt field fails).
_POD_TEMPLATE = {"type": "object", "required": ["spec"]}
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {}, "kind": {}, "metadata": {"type": "object", "required": ["name"]},
            "spec": {
                "type": "object", "additionalProperties": False, "required": ["scaleTargetRef", "triggers"],
                "properties": {
                    "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                       "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                                                      "apiVersion": {"type": "string"}}},
                    "minReplicaCount": {"type": "integer", "minimum": 0},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "pollingInterval": {"type": "integer"}, "cooldownPeriod": {"type": "integer"},
                    "advanced": {"type": "object"},
                    "triggers": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["type", "metadata"],
                        "properties": {"type": {"enum": ["prometheus", "redis", "redis-streams", "cpu"]},
                                       "metadata": {"type": "object",
                                                    "additionalProperties": {"type": "string"}}}}},
                },
            },
        },
    },
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {}, "kind": {}, "metadata": {"type": "object", "required": ["name"]},
            "spec": {
                "type": "object", "additionalProperties": False, "required": ["leaderWorkerTemplate"],
                "properties": {
                    "replicas": {"type": "integer", "minimum": 0},
                    "leaderWorkerTemplate": {
                        "type": "object", "additionalProperties": False, "required": ["size", "workerTemplate"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "Default", "None"]},
                            "leaderTemplate": _POD_TEMPLATE, "workerTemplate": _POD_TEMPLATE,
                        },
                    },
                },
            },
        },
    },
}

# The Prometheus Operator's objects: JSON schemas generated from its CRDs (deploy/k8s/schemas/generate.py), as strict
# as the API server's field validation.
OPERATOR_SCHEMAS = K8S / "schemas" / "monitoring.coreos.com"
for _kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
    _schema = OPERATOR_SCHEMAS / f"{_kind.lower()}_v1.json"
    CRD_SCHEMAS[("monitoring.coreos.com/v1", _kind)] = json.loads(_schema.read_text())

# Runs in the ops venv (kubernetes-validate and jsonschema live there): validates every document on stdin.
_VALIDATOR = r"""
import json, sys
import jsonschema, kubernetes_validate as kv
payload = json.load(sys.stdin)
crds = {tuple(k.split("|")): v for k, v in payload["crds"].items()}
errors = []
def k8s(doc, where):
    try:
        kv.validate(doc, payload["version"], strict=True)
    except kv.ValidationError as exc:
        errors.append(f"{where}: {exc.message} at {'.'.join(map(str, exc.path))}")
    except kv.SchemaNotFoundError:
        errors.append(f"{where}: no Kubernetes schema for {doc.get('apiVersion')} {doc.get('kind')}")
for where, doc in payload["docs"]:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in crds:
        validator = jsonschema.validators.validator_for(crds[key], default=jsonschema.Draft7Validator)
        for err in validator(crds[key]).iter_errors(doc):
            errors.append(f"{where}: {err.message} at {'.'.join(map(str, err.path))}")
        if key[1] == "LeaderWorkerSet":
            for role in ("leaderTemplate", "workerTemplate"):
                template = doc["spec"]["leaderWorkerTemplate"].get(role)
                if template:
                    k8s({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role},
                         "template": template}, f"{where} {role}")
    else:
        k8s(doc, where)
print(json.dumps(errors))
"""


def validate_k8s(docs: list[tuple[str, dict]]) -> list[str]:
    payload = {"version": "1.37.0", "docs": docs,
               "crds": {f"{a}|{k}": schema for (a, k), schema in CRD_SCHEMAS.items()}}
    proc = subprocess.run([str(OPS_BIN / "python"), "-c", _VALIDATOR], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def k8s_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/k8s with secrets.env made from the example (as an operator does; the real one is never committed)."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets.env"))
    shutil.copytree(K8S.parent / "grafana", tree.parent / "grafana")  # base takes the board's folder in
    shutil.copy(tree / "base" / "secrets.env.example", tree / "base" / "secrets.env")
    return tree


def kustomize(where: Path) -> list[dict]:
    proc = run([tool("kubectl"), "kustomize", str(where)])
    assert proc.returncode == 0, f"kubectl kustomize {where.name}:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module")
def rendered_k8s(k8s_tree: Path) -> dict[str, list[dict]]:
    """Every overlay as `kubectl kustomize` renders it."""
    return {overlay: kustomize(k8s_tree / "overlays" / overlay) for overlay in OVERLAYS}


def _find(docs: list[dict], kind: str, name: str) -> dict:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def _pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    specs = []
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in ("Deployment", "StatefulSet"):
            specs.append((name, doc["spec"]["template"]["spec"]))
        elif doc["kind"] == "LeaderWorkerSet":
            lwt = doc["spec"]["leaderWorkerTemplate"]
            specs += [(f"{name} {role}", lwt[role]["spec"]) for role in ("leaderTemplate", "workerTemplate")]
    return specs


def test_k8s_overlays_exist() -> None:
    assert {"default", "external-redis", "ernie-21b-ep", "ernie-21b-multinode"} <= set(OVERLAYS)
    assert not (K8S / "base" / "secrets.env").exists() or "secrets.env" in (ROOT / ".gitignore").read_text()


def test_k8s_validate_against_schemas(rendered_k8s: dict[str, list[dict]]) -> None:
    docs = [(f"{overlay}: {d['kind']}/{d['metadata']['name']}", d) for overlay, ds in rendered_k8s.items()
            for d in ds]
    assert validate_k8s(docs) == []


def test_k8s_validator_rejects_wrong_manifests() -> None:
    wrong = [
        ("typo", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                           "template": {"metadata": {"labels": {"a": "b"}},
                                        "spec": {"containers": [{"name": "x", "image": "x:1", "comand": []}]}}}}),
        ("crd", {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
                 "spec": {"scaleTargetRef": {"name": "w"}, "triggers": [], "maxReplicas": 3}}),
        ("unknown", {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}}),
        ("servicemonitor", {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                            "metadata": {"name": "x"},
                            "spec": {"jobLable": "a", "selector": {}, "endpoints": [{"port": "admin"}]}}),
        ("podmonitor", {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
                        "spec": {"selector": {}, "podMetricsEndpoints": [{"port": "m", "relabelings": [
                            {"action": "rename", "targetLabel": "job"}]}]}}),
        ("rule", {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "x"},
                  "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expression": "up == 0"}]}]}}),
        ("good", {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
                  "spec": {"selector": {"matchLabels": {"a": "b"}}, "jobLabel": "a",
                           "podMetricsEndpoints": [{"port": "m", "interval": "15s"}]}}),
    ]
    errors = validate_k8s(wrong)
    assert {e.split(":")[0] for e in errors} == {"typo", "crd", "unknown", "servicemonitor", "podmonitor", "rule"}, \
        errors


def test_k8s_workloads(rendered_k8s: dict[str, list[dict]]) -> None:
    for overlay, docs in rendered_k8s.items():
        for name, spec in _pod_specs(docs):
            for container in spec["containers"]:
                assert_pinned(container["image"])
                assert container.get("resources", {}).get("requests"), f"{overlay} {name}: no resource requests"
                if not name.endswith("workerTemplate"):  # a Ray worker pod serves nothing to probe
                    assert {"readinessProbe", "livenessProbe"} & set(container), f"{overlay} {name}: no probe"
                if container["image"].startswith("botgw:"):
                    args = build_parser().parse_args(container["args"])
                    assert args.config == "/etc/botgw/botgw.yaml"
        kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
        assert ("NetworkPolicy", "default-deny-ingress") in kinds
        for workload in ("gateway", "worker", "dingtalk-stream", "web"):
            assert ("PodDisruptionBudget", workload) in kinds, f"{overlay}: no PDB for {workload}"
        assert _find(docs, "Deployment", "dingtalk-stream")["spec"]["replicas"] == 2
        hpa = _find(docs, "HorizontalPodAutoscaler", "gateway")
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        scaled = _find(docs, "ScaledObject", "worker")
        assert scaled["spec"]["scaleTargetRef"]["name"] == "worker"
        metrics_source = (ROOT / "gateway" / "metrics.py").read_text()
        for trigger in scaled["spec"]["triggers"]:
            for metric in re.findall(r"botgw_\w+", trigger["metadata"]["query"]):
                assert f'"{metric}"' in metrics_source, f"{metric} is not exported"
        assert (("StatefulSet", "redis") in kinds) == (overlay != "external-redis")
        assert ("StatefulSet", "qdrant") in kinds


def test_k8s_vllm_images_are_the_checked_version(rendered_k8s: dict[str, list[dict]]) -> None:
    for overlay, docs in rendered_k8s.items():
        pods = [spec for _, spec in _pod_specs(docs)]
        images = [c["image"] for spec in pods for c in spec["containers"] + spec.get("initContainers", [])]
        assert_checked_vllm(images, f"k8s overlays/{overlay}")


def test_k8s_ingress_exposes_only_callbacks_and_the_page(rendered_k8s: dict[str, list[dict]]) -> None:
    for docs in rendered_k8s.values():
        routes = set()
        for ingress in (d for d in docs if d["kind"] == "Ingress"):
            for rule in ingress["spec"]["rules"]:
                for path in rule["http"]["paths"]:
                    backend = path["backend"]["service"]
                    routes.add((path["path"], backend["name"], backend["port"]["name"]))
        assert routes == {("/callback/", "gateway", "http"), ("/", "web", "http")}
        gateway_port = next(p for p in _find(docs, "Service", "gateway")["spec"]["ports"] if p["name"] == "http")
        assert gateway_port["port"] == 8080
        policy = _find(docs, "NetworkPolicy", "gateway")["spec"]["ingress"]
        admin_from = [rule["from"] for rule in policy if {p["port"] for p in rule["ports"]} == {8081}]
        assert admin_from == [[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]]


def _vllm_container(docs: list[dict]) -> tuple[dict, int]:
    lws = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    if lws:
        lwt = lws[0]["spec"]["leaderWorkerTemplate"]
        return lwt["leaderTemplate"]["spec"]["containers"][0], lwt["size"]
    return _find(docs, "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0], 1


def test_k8s_vllm_runs_the_launcher_profiles(rendered_k8s: dict[str, list[dict]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from bots.web.config import hash_password

    secrets = {key: filled(key, value) for key, value in (
        line.split("=", 1) for line in (K8S / "base" / "secrets.env.example").read_text().splitlines()
        if line and not line.startswith("#"))}  # fmt: skip
    secrets["WEB_USER_PASSWORD_HASH"] = hash_password("a password")  # as the operator fills it in (the example's
    # placeholder is refused at start, as it should be)
    for overlay, docs in rendered_k8s.items():
        container, nodes = _vllm_container(docs)
        args = container["args"]
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        tp, dp = int(flag(args, "--tensor-parallel-size") if "--tensor-parallel-size" in args else 1), \
            int(flag(args, "--data-parallel-size") if "--data-parallel-size" in args else 1)
        if nodes > 1:
            profile = launcher.ernie_21b_a3b_multinode_profile(nodes=nodes, gpus_per_node=gpus)
            assert tp * dp == gpus * nodes and int(flag(args, "--data-parallel-size-local")) * nodes == dp
        elif "21B" in serve_model(args):
            profile = launcher.ernie_21b_a3b_profile(tensor_parallel_size=tp, data_parallel_size=dp)
            assert gpus == tp * dp
        else:
            profile = launcher.get_profile("ernie-0.3b-gpu")
            assert gpus == 1
        assert args == profile_args(profile), overlay
        command = container["command"]  # `vllm serve`, directly or as the leader script's last word
        assert command == ["vllm", "serve"] or 'exec vllm serve "$@"' in command[-2], overlay
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        assert any(m["mountPath"] == str(Path(TEMPLATE_IN_CONTAINER).parent) for m in container["volumeMounts"])
        # the configuration the botgw pods get: the ConfigMap's file, the Secret's and botgw-env's variables
        env = {**secrets, **next(d for d in docs if d["kind"] == "ConfigMap"
                                 and d["metadata"]["name"].startswith("botgw-env"))["data"]}
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            config = next(d for d in docs if d["kind"] == "ConfigMap" and "botgw.yaml" in d.get("data", {}))
            file = Path(os.environ.get("TMPDIR", "/tmp")) / f"botgw-k8s-{os.getpid()}-{overlay}.yaml"
            file.write_text(config["data"]["botgw.yaml"])
            try:
                settings = load_settings(file)
            finally:
                file.unlink()
        assert settings.engine.model == profile.served_model_name, overlay
        assert settings.engine.max_in_flight == int(flag(args, "--max-num-seqs")) * dp, overlay
        services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
        for url in (settings.engine.base_url, settings.knowledge.store.qdrant_url, settings.bot("web").gateway_url):
            assert urlsplit(url).hostname in services, f"{overlay}: {url} names no Service"
        if overlay != "external-redis":
            assert urlsplit(settings.redis_url).hostname in services


def test_k8s_template_is_the_engine_template() -> None:
    assert (K8S / "base" / "ernie45.jinja").read_bytes() == launcher.CHAT_TEMPLATE.read_bytes()


# --- monitoring: the Prometheus Operator's objects, the labels the rules, the board and KEDA agree on -----------

RULES_FILE = ROOT / "deploy" / "prometheus" / "rules" / "botgw.rules.yml"
COMPOSE_PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
BOARD = ROOT / "deploy" / "grafana" / "dashboards" / "botgw.json"
_MATCHER = r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"'


def label_matchers(expr: str) -> list[tuple[str, str, str]]:
    """(label, operator, value) of every matcher in a PromQL expression."""
    return re.findall(_MATCHER, expr)


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [str(rule["expr"]) for group in groups for rule in group["rules"]]


def board_expressions() -> list[str]:
    panels = json.loads(BOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def compose_jobs() -> dict[str, dict[str, str]]:
    """Compose's scrape jobs and the constant labels their relabelings add."""
    jobs = {}
    for job in yaml.safe_load(COMPOSE_PROMETHEUS.read_text())["scrape_configs"]:
        jobs[job["job_name"]] = {r["target_label"]: r["replacement"] for r in job.get("relabel_configs", [])
                                 if "source_labels" not in r}
    return jobs


def _selected(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def operator_targets(docs: list[dict]) -> dict[str, dict]:
    """What each ServiceMonitor and PodMonitor scrapes, as the Operator builds it: the job label (jobLabel's value on
    the Service or pod, else the Service's name / `namespace/name` of the PodMonitor, then relabelings), the constant
    labels relabelings add, the namespace, the port (name and number) and the pods behind it."""
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "LeaderWorkerSet")]

    def pod_templates() -> list[dict]:
        out = []
        for d in workloads:
            if d["kind"] == "LeaderWorkerSet":
                out += [d["spec"]["leaderWorkerTemplate"][r] for r in ("leaderTemplate", "workerTemplate")]
            else:
                out.append(d["spec"]["template"])
        return out

    targets = {}
    for monitor in (d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")):
        spec, name = monitor["spec"], monitor["metadata"]["name"]
        endpoints = spec.get("endpoints") or spec.get("podMetricsEndpoints")
        assert len(endpoints) == 1, f"{name}: one endpoint expected"
        endpoint = endpoints[0]
        if monitor["kind"] == "ServiceMonitor":
            services = [d for d in docs
                        if d["kind"] == "Service" and _selected(spec["selector"], d["metadata"]["labels"])]
            assert len(services) == 1, f"ServiceMonitor {name} selects {len(services)} Services"
            service = services[0]
            job_default, job_source = service["metadata"]["name"], service["metadata"]["labels"]
            port = next((p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]), None)
            assert port, f"ServiceMonitor {name}: the Service has no port {endpoint['port']}"
            templates = [t for t in pod_templates() if _selected({"matchLabels": service["spec"]["selector"]},
                                                                 t["metadata"]["labels"])]
            number = port["port"]
            container_ports = [p for t in templates for c in t["spec"]["containers"] for p in c.get("ports", [])
                               if p.get("name") == port["targetPort"] or p["containerPort"] == port["targetPort"]]
            assert container_ports, f"ServiceMonitor {name}: no pod has the Service's targetPort {port['targetPort']}"
            number = container_ports[0]["containerPort"]
        else:
            templates = [t for t in pod_templates() if _selected(spec["selector"], t["metadata"]["labels"])]
            assert templates, f"PodMonitor {name} selects no pods"
            job_default = f"{monitor['metadata'].get('namespace')}/{name}"
            job_source = templates[0]["metadata"]["labels"]
            ports = [p for c in templates[0]["spec"]["containers"] for p in c.get("ports", [])
                     if p.get("name") == endpoint["port"]]
            assert ports, f"PodMonitor {name}: the pods have no port {endpoint['port']}"
            number = ports[0]["containerPort"]
        job = job_source[spec["jobLabel"]] if spec.get("jobLabel") else job_default
        constants = {}
        for relabel in endpoint.get("relabelings", []):
            assert not relabel.get("sourceLabels"), f"{name}: only constant relabelings are modelled here"
            constants[relabel["targetLabel"]] = relabel["replacement"]
        job = constants.pop("job", job)
        targets[name] = {"job": job, "labels": constants, "namespace": monitor["metadata"].get("namespace"),
                         "port": number, "pod_labels": templates[0]["metadata"]["labels"],
                         "path": endpoint.get("path", "/metrics")}
    return targets


def test_k8s_monitors_give_the_compose_job_names(rendered_k8s: dict[str, list[dict]]) -> None:
    """The same `job` (and `role`) labels as compose's Prometheus, for the same processes."""
    compose = compose_jobs()
    for overlay, docs in rendered_k8s.items():
        targets = operator_targets(docs)
        assert set(targets) == {"gateway", "worker", "dingtalk-stream", "vllm"}, overlay
        for name, target in targets.items():
            assert target["job"] == name, f"{overlay}: {name} scraped as job {target['job']!r}"
            assert target["labels"] == compose[name], f"{overlay}: {name} labels {target['labels']} vs compose"
            assert target["namespace"] == "botgw" and target["path"] == "/metrics"
        # the ports are compose's (deploy/prometheus/prometheus.yml scrapes the same ones)
        scrape = yaml.safe_load(COMPOSE_PROMETHEUS.read_text())["scrape_configs"]
        compose_ports = {j["job_name"]: j["dns_sd_configs"][0]["port"] for j in scrape if "dns_sd_configs" in j}
        assert {n: t["port"] for n, t in targets.items()} == {n: compose_ports[n] for n in targets}, overlay


def test_k8s_monitoring_namespace_may_reach_every_scraped_port(rendered_k8s: dict[str, list[dict]]) -> None:
    for overlay, docs in rendered_k8s.items():
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        for name, target in operator_targets(docs).items():
            allowed = False
            for policy in policies:
                if not _selected(policy["spec"]["podSelector"], target["pod_labels"]):
                    continue
                for rule in policy["spec"].get("ingress", []):
                    from_monitoring = any(f.get("namespaceSelector", {}).get("matchLabels", {})
                                          .get("kubernetes.io/metadata.name") == "monitoring" for f in rule["from"])
                    if from_monitoring and target["port"] in {p["port"] for p in rule.get("ports", [])}:
                        allowed = True
            assert allowed, f"{overlay}: no NetworkPolicy lets namespace monitoring scrape {name}:{target['port']}"


def test_alert_rules_and_board_name_only_jobs_both_deployments_produce(rendered_k8s: dict[str, list[dict]]) -> None:
    """Every `job` the rules and the board match on is a compose job, and one the Operator's monitors produce (but
    vllm-embed, compose's optional embedding engine, which k8s does not run); no other label is matched on that
    only one of the two gives."""
    compose = compose_jobs()
    k8s_jobs = {t["job"] for t in operator_targets(rendered_k8s["default"]).values()}
    assert k8s_jobs == set(compose) - {"vllm-embed", "prometheus"}
    named_jobs = set()
    for expr in rule_expressions() + board_expressions():
        for label, op, value in label_matchers(expr):
            if label == "job":
                alternatives = value.split("|") if op in ("=~", "!~") else [value]
                assert all(re.fullmatch(r"[\w-]+", a) for a in alternatives), f"{expr}: a job pattern, not names"
                named_jobs |= set(alternatives)
            else:  # a label the services themselves export, never a scrape label only one deployment adds
                assert label not in {"namespace", "pod", "service", "container", "endpoint", "role", "deployment"}, \
                    f"{expr}: {label} is a scrape label"
    assert named_jobs, "the rules match on job"
    assert named_jobs <= set(compose), named_jobs - set(compose)
    assert named_jobs - {"vllm-embed"} <= k8s_jobs, named_jobs - k8s_jobs


def test_the_label_check_catches_a_job_nobody_scrapes() -> None:
    assert label_matchers('up{job=~"gateway|worker"} == 0 or absent(up{job="vlm"})') == [
        ("job", "=~", "gateway|worker"), ("job", "=", "vlm")]
    assert "vlm" not in compose_jobs()


def test_k8s_prometheus_rule_is_the_rules_file(rendered_k8s: dict[str, list[dict]]) -> None:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    for overlay, docs in rendered_k8s.items():
        rule = _find(docs, "PrometheusRule", "botgw")
        assert rule["spec"]["groups"] == groups, f"{overlay}: base/prometheusrule.yaml differs from {RULES_FILE.name}"


def test_keda_asks_the_operators_prometheus_for_labels_the_gateway_monitor_gives(
    rendered_k8s: dict[str, list[dict]],
) -> None:
    for overlay, docs in rendered_k8s.items():
        gateway = operator_targets(docs)["gateway"]
        produced = {"job": gateway["job"], "namespace": gateway["namespace"], **gateway["labels"]}
        for trigger in _find(docs, "ScaledObject", "worker")["spec"]["triggers"]:
            meta = trigger["metadata"]
            # the Service the Operator makes for its Prometheus pods: prometheus-operated, port 9090 (web)
            assert re.fullmatch(r"http://prometheus-operated\.monitoring\.svc(\.cluster\.local)?:9090",
                                meta["serverAddress"]), meta["serverAddress"]
            matchers = label_matchers(meta["query"])
            assert ("job", "=", "gateway") in matchers, meta["query"]
            for label, op, value in matchers:
                assert op == "=" and produced.get(label) == value, f"{overlay}: {label}{op}{value!r} matches no series"


def test_k8s_grafana_board_is_the_compose_board(rendered_k8s: dict[str, list[dict]]) -> None:
    """The board as a ConfigMap for Grafana's dashboard sidecar (label grafana_dashboard=1), the same file as
    compose's; its panels use the datasource uid `prometheus`, which compose provisions and kube-prometheus-stack
    gives its own Prometheus datasource."""
    assert not (K8S / "base" / "grafana").exists(), "one board: deploy/grafana/kustomization.yaml makes the ConfigMap"
    for docs in rendered_k8s.values():
        config = _find(docs, "ConfigMap", "botgw-grafana-dashboard")
        assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(config["data"]["botgw.json"]) == json.loads(BOARD.read_text())


PLACEHOLDER_HOST = "botgw.example.invalid"


def test_k8s_hosts_and_tls_come_from_the_overlays(k8s_tree: Path, rendered_k8s: dict[str, list[dict]]) -> None:
    """base alone claims no real host on a shared ingress controller (every rule has the placeholder host, which
    never resolves); every overlay replaces it with its own hosts and TLS."""
    base = [d for d in kustomize(k8s_tree / "base") if d["kind"] == "Ingress"]
    assert len(base) == 2
    for ingress in base:
        assert "tls" not in ingress["spec"] and [r.get("host") for r in ingress["spec"]["rules"]] == [PLACEHOLDER_HOST]
    for overlay, docs in rendered_k8s.items():
        for ingress in (d for d in docs if d["kind"] == "Ingress"):
            hosts = [r.get("host") for r in ingress["spec"]["rules"]]
            assert all(hosts) and not any(h.endswith(".invalid") for h in hosts), f"{overlay}: {hosts}"
            tls = ingress["spec"]["tls"]
            assert hosts and {h for t in tls for h in t["hosts"]} == set(hosts), overlay
            assert all(t["secretName"] for t in tls)
            assert ingress["metadata"]["annotations"]["cert-manager.io/cluster-issuer"]


def test_k8s_page_trusts_only_what_may_reach_it(rendered_k8s: dict[str, list[dict]]) -> None:
    """The web bot trusts X-Forwarded-For from a pod range (the ingress controller's, docs/kubernetes.md), and the
    only pods that may connect to the page are the ingress controller's namespace: a wide range trusts no other."""
    for overlay, docs in rendered_k8s.items():
        config = next(d for d in docs if d["kind"] == "ConfigMap" and "botgw.yaml" in d.get("data", {}))
        web = next(b for b in yaml.safe_load(config["data"]["botgw.yaml"])["bots"] if b["platform"] == "web")
        assert web["trusted_proxies"] and not web.get("trusted_header"), overlay
        assert all(ipaddress.ip_network(n, strict=False).is_private for n in web["trusted_proxies"])
        pod_labels = _find(docs, "Deployment", "web")["spec"]["template"]["metadata"]["labels"]
        sources = [f for policy in docs if policy["kind"] == "NetworkPolicy"
                   and _selected(policy["spec"]["podSelector"], pod_labels)
                   for rule in policy["spec"].get("ingress", []) for f in rule.get("from", [{}])]
        assert sources == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}], \
            f"{overlay}: {sources}"
    assert "trusted_proxies" in (ROOT / "docs" / "kubernetes.md").read_text()
