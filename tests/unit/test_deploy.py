"""deploy/: alert rules (promtool), the Grafana dashboard, Kubernetes manifests (schemas, offline),
the systemd unit, the local configurations and the Prometheus example config."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nameserver import config
from tests.cluster import ROOT

DEPLOY = os.path.join(ROOT, "deploy")
PROM_DIR = os.path.join(DEPLOY, "prometheus")
K8S_DIR = os.path.join(DEPLOY, "k8s")
UNIT = os.path.join(DEPLOY, "systemd", "nameserver@.service")
DASHBOARD = os.path.join(DEPLOY, "grafana", "nameserver.json")
# The oldest Kubernetes the manifests claim (gRPC probes are GA since 1.27) and the newest schema bundled.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def promtool() -> str:
    if shutil.which("promtool") is None:
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "ensure-prometheus.sh")], check=True,
                       stdin=subprocess.DEVNULL, timeout=900)
    found = shutil.which("promtool")
    assert found, "promtool still missing after scripts/ensure-prometheus.sh"
    return found


def run_promtool(*args: str, cwd: str = PROM_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ---- Prometheus ----------------------------------------------------------------------------------

def load_alerts() -> list[dict[str, Any]]:
    with open(os.path.join(PROM_DIR, "alerts.yml")) as f:
        return [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def test_promtool_checks_alert_rules() -> None:
    res = run_promtool("check", "rules", "alerts.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(load_alerts())} rules found" in res.stdout


def test_promtool_unit_tests_alert_rules() -> None:
    res = run_promtool("test", "rules", "alerts_test.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_a_firing_unit_test() -> None:
    with open(os.path.join(PROM_DIR, "alerts_test.yml")) as f:
        tests = yaml.safe_load(f)["tests"]
    fired = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case.get("exp_alerts")}
    quiet = {case["alertname"] for t in tests for case in t["alert_rule_test"] if not case.get("exp_alerts")}
    names = {r["alert"] for r in load_alerts()}
    assert names == fired, f"alerts without a firing test: {names - fired}"
    assert names == quiet, f"alerts without a not-firing test: {names - quiet}"


def test_required_alerts_exist_with_severity_and_text() -> None:
    rules = {r["alert"]: r for r in load_alerts()}
    for name in ("NameserverNoLeader", "NameserverTooManyLeaderChanges", "NameserverApplyLagHigh",
                 "NameserverCommitApplyGap", "NameserverSnapshotTooOld", "NameserverNotReady"):
        assert name in rules, name
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_prometheus_example_config_is_valid_and_scrapes_the_local_nodes() -> None:
    res = run_promtool("check", "config", "prometheus.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    with open(os.path.join(PROM_DIR, "prometheus.yml")) as f:
        doc = yaml.safe_load(f)
    targets = {sc["job_name"]: {t for st in sc["static_configs"] for t in st["targets"]}
               for sc in doc["scrape_configs"]}
    local3 = {config.load(os.path.join(DEPLOY, "local-3", f"n{i}.toml")).metrics_addr for i in (1, 2, 3)}
    assert targets["nameserver"] == local3
    # the continuous audit's default --metrics address
    from pipeline.cli import build_parser

    watch = build_parser().parse_args(["watch", "--log", "x", "--endpoints", "y", "--work", "z"])
    assert targets["pipeline-audit"] == {watch.metrics}


# ---- Grafana -------------------------------------------------------------------------------------

def dashboard_exprs() -> list[tuple[str, str]]:
    with open(DASHBOARD) as f:
        dash = json.load(f)
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_structure() -> None:
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= variables
    titles = {p["title"] for p in dash["panels"]}
    for wanted in ("Offsets per node", "Apply lag", "Leader", "RPC rate by method and code",
                   "Unary RPC latency p99"):
        assert wanted in titles, wanted
    offsets = " ".join(e for title, e in dashboard_exprs() if title == "Offsets per node")
    for name in ("nameserver_log_end_offset", "nameserver_commit_offset", "nameserver_apply_offset",
                 "nameserver_snapshot_offset"):
        assert name in offsets
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by what they expand to, so promtool can parse the query."""
    return expr.replace("$__rate_interval", "1m").replace("$job", ".*").replace("$instance", ".*")


