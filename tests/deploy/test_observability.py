"""Prometheus and Grafana as shipped in deploy/: the scrape config and alert rules pass promtool (and the rules'
unit tests), and every metric an alert or a Grafana panel names is exported by a live gateway, worker, DingTalk
Stream process or the vLLM CPU engine (their /metrics compared by name).

promtool comes from Debian's `prometheus` package (scripts/install_ops_tools.sh, which `make test` runs); the
PromQL is parsed by `promql-parser` (PyPI, a binding of the Rust parser that GreptimeDB uses). A missing tool fails
these tests, it never skips them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest
import yaml

from testkit.configs import ENGINE_MODEL
from testkit.processes import BOTGW, ROOT, Proc, free_port, wait_http

PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = sorted((PROMETHEUS / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
BOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
GRAFANA_PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
# Series Prometheus makes itself for every target, not exported by anyone.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"}
# Grafana's interval variables, replaced by a duration so that the query parses as PromQL.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}")


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool is not installed (Debian package `prometheus`): run `make test`, which installs it")
    return path


def run_promtool(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def parser_module():  # imported here, so that its absence fails these tests with a message
    try:
        import promql_parser
    except ImportError:
        pytest.fail("promql-parser is not installed: it belongs in the test extras (pip install -e '.[test]')")
    return promql_parser


# ---- what the rules and the board ask for -------------------------------------------------------------------


def rule_expressions(paths: Iterable[Path] = RULES) -> dict[str, str]:
    """{"file: alert": expr} for every alerting and recording rule."""
    found = {}
    for path in paths:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                found[f"{path.name}: {rule.get('alert') or rule.get('record')}"] = rule["expr"]
    return found


def board_expressions(paths: Iterable[Path] = BOARDS) -> dict[str, str]:
    """{"board: panel: refId": expr} for every Prometheus query of every panel (rows' panels included)."""

    def panels(items: list[dict]) -> Iterable[dict]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels") or [])

    found = {}
    for path in paths:
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in panels(board["panels"]):
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    found[f"{path.name}: {panel['title']}: {target['refId']}"] = target["expr"]
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects, by its syntax tree (a `{__name__="…"}` matcher counts)."""
    parser = parser_module()
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, parser.VectorSelector):
            if node.name:
                names.add(node.name)
            groups = [node.matchers.matchers, *node.matchers.or_matchers]
            for matcher in (m for group in groups for m in group):
                if matcher.name == "__name__":  # a regex stays as written, so it is reported, not guessed at
                    names.add(matcher.value)
        return True

    parser.walk(parser.parse(GRAFANA_INTERVALS.sub("5m", expr)), visit)
    return names


# ---- what live processes export -----------------------------------------------------------------------------


def exposed_names(text: str) -> set[str]:
    """Every series name an exposition offers: sample names, and the names in # HELP / # TYPE lines, which
    prometheus_client prints even for a labelled metric with no series yet (a histogram's or summary's
    _bucket/_sum/_count and a counter's _total are included)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}.get(kind, ())
            names.update(name + suffix for suffix in suffixes)
            if kind == "counter" and not name.endswith("_total"):
                names.add(name + "_total")
        elif line.startswith("# HELP "):
            names.add(line.split(maxsplit=3)[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def missing(expressions: dict[str, str], exported: set[str]) -> dict[str, list[str]]:
    """{where: [names nobody exports]} for the expressions that name such metrics."""
    gaps = {}
    for where, expr in expressions.items():
        unknown = sorted(metric_names(expr) - exported - SYNTHETIC)
        if unknown:
            gaps[where] = unknown
    return gaps


# ---- the tests ----------------------------------------------------------------------------------------------


def test_promtool_accepts_the_scrape_config_and_the_rules() -> None:
    assert RULES, "no rule files in deploy/prometheus/rules/"
    assert "SUCCESS" in run_promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    output = run_promtool("check", "rules", *map(str, RULES))
    assert "SUCCESS" in output
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"gateway", "worker", "dingtalk-stream", "vllm", "vllm-embed"} <= jobs


def test_promtool_rule_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool rule tests in deploy/prometheus/tests/"
    for path in RULE_TESTS:
        assert "SUCCESS" in run_promtool("test", "rules", path.name, cwd=path.parent)


def test_every_alert_is_documented_and_graded() -> None:
    for path in RULES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                name = rule["alert"]
                anchor = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()
                assert rule.get("for"), f"{name} has no for:"
                assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
                notes = rule["annotations"]
                assert notes.get("summary") and notes.get("description"), name
                assert notes["runbook_url"] == f"docs/operations.md#{anchor}", name


def test_grafana_provisioning_points_at_the_board() -> None:
    datasources = yaml.safe_load((GRAFANA_PROVISIONING / "datasources" / "prometheus.yml").read_text())
    uids = {source["uid"] for source in datasources["datasources"] if source["type"] == "prometheus"}
    providers = yaml.safe_load((GRAFANA_PROVISIONING / "dashboards" / "botgw.yml").read_text())["providers"]
    assert [p["options"]["path"] for p in providers] == ["/var/lib/grafana/dashboards"]
    assert BOARDS, "no dashboards in deploy/grafana/dashboards/"
    for path in BOARDS:
        board = json.loads(path.read_text(encoding="utf-8"))
        assert board["uid"] and board["panels"]
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] in uids, f"{path.name}: {panel['title']}"


def test_the_name_check_catches_a_metric_nobody_exports() -> None:
    """A rule or a panel naming an unknown metric is reported, wherever the name hides in the expression."""
    exported = {"botgw_queue_depth", "vllm:kv_cache_usage_perc", "botgw_ack_latency_seconds_bucket"}
    planted = {
        "rule": "max(botgw_queue_depth) > 0 and on() max(botgw_queue_depht_typo) > 0",
        "panel": 'histogram_quantile(0.9, sum by (le) (rate(botgw_ack_latency_seconds_bucket[$__rate_interval])))'
        ' / ignoring(x) sum(rate({__name__="botgw_bogus_total", platform="wecom"}[5m]))',
        "clean": "max by (instance) (vllm:kv_cache_usage_perc) > 0.92 or up == 0",
    }
    assert missing(planted, exported) == {"rule": ["botgw_queue_depht_typo"], "panel": ["botgw_bogus_total"]}


def test_every_metric_in_the_rules_and_the_board_is_exported(cluster, stack, live_engine: str) -> None:
    """Live processes after traffic: a gateway and a worker (worker.metrics_port) of their own, the DingTalk
    Stream process (--metrics-port) and the real vLLM CPU engine. Names are compared; the rules' and the board's
    names must all be among them."""
    worker_port, stream_port = free_port(), free_port()
    c = cluster(0.1, worker={"metrics_port": worker_port})
    c.add_gateway()
    c.add_worker("obs")
    stream = Proc(
        [*BOTGW, "dingtalk-stream", "--config", str(c.path), "--metrics-port", str(stream_port)],
        c.log_dir / f"dingtalk-stream-{c.namespace}.log",
    )
    try:
        user = "obs" + c.namespace
        assert c.stack.post_callback(c.stack.signer().text(user, "hello metrics")).status_code == 200
        c.stack.wait_delivered(user, 1, timeout=60, settle=0)
        answer = httpx.post(
            f"{live_engine}/v1/chat/completions",
            json={"model": ENGINE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=120,
        )
        answer.raise_for_status()
        wait_http(f"http://127.0.0.1:{stream_port}/metrics", 30, stream)
        scraped = {
            "gateway": f"{c.stack.procs['gateway'].admin_url}/metrics",
            "worker": f"http://127.0.0.1:{worker_port}/metrics",
            "dingtalk-stream": f"http://127.0.0.1:{stream_port}/metrics",
            "vllm": f"{live_engine}/metrics",
        }
        exports = {name: exposed_names(httpx.get(url, timeout=10).text) for name, url in scraped.items()}
    finally:
        stream.stop()
    # each process shows what it is for (a wrong port or a stranger's /metrics would not)
    assert "botgw_ack_latency_seconds_bucket" in exports["gateway"]
    assert "botgw_replies_total" in exports["worker"] and "botgw_knowledge_questions_total" in exports["worker"]
    assert "botgw_callbacks_total" in exports["dingtalk-stream"]
    assert "vllm:kv_cache_usage_perc" in exports["vllm"] and "vllm:num_requests_running" in exports["vllm"]
    exported = set().union(*exports.values())

    rules, board = rule_expressions(), board_expressions()
    assert len(rules) >= 8 and len(board) >= 20
    assert missing(rules, exported) == {}, "alert rules name metrics that nobody exports"
    assert missing(board, exported) == {}, "Grafana panels name metrics that nobody exports"
    # and the check bites on these very exports: one planted name is reported
    planted = {**rules, "planted: BogusAlert": "sum(rate(botgw_no_such_metric_total[5m])) > 0"}
    assert missing(planted, exported) == {"planted: BogusAlert": ["botgw_no_such_metric_total"]}
