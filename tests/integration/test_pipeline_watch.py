"""The continuous audit (pipeline/watch.py) against a real 3-process cluster that runs idle no-ops: cut after
cut it says ok while the cluster is idle or busy; then one replica's state is corrupted (its snapshot
rewritten with one value changed and a digest to match, as a bug in apply would leave it, so every
checksum passes) and the next cut names that node, the metric says so, and once the log covers the dump
it took of that node, the differing key is named."""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver.cli import nsctl
from nameserver.pb import api_pb2, state_pb2
from pipeline.audit import render, run_audit
from pipeline.watch import Watcher, WatchOptions, serve_metrics
from raftlog.digest import digest_hex, pair_hash
from snapshot import SnapshotStore
from tests.cluster import free_ports, register_request, retry

pytestmark = [pytest.mark.cluster, pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")]

KEY = "kv/AUDIT/victim"


def _corrupt_snapshot(data_dir: str, key: str, value: bytes) -> int:
    """Rewrite the node's latest snapshot (raft.dump) with `key` set to `value` and the digest to match."""
    dump = os.path.join(data_dir, "raft", "raft.dump")
    scratch = SnapshotStore(os.path.join(data_dir, "scratch"))
    info, items = scratch.load(dump)
    rows = list(items)
    digest = int(info.digest, 16)
    for i, (k, v, ver, t) in enumerate(rows):
        if k == key:
            digest ^= pair_hash(k, v) ^ pair_hash(k, value)
            rows[i] = (k, value, ver, t)
    assert digest != int(info.digest, 16), f"{key} is not in the snapshot"
    forged = scratch.write(info.offset, info.term, digest_hex(digest), iter(rows), info.meta)
    os.replace(forged.path, dump)
    return info.offset


def _metrics(addr: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, s.labels.get("node") or s.labels.get("result", "")): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _export(endpoints: str, out: str) -> None:
    assert nsctl.main(["--endpoints", endpoints, "log", "export", "--from", "1", "--out", out,
                       "--segment-rows", "40"]) == 0


def test_continuous_audit_stays_quiet_on_a_healthy_cluster_and_names_a_corrupted_replica(
        make_cluster, spark, tmp_path) -> None:
    c = make_cluster(metrics=True)  # runs the idle no-op: the nodes move on twice a second
    leader = c.wait_ready()
    ns = leader.ns
    retry(lambda: ns.RegisterBroker(register_request("C1", "broker-a", "10.0.0.1:10911", ["T1", "T2"]), timeout=10))
    ns.PutKv(api_pb2.PutKvRequest(namespace="AUDIT", key="victim", value="right"), timeout=10)
    c.wait_converged()
    endpoints = ",".join(n.grpc_addr for n in c.nodes)
    segments, work = str(tmp_path / "segments"), str(tmp_path / "work")
    _export(endpoints, segments)

    watcher = Watcher(spark, WatchOptions(segments, endpoints.split(","), work, interval_s=0.5))
    listen = f"127.0.0.1:{free_ports(1)[0]}"
    server = serve_metrics(watcher.registry, listen)
    try:
        first = watcher.step()
        assert first.new and not first.diverged and [n.verdict for n in first.nodes] == ["matches"] * 3
        time.sleep(1.5)  # idle: only no-ops; the same cut again
        again = watcher.step()
        assert not again.new and again.offset == first.offset and not again.diverged
        # busy: writes, a new export, a new cut
        for i in range(10):
            ns.RegisterBroker(register_request("C1", "broker-a", "10.0.0.1:10911", [f"T{j}" for j in range(i + 3)],
                                               counter=i + 2), timeout=10)
        _export(endpoints, segments)
        busy = watcher.step()
        assert busy.new and busy.offset > first.offset and not busy.diverged
        assert all(n.verdict == "matches" for n in busy.nodes)
        m = _metrics(listen)
        assert m[("pipeline_audit_cut_offset", "")] == busy.offset
        assert all(m[("pipeline_audit_replica_diverged", n.grpc_addr)] == 0 for n in c.nodes)
        assert all(m[("pipeline_audit_replica_comparable", n.grpc_addr)] == 1 for n in c.nodes)
        assert m[("pipeline_audit_cuts_total", "ok")] == 3 and m[("pipeline_audit_cuts_total", "divergence")] == 0

        # Corrupt n3: its snapshot now says KEY is "wrong"; checksums and stamped digest agree with it.
        victim = c.nodes[2]
        assert victim.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30).offset > 0
        c.kill(victim, signal.SIGTERM)
        _corrupt_snapshot(os.path.join(c.root, "n3-data"), KEY, state_pb2.KvValue(value="wrong").SerializeToString())
        c.start(victim)
        c.wait_for("n3 ready", lambda: (s := victim.status()) is not None and s.ready, timeout=60)
        ns.PutKv(api_pb2.PutKvRequest(namespace="AUDIT", key="after", value="1"), timeout=10)
        top = ns.PutKv(api_pb2.PutKvRequest(namespace="AUDIT", key="after2", value="2"), timeout=10).offset
        c.wait_for("n3 caught up", lambda: (s := victim.status()) is not None and s.apply_offset >= top, timeout=30)
        _export(endpoints, segments)
        found = watcher.step()
        assert found.diverged == [victim.grpc_addr]
        assert [n.verdict for n in found.nodes[:2]] == ["matches", "matches"]
        assert _metrics(listen)[("pipeline_audit_replica_diverged", victim.grpc_addr)] == 1
        assert _metrics(listen)[("pipeline_audit_replica_diverged", c.nodes[0].grpc_addr)] == 0

        # The dump the watcher took of n3 is compared once the log covers it: the key is named.
        ns.PutKv(api_pb2.PutKvRequest(namespace="AUDIT", key="after3", value="3"), timeout=10)
        _export(endpoints, segments)
        named = watcher.step()
        bad = next(n for n in named.nodes if n.node == victim.grpc_addr)
        assert bad.verdict == "DIFFERS" and bad.differing_keys == 1
        assert [(k["key"], k["kind"]) for k in bad.keys] == [(KEY, "value_differs")]
        assert _metrics(listen)[("pipeline_audit_replica_differing_keys", victim.grpc_addr)] == 1

        # The one-shot audit says the same, and names the key too (it dumps n3, reads the log on from n1/n2).
        one = run_audit(spark, segments, None, endpoints.split(","), [], [], None)
        assert not one.ok
        by_node = {v.source.rsplit("(", 1)[-1].rstrip(")"): v for v in one.verdicts}
        assert by_node[c.nodes[0].grpc_addr].match and by_node[c.nodes[1].grpc_addr].match
        assert by_node[victim.grpc_addr].match is False
        assert [(k["key"], k["kind"]) for k in by_node[victim.grpc_addr].keys] == [(KEY, "value_differs")]
        assert KEY in render(one) and "DIFFERS" in render(one)

        # A watcher restarted on the same work directory resumes from its last cut.
        resumed = Watcher(spark, WatchOptions(segments, endpoints.split(","), work, interval_s=0.5))
        assert resumed.base is not None and resumed.base.offset == named.offset
        assert resumed.step().diverged == [victim.grpc_addr]
    finally:
        server.shutdown()
