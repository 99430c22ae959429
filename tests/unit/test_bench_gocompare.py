"""The compare's compiled load generator, the parts that need no processes (bench/gocompare.py): the request
files, the generator's command line and report, the medians, ratios and issue 27's targets, the table, the
compare's --loadgen and --rounds, and its fallback to the Python load generator when Go does not build."""

from __future__ import annotations

import json
import resource
import time

import pytest

from bench import compare, gocompare, load


def _unframe(data: bytes) -> list[bytes]:
    out = []
    while data:
        n, shift, k = 0, 0, 0
        while True:
            b = data[k]
            n |= (b & 0x7F) << shift
            shift += 7
            k += 1
            if b < 0x80:
                break
        out.append(data[k:k + n])
        data = data[k + n:]
    return out


def test_frame_writes_each_request_with_its_uvarint_length() -> None:
    msgs = [b"", b"a", b"x" * 127, b"y" * 128, b"z" * 20_000]
    data = gocompare.frame(msgs)
    assert data[:2] == b"\x00\x01" and data[131:133] == b"\x80\x01"  # 128 as a two-byte uvarint
    assert _unframe(data) == msgs


def test_load_command_names_every_flag() -> None:
    cmd = gocompare.load_command("/bin/g", ["a:1", "b:2"], "/S/M", "/r.reqs", 16, 5.0, group=2, require_field=2,
                                 sum_field=2)
    assert cmd[:2] == ["/bin/g", "load"]
    flags = {f: cmd[i + 1] for i, f in enumerate(cmd) if f.startswith("-") and f != "-announce"}
    assert flags["-addrs"] == "a:1,b:2" and flags["-method"] == "/S/M" and flags["-requests"] == "/r.reqs"
    assert (flags["-clients"], flags["-seconds"], flags["-group"]) == ("16", "5.0", "2")
    assert (flags["-require-field"], flags["-sum-field"]) == ("2", "2")
    assert "-announce" in cmd and "-expect" not in cmd


def _report(**over: object) -> str:
    g = {"clients": 4, "conns": 4, "seconds": 2.0, "calls": 1000, "errors": 1, "mismatches": 2, "first_error": "e",
         "calls_per_s": 500.0, "p50_ms": 1.5, "p99_ms": 9.0, "cpu_s": 0.2, "cpu_us_per_call": 200.0,
         "cpu_cores": 0.1, "field_sum": 9000, "calls_per_addr": {"a:1": 1000}, "untimed_ok": 4,
         "untimed_field_sum": 27}
    return json.dumps(g | over)


def test_parse_result_records_cpu_and_errors() -> None:
    row = gocompare.parse_result(_report(), server_cpu_s=3.0)
    assert (row["per_s"], row["records"], row["records_per_s"], row["records_written"]) == (500.0, 9000, 4500.0, 9027)
    assert (row["server_us_per_op"], row["server_cores"]) == (3000.0, 1.5)
    assert (row["loadgen_us_per_op"], row["loadgen_cores"]) == (200.0, 0.1)
    assert row["errors"] == 3 and row["first_error"] == "e"
    etcd = gocompare.parse_result(_report(), server_cpu_s=None, records_per_call=9)  # records per answered call
    assert (etcd["records"], etcd["records_written"]) == (9000, 9036) and "server_us_per_op" not in etcd
    none = gocompare.parse_result(_report(calls=0, calls_per_s=0.0), server_cpu_s=1.0)
    assert none["server_us_per_op"] is None and none["loadgen_us_per_op"] is None


def test_parse_result_says_what_the_rest_of_the_machine_took() -> None:
    # 2 s window: the servers 3.0 s of CPU, the generator 0.2 s, the whole machine 4.0 s: others took 0.4 cores
    row = gocompare.parse_result(_report(), server_cpu_s=3.0, machine_cpu_s=4.0)
    assert row["other_cores"] == 0.4
    assert gocompare.parse_result(_report(), server_cpu_s=3.0, machine_cpu_s=3.1)["other_cores"] == 0.0  # ticks
    assert "other_cores" not in gocompare.parse_result(_report(), server_cpu_s=3.0)


def test_machine_busy_counts_this_process_too() -> None:
    mine0, machine0 = resource.getrusage(resource.RUSAGE_SELF), load.machine_busy_s()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    mine1, machine1 = resource.getrusage(resource.RUSAGE_SELF), load.machine_busy_s()
    mine = (mine1.ru_utime + mine1.ru_stime) - (mine0.ru_utime + mine0.ru_stime)
    assert machine1 - machine0 >= mine - 0.05  # the clock ticks /proc/stat counts in (and others' on top)


