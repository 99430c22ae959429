"""Pieces of the comparative benchmark that need no processes: etcd key ranges, ratios, the report,
and the clear failure when etcd cannot be installed."""

from __future__ import annotations

import pytest

from bench import compare, etcd
from bench.pb.etcd.etcdserverpb import rpc_pb2


def test_prefix_end() -> None:
    assert etcd.prefix_end(b"topic/T/") == b"topic/T0"
    assert etcd.prefix_end(b"a\xff") == b"b"
    assert etcd.prefix_end(b"\xff\xff") == b"\0"


def test_etcd_messages_keep_etcds_field_numbers() -> None:
    # A few spot checks against etcd 3.4's rpc.proto (the full copy is checked when trimmed).
    f = rpc_pb2.RangeRequest.DESCRIPTOR.fields_by_name
    assert (f["key"].number, f["range_end"].number, f["serializable"].number) == (1, 2, 7)
    assert rpc_pb2.WatchResponse.DESCRIPTOR.fields_by_name["events"].number == 11
    assert rpc_pb2.Compare.DESCRIPTOR.fields_by_name["range_end"].number == 64
    assert rpc_pb2.DESCRIPTOR.services_by_name["KV"].full_name == "etcdserverpb.KV"
    assert rpc_pb2.DESCRIPTOR.services_by_name["Maintenance"].methods_by_name["Status"].full_name == \
        "etcdserverpb.Maintenance.Status"


def test_missing_etcd_fails_with_a_clear_message(monkeypatch, tmp_path) -> None:
    script = tmp_path / "ensure.sh"
    script.write_text("echo 'ensure-debian-package: etcd missing; run as root: apt-get install -y etcd-server' >&2\n"
                      "exit 1\n")
    monkeypatch.setattr(etcd.shutil, "which", lambda name: None)
    monkeypatch.setattr(etcd, "ENSURE_SCRIPT", str(script))
    with pytest.raises(etcd.EtcdUnavailable, match="etcd-server"):
        etcd.ensure_etcd()
    with pytest.raises(etcd.EtcdUnavailable):  # before anything is started
        compare.run_compare(str(tmp_path / "run"), 1.0, [1])
    assert not (tmp_path / "run").exists()


def _load(per_s: float, p50: float = 1.0, p99: float = 2.0, records: int = 0) -> dict:
    return {"threads": 1, "seconds": 1.0, "n": int(per_s), "per_s": per_s, "p50_ms": p50, "p99_ms": p99,
            "mean_ms": p50, "records": records, "records_per_s": float(records), "errors": 0,
            "client_cpu_cores": 0.5, "server_cpu_cores": 0.5,
            "per_node": {"n1": {"per_s": per_s, "p99_ms": p99}}}


def _side(reg: float, reads: float, watch_p99: float) -> dict:
    return {"registration": {"1": _load(reg, records=int(reg * 9))}, "route_reads": _load(reads),
            "linearizable_reads": _load(reads / 2), "watch": {"p50_ms": 0.5, "p99_ms": watch_p99, "missing": 0},
            "registration_check": {"counted": 9, "in_cluster": 9, "ok": True, "method": "m"}}


def test_ratios_targets_and_markdown() -> None:
    res = {"ours": _side(200, 3000, 4.0), "etcd": _side(100, 1500, 1.0), "ceiling": _side(1000, 6000, 0)}
    res["ratios"], res["targets"] = compare.ratios(res)
    assert res["ratios"]["registration"]["1"]["records_per_s_ours_etcd"] == 2.0
    assert res["ratios"]["registration"]["1"]["ops_per_s_ours_ceiling"] == 0.2
    assert res["ratios"]["route_reads"]["per_s_ours_ceiling"] == 0.5
    assert res["targets"]["registration_records_per_s_ge_etcd"]["met"]
    assert res["targets"]["route_reads_per_s_ge_etcd"]["met"]
    assert res["targets"]["watch_p99_le_50ms"]["met"]
    res["meta"] = {"topics_per_broker": 8, "read_threads": 6, "date": "d", "seconds_per_workload": 1.0,
                   "etcd_version": "3.4.23", "durability": {"ours": "raft.fsync = true"},
                   "machine": {"cores": 2, "cpu": "x", "python": "3.11", "grpcio": "1",
                               "load_average_at_start": [0, 0, 0]}}
    table = compare.markdown(res)
    assert "| registration (8 topics, 9 records), 1 client | **1,800 records/s**" in table
    assert "route reads/s >= etcd: met" in table


def test_issue27_targets_and_the_row_without_workers() -> None:
    ours = _side(200, 3000, 4.0) | {"worker_processes": 2}
    none = _side(100, 1000, 4.0) | {"worker_processes": 0}
    ours["registration"]["16"] = _load(150, records=150 * 9)
    none["registration"]["16"] = _load(50, records=50 * 9)
    etcd = _side(100, 1500, 1.0)
    etcd["registration"]["16"] = _load(200, records=200 * 9)  # ours / etcd at 16 clients: 0.75
    ceiling = _side(1000, 6000, 0)
    ceiling["registration"]["16"] = _load(1000)
    res = {"ours": ours, "ours_no_workers": none, "etcd": etcd, "ceiling": ceiling,
           "ceiling_one_process": {"route_reads": _load(2500)}}
    res["ratios"], res["targets"] = compare.ratios(res)
    assert res["ratios"]["workers_gain"] == {"registration 1": 2.0, "registration 16": 3.0, "route_reads": 3.0,
                                             "linearizable_reads": 3.0}
    got = {t["target"]: (t["ratio"], t["threshold"], t["met"]) for t in res["targets"]["issue27"]}
    assert got == {"registration records/s >= etcd, 1 client": (2.0, 1.0, True),
                   "registration records/s >= etcd, 16 clients": (0.75, 1.0, False),
                   "linearizable reads/s >= etcd": (2.0, 1.0, True),
                   "route reads/s >= 1.5x etcd": (2.0, 1.5, True),
                   "route reads/s above the one-process echo ceiling": (1.2, 1.0, True)}
    res["meta"] = {"topics_per_broker": 8, "read_threads": 6, "date": "d", "seconds_per_workload": 1.0,
                   "etcd_version": "3.4.23", "durability": {"ours": "raft.fsync = true"}, "ours_worker_processes": 2,
                   "machine": {"cores": 2, "cpu": "x", "python": "3.11", "grpcio": "1",
                               "load_average_at_start": [0, 0, 0]}}
    for side in ("ours", "ours_no_workers", "etcd", "ceiling"):  # every row shows the servers' CPU per op
        for load in [*res[side]["registration"].values(), res[side]["route_reads"]]:
            load["server_us_per_op"] = 250.0
    table = compare.markdown(res)
    assert "**Ours with 2 worker processes per node beside ours without**" in table
    assert "| registration, 16 clients | 150 reg/s, p50 1.00 / p99 2.00 ms, 250 µs CPU/op | 50.0 reg/s" in table
    assert "| registration records/s >= etcd, 16 clients | 0.75 | 1 | NOT met |" in table
    assert "| route reads/s above the one-process echo ceiling | 1.20 | 1 | met |" in table
