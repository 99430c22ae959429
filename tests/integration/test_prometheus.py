"""A real Prometheus scraping a real 3-node cluster on loopback.

Prometheus (Debian's package, installed by scripts/ensure-prometheus.sh when missing) scrapes every
node each second with deploy/prometheus/alerts.yml loaded. The test reads everything back through
Prometheus' HTTP API: the offsets of every node, that they move with writes, the leader, records
applied by type, forwarded writes, alert rules evaluating cleanly, and a leader failover. The nodes
log JSON (`[log] format = "json"`), and every line of their logs must parse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import ROOT, Cluster, free_ports, register_request, running

pytestmark = pytest.mark.cluster

OFFSETS = ("nameserver_log_end_offset", "nameserver_commit_offset", "nameserver_apply_offset",
           "nameserver_snapshot_offset")
ALERTS = os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "nameserver.json")


def ensure_prometheus() -> tuple[str, str]:
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "ensure-prometheus.sh")], check=True,
                       stdin=subprocess.DEVNULL, timeout=900)
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    assert prometheus and promtool, "prometheus/promtool still missing after scripts/ensure-prometheus.sh"
    return prometheus, promtool


class Prometheus:
    def __init__(self, root: str, targets: list[str]) -> None:
        self.binary, _ = ensure_prometheus()
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = os.path.join(root, "prometheus.yml")
        self.log_path = os.path.join(root, "prometheus.log")
        with open(self.config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files:
  - {json.dumps(ALERTS)}
scrape_configs:
  - job_name: nameserver
    static_configs:
      - targets: {json.dumps(targets)}
""")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={os.path.join(root, 'tsdb')}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc = json.load(resp)
        assert doc["status"] == "success", doc
        return doc["data"]

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited:\n{self.logs()}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def query(self, expr: str, at: float | None = None) -> dict[str, float]:
        """Instant query (now, or at unix time `at`); {instance: value} (instance "" for series without one)."""
        data = self.get("/api/v1/query", query=expr, **({} if at is None else {"time": f"{at:.3f}"}))
        assert data["resultType"] == "vector", data
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in data["result"]}


@pytest.fixture(scope="module")
def prom_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Prometheus]]:
    """One cluster and one Prometheus for the module: Prometheus hands its first targets to the scrapers
    only after about 5 s. The tests run in file order; each expects only what the ones before it did, and
    the failover test, which kills the leader, is last."""
    root = tmp_path_factory.mktemp("prom")
    cluster = Cluster(str(root), 3, metrics=True)
    for node in cluster.nodes:
        with open(node.config_path, "a") as f:
            f.write('\n[log]\nformat = "json"\n')
    with running(cluster):
        prom_root = root / "prometheus"
        prom_root.mkdir()
        prom = Prometheus(str(prom_root), [n.metrics_addr for n in cluster.nodes])
        try:
            wait(cluster, prom, "prometheus to be ready", prom.ready, timeout=60)
            yield cluster, prom
        finally:
            prom.stop()


def wait(cluster: Cluster, prom: Prometheus, what: str, cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})\n"
                         f"{prom.logs()}\n{cluster.logs()}")


def scrape_counter(addr: str, name: str) -> float:
    """A sample straight from a node's /metrics (no Prometheus delay)."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
        for family in text_string_to_metric_families(resp.read().decode()):
            for sample in family.samples:
                if sample.name == name:
                    return sample.value
    raise AssertionError(f"{name} not exported by {addr}")


def query_until(prom: Prometheus, expr: str, pred: Callable[[dict[str, float]], bool]
                ) -> Callable[[], dict[str, float] | None]:
    """A condition for wait(): the query's result once `pred` accepts it."""
    def check() -> dict[str, float] | None:
        got = prom.query(expr)
        return got if pred(got) else None

    return check


