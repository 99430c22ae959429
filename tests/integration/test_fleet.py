"""The fleet simulator (bench/fleet, bench/loadgen/fleet.go), short version: 50 brokers with their periods
scaled 30 times down, clients polling routes, restarts and topic churn, and a mass expiry of a fifth of the
brokers, against a real 3-node cluster. The report must hold what the capacity model is validated against
(per operation per window, per node, per follower, the fleet in the model's shape), and the mass expiry must
be seen on every node, neither before the brokers' timeout nor long after it. Counts and bounds, not speeds
(the long runs are `make simulate`'s, docs/scaling.md "Simulator runs")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bench.fleet import Fleet
from bench.fleet.__main__ import PRESETS
from bench.fleet.chart import page, svg
from bench.fleet.run import simulate
from bench.fleet.summary import COLUMNS, row
from bench.fleet.validate import compare
from tests.unit.test_capacity import costs_file

pytestmark = pytest.mark.cluster

# The capacity model's fleet input (issue 29): brokers, topics, queues per topic, clients, route-poll period,
# heartbeat period, broker restarts/hour, topic changes/hour; then the simulator's own additions.
MODEL_FLEET = {"brokers", "topics", "queues_per_topic", "clients", "route_poll_period_s", "heartbeat_period_s",
               "broker_restarts_per_hour", "topic_changes_per_hour"}
OP_FIELDS = {"count", "errors", "p50_ms", "p99_ms", "max_ms"}
# How late past its bound a route may still be seen on a machine shared by several test runs: the removal is
# a Raft write that each node applies, and the probe walks its sample one call at a time.
EXPIRY_SLACK_S = 3.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return simulate(PRESETS["short"], str(tmp_path_factory.mktemp("fleet")), log=lambda _: None)


def _ordered(op: dict[str, Any]) -> bool:
    return op["count"] == 0 or 0 < op["p50_ms"] <= op["p99_ms"] <= op["max_ms"]


def test_reports_the_fleet_it_ran_in_the_models_shape(report: dict[str, Any]) -> None:
    sim = PRESETS["short"]
    assert set(report["fleet"]) >= MODEL_FLEET, report["fleet"]
    assert report["fleet"] == sim.fleet.scaled(sim.time_scale).as_dict()
    assert report["represents"] == sim.fleet.as_dict() and report["time_scale"] == sim.time_scale
    assert report["fleet"]["heartbeat_period_s"] == sim.fleet.heartbeat_period_s / sim.time_scale
    assert report["commit"] and report["date"] and report["machine"]["cpus"]


def test_every_window_has_each_operation_and_node(report: dict[str, Any]) -> None:
    sim = PRESETS["short"]
    wins = report["windows"]
    assert len(wins) == round(sim.seconds / sim.window_s)
    for w in wins:
        for op in ("heartbeat", "route"):  # both run all the time, at their periods
            assert set(w["ops"][op]) >= OP_FIELDS and w["ops"][op]["count"] > 0, (w["t_s"], op, w["ops"])
        for op in w["ops"].values():
            assert op["errors"] == 0 and _ordered(op), (w["t_s"], op)
        assert set(w["nodes"]) == {"n1", "n2", "n3"}, w
        assert all(n["cpu_s"] >= 0 and n["rss_bytes"] > 0 for n in w["nodes"].values()), w
        assert len(w["raft_lag"]) == 2 and w["leader"] not in w["raft_lag"], w  # one figure per follower


def test_totals_count_every_kind_of_call(report: dict[str, Any]) -> None:
    ops = report["totals"]["ops"]
    # restarts (104, then a changed 103) and topic churn (a changed 103) ran, beside the steady load
    assert {"heartbeat", "route", "register_changed", "unregister"} <= set(ops), ops
    for name, op in ops.items():
        assert op["errors"] == 0 and op["count"] > 0 and _ordered(op), (name, op, report["first_errors"])
    f = report["fleet"]
    # every broker heartbeats every node each period: about brokers x nodes x seconds / period (the silent
    # fifth stops at 1 s of 7)
    expected = f["brokers"] * 3 * PRESETS["short"].seconds / f["heartbeat_period_s"]
    assert 0.5 * expected < ops["heartbeat"]["count"] <= expected, (ops["heartbeat"], expected)
    kinds = {e["kind"] for e in report["events"]}
    assert {"restart", "topic_added", "topic_removed", "mass_expiry"} <= kinds, kinds
    nodes = report["totals"]["nodes"]
    assert set(nodes) == {"n1", "n2", "n3"} and all(n["cpu_s"] > 0 and n["rss_max_bytes"] > 0
                                                     for n in nodes.values()), nodes
    assert report["setup"]["errors"] == 0 and report["setup"]["registrations"] == f["brokers"] * 3


def test_mass_expiry_is_seen_on_every_node_within_its_bound(report: dict[str, Any]) -> None:
    e = report["expiry"]
    assert e["brokers"] == int(PRESETS["short"].fleet.brokers * PRESETS["short"].mass_expiry_fraction)
    assert e["all_nodes_s"] is not None, e  # every node stopped routing every probed broker's topic
    for gone in e["gone_after_s"]:
        assert e["earliest_s"] <= gone <= e["bound_s"] + EXPIRY_SLACK_S, e
    for node in report["final_check"]:  # after the run, every broker's route on every node
        assert "error" not in node and node["silent_still_routed"] == 0 and node["live_missing"] == 0, node


def test_chart_and_table_row_show_the_run(report: dict[str, Any]) -> None:
    assert row(report).count(" | ") == len(COLUMNS) - 1 and "50 brokers" in row(report)
    chart = svg(report)
    assert chart.lstrip().startswith("<?xml") and "<svg" in chart
    html = page(report, chart)
    assert html.count("<svg") == 1 and '"brokers": 50' in html


def test_scaling_divides_periods_and_multiplies_rates() -> None:
    real = Fleet(brokers=10, topics=10, heartbeat_timeout_s=120, broker_restarts_per_hour=2)
    run = real.scaled(4)
    assert (run.heartbeat_period_s, run.route_poll_period_s, run.heartbeat_timeout_s) == (7.5, 7.5, 30)
    assert run.broker_restarts_per_hour == 8 and run.brokers == 10 and run.topics == 10
    assert real.scaled(1000).heartbeat_timeout_s == 1.0  # the node's floor
    with pytest.raises(ValueError, match="time_scale"):
        real.scaled(0)


@pytest.mark.slow
def test_a_cluster_with_worker_processes_reports_its_cores_apart(tmp_path: Any) -> None:
    # [node] worker_processes = 1: the workers hold the ports, so the heartbeats and routes are theirs to answer;
    # each node's CPU is its core and its worker, the core's sampled apart, and the model compares both
    sim = replace(PRESETS["short"], worker_processes=1, mass_expiry_at_s=-1.0)
    r = simulate(sim, str(tmp_path), log=lambda _: None)
    assert r["cluster"]["worker_processes"] == 1
    ops = r["totals"]["ops"]
    assert ops["heartbeat"]["count"] > 0 and ops["route"]["count"] > 0
    assert all(op["errors"] == 0 for op in ops.values()), (ops, r["first_errors"])
    for name, n in r["totals"]["nodes"].items():
        assert 0 < n["core_cpu_per_s"] < n["cpu_per_s"], (name, n)  # the worker used CPU of its own
    rows, _ = compare(r, costs_file())
    quantities = {row.quantity for row in rows}
    assert {"leader core CPU", "leader's workers CPU", "follower core CPU (mean)",
            "followers' workers CPU (mean)"} <= quantities
