"""`make bench` and `make bench-quick` produce a report: their recipes, run as the Makefile has them, with one
short part (`--only failover`, two trials) so that the run fits in make test. (Once, both targets named a
module without an entry point and silently did nothing.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.cluster import ROOT

pytestmark = pytest.mark.cluster


def recipe(target: str) -> list[str]:
    """The command line of a Makefile target's line that runs the suite (`$(PY) -m bench`), with $(PY) as
    this interpreter (the target may install tools on lines before it)."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.+\n)+)", text, re.M)
    assert m, f"no target {target} in the Makefile"
    lines = [line.split("&&")[-1].strip() for line in m.group(1).splitlines()]  # "mkdir -p data && $(PY) -m bench"
    line = next((line for line in lines if line.startswith("$(PY) -m bench")), "")
    assert line, f"target {target} does not run $(PY) -m bench"
    return [sys.executable if word == "$(PY)" else word for word in line.split()]


def test_the_bench_targets_run_the_suite_and_write_a_report(tmp_path) -> None:
    full, quick = recipe("bench"), recipe("bench-quick")
    assert full[1:3] == quick[1:3] == ["-m", "bench"] and "--quick" in quick
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    cmd = [*quick, "--only", "failover", "--failover-trials", "2", "--root", str(tmp_path / "work"),
           "--json", str(out_json), "--report", str(out_md)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out_json.read_text())
    assert result["meta"]["command"].startswith("python -m bench --quick")
    failover = result["failover"]
    assert failover["trials"] == 2 and len(failover["times_s"]) == 2, failover
    assert all(t > 0 for t in failover["times_s"]), failover
    report = out_md.read_text()
    assert "ailover" in report and report.strip() in proc.stdout


def run_part(tmp_path, command: list[str]) -> tuple[dict, str, str]:
    """Run the suite's `command` with a short root (a node's private socket lives in its data directory,
    and a unix socket's path is at most 107 bytes: pytest's tmp_path is long); its JSON, report and stdout."""
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    root = tempfile.mkdtemp(prefix="bc-")
    try:
        proc = subprocess.run([*command, "--root", root, "--json", str(out_json), "--report", str(out_md)],
                              capture_output=True, text=True, timeout=900, cwd=ROOT)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out_json.read_text()), out_md.read_text(), proc.stdout


# `make test-slow` (a minute or two: three stock NameServer JVMs, five clusters of ours, two replicas);
# `make bench-quick` runs the part for real.
@pytest.mark.slow
def test_the_cores_part_runs_and_reports_issue_27s_yardsticks(tmp_path) -> None:
    result, report, stdout = run_part(tmp_path, [*recipe("bench-quick"), "--only", "cores", "--seconds", "0.5",
                                                 "--cores-clients", "1,2", "--worker-processes", "2",
                                                 "--idle-seconds", "0.2"])
    cores = result["cores"]
    loads = [(f"{setup} {side} c={c}", row) for setup, out in cores["stock"]["setups"].items()
             for side in ("stock", "ours") for c, row in out[side]["reads"].items()]
    loads += [(f"scaling w={w} {kind}", row) for w, rows in cores["scaling"].items() for kind, row in rows.items()]
    loads += [(f"{r['label']} {k}", r[k]) for r in cores["replicas"]["rows"]
              for k in ("reads", "writes", "writes_replicas_yielding") if k in r]
    # setups x sides x clients, scaling w=1,2 x reads/writes, replica rows (voters, +2, +2 on the leader) x
    # reads/writes, and the registrations again with the replicas yielding the CPU on the two rows with replicas
    assert len(loads) == 3 * 2 * 2 + 2 * 2 + 3 * 2 + 2, [name for name, _ in loads]
    for name, row in loads:  # each row measured something, with its CPU per operation on both ends
        assert row["errors"] == 0, f"{name}: {row['first_error']}"
        assert row["n"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0, (name, row)
        assert row["server_us_per_op"] > 0 and row["loadgen_us_per_op"] >= 0, (name, row)
    assert set(cores["scaling"]) == {"1", "2"}
    assert cores["projection"]["cores"] == 16 and cores["projection"]["reads_per_s"] > 0
    assert cores["projection"]["writes_per_s"] > 0
    assert len(cores["targets"]) == 3 * 2 + 2 and all(isinstance(t["met"], bool) for t in cores["targets"])
    for heading in ("beside the stock NameServer", "**Scaling: one node, worker_processes 1 vs 2**",
                    "**A projection, not a measurement: 16 cores**", "**3 voters with and without 2 read replicas**",
                    "**Issue 27's remoting targets**"):
        assert heading in report, heading
    assert "Errors: 0." in report and report.strip() in stdout


# `make test-slow` (under a minute: a 3-node cluster with one group, then one with two, one worker each)
@pytest.mark.slow
def test_the_groups_part_loads_one_group_and_two_side_by_side(tmp_path) -> None:
    result, report, _ = run_part(tmp_path, [sys.executable, "-m", "bench", "--only", "groups", "--seconds", "2",
                                         "--concurrency", "2", "--topics", "4"])
    groups = result["groups"]
    for variant in ("1", "2"):  # every registration acknowledged, in both
        assert groups[variant]["2"]["per_s"] > 0 and groups[variant]["2"]["errors"] == 0, groups
    assert "2 Raft groups against 1" in report
