"""The leader-balancing duty (docs/scaling.md, "Sharding": leader balance) on a real sharded cluster: 3 nodes,
[sharding] groups = 2 and a 1 s settle period. Each group's leadership ends on its preferred member (group
k: the (k mod 3)-th node by Raft address, so two distinct nodes); a SIGKILLed preferred leader of group 1,
restarted, gets its group's leadership back once caught up, and writes to both groups go on throughout.
With leader_balance_s = 0 the last step fails (the leadership stays where the election put it). A restarted
preferred leader whose workers are slow to come up (its public gRPC port closed while its group cores are
caught up and ready) gets the leadership only once its port is open and its node ready: without the
readiness check (Admin.Status through that port) it got it while its port was still closed."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver.config import group_raft_addr
from nameserver.pb import api_pb2
from nameserver.state.shards.directory import default_group
from tests.cluster import ROOT, Cluster, NodeProc, register_request, running
from tests.integration.groupcores import group_leader, group_status

pytestmark = pytest.mark.slow  # a sharded cluster's start, a kill and a restart: 30-60 s on this machine

GROUPS = 2
CLUSTER = "BalanceCluster"
SETTLE_S = 1.0
WORKER_DELAY_S = 8.0  # how long the restarted node's workers sleep before they start (slow_workers)
# Test-only: a worker process (python -m nameserver.worker) of a node started with this directory on its
# PYTHONPATH sleeps SLOW_WORKER_S before anything else, as one loading a large state would be late to open
# the node's public gRPC port. Other processes (the core, the group cores) start as usual.
SITECUSTOMIZE = """import os, sys, time
if "nameserver.worker" in sys.orig_argv:
    time.sleep(float(os.environ.get("SLOW_WORKER_S", "0")))
