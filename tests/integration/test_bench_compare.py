"""The comparative benchmark (bench/compare.py) on real processes: ours, etcd and the echo ceiling, with the
Python load generator (--loadgen python) and the compiled one (the default, bench/gocompare.py).

Short runs (0.5 s per load, 1 and 4 clients) that must measure something on every side: every figure
positive, no errors, and the records the harness counted equal to the records each cluster holds.
etcd is installed when missing (Debian's etcd-server); if that is impossible the run fails with
EtcdUnavailable, it is not skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

from bench.compare import markdown, run_compare

pytestmark = pytest.mark.cluster


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def _positive(load: dict, what: str) -> None:
    assert load["errors"] == 0, f"{what}: {load.get('first_error')}"
    for k in ("n", "per_s", "p50_ms", "p99_ms", "server_us_per_op"):  # every row with the servers' CPU per op
        assert load[k] > 0, f"{what}: {k} = {load[k]}"
    assert load["p99_ms"] >= load["p50_ms"]


# `make test-slow` (30 s); `make bench-quick` runs the compare part for real.
@pytest.mark.slow
def test_compare_short_run_measures_every_side() -> None:
    root = tempfile.mkdtemp(prefix="pc-")  # short: pytest's tmp_path can make a node's unix socket path too long
    try:
        res = run_compare(root, 0.5, [1, 4], read_threads=6, worker_processes=1, loadgen="python",
                          log=lambda s: None)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert res["meta"]["loadgen"] == "python"
    json.loads(json.dumps(res, allow_nan=False))  # plain JSON, no NaN: nothing went unmeasured
    assert set(res) >= {"meta", "ours", "ours_no_workers", "etcd", "ceiling", "ceiling_one_process", "ratios",
                        "targets"}
    assert (res["ours"]["worker_processes"], res["ours_no_workers"]["worker_processes"]) == (1, 0)
    for c in ("1", "4"):  # the row without workers beside the row with them, for each load
        _positive(res["ours_no_workers"]["registration"][c], f"ours without workers, registration c={c}")
    _positive(res["ours_no_workers"]["route_reads"], "ours without workers, route reads")
    _positive(res["ceiling_one_process"]["route_reads"], "one echo process, route reads")
    assert all(x > 0 for x in res["ratios"]["workers_gain"].values()), res["ratios"]["workers_gain"]
    assert [t["target"] for t in res["targets"]["issue27"]] == [
        "registration records/s >= etcd, 1 client", "linearizable reads/s >= etcd", "route reads/s >= 1.5x etcd",
        "route reads/s above the one-process echo ceiling"]
    assert res["meta"]["etcd_version"].startswith("3.")
    for side in ("ours", "etcd", "ceiling"):
        assert set(res[side]["registration"]) == {"1", "4"}
        for c, load in res[side]["registration"].items():
            _positive(load, f"{side} registration c={c}")
            assert load["threads"] == int(c)
        for w in ("reregistration", "reregistration_spread"):
            assert set(res[side][w]) == {"1", "4"}, (side, w)
            for c, load in res[side][w].items():
                _positive(load, f"{side} {w} c={c}")
        _positive(res[side]["route_reads"], f"{side} route reads")
        assert len(res[side]["route_reads"]["per_node"]) == 3
        assert all(n["per_s"] > 0 for n in res[side]["route_reads"]["per_node"].values())
    for side in ("ours", "etcd"):
        for c, load in res[side]["registration"].items():
            assert load["records_per_s"] > 0
            # every registration writes the broker's record and one per topic (ours: its first, one more)
            assert load["records"] >= load["n"] * 9, f"{side} c={c}: {load['records']} records in {load['n']} ops"
        check = res[side]["registration_check"]
        assert check["counted"] > 0 and check["counted"] == check["in_cluster"], check
        _positive(res[side]["linearizable_reads"], f"{side} linearizable reads")
        watch = res[side]["watch"]
        assert watch["writes"] > 10 and watch["missing"] == 0 and watch["p99_ms"] >= 0, watch
    for c in ("1", "4"):
        r = res["ratios"]["registration"][c]
        assert r["records_per_s_ours_etcd"] > 0 and r["ops_per_s_ours_ceiling"] > 0
    assert res["ratios"]["route_reads"]["per_s_ours_etcd"] > 0
    table = markdown(res)
    assert "| registration (8 topics, 9 records), 4 clients |" in table and "watch propagation" in table
    assert "| re-registration, unchanged (8 topics), over every node, 4 clients |" in table
    assert not _processes_mentioning(res["meta"]["run_dir"]), "processes left running after the run"


# `make test-slow` (about a minute: ours with grpcio, ours behind the Go front end, etcd, one echo process;
# a cold build of bench/gofront and front/ adds a minute or more).
@pytest.mark.slow
def test_compare_with_the_compiled_load_generator_measures_every_side() -> None:
    root = tempfile.mkdtemp(prefix="gc-")  # short: a node's unix socket path is at most 107 bytes
    try:
        res = run_compare(root, 0.5, [1, 4], worker_processes=1, rounds=1, log=lambda s: None)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    json.loads(json.dumps(res, allow_nan=False))
    assert res["meta"]["loadgen"] == "go" and res["meta"]["fronts"] == ["grpcio", "go"]
    assert [r["system"] for r in res["runs"]] == ["ours-grpcio", "ours-go", "etcd", "echo"]
    for run in res["runs"]:
        workloads = ("route_reads",) if run["system"] == "echo" else ("registration", "linearizable_reads",
                                                                       "route_reads")
        for w in workloads:
            assert set(run[w]) == {"1", "4"}, (run["system"], w)
            for c, row in run[w].items():
                what = f"{run['system']} {w} c={c}"
                assert row["errors"] == 0, f"{what}: {row['first_error']}"
                for k in ("calls", "per_s", "p50_ms", "p99_ms", "server_us_per_op", "loadgen_us_per_op"):
                    assert row[k] > 0, f"{what}: {k} = {row[k]}"
                assert row["other_cores"] >= 0, what  # the rest of the machine, measured over every load
                if w == "registration":  # every timed registration wrote the broker's record and one per topic
                    assert row["records"] == row["calls"] * 9, what
                if w != "registration" and run["system"] != "echo" and c == "4":  # spread over the 3 nodes
                    assert len(row["calls_per_addr"]) == 3, (what, row["calls_per_addr"])
        for check in run.get("registration_check", []):
            assert check["ok"] and check["counted"] > 0, (run["system"], check)
    for f in ("grpcio", "go"):
        assert [t["target"] for t in res["targets"]["issue27"][f]] == [
            "registration records/s >= etcd, 1 client", "linearizable reads/s >= etcd",
            "route reads/s >= 1.5x etcd", "route reads/s above the one-process echo ceiling"]
        assert all(v > 0 for t in res["targets"]["issue27"][f] for v in t["ratios"].values())
    table = markdown(res)
    assert "| route reads | 4 | ours-go |" in table and "**The Go front end over grpcio" in table
    assert not _processes_mentioning(res["meta"]["run_dir"]), "processes left running after the run"


# `make test-slow` (seconds once bench/gofront is built; a cold build takes a minute or more).
@pytest.mark.slow
def test_the_load_generator_checks_and_sums_reply_fields(tmp_path) -> None:
    """Against an echo server (each reply is the request): a request without the required field is a
    mismatch, not a call; the summed field adds up over the timed calls and, apart, the untimed ones."""
    from bench import gocompare
    from bench.echo import METHOD, EchoProcess
    from nameserver.pb import api_pb2

    with_records = api_pb2.RegisterBrokerReply(records=9).SerializeToString()
    without = api_pb2.RegisterBrokerReply(offset=5).SerializeToString()  # records 0: the field is absent
    requests = tmp_path / "r.reqs"
    # client 0 cycles through group 0 (two replies with records), client 1 through group 1 (one without)
    requests.write_bytes(gocompare.frame([with_records, with_records, without, with_records]))
    with EchoProcess(log_path=str(tmp_path / "echo.log")) as echo:
        row = gocompare.run_load(gocompare.binary(), [echo.addr], METHOD, str(requests), 2, 1.0,
                                 [echo.proc.pid] if echo.proc else [], group=2, require_field=2, sum_field=2)
    assert row["calls"] > 0 and row["records"] == 9 * row["calls"], row
    # client 1 alternates: every other call of its is a mismatch (counted with the errors)
    assert row["errors"] > 0 and "has no field 2" in row["first_error"], row
    # the untimed first calls: client 0 starts at its group's first request, client 1 at its second (i mod 2)
    assert row["records_written"] - row["records"] == 18, row
    assert row["server_us_per_op"] > 0 and row["loadgen_us_per_op"] > 0
