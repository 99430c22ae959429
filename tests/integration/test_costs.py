"""`make costs` writes a costs file the capacity model reads: the recipe's command (with --quick, one
repetition of 1 s loads) against real clusters, then `nsctl plan` on what it wrote. Slow (about 90 s):
make test-slow; the model's arithmetic is tests/unit/test_capacity.py's, in make test."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from nameserver.cli import nsctl
from nameserver.ops.capacity import COST_KEYS, IDLE_KEY, NOTED_KEY, WORKER_RECEIVE_KEY, read_costs
from tests.cluster import ROOT
from tests.integration.test_bench_suite import recipe

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_make_costs_writes_every_cost_the_model_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = recipe("costs")
    assert cmd[1:5] == ["-m", "bench", "--only", "costs"]
    costs = tmp_path / "costs.json"
    # a short work directory: a worker node's private Unix sockets live under it (sun_path: 108 bytes)
    with tempfile.TemporaryDirectory(prefix="costs-") as work:
        cmd = [*cmd[:5], "--quick", "--seconds", "1", "--root", work, "--costs-file", str(costs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(costs.read_text())
    assert doc["schema"] == "rip18-costs/1" and len(doc["commit"]) == 40 and doc["machine"]["cores"] >= 1, doc
    assert doc["machine"]["model"] and "failed" not in doc, doc
    values = read_costs(doc)
    # every cost the model needs, and the idle CPU and the worker-mode heartbeat costs it reads beside them (the
    # request-alone cost is not measured by make costs yet: docs/scaling.md, "Validation against the simulator")
    assert set(values) == set(COST_KEYS) | {IDLE_KEY, NOTED_KEY, f"{WORKER_RECEIVE_KEY}_base",
                                            f"{WORKER_RECEIVE_KEY}_per_topic"}
    assert values[NOTED_KEY] > 0
    for key, cost in doc["costs"].items():
        assert {"value", "unit", "method", "repetitions", "runs", "min", "max", "spread_pct"} <= set(cost), key
        assert len(cost["runs"]) == cost["repetitions"] >= 1, key
    # work was measured: CPU per operation and the memory the state takes are positive
    for key in ("route_read_remoting_cpu_us", "changed_registration_leader_cpu_us_per_topic",
                "memory_per_queue_data_rss_bytes", "route_read_remoting_bytes_out", "expiry_leader_cpu_us"):
        assert values[key] > 0, (key, doc["costs"][key])
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("brokers = 100\ntopics = 1000\nclients = 10000\n")
    assert nsctl.main(["plan", "--fleet", str(fleet), "--costs", str(costs)]) == 0
    assert "saturates first" in capsys.readouterr().out
