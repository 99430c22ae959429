"""The remoting benchmark (bench_remoting.py) measures something on both sides: a short run, every figure
positive and no errors (speeds are for docs/benchmarks.md, never asserted)."""

from __future__ import annotations

import pytest

from . import jars
from .bench_remoting import run

pytestmark = pytest.mark.interop


def test_short_run_measures_both_sides() -> None:
    res = run(jars.LINE_5, [1, 2], 1.0)
    for side in ("stock", "ours"):
        for kind in ("reads", "registrations", "unchanged"):
            for clients, load in res[side][kind].items():
                what = f"{side} {kind} c={clients}"
                assert load["errors"] == 0, f"{what}: {load['first_error']}"
                assert load["n"] > 0 and load["per_s"] > 0 and load["p99_ms"] >= load["p50_ms"] > 0, (what, load)
    assert set(res["ratios"]) == {"reads", "registrations", "unchanged"}
