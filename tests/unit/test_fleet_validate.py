"""bench.fleet.validate: the capacity model against a simulator report. On a small report worked by hand,
the model runs at the load the cluster served, only steady windows count (not the mass expiry's removals,
not a window whose leader changed), and a quantity off by more than 20 % is flagged."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench.fleet.validate import compare, main, steady_windows, table
from tests.unit.test_capacity import costs_file

# With test_capacity's round costs: 30 brokers of 10 topics, each heartbeating every 10 s to 3 nodes (9/s
# served), 30 clients x 2 routes every 10 s (6/s), one topic change a window reaching the 3 nodes (0.1/s).
# Leader's core: 0.1 x (2000 + 30 x 10) + 3 x (400 + 10 x 10) + 3 x 2 followers x 50 + reads 6 x 200 / 3
# = 2430 us/s; a follower's: 0.1 x (200 + 20 x 10) + 3 x 500 + 400 = 1940 us/s.
# Memory: 60e6 + 30 x 4000 + 300 x 800 + 2400 x 5 = 60,372,000 B.
STEADY_OPS = {"heartbeat": {"count": 90}, "route": {"count": 60}, "register_changed": {"count": 3},
              "unregister": {"count": 0}}
WILD = {"n1": {"cpu_s": 5.0, "rss_bytes": 10**10}, "n2": {"cpu_s": 5.0, "rss_bytes": 10**10},
        "n3": {"cpu_s": 5.0, "rss_bytes": 10**10}}


def _steady(t: int) -> dict[str, Any]:
    return {"t_s": t, "ops": copy.deepcopy(STEADY_OPS), "leader": "n1",
            "nodes": {"n1": {"cpu_s": 0.0243, "rss_bytes": 66_409_200},  # x1.1 of the model's memory
                      "n2": {"cpu_s": 0.0194, "rss_bytes": 60_000_000},
                      "n3": {"cpu_s": 0.0291, "rss_bytes": 60_000_000}}}  # followers' mean x1.25 of the model's


def report() -> dict[str, Any]:
    wild_ops = {k: {"count": 1000} for k in STEADY_OPS}
    return {
        "fleet": {"brokers": 30, "topics": 300, "queues_per_topic": 8, "clients": 30, "topics_per_client": 2,
                  "route_poll_period_s": 10.0, "heartbeat_period_s": 10.0, "heartbeat_timeout_s": 20.0,
                  "broker_restarts_per_hour": 0, "topic_changes_per_hour": 360, "restart_downtime_s": 1.0},
        "cluster": {"nodes": 3},
        "simulation": {"seconds": 50, "window_s": 10, "mass_expiry_at_s": 15, "mass_expiry_fraction": 0.1},
        # the silenced brokers went between 15 + 5 and 15 + 20 s: windows 20 and 30 hold their removals
        "expiry": {"at_s": 15, "earliest_s": 5, "all_nodes_s": 20},
        "windows": [_steady(0), _steady(10),
                    {"t_s": 20, "ops": wild_ops, "leader": "n1", "nodes": WILD},
                    {"t_s": 30, "ops": wild_ops, "leader": "n1", "nodes": WILD},
                    {"t_s": 40, "ops": wild_ops, "leader": "n2", "nodes": WILD}],  # an election
    }


def test_only_steady_windows_count() -> None:
    assert [w["t_s"] for w in steady_windows(report())] == [0, 10]


def test_the_model_at_the_load_served_against_the_measured_figures() -> None:
    rows, info = compare(report(), costs_file())
    by = {r.quantity: r for r in rows}
    served = info["fleet_at_served_load"]
    assert (served.brokers, served.topics, served.clients, served.topics_per_client) == (30, 300, 30, 2)
    assert served.topic_changes_per_hour == pytest.approx(360)
    # offered: 9 heartbeats/s, then 5 s of window 10 with a tenth silent: (9 + 8.55) / 2
    assert by["heartbeats served, all nodes"].predicted == pytest.approx(8.775)
    assert by["heartbeats served, all nodes"].measured == pytest.approx(9.0)
    assert by["route reads served, all nodes"].ratio == pytest.approx(1.0)
    assert by["leader node CPU"].predicted == pytest.approx(0.00243)
    assert by["leader node CPU"].ratio == pytest.approx(1.0) and by["leader node CPU"].within
    assert by["follower node CPU (mean)"].predicted == pytest.approx(0.00194)
    assert by["follower node CPU (mean)"].ratio == pytest.approx(1.25)
    assert not by["follower node CPU (mean)"].within
    assert by["all nodes CPU"].predicted == pytest.approx(0.00243 + 2 * 0.00194)
    assert by["memory per node (RSS)"].predicted == pytest.approx(60_372_000 / 2**20)
    assert by["memory per node (RSS)"].ratio == pytest.approx(1.1)
    text = table(rows)
    assert "| follower node CPU (mean) | 0.002 cores | 0.002 cores | 1.25 | **no** |" in text
    assert "| leader node CPU | 0.002 cores | 0.002 cores | 1.00 | yes |" in text


def test_a_report_with_no_steady_window_is_refused() -> None:
    r = report()
    r["windows"] = r["windows"][2:4]
    with pytest.raises(ValueError, match="no steady window"):
        compare(r, costs_file())


def test_the_command_prints_a_table_per_report(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    (tmp_path / "r.json").write_text(json.dumps(report()))
    (tmp_path / "c.json").write_text(json.dumps(costs_file()))
    assert main([str(tmp_path / "r.json"), "--costs", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "Steady windows starting at 0, 10 s (20 s)" in out and "| memory per node (RSS) |" in out


def worker_report() -> dict[str, Any]:
    """report() as run with one worker process a node, each node's core CPU sampled apart. The model at the load
    served, with test_capacity's costs (no note figure: the leader's 50 us per forwarded liveness stands in):
    - the leader's core: 0.1 x (2000 + 30 x 10) + 3 x 50 noted + 3 x 2 followers x 50 + feeding 0.1 x 50 = 685 us/s
      (no route read: the workers hold the ports);
    - a follower's core: 0.1 x (200 + 20 x 10) + 3 x 50 + 5 = 195 us/s;
    - a node's worker: reads 6 x 200 / 3 + heartbeats 3 x (400 + 10 x 10) + following 0.1 x (100 + 10 x 10)
      = 1920 us/s."""
    r = report()
    r["cluster"]["worker_processes"] = 1
    for w in r["windows"]:
        for n in w["nodes"].values():
            n["core_cpu_s"] = n["cpu_s"] / 2
    for t in (0, 1):
        r["windows"][t]["nodes"] = {
            "n1": {"cpu_s": 0.00685 + 0.0192, "core_cpu_s": 0.00685, "rss_bytes": 120_744_000},
            "n2": {"cpu_s": 0.00195 + 0.0192, "core_cpu_s": 0.00195, "rss_bytes": 60_000_000},
            "n3": {"cpu_s": 0.0039 + 0.0192, "core_cpu_s": 0.0039, "rss_bytes": 60_000_000}}  # mean x1.5
    return r


def test_a_cluster_with_workers_is_costed_with_them_core_and_workers_apart() -> None:
    rows, _ = compare(worker_report(), costs_file())
    by = {r.quantity: r for r in rows}
    assert by["leader core CPU"].predicted == pytest.approx(0.000685)
    assert by["leader core CPU"].ratio == pytest.approx(1.0)
    assert by["leader's workers CPU"].predicted == pytest.approx(0.00192)
    assert by["leader's workers CPU"].ratio == pytest.approx(1.0)
    assert by["follower core CPU (mean)"].predicted == pytest.approx(0.000195)
    assert by["follower core CPU (mean)"].ratio == pytest.approx(1.5) and not by["follower core CPU (mean)"].within
    assert by["followers' workers CPU (mean)"].ratio == pytest.approx(1.0)
    assert by["all nodes CPU"].predicted == pytest.approx(0.000685 + 2 * 0.000195 + 3 * 0.00192)
    # the model's memory: a core and one worker, each holding the state
    assert by["memory per node (RSS)"].predicted == pytest.approx(2 * 60_372_000 / 2**20)
    assert by["memory per node (RSS)"].ratio == pytest.approx(1.0)


def test_a_worker_report_without_the_cores_cpu_apart_is_refused() -> None:
    r = worker_report()
    del r["windows"][0]["nodes"]["n2"]["core_cpu_s"]
    with pytest.raises(ValueError, match="core_cpu_s"):
        compare(r, costs_file())