def test_dashboard_queries_are_valid_promql(tmp_path) -> None:
    # promtool parses PromQL only inside rule files: make one recording rule per panel query.
    rules = [{"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)}
             for i, (_, e) in enumerate(dashboard_exprs())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = run_promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr


# ---- Kubernetes ----------------------------------------------------------------------------------

def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name in sorted(os.listdir(K8S_DIR)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S_DIR, name)) as f:
                out += [(name, d) for d in yaml.safe_load_all(f) if d]
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in k8s_docs() if d["kind"] == kind]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_match_the_schemas(version: str) -> None:
    docs = k8s_docs()
    assert {d["kind"] for _, d in docs} >= {"StatefulSet", "Service", "PodDisruptionBudget", "ConfigMap"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']} invalid for {version}: {exc.message}")


def test_k8s_validator_rejects_a_broken_statefulset() -> None:
    sts = copy.deepcopy(by_kind("StatefulSet")[0])
    sts["spec"]["replicaz"] = 3  # a typo must not pass silently (strict mode)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSIONS[-1], strict=True)
    sts = copy.deepcopy(by_kind("StatefulSet")[0])
    sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9201"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSIONS[-1], strict=True)


def test_k8s_manifests_fit_together(tmp_path) -> None:
    (sts,) = by_kind("StatefulSet")
    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    (pdb,) = by_kind("PodDisruptionBudget")
    (cm,) = by_kind("ConfigMap")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    headless = services[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True  # peers must reach not-ready pods
    assert sts["spec"]["podManagementPolicy"] == "Parallel"      # a quorum needs every pod started
    for selector in [s["spec"]["selector"] for s in services.values()] + [pdb["spec"]["selector"]["matchLabels"]]:
        assert selector.items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1

    # The ConfigMap's TOML is a valid node config for every pod, with its identity from the args.
    container = sts["spec"]["template"]["spec"]["containers"][0]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if a.startswith("--"))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_key = args["config"].removeprefix(mounts["config"] + "/")
    assert config_key in cm["data"]
    assert args["data-dir"] == mounts["data"]
    toml_path = tmp_path / config_key
    toml_path.write_text(cm["data"][config_key])
    replicas = sts["spec"]["replicas"]
    env = {e["name"] for e in container["env"]}
    raft = tomllib.loads(cm["data"][config_key]).get("raft", {})
    assert raft.get("password_env") in env                     # the password comes from the Secret
    os.environ[raft["password_env"]] = "test-only"
    try:
        for ordinal in range(replicas):
            pod = f"{sts['metadata']['name']}-{ordinal}"
            cfg = config.load(str(toml_path), {
                "raft_addr": args["raft-addr"].replace("$(POD_NAME)", pod), "grpc_addr": args["grpc-addr"],
                "data_dir": args["data-dir"]})
            assert len(cfg.members) == replicas
            host = f"{pod}.{headless['metadata']['name']}"
            assert cfg.raft_addr.startswith(host + ":")
            assert cfg.grpc_of(cfg.raft_addr).startswith(host + ":")
    finally:
        del os.environ[raft["password_env"]]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert cfg.metrics_addr.endswith(f":{ports['metrics']}")
    assert cfg.raft_addr.endswith(f":{ports['raft']}") and args["grpc-addr"].endswith(f":{ports['grpc']}")


def test_dockerfile_copies_what_the_package_needs() -> None:
    with open(os.path.join(K8S_DIR, "Dockerfile")) as f:
        lines = f.read().splitlines()
    sources = [part for line in lines if line.startswith("COPY ") for part in line.split()[1:-1]]
    for src in sources:
        assert os.path.exists(os.path.join(ROOT, src)), src
    for package in ("raftlog", "snapshot", "nameserver"):
        assert package in sources


# ---- systemd -------------------------------------------------------------------------------------

def parse_unit(path: str) -> dict[str, list[tuple[str, str]]]:
    """systemd's unit syntax: [Section] then Key=Value lines; keys may repeat."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                current = line[1:-1]
                sections.setdefault(current, [])
                continue
            assert current is not None and "=" in line, f"{path}:{n}: not Key=Value: {line}"
            key, value = line.split("=", 1)
            sections[current].append((key.strip(), value.strip()))
    return sections


def test_systemd_unit_parses_and_is_hardened() -> None:
    unit = parse_unit(UNIT)
    assert set(unit) == {"Unit", "Service", "Install"}
    service = dict(unit["Service"])
    for key, wanted in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
                        "ProtectHome": "yes", "CapabilityBoundingSet": "", "Restart": "on-failure",
                        "User": "nameserver"}.items():
        assert service.get(key) == wanted, key
    assert service["ReadWritePaths"] == "/var/lib/nameserver/%i"
    assert service["StateDirectory"] == "nameserver/%i"
    assert dict(unit["Install"])["WantedBy"] == "multi-user.target"


def test_systemd_execstart_flags_are_accepted_by_the_cli(tmp_path) -> None:
    exec_start = dict(parse_unit(UNIT)["Service"])["ExecStart"].split()
    assert exec_start[:2] == ["/opt/rip18/bin/nameserver", "serve"]
    # Same flags, a config file that does not exist: the CLI must get past argument parsing and
    # fail on the config (exit 2 with "config error"), not on an unknown flag (argparse, also 2).
    args = [a.replace("/etc/nameserver/%i.toml", str(tmp_path / "missing.toml")) for a in exec_start[1:]]
    res = subprocess.run([sys.executable, "-m", "nameserver.cli.serve", *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert res.returncode == 2 and "config error" in res.stderr, res.stderr


def test_systemd_analyze_verify_reports_nothing(tmp_path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze (Debian's systemd package) is needed to verify the unit"
    # verify checks that ExecStart exists: point it at this checkout's entry point.
    binary = os.path.join(os.path.dirname(sys.executable), "nameserver")
    assert os.access(binary, os.X_OK), binary
    with open(UNIT) as f:
        text = f.read().replace("/opt/rip18/bin/nameserver", binary)
    (tmp_path / "nameserver@.service").write_text(text)
    res = subprocess.run([analyze, "verify", "nameserver@n1.service"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    # Unknown keys and bad values are only warnings (exit 0): any output at all is a failure.
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


# ---- local configurations ------------------------------------------------------------------------

@pytest.mark.parametrize("size", [3, 5])
def test_local_configs_form_one_cluster_with_metrics(size: int) -> None:
    cfgs = [config.load(os.path.join(DEPLOY, f"local-{size}", f"n{i}.toml")) for i in range(1, size + 1)]
    members = {tuple(sorted((m.raft_addr, m.grpc_addr) for m in c.members)) for c in cfgs}
    assert len(members) == 1 and len(next(iter(members))) == size
    for attr in ("raft_addr", "grpc_addr", "metrics_addr", "data_dir"):
        values = [getattr(c, attr) for c in cfgs]
        assert all(values) and len(set(values)) == size, attr
    assert [c.metrics_addr for c in cfgs] == [f"127.0.0.1:930{i}" for i in range(1, size + 1)]


def test_ensure_prometheus_script_is_valid_and_idempotent() -> None:
    script = os.path.join(ROOT, "scripts", "ensure-prometheus.sh")
    assert subprocess.run(["bash", "-n", script], timeout=30).returncode == 0
    promtool()  # installs when missing
    res = subprocess.run(["bash", script], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr  # already there: nothing to do, nothing said


def test_alert_and_dashboard_metric_names_follow_conventions() -> None:
    names = set()
    for expr in [r["expr"] for r in load_alerts()] + [e for _, e in dashboard_exprs()]:
        names |= set(re.findall(r"\bnameserver_[a-z_]+", expr))
    for name in names:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert not re.search(r"_(ms|milliseconds|kb|mb)\b", base), name   # base units only
    assert {"nameserver_log_end_offset", "nameserver_commit_offset", "nameserver_apply_offset",
            "nameserver_snapshot_offset"} <= names