def test_parse_result_names_what_is_wrong() -> None:
    with pytest.raises(RuntimeError, match="not JSON"):
        gocompare.parse_result("gofront: connection refused", 1.0)
    without = {k: v for k, v in json.loads(_report()).items() if k != "p99_ms"}
    with pytest.raises(RuntimeError, match="lacks p99_ms"):
        gocompare.parse_result(json.dumps(without), 1.0)


def _row(per_s: float, server_us: float, records_per_s: float = 0.0) -> dict:
    return {"per_s": per_s, "records_per_s": records_per_s, "p50_ms": 1.0, "p99_ms": 2.0, "server_us_per_op": server_us,
            "server_cores": 1.0, "loadgen_us_per_op": 100.0, "loadgen_cores": 0.2, "errors": 0}


def _run(system: str, rnd: int, reg: float, lin: float, route: float, us: float) -> dict:
    run = {"round": rnd, "system": system}
    if system != "echo":
        run["registration"] = {c: _row(reg / 9, us * 4, reg) for c in ("1", "16", "64")}
        run["linearizable_reads"] = {c: _row(lin, us * 2) for c in ("1", "16", "64")}
        run["registration_check"] = [{"counted": 9, "in_cluster": 9, "ok": True, "method": "m"}]
    run["route_reads"] = {c: _row(route, us) for c in ("1", "16", "64")}
    return run


def _result() -> dict:
    runs = []
    for rnd, k in ((1, 1.0), (2, 3.0)):  # two rounds: the medians are the means of the two here
        runs += [_run("ours-grpcio", rnd, 900 * k, 450 * k, 1000 * k, 400), _run("ours-go", rnd, 1000 * k, 600 * k,
                                                                                 3000 * k, 200),
                 _run("etcd", rnd, 1000 * k, 500 * k, 1500 * k, 250), _run("echo", rnd, 0, 0, 2000 * k, 300)]
    summary = gocompare.summarize(runs)
    rat = gocompare.ratios(summary, ["grpcio", "go"])
    meta = {"date": "d", "machine": {"cores": 2, "cpu": "x", "load_average_at_start": [1, 2, 3]},
            "etcd_version": "3.4.23", "rounds": 2, "fronts": ["grpcio", "go"], "seconds_per_load": 5.0,
            "ours_worker_processes": 1, "topics_per_broker": 8, "records_per_registration": 9,
            "durability": {"ours": "raft.fsync = true"}, "load_average_at_end": [3, 2, 1], "loadgen": "go",
            "notes": ["n"]}
    return {"meta": meta, "runs": runs, "summary": summary, "ratios": rat,
            "targets": {"issue27": {f: gocompare.issue27(rat, f) for f in ("grpcio", "go")}}}


def test_medians_ratios_and_issue27s_targets() -> None:
    r = _result()
    route = r["summary"]["ours-go"]["route_reads"]["16"]
    assert route["per_s"] == 6000 and route["per_s_range"] == [3000, 9000] and route["rounds"] == 2
    assert r["ratios"]["go"]["route_reads"]["16"] == {"throughput_ours_etcd": 2.0, "server_us_per_op_ours_etcd": 0.8,
                                                     "per_s_ours_echo": 1.5}
    assert r["ratios"]["grpcio"]["registration"]["64"]["throughput_ours_etcd"] == 0.9  # records/s, not calls/s
    assert r["ratios"]["go_over_grpcio"]["route_reads"]["1"] == {"throughput": 3.0, "server_us_per_op": 0.5}
    got = {f: {t["target"]: t["met"] for t in r["targets"]["issue27"][f]} for f in ("grpcio", "go")}
    assert got["go"] == {"registration records/s >= etcd, 1 client": True,
                         "registration records/s >= etcd, 16 clients": True,
                         "registration records/s >= etcd, 64 clients": True,
                         "linearizable reads/s >= etcd": True, "route reads/s >= 1.5x etcd": True,
                         "route reads/s above the one-process echo ceiling": True}
    assert not any(got["grpcio"].values())