"""


def _named(group: int) -> str:
    return next(f"balance-{i}" for i in range(64) if default_group(f"balance-{i}", GROUPS) == group)


def _port(node: NodeProc) -> int:
    return int(node.raft_addr.rpartition(":")[2])


def preferred(cluster: Cluster, group: int) -> NodeProc:
    """Group `group`'s preferred leader as the docs define it: the (group mod N)-th member by Raft address
    (the cluster's nodes share a host; every group shifts their ports alike)."""
    ordered = sorted(cluster.nodes, key=_port)
    return ordered[group % len(ordered)]


class Writes:
    """Registrations of a group-0 set and a group-1 set, in turn, through every live node, until stopped:
    each must be acknowledged within WRITE_WINDOW_S of retries (an election in between is ridden out)."""

    WRITE_WINDOW_S = 20.0

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.acked = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writes:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _one(self, group: int, n: int) -> None:
        # each write a change: a new data version and queue count
        request = register_request(CLUSTER, _named(group), f"10.9.0.{group + 1}:10911", [f"Balance{group}"],
                                   counter=n + 1, queues=1 + n % 8)
        deadline = time.monotonic() + self.WRITE_WINDOW_S
        last = ""
        while time.monotonic() < deadline and not self._stop.is_set():
            for node in [n for n in self.cluster.nodes if n.alive]:
                try:
                    node.ns.RegisterBroker(request, timeout=5)
                    self.acked += 1
                    return
                except grpc.RpcError as exc:
                    last = f"{node.name}: {exc.code()} {exc.details()}"
            time.sleep(0.2)
        if not self._stop.is_set():
            self.failures.append(f"group {group} write {n} not acknowledged in {self.WRITE_WINDOW_S} s: {last}")

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self._one(n % GROUPS, n)
            n += 1
            time.sleep(0.1)


def _transfers(node: NodeProc) -> dict[str, float]:
    """nameserver_leader_balance_transfers_total by group, from `node`'s /metrics."""
    text = urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=10).read().decode()
    return {s.labels["group"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "nameserver_leader_balance_transfers_total"}


def _leaders_on(cluster: Cluster, want: dict[int, NodeProc]) -> bool:
    return all(group_leader(cluster, group) is node for group, node in want.items())


def _balance(tmp: str, settle_s: float) -> Iterator[Cluster]:
    cluster = Cluster(tmp, size=3, worker_processes=1, groups=GROUPS, metrics=True, leader_balance_s=settle_s)
    with running(cluster, timeout=cluster.ready_timeout):
        yield cluster


@pytest.fixture
def balanced(tmp_path: object) -> Iterator[Cluster]:
    yield from _balance(str(tmp_path), SETTLE_S)


def test_each_group_s_leadership_ends_on_its_preferred_node_and_comes_back_after_a_restart(
        balanced: Cluster) -> None:
    cluster = balanced
    want = {group: preferred(cluster, group) for group in range(GROUPS)}
    assert want[0] is not want[1]
    with Writes(cluster) as writes:
        cluster.wait_for("each group led by its preferred node", lambda: _leaders_on(cluster, want), timeout=60)
        victim = want[1]
        cluster.kill(victim)  # SIGKILL: group 1's leader (and group 0's follower there) gone at once
        interim = cluster.wait_for("group 1 led by another node", lambda: group_leader(cluster, 1), timeout=30)
        assert interim is not victim
        acked = writes.acked
        cluster.wait_for("writes acknowledged without group 1's preferred node", lambda: writes.acked > acked + 4,
                         timeout=30)
        cluster.start(victim)
        cluster.wait_for("group 1's leadership back on its restarted preferred node",
                         lambda: _leaders_on(cluster, want), timeout=90)
        acked = writes.acked
        cluster.wait_for("writes acknowledged after the leadership came back", lambda: writes.acked > acked + 4,
                         timeout=30)
    assert not writes.failures, writes.failures
    assert _transfers(interim).get("1", 0) >= 1  # the interim leader of group 1 handed it back, and counted it
    with open(interim.log_path) as f:
        to = group_raft_addr(victim.raft_addr, 1, cluster.raft_port_step)
        assert any("group 1: handing the leadership from" in line and f" to {to}:" in line for line in f)


def slow_workers(node: NodeProc, where: str, delay_s: float) -> None:
    """`node`, when next started, has its workers sleep `delay_s` first (SITECUSTOMIZE in `where`)."""
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    node.env = {**node.env, "PYTHONPATH": f"{where}{os.pathsep}{ROOT}", "SLOW_WORKER_S": str(delay_s)}


def port_open(node: NodeProc) -> bool:
    host, _, port = node.grpc_addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def test_the_leadership_waits_for_the_restarted_preferred_node_s_workers(balanced: Cluster, tmp_path: object
                                                                          ) -> None:
    cluster = balanced
    want = {group: preferred(cluster, group) for group in range(GROUPS)}
    cluster.wait_for("each group led by its preferred node", lambda: _leaders_on(cluster, want), timeout=60)
    victim = want[1]
    cluster.kill(victim)
    interim = cluster.wait_for("group 1 led by another node", lambda: group_leader(cluster, 1), timeout=30)
    slow_workers(victim, os.path.join(str(tmp_path), "slow"), WORKER_DELAY_S)
    cluster.start(victim)
    caught_up_while_closed = False  # the hazard happened: its group 1 core ready, its port not open yet
    deadline = time.monotonic() + 90
    while True:
        leads = group_leader(cluster, 1) is victim
        opened = port_open(victim)  # looked at after the leader: a port once open stays open
        if leads:
            assert opened, "group 1's leadership went to the restarted node before its workers opened its port"
            break
        if not opened:
            st = group_status(victim, 1)
            caught_up_while_closed |= st is not None and st.ready
        assert time.monotonic() < deadline, f"group 1's leadership not back on {victim.name}\n{cluster.logs()}"
        time.sleep(0.1)
    assert caught_up_while_closed, "the restarted node's group 1 core was never ready before its port opened"
    assert victim.admin.Status(api_pb2.StatusRequest(), timeout=10).ready
    with open(interim.log_path) as f:
        lines = f.readlines()
    to = group_raft_addr(victim.raft_addr, 1, cluster.raft_port_step)
    waited = [i for i, line in enumerate(lines) if f"group 1: leadership not handed to {to} yet" in line]
    handed = [i for i, line in enumerate(lines)
              if "group 1: handing the leadership from" in line and f" to {to}:" in line]
    assert waited and handed and waited[0] < handed[-1], "the interim leader waited for the node's readiness"
    assert len(waited) <= 3, f"one line per reason, not one per check: {len(waited)}"
