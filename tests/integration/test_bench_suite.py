"""`make bench` and `make bench-quick` produce a report: their recipes, run as the Makefile has them, with one
short part (`--only failover`, two trials) so that the run fits in make test. (Once, both targets named a
module without an entry point and silently did nothing.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

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
