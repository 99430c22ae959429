"""The soak's short version (the hour is `make soak`): the same harness, 40 s, a fault every 8 s."""

from __future__ import annotations

import os

import pytest

from tests.soak.soak import soak

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(900)
def test_a_short_soak_holds_every_check_and_reports(tmp_path) -> None:
    report = soak(str(tmp_path / "cluster"), minutes=40 / 60, fault_every_s=8, sample_every_s=3, calibrate_s=4,
                  out=str(tmp_path / "out"))
    assert len(report["faults"]) >= 4, report["faults"]
    assert report["checks"]["acked"] >= 50
    assert all(report["maxima"][k] > 0 for k in ("registration", "route_read", "kv_write", "binding")), \
        report["maxima"]
    samples = report["samples"]
    assert len(samples) >= 12 and all(s["nodes"] for s in samples)
    assert all(v["rss_mib"] > 10 and v["fds"] > 5 for s in samples for v in s["nodes"].values())
    moving = [s for s in samples[1:] if s["rates"].get("registration", 0) > 0 and s["rates"].get("route_read", 0) > 0]
    assert len(moving) >= len(samples) // 2, "the paced load stalled"
    assert os.path.getsize(tmp_path / "out" / "soak.png") > 10_000
