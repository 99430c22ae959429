"""Issue 6's done-criteria on a real 3-process cluster: export, compaction, audit, report, archive."""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nameserver.cli import nsctl
from nameserver.logformat.segments import DUMP_FILE, covered_ranges
from nameserver.pb import api_pb2, state_pb2
from pipeline.audit import run_audit
from pipeline.compact import run_compact
from pipeline.report import ReportOptions, run_report
from tests.cluster import register_request, retry

# PySpark 4.1 calls pandas 3 with a deprecated keyword: noise, not a problem of ours.
pytestmark = [pytest.mark.cluster, pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")]

ROW_ID = ["offset", "batch_index", "record_index", "key", "op", "entry_id"]


def _topics(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _workload(ns) -> None:
    """Registrations, a DataVersion change, an expiry, an unregister, KV, topics, perms and bindings."""
    retry(lambda: ns.RegisterBroker(register_request("C1", "broker-a", "10.0.0.1:10911", _topics("TA", 20)),
                                    timeout=10))
    ns.RegisterBroker(register_request("C1", "broker-b", "10.0.0.2:10911", _topics("TB", 8), timeout_ms=1000),
                      timeout=10)  # never heartbeats: expires
    ns.RegisterBroker(register_request("C2", "broker-c", "10.0.0.3:10911", _topics("TC", 5)), timeout=10)
    ns.RegisterBroker(register_request("C1", "broker-a", "10.0.0.1:10911", _topics("TA", 21), counter=2),
                      timeout=10)
    for key in ("TA1", "TA2"):
        ns.PutKv(api_pb2.PutKvRequest(namespace="ORDER_TOPIC_CONFIG", key=key, value="broker-a:4"), timeout=10)
    ns.DeleteKv(api_pb2.DeleteKvRequest(namespace="ORDER_TOPIC_CONFIG", key="TA2"), timeout=10)
    ns.RegisterTopic(api_pb2.RegisterTopicRequest(topic="TNEW", queue_datas=[state_pb2.QueueData(
        broker_name="broker-a", read_queue_nums=2, write_queue_nums=2, perm=6)]), timeout=10)
    ns.DeleteTopic(api_pb2.DeleteTopicRequest(topic="TA3"), timeout=10)
    ns.WipeWritePerm(api_pb2.BrokerPermRequest(broker_name="broker-c"), timeout=10)
    ns.UnregisterBroker(api_pb2.UnregisterBrokerRequest(cluster_name="C2", broker_name="broker-c",
                                                        broker_addr="10.0.0.3:10911"), timeout=10)
    first = ns.BindQueue(api_pb2.BindQueueRequest(topic="TA1", queue_id=0, owner="broker-a"), timeout=10)
    ns.BindQueue(api_pb2.BindQueueRequest(topic="TA1", queue_id=0, owner="broker-x",
                                          expected_version=first.binding.version), timeout=10)
    other = ns.BindQueue(api_pb2.BindQueueRequest(topic="TA1", queue_id=1, owner="broker-a"), timeout=10)
    ns.ReleaseQueue(api_pb2.ReleaseQueueRequest(topic="TA1", queue_id=1, expected_version=other.binding.version),
                    timeout=10)


def _rows(directory: str, upto: int) -> list[tuple]:
    t = pq.read_table(directory, columns=ROW_ID).to_pylist()
    return sorted(tuple(r[c] for c in ROW_ID) for r in t if r["offset"] <= upto)


def test_exported_log_compacts_audits_and_reports_like_the_cluster(make_cluster, spark, tmp_path) -> None:
    c = make_cluster(start=False)
    for n in c.nodes:  # every node archives the log as it commits
        with open(n.config_path, "a") as f:
            f.write(f'\n[archive]\ndir = "{n.name}-archive"\n')
    c.start()
    leader = c.wait_ready()
    _workload(c.followers()[0].ns)
    c.wait_for("broker-b expired", lambda: "broker-b" not in leader.ns.GetClusterInfo(
        api_pb2.GetClusterInfoRequest(), timeout=5).broker_addr_table, timeout=30)
    sts = c.wait_converged()
    at, digest = sts[0].apply_offset, sts[0].digest
    endpoints = ",".join(n.grpc_addr for n in c.nodes)

    # Export, in small segments; a second run finds nothing to do; a lost segment is exported again.
    exp = str(tmp_path / "export")
    args = ["--endpoints", endpoints, "log", "export", "--to", str(at), "--out", exp, "--segment-rows", "15"]
    assert nsctl.main(args) == 0
    ranges = covered_ranges(exp)
    assert len(ranges) >= 3 and ranges[0][0] == 1 and ranges[-1][1] == at
    files = sorted(os.listdir(exp))
    assert nsctl.main(args) == 0 and sorted(os.listdir(exp)) == files
    os.unlink(os.path.join(exp, files[1]))
    assert nsctl.main(args) == 0 and sorted(os.listdir(exp)) == files
    exported = _rows(exp, at)
    kinds = {k.split("/")[0] for _, _, _, k, _, _ in exported}
    assert {"broker", "live", "topic", "kv", "bind"} <= kinds

    # Compaction by Spark gives every node's digest at that offset.
    comp = run_compact(spark, exp, at, str(tmp_path / "state"))
    assert all(s.apply_offset == at and s.digest == digest for s in sts)
    assert comp.digest == digest and comp.keys == sts[0].keys

    # Audit: live nodes and a faithful dump agree; an injected divergence is found and its keys named.
    good = str(tmp_path / "dump-n2")
    assert nsctl.main(["--endpoints", c.nodes[1].grpc_addr, "state", "dump", "--out", good]) == 0
    bad = str(tmp_path / "dump-n2-diverged")
    shutil.copytree(good, bad)
    rows = pq.read_table(os.path.join(bad, DUMP_FILE)).to_pylist()
    target = next(i for i, r in enumerate(rows) if r["key"] == "kv/ORDER_TOPIC_CONFIG/TA1")
    rows[target]["value"] = state_pb2.KvValue(value="broker-z:8").SerializeToString()
    gone = next(r["key"] for r in rows if r["key"].startswith("topic/TA5/"))
    rows = [r for r in rows if r["key"] != gone]
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(os.path.join(good, DUMP_FILE))),
                   os.path.join(bad, DUMP_FILE))
    # The nodes move on past the exported log (as idle no-ops move them twice a second): the audit still
    # compares every node at the log's last offset, a consistent cut, and finds no divergence.
    moved = c.nodes[0].ns.PutKv(api_pb2.PutKvRequest(namespace="after", key="export", value="1"), timeout=10)
    assert moved.offset > at
    c.wait_converged()
    result = run_audit(spark, exp, None, endpoints.split(","), [good, bad], [], str(tmp_path / "audit"))
    verdicts = {v.source.split(" ")[1] if v.source.startswith("dump ") else v.source: v for v in result.verdicts}
    nodes = [v for v in result.verdicts if v.source.startswith("node ")]
    assert len(nodes) == 3 and all(v.match and v.ok for v in nodes)
    assert verdicts[good].ok and verdicts[good].match and verdicts[good].differing_keys == 0
    diverged = verdicts[bad]
    assert not diverged.ok and not result.ok
    assert diverged.rows_digest != diverged.reported_digest
    assert {(k["key"], k["kind"]) for k in diverged.keys} == {
        ("kv/ORDER_TOPIC_CONFIG/TA1", "value_differs"), (gone, "missing_on_node")}

    # Report: tables and an HTML page with charts; broker-b's session ended by expiry, broker-c's by unregister.
    out = str(tmp_path / "report")
    summary = run_report(spark, exp, out, ReportOptions(top=10))
    assert os.path.getsize(os.path.join(out, "report.html")) > 10_000
    for table in summary["tables"]:
        assert os.path.isdir(os.path.join(out, "tables", table))
    ends = {s["addr"]: s["end_reason"] for s in pq.read_table(os.path.join(out, "tables", "sessions")).to_pylist()}
    assert ends["10.0.0.1:10911"] == "open" and ends["10.0.0.3:10911"] == "unregistered"
    assert ends["10.0.0.2:10911"] in ("expired", "unknown")  # "expired" once the leader tags its expiries
    churn = {r["cluster"]: r for r in pq.read_table(os.path.join(out, "tables", "topic_churn")).to_pylist()}
    assert churn["C1"]["creations"] >= 21 and churn["C1"]["deletions"] >= 1

    # The nodes' archivers wrote the same log (flushed when the nodes stop).
    c.stop()
    for n in c.nodes:
        archive = os.path.join(c.root, f"{n.name}-archive")
        assert covered_ranges(archive)[0][0] == 1 and covered_ranges(archive)[-1][1] >= at
        assert _rows(archive, at) == exported
