"""Compact and audit on a real Spark standalone cluster: a master and two workers, each its own JVM, started
by the project's launcher (pipeline/standalone.py); the jobs are submitted from `python -m pipeline` as a
user would, and the executors run a Python that holds pandas and pyarrow but not this project, so the
pipeline reaches them only through the zip the jobs ship."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nameserver.logformat.segments import DUMP_FILE, write_dump
from pipeline import standalone
from pipeline.replay import replay
from pipeline.synth import FleetSpec, generate
from tests.cluster import free_ports

pytestmark = pytest.mark.cluster

EXECUTOR_VENV = os.path.expanduser("~/.cache/rip18/spark-executor")
C1_ONLY = "-XX:TieredStopAtLevel=1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("spark-standalone"))
    c = standalone.start(directory, workers=2, cores=1, memory="1200m", port=free_ports(1)[0], venv=EXECUTOR_VENV)
    yield c
    assert standalone.stop(directory)
    assert not any(standalone._running(p) for p in c.pids)


def _job(c: standalone.Cluster, *args: str, relative: bool = False) -> subprocess.CompletedProcess[str]:
    python = os.path.relpath(c.executor_python) if relative else c.executor_python  # as a user types it
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args, "--master", c.master_url, "--executor-python", python,
         "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.executor.memory=900m",
         # short jobs: the JVMs compile with C1 only (as tests/conftest.py's local session does)
         "--conf", f"spark.driver.extraJavaOptions={C1_ONLY}", "--conf", f"spark.executor.extraJavaOptions={C1_ONLY}",
         "--json"],
        capture_output=True, text=True, timeout=300)


def test_executors_run_a_python_without_the_project(cluster) -> None:
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('pandas') and u.find_spec('pyarrow') " \
            "and not u.find_spec('pipeline') and not u.find_spec('raftlog') and not u.find_spec('grpc') else 1)"
    assert subprocess.run([cluster.executor_python, "-c", probe], cwd="/", timeout=60).returncode == 0
    with urllib.request.urlopen(f"{cluster.web_url}/json/", timeout=5) as r:
        status = json.load(r)
    assert status["status"] == "ALIVE" and status["aliveworkers"] == 2 and status["cores"] == 2


# 64 s of make test's 20 minutes: `make test-slow`. make test keeps the cluster's start and its executors'
# Python (above), and the same jobs on a local Spark (tests/integration/test_pipeline.py).
@pytest.mark.slow
def test_compact_and_audit_run_in_the_cluster_executors(cluster, tmp_path) -> None:
    log = str(tmp_path / "log")
    synth = generate(log, FleetSpec(records=8_000, clusters=2, groups_per_cluster=3, topics_per_group=10,
                                    race_rate=0.05, rows_per_segment=2500, seed=5))
    kv, expected = replay(log)
    assert synth.failed_batches > 0  # the precondition walk has work to do in the executors
    good, bad = str(tmp_path / "dump-good"), str(tmp_path / "dump-bad")
    write_dump(good, ((k, v, ver, t) for k, v, ver, t in kv.items()), kv.offset, kv.digest_hex, "replay")
    shutil.copytree(good, bad)
    rows = pq.read_table(os.path.join(bad, DUMP_FILE)).to_pylist()
    dropped = rows.pop(len(rows) // 2)["key"]
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(os.path.join(good, DUMP_FILE))),
                   os.path.join(bad, DUMP_FILE))

    comp = _job(cluster, "compact", "--log", log, "--out", str(tmp_path / "state"))
    assert comp.returncode == 0, comp.stderr[-3000:]
    result = json.loads(comp.stdout)
    assert (result["digest"], result["keys"], result["failed_batches"]) == \
        (expected.digest, expected.keys, synth.failed_batches)

    audit = _job(cluster, "audit", "--log", log, "--dump", good, "--dump", bad, relative=True)
    assert audit.returncode == 1, audit.stderr[-3000:]  # a divergence: exit 1
    verdicts = {v["source"].split(" ")[1]: v for v in json.loads(audit.stdout)["verdicts"]}
    assert verdicts[good]["ok"] and verdicts[good]["match"]
    assert not verdicts[bad]["ok"] and [(k["key"], k["kind"]) for k in verdicts[bad]["keys"]] == \
        [(dropped, "missing_on_node")]

    # Both jobs ran as applications of the standalone master, on its workers' executors.
    with urllib.request.urlopen(f"{cluster.web_url}/json/", timeout=5) as r:
        apps = {a["name"] for a in json.load(r)["completedapps"]}
    assert {"rip18-compact", "rip18-audit"} <= apps
