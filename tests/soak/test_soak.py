"""The soak's short version (the hour is `make soak`): the same harness, 15 s, a fault 2 s after the last healed."""

from __future__ import annotations

import os

import pytest

from tests.soak.soak import soak

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(900)
def test_a_short_soak_holds_every_check_and_reports(tmp_path) -> None:
    report = soak(str(tmp_path / "cluster"), minutes=15 / 60, fault_every_s=2, sample_every_s=1.5, calibrate_s=3,
                  out=str(tmp_path / "out"))
    assert len(report["faults"]) >= 3, report["faults"]
    assert report["checks"]["acked"] >= 50
    assert all(report["maxima"][k] > 0 for k in ("registration", "route_read", "kv_write", "binding")), \
        report["maxima"]
    samples = report["samples"]
    assert len(samples) >= 8 and all(s["nodes"] for s in samples)
    for name in ("n1", "n2", "n3"):  # a sample may catch a killed node still starting: judge by the median
        rss = sorted(s["nodes"][name]["rss_mib"] for s in samples if name in s["nodes"])
        fds = [s["nodes"][name]["fds"] for s in samples if name in s["nodes"]]
        assert rss[len(rss) // 2] > 30 and 20 < max(fds) < 500, (name, rss, fds)
    moving = [s for s in samples[1:] if s["rates"].get("registration", 0) > 0 and s["rates"].get("route_read", 0) > 0]
    assert len(moving) >= len(samples) // 2, "the paced load stalled"
    assert os.path.getsize(tmp_path / "out" / "soak.png") > 10_000
