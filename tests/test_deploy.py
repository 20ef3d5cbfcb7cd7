"""The deploy artefacts, checked with the real tools (scripts/install_ops_tools.sh installs them; a missing
tool fails these tests, it does not skip them):

- docker-compose.yml, alone and with deploy/compose.cpu.yml: the Docker Compose v2 CLI's `config` (the
  compose specification's schema, interpolation, merging; no engine needed); every image pinned, only the
  callback port and the web page published, secrets only from the environment;
- deploy/k8s: every overlay rendered by `kubectl kustomize` and validated against the Kubernetes 1.37 schemas
  (kubernetes-validate, strict); the two CRDs (KEDA ScaledObject, LeaderWorkerSet) against schemas here, the
  LeaderWorkerSet's pod templates against Kubernetes' PodTemplate schema;
- deploy/Dockerfile: hadolint; its ENTRYPOINT is the console script;
- across all of them: every botgw command they run parses with botgw's own CLI parser, the configuration
  files load with the environment the deployment gives them, and every vLLM command line is the launcher's
  profile (engine/launcher.py).
"""

from __future__ import annotations

import functools
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
from gateway.cli import _parser
from gateway.config import load_settings

ROOT = Path(__file__).resolve().parent.parent
OPS_BIN = Path(os.environ.get("BOTGW_OPS_VENV", "~/.cache/botgw/ops-venv")).expanduser() / "bin"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_CPU = ROOT / "deploy" / "compose.cpu.yml"
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
TEMPLATE_IN_CONTAINER = "/etc/botgw/templates/ernie45.jinja"
PUBLIC_TARGETS = {("gateway", 8080), ("web", 8100)}
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
    """The vLLM arguments of a profile as a container runs them (the image's own template path)."""
    argv, _ = launcher.build_command(profile, python="python3", host="0.0.0.0", port=8000)
    args = argv[3:]  # after python3 -m vllm.entrypoints.openai.api_server
    args[args.index("--chat-template") + 1] = TEMPLATE_IN_CONTAINER
    return args


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def assert_pinned(image: str) -> None:
    name, _, tag = image.rpartition(":")
    assert name and "/" not in tag, f"{image}: no tag"
    assert tag != "latest" and re.search(r"\d", tag), f"{image}: not pinned to a version"


@functools.cache
def checked_vllm_version() -> str:
    """The vLLM whose parser checks the launcher's profiles (tests/test_engine_profiles.py runs it in the engine
    venv): what scripts/install.sh pins, and what that venv has installed; the two must agree."""
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

VARIANTS = {"gpu": [COMPOSE], "cpu": [COMPOSE, COMPOSE_CPU]}


