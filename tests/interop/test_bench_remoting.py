"""The remoting benchmark (bench_remoting.py) measures something on both sides of every setup: a short
run, every figure positive and no errors (speeds are for docs/benchmarks.md, never asserted)."""

from __future__ import annotations

import pytest

from bench.remoting import SETUPS, markdown, run

from . import jars

pytestmark = pytest.mark.interop


def test_short_run_measures_both_sides() -> None:
    res = run(jars.LINE_5, [1, 2], 1.0)
    assert set(res["setups"]) == set(SETUPS)
    for setup, out in res["setups"].items():
        for side in ("stock", "ours"):
            for kind in ("reads", "registrations", "unchanged"):
                for clients, load in out[side][kind].items():
                    what = f"{setup} {side} {kind} c={clients}"
                    assert load["errors"] == 0, f"{what}: {load['first_error']}"
                    assert load["n"] > 0 and load["per_s"] > 0 and load["p99_ms"] >= load["p50_ms"] > 0, (what, load)
                    assert load["server_us_per_op"] > 0 and load["loadgen_us_per_op"] >= 0, (what, load)
        assert set(out["ratios"]) == set(out["cpu_ratios"]) == {"reads", "registrations", "unchanged"}
    assert res["setups"]["core"]["server_cpus"] != "all" and res["setups"]["node"]["server_cpus"] == "all"
    assert "per core" in markdown(res) and "Errors: 0." in markdown(res)