def test_prometheus_scrapes_offsets_that_move_with_writes(prom_cluster: tuple[Cluster, Prometheus]) -> None:
    cluster, prom = prom_cluster
    instances = {n.metrics_addr for n in cluster.nodes}

    def every_offset_of_every_node() -> dict[str, dict[str, float]] | None:
        # One evaluation time for all four (a second back, so that every scrape before it is stored):
        # queried at "now" one by one, a scrape landing between two queries mixes two moments.
        at = time.time() - 1.0
        got = {name: prom.query(name, at) for name in OFFSETS}
        return got if all(set(v) == instances for v in got.values()) else None

    before = wait(cluster, prom, "the four offsets of all three nodes", every_offset_of_every_node)
    for inst in instances:
        assert before["nameserver_apply_offset"][inst] <= before["nameserver_commit_offset"][inst] \
            <= before["nameserver_log_end_offset"][inst]

    # A write through a follower: forwarded to the leader, replicated, applied everywhere.
    leader = cluster.leader()
    assert leader is not None
    follower = next(n for n in cluster.nodes if n is not leader)
    topics = [f"PromTopic{i}" for i in range(50)]
    reply = follower.ns.RegisterBroker(register_request("C", "broker-p", "10.0.0.7:10911", topics), timeout=10)
    assert reply.offset > max(before["nameserver_apply_offset"].values())

    def offsets_reached_write() -> bool:
        return all(prom.query(name).get(inst, 0) >= reply.offset for name in OFFSETS[:3] for inst in instances)

    wait(cluster, prom, f"every node's end/commit/apply offsets in Prometheus to reach {reply.offset}",
         offsets_reached_write)
    # The write itself, not only idle no-ops, is what every node applied.
    assert prom.query('sum by (instance) (nameserver_records_applied_total{type="TOPIC_QUEUE", op="upsert"})') \
        == {inst: 50.0 for inst in instances}
    assert prom.query("nameserver_topics") == {inst: 50.0 for inst in instances}
    assert prom.query("nameserver_live_brokers") == {inst: 1.0 for inst in instances}
    assert prom.query("sum(nameserver_is_leader)") == {"": 1.0}
    assert prom.query('nameserver_forwarded_requests_received_total{method="RegisterBroker"}') == \
        {leader.metrics_addr: 1.0}
    lags = prom.query("nameserver_apply_lag_seconds")
    assert set(lags) == instances and all(v < 3 for v in lags.values()), lags

    # Snapshots: the snapshot offset moves too once every node takes one.
    for node in cluster.nodes:
        node.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30)
    wait(cluster, prom, "snapshot offsets past the write",
         lambda: all(v >= reply.offset for v in prom.query("nameserver_snapshot_offset").values())
         and len(prom.query("nameserver_snapshot_offset")) == 3)
    assert set(prom.query("nameserver_snapshot_size_bytes")) == instances