def compose_config(files: list[Path], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [tool("docker-compose"), "--env-file", str(ROOT / ".env.example"), "--project-directory", str(ROOT)]
    for file in files:
        argv += ["-f", str(file)]
    return run([*argv, "--profile", "embed", "config", "--format", "json", *extra])


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered_compose(request: pytest.FixtureRequest) -> tuple[str, dict]:
    proc = compose_config(VARIANTS[request.param])
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


def test_compose_services_images_ports(rendered_compose: tuple[str, dict]) -> None:
    variant, config = rendered_compose
    services = config["services"]
    expected = {"vllm", "vllm-embed", "redis", "qdrant", "gateway", "worker", "dingtalk-stream", "web",
                "prometheus", "grafana"}
    assert set(services) == expected
    for name, service in services.items():
        assert_pinned(service["image"])
        assert "latest" not in service["image"]
        assert service.get("restart") == "unless-stopped", name
        assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        for port in service.get("ports", []):
            if (name, int(port["target"])) not in PUBLIC_TARGETS:
                assert port.get("host_ip") == "127.0.0.1", f"{name}: port {port} published beyond loopback"
    published = {(n, int(p["target"])) for n, s in services.items() for p in s.get("ports", [])
                 if p.get("host_ip") != "127.0.0.1"}
    assert published == PUBLIC_TARGETS
    worker = services["worker"]
    assert "container_name" not in worker and not worker.get("ports"), "worker must scale with --scale"
    assert services["vllm-embed"]["profiles"] == ["embed"]
    gpu = services["vllm"].get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    if variant == "gpu":
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
    assert vllm["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    profile = launcher.get_profile("ernie-0.3b-gpu" if variant == "gpu" else "ernie-0.3b-cpu")
    assert vllm["command"] == profile_args(profile)
    for key, value in profile.env.items():
        assert vllm["environment"][key] == value
    template = next(v for v in vllm["volumes"] if v["target"] == TEMPLATE_IN_CONTAINER)
    assert Path(template["source"]) == launcher.CHAT_TEMPLATE
    embed = config["services"]["vllm-embed"]["command"]
    assert flag(embed, "--model") == "BAAI/bge-m3" and flag(embed, "--runner") == "pooling"


def test_compose_botgw_commands_parse_and_config_loads(
    rendered_compose: tuple[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, config = rendered_compose
    services = config["services"]
    vllm_args = services["vllm"]["command"]
    botgw_services = {n: s for n, s in services.items() if s["image"].startswith("botgw:")}
    assert set(botgw_services) == {"gateway", "worker", "dingtalk-stream", "web"}
    for name, service in botgw_services.items():
        args = _parser().parse_args(service["command"])
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
            assert _parser().parse_args(service["command"]).port == 8100
        if name == "dingtalk-stream":  # deploy/prometheus/prometheus.yml scrapes it there
            assert _parser().parse_args(service["command"]).metrics_port == 9102


def test_env_example_names_every_variable_with_a_comment() -> None:
    text = (ROOT / ".env.example").read_text()
    defined, commented = {}, False
    for line in text.splitlines():
        if not line.strip():
            commented = False
        elif line.lstrip().startswith("#"):
            commented = True
        else:
            name = line.split("=", 1)[0].strip()
            assert commented, f".env.example: {name} has no comment"
            defined[name] = line
    used = set()
    for file in (COMPOSE, COMPOSE_CPU, ROOT / "deploy" / "botgw.yaml"):
        text = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in file.read_text().splitlines())
        used |= set(re.findall(r"(?<!\$)\$\{(\w+)", text))
    assert used - set(defined) == set(), "variables the deployment uses but .env.example does not name"
    assert set(defined) - used == set(), ".env.example names variables nothing uses"


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
    assert _parser().parse_args(json.loads(next(arg for op, arg in final if op == "CMD"))).command == "serve"
    user = next(arg for op, arg in final if op == "USER")
    assert user.split(":")[0] not in ("root", "0")
    assert any(op == "HEALTHCHECK" for op, _ in final)
    build = "\n".join(arg for op, arg in instructions if op == "RUN")
    assert "rm -rf bots/simulator" in build


def test_dockerignore_leaves_out_simulator_tests_bench() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "an allow-list: everything else stays out"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert not allowed & {"tests", "bench", "bots/simulator", ".env"}
    assert "bots/simulator/" in lines
    for op, arg in _instructions():
        if op == "COPY" and "--from" not in arg:
            for source in arg.split()[:-1]:
                assert source.rstrip("/") in allowed, f"COPY {source} is not in the build context"


def test_image_commands_do_not_import_the_simulator() -> None:
    """The image has no bots/simulator: what its commands import must not need it."""
    code = (
        "import sys, gateway.cli, gateway.app, gateway.worker, gateway.runtime, gateway.stream_mode, "
        "bots.web.config, knowledge.commands, engine.launcher\n"
        "gateway.cli._parser()\n"
        "print([m for m in sys.modules if m.startswith('bots.simulator')])"
    )
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    import ast

    for path in [*ROOT.glob("gateway/**/*.py"), *ROOT.glob("bots/**/*.py"), *ROOT.glob("engine/**/*.py"),
                 *ROOT.glob("knowledge/**/*.py")]:
        if "simulator" in path.parts:
            continue
        for node in ast.parse(path.read_text()).body:  # module level only: sim commands import lazily
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("bots.simulator") for n in names), f"{path} imports the simulator"


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path in ("/healthz", "/metrics", "/") else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_healthcheck_script() -> None:
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
    finally:
        server.shutdown()
        server.server_close()
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
        for err in jsonschema.Draft7Validator(crds[key]).iter_errors(doc):
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
def rendered_k8s(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Every overlay as `kubectl kustomize` renders it, with secrets.env made from the example (as an operator
    does; the real one is never committed)."""
    kubectl = tool("kubectl")
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets.env"))
    shutil.copy(tree / "base" / "secrets.env.example", tree / "base" / "secrets.env")
    rendered = {}
    for overlay in OVERLAYS:
        proc = run([kubectl, "kustomize", str(tree / "overlays" / overlay)])
        assert proc.returncode == 0, f"kubectl kustomize overlays/{overlay}:\n{proc.stderr}"
        rendered[overlay] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    return rendered


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
    ]
    errors = validate_k8s(wrong)
    assert {e.split(":")[0] for e in errors} == {"typo", "crd", "unknown"}, errors


def test_k8s_workloads(rendered_k8s: dict[str, list[dict]]) -> None:
    for overlay, docs in rendered_k8s.items():
        for name, spec in _pod_specs(docs):
            for container in spec["containers"]:
                assert_pinned(container["image"])
                assert container.get("resources", {}).get("requests"), f"{overlay} {name}: no resource requests"
                if not name.endswith("workerTemplate"):  # a Ray worker pod serves nothing to probe
                    assert {"readinessProbe", "livenessProbe"} & set(container), f"{overlay} {name}: no probe"
                if container["image"].startswith("botgw:"):
                    args = _parser().parse_args(container["args"])
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
    secrets = dict(line.split("=", 1) for line in (K8S / "base" / "secrets.env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    for overlay, docs in rendered_k8s.items():
        container, nodes = _vllm_container(docs)
        args = container["args"]
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        tp, dp = int(flag(args, "--tensor-parallel-size") if "--tensor-parallel-size" in args else 1), \
            int(flag(args, "--data-parallel-size") if "--data-parallel-size" in args else 1)
        if nodes > 1:
            profile = launcher.ernie_21b_a3b_multinode_profile(nodes=nodes, gpus_per_node=gpus)
            assert tp == gpus and dp == nodes
        elif "21B" in flag(args, "--model"):
            profile = launcher.ernie_21b_a3b_profile(tensor_parallel_size=tp, data_parallel_size=dp)
            assert gpus == tp * dp
        else:
            profile = launcher.get_profile("ernie-0.3b-gpu")
            assert gpus == 1
        assert args == profile_args(profile), overlay
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
