"""The compiled remoting load generator (bench/loadgen/) against a real node of ours: each workload's
calls succeed and its JSON report is whole; the benchmark's row adds the server's CPU per operation.
Counts only, never speeds (those are docs/benchmarks.md's)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from fakebroker import FakeBroker

from bench import loadgen
from bench.remoting import ROUTE_TOPICS, run_load
from tests.cluster import Cluster

pytestmark = pytest.mark.cluster

FIELDS = {"workload", "connections", "inflight", "seconds", "elapsed_s", "ops", "errors", "first_error", "ops_per_s",
          "p50_ms", "p90_ms", "p99_ms", "max_ms", "cpu_s", "cpu_us_per_op", "bytes_sent", "bytes_received"}
FRAME_PREFIX = 8  # length and header-length words: every frame is at least this


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node with remoting, its route topics held by a broker whose connection stays open."""
    c = Cluster(str(tmp_path_factory.mktemp("loadgen")), 1, remoting=True)
    c.start()
    seed = FakeBroker(name="loadgen-routes", cluster="LoadgenCluster")
    try:
        c.wait_ready(timeout=60)
        resp = seed.register(c.nodes[0].remoting_addr, ROUTE_TOPICS, compressed=False)
        assert resp.code == 0, resp.remark
        yield c
    finally:
        seed.close_channels()
        seed.stop()
        c.stop(wait=False)  # the nodes shut down while the next test starts


@pytest.mark.parametrize("workload,inflight", [("reads", 1), ("reads", 4), ("register", 1), ("register", 3),
                                                ("unchanged", 1)])
def test_workload_succeeds(node: Cluster, workload: str, inflight: int) -> None:
    out = loadgen.run(workload, [node.nodes[0].remoting_addr], 2, 1.0, inflight=inflight, topics=ROUTE_TOPICS,
                      prefix=f"lg-{workload}-{inflight}")
    assert set(out) == FIELDS, out
    assert out["errors"] == 0, out["first_error"]
    assert (out["workload"], out["connections"], out["inflight"]) == (workload, 2, inflight)
    assert out["ops"] > 0 and out["ops_per_s"] > 0, out
    assert 0 < out["p50_ms"] <= out["p90_ms"] <= out["p99_ms"] <= out["max_ms"], out
    assert out["cpu_s"] >= 0 and out["elapsed_s"] >= 1.0, out
    # the frames' bytes (the capacity model's bytes per call): at least a whole frame per call each way
    assert out["bytes_sent"] >= out["ops"] * FRAME_PREFIX and out["bytes_received"] >= out["ops"] * FRAME_PREFIX, out


def _applied(c: Cluster) -> int:
    st = c.nodes[0].status()
    assert st is not None
    return st.apply_offset


def test_changed_registrations_write_unchanged_do_not(node: Cluster) -> None:
    """Changed registrations are writes (the log grows with the calls; concurrent ones may share an entry);
    unchanged ones are not (the log grows only by each broker's first registration and its unregistration
    when its connection closes: 2 each for 2 connections)."""
    addr = node.nodes[0].remoting_addr
    before = _applied(node)
    changed = loadgen.run("register", [addr], 2, 1.0, prefix="lg-write")
    node.wait_converged()
    grew = _applied(node) - before
    assert changed["errors"] == 0 and changed["ops"] > 10 and grew > changed["ops"] // 4, (changed, grew)
    before = _applied(node)
    same = loadgen.run("unchanged", [addr], 2, 1.0, prefix="lg-same")
    node.wait_converged()
    grew = _applied(node) - before
    assert same["errors"] == 0 and same["ops"] > 10 * 4 and grew <= 4, (same, grew)


def test_bench_row_has_server_cpu(node: Cluster) -> None:
    n = node.nodes[0]
    assert n.proc is not None
    row = run_load("reads", [n.remoting_addr], 2, 1.0, [n.proc.pid], prefix="lg-row")
    assert row["errors"] == 0 and row["n"] > 0, row
    assert row["server_cpu_s"] > 0 and row["server_us_per_op"] > 0, row
    assert row["loadgen_cpu_s"] >= 0 and row["p99_ms"] >= row["p50_ms"] > 0, row


def test_bad_workload_is_refused() -> None:
    res = subprocess.run([loadgen.build(), "-workload", "write"], capture_output=True, text=True, timeout=30,
                         env=os.environ)
    assert res.returncode == 2 and "-workload" in res.stderr and res.stdout == "", res