def test_alert_rules_and_dashboard_work_on_live_data(prom_cluster: tuple[Cluster, Prometheus]) -> None:
    cluster, prom = prom_cluster
    # Make every metric family exist: a forwarded write, reads, a snapshot on every node.
    leader = cluster.leader()
    assert leader is not None
    follower = next(n for n in cluster.nodes if n is not leader)
    reply = follower.ns.RegisterBroker(register_request("C", "broker-d", "10.0.0.8:10911", ["DashTopic"]), timeout=10)
    # A controller-mode broker set with a live master (the nameserver_controller_* gauges exist only once
    # there is a set; a live master keeps BrokerSetWithoutMaster quiet)
    ctrl = api_pb2_grpc.ControllerStub(grpc.insecure_channel(leader.grpc_addr))
    applied = ctrl.ApplyBrokerId(api_pb2.ApplyBrokerIdRequest(
        cluster_name="C", broker_name="broker-set-d", broker_id=1, register_check_code="10.0.0.9:10911;1"),
        timeout=10)
    assert applied.code == 0, applied
    for node in cluster.nodes:
        api_pb2_grpc.ControllerStub(grpc.insecure_channel(node.grpc_addr)).Heartbeat(
            api_pb2.ControllerHeartbeatRequest(cluster_name="C", broker_name="broker-set-d",
                                               broker_address="10.0.0.9:10911", broker_id=1, timeout_ms=600_000),
            timeout=10)
    elected = ctrl.ElectMaster(api_pb2.ElectMasterRequest(cluster_name="C", broker_name="broker-set-d",
                                                          broker_id=1), timeout=10)
    assert elected.code == 0 and elected.set.master_id == 1, elected
    for node in cluster.nodes:
        node.ns.GetRoute(api_pb2.GetRouteRequest(topic="DashTopic", min_offset=reply.offset), timeout=10)
        node.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30)

    def evaluated() -> list[dict] | None:
        groups = prom.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else None

    rules = wait(cluster, prom, "every alert rule evaluated without error", evaluated)
    names = {r["name"] for r in rules}
    assert {"NameserverNoLeader", "NameserverTooManyLeaderChanges", "NameserverApplyLagHigh",
            "NameserverCommitApplyGap", "NameserverSnapshotTooOld", "NameserverNotReady"} <= names
    wait(cluster, prom, "all three nodes scraped", lambda: prom.query("up") == {
        n.metrics_addr: 1.0 for n in cluster.nodes})
    time.sleep(2)  # a few evaluations of a healthy cluster
    assert prom.get("/api/v1/alerts")["alerts"] == []

    # Every metric the alerts and the dashboard name is one the nodes really export.
    with open(DASHBOARD) as f:
        panels = json.load(f)["panels"]
    queries = {(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])}
    exprs = [r["query"] for r in rules] + [e for _, e in queries]
    referenced = {m for e in exprs for m in re.findall(r"\bnameserver_[a-z_]+", e)}

    def exported() -> set[str] | None:
        have = set(prom.get("/api/v1/label/__name__/values"))
        return have if referenced <= have else None

    wait(cluster, prom, f"these metrics in Prometheus: {sorted(referenced)}", exported)

    # Every panel's query runs, and the essential panels show every node.
    per_node = ("Offsets per node", "Apply lag", "Leader")           # one series (or more) per node
    cluster_wide = ("RPC rate by method and code", "Unary RPC latency p99", "Records applied by type")
    deadline = time.monotonic() + 30
    while True:
        counts: dict[str, int] = {}
        for title, expr in queries:
            promql = expr.replace("$__rate_interval", "10s").replace("$job", ".*").replace("$instance", ".*")
            counts[title] = max(counts.get(title, 0), len(prom.query(promql)))
        if all(counts[t] >= 3 for t in per_node) and all(counts[t] >= 1 for t in cluster_wide):
            break
        assert time.monotonic() < deadline, f"dashboard panels without data (series per panel): {counts}"
        time.sleep(0.5)


def test_leader_failover_is_visible_in_prometheus(prom_cluster: tuple[Cluster, Prometheus]) -> None:
    cluster, prom = prom_cluster
    old = cluster.leader()
    assert old is not None
    wait(cluster, prom, "the leader in Prometheus", lambda: prom.query("nameserver_is_leader == 1") == {
        old.metrics_addr: 1.0})
    seen_before = wait(cluster, prom, "every node to have seen the leader", query_until(
        prom, "nameserver_leader_changes_seen_total", lambda seen: len(seen) == 3 and min(seen.values()) >= 1))
    cluster.kill(old)
    survivors = [n for n in cluster.nodes if n is not old]
    new = cluster.wait_ready(survivors)
    assert new is not old
    wait(cluster, prom, "the new leader in Prometheus and the old one down",
         lambda: prom.query("nameserver_is_leader == 1") == {new.metrics_addr: 1.0}
         and prom.query(f'up{{instance="{old.metrics_addr}"}}') == {old.metrics_addr: 0.0})
    # One more change each (more only if the machine is so loaded that an election failed over again).
    seen_after = wait(cluster, prom, "each survivor to count the leader change", query_until(
        prom, "nameserver_leader_changes_seen_total",
        lambda seen: all(seen.get(n.metrics_addr, 0) >= seen_before[n.metrics_addr] + 1 for n in survivors)))

    # Structured logs: every line of every node's log is one JSON object, and each surviving node
    # logged exactly the leader changes it counted.
    for n in cluster.nodes:
        with open(n.log_path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        changes = [line for line in lines if line.get("event") == "leader_change"]
        if n in survivors:
            # One log line per change seen: the lines and the counter agree (read the counter fresh).
            counted = scrape_counter(n.metrics_addr, "nameserver_leader_changes_seen_total")
            assert len(changes) == counted >= seen_after[n.metrics_addr], (n.name, changes)
            assert any(c["leader"] == new.raft_addr for c in changes)
        assert all(line["node"] == n.raft_addr for line in lines)