def test_a_read_target_is_met_only_at_every_concurrency_and_the_echo_strictly() -> None:
    rat = {"go": {"linearizable_reads": {"1": {"throughput_ours_etcd": 1.2}, "64": {"throughput_ours_etcd": 0.99}},
                  "route_reads": {"1": {"throughput_ours_etcd": 1.5, "per_s_ours_echo": 1.0}}}}
    got = {t["target"]: t["met"] for t in gocompare.issue27(rat, "go")}
    assert got == {"linearizable reads/s >= etcd": False, "route reads/s >= 1.5x etcd": True,
                   "route reads/s above the one-process echo ceiling": False}


def test_markdown_through_the_compare() -> None:
    table = compare.markdown(_result())  # the compare hands a Go run's result to gocompare.markdown
    assert "| route reads | 16 | ours-go | 6,000/s [3,000-9,000] | 1.00 / 2.00 | 200 (1.00) | 100 (0.20) | " \
           "2.00, 0.80; / echo 1.50 | 0 |" in table
    assert "| registration | 1 | etcd | 2,000 records/s (222/s) [111-333] |" in table
    assert "| route reads | 1 | 3.00 | 0.50 |" in table  # go over grpcio
    assert "| route reads/s >= 1.5x etcd | 1: 0.67, 16: 0.67, 64: 0.67 | 1.5 | NOT met |" in table
    assert "6 of 6 loads equal" in table and "- n" in table
    assert "Other processes" not in table  # rows without the rest of the machine's CPU (an older run's)


def test_markdown_says_how_busy_the_machine_was() -> None:
    r = _result()
    for run in r["runs"]:
        for w in gocompare.WORKLOADS:
            for c, row in run.get(w, {}).items():
                row["other_cores"] = 0.5 if (run["system"], w, c) == ("ours-go", "route_reads", "64") else 0.1
    r["summary"] = gocompare.summarize(r["runs"])
    assert r["summary"]["ours-go"]["route_reads"]["64"]["other_cores"] == 0.5
    assert ("Other processes on the machine took at most 0.50 cores during a load (route reads at 64 on ours-go)"
            in gocompare.markdown(r))


def test_loadgen_and_rounds_arguments(monkeypatch, tmp_path, capsys) -> None:
    seen = {}

    def fake(root, seconds, concurrency, sections, **kw):
        seen.update(kw)
        return {"meta": {"loadgen": "fake"}}

    monkeypatch.setattr(compare, "run_compare", fake)
    monkeypatch.setattr(compare, "markdown", lambda r: "table")
    assert compare.main(["--root", str(tmp_path)]) == 0
    assert (seen["loadgen"], seen["rounds"]) == ("go", gocompare.DEFAULT_ROUNDS)
    assert compare.main(["--root", str(tmp_path), "--loadgen", "python", "--rounds", "3"]) == 0
    assert (seen["loadgen"], seen["rounds"]) == ("python", 3)
    with pytest.raises(SystemExit):
        compare.main(["--root", str(tmp_path), "--loadgen", "java"])
    with pytest.raises(SystemExit):
        compare.main(["--root", str(tmp_path), "--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
    monkeypatch.undo()
    with pytest.raises(ValueError, match="loadgen"):  # before etcd or anything else is started
        compare.run_compare(str(tmp_path / "run"), 1.0, [1], loadgen="java")
    assert not (tmp_path / "run").exists()


class _Started(Exception):
    pass


def test_falls_back_to_the_python_load_generator_naming_why(monkeypatch, tmp_path) -> None:
    def no_go() -> str:
        raise gocompare.GoUnavailable("bench/gofront did not build: go: command not found")

    def cluster(*args, **kwargs):
        raise _Started  # the Python path's first cluster: far enough

    monkeypatch.setattr(compare, "ensure_etcd", lambda: "/usr/bin/etcd")
    monkeypatch.setattr(compare, "etcd_version", lambda binary: "3.4.23")
    monkeypatch.setattr(gocompare, "binary", no_go)
    monkeypatch.setattr(compare, "LocalCluster", cluster)
    logged: list[str] = []
    with pytest.raises(_Started):
        compare.run_compare(str(tmp_path), 1.0, [1], log=logged.append)
    assert any("Python one ran" in m and "go: command not found" in m for m in logged), logged


def test_a_failed_go_build_is_go_unavailable(monkeypatch) -> None:
    def broken(source):
        raise RuntimeError("`go` is not on PATH")

    monkeypatch.setattr(gocompare.loadgen, "build", broken)
    with pytest.raises(gocompare.GoUnavailable, match="not on PATH"):
        gocompare.binary()
