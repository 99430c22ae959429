"""The cores part's arithmetic and report (bench/cores.py) on a made-up result: the projection's formula, the
targets against issue 27's thresholds, and the tables. No processes, no speeds."""

from __future__ import annotations

from typing import Any

from bench import cores


def _row(per_s: float, server_us: float, core_us: float = 0.0) -> dict[str, Any]:
    return {"clients": 8, "inflight": 1, "n": int(per_s), "per_s": per_s, "errors": 0, "first_error": "",
            "p50_ms": 1.0, "p90_ms": 1.5, "p99_ms": 2.0, "max_ms": 3.0, "server_cpu_s": 1.0,
            "server_us_per_op": server_us, "core_us_per_op": core_us, "loadgen_cpu_s": 0.1, "loadgen_us_per_op": 20.0}


def test_projection_reads_every_core_writes_bound_by_the_core_or_the_workers() -> None:
    # reads: 16 cores / 200 µs; writes: the workers' 300 µs over 15 cores (50,000/s) beat the core's 100 µs
    p = cores.projection({"reads": _row(5000, 200, 5), "registrations": _row(2000, 400, 100)})
    assert p == {"cores": 16, "reads_per_s": 80_000, "writes_per_s": 10_000,
                 "writes_bound": "the core process (one core)"}
    p = cores.projection({"reads": _row(5000, 200), "registrations": _row(2000, 3010, 10)}, cores=4)
    assert (p["writes_per_s"], p["writes_bound"]) == (1000, "the workers")


def _result() -> dict[str, Any]:
    setups = {}
    for setup, ratio in (("core", 1.25), ("node", 0.8), ("machine", 2.0)):
        setups[setup] = {"server_cpus": "0" if setup == "core" else "all", "loadgen_cpus": "1" if setup == "core"
                         else "all", "ours_nodes": 3 if setup == "machine" else 1,
                         "stock": {"reads": {"1": _row(1000, 100), "8": _row(4000, 80)}},
                         "ours": {"reads": {"1": _row(1000 * ratio, 90, 10), "8": _row(4000 * ratio, 70, 5)}},
                         "ratios": {"reads": {"1": ratio, "8": ratio}}}
    rows = [{"label": "voters-0", "replicas": 0, "reads": _row(9000, 100), "writes": _row(1000, 300),
             "reads_per_s": 9000, "writes_per_s": 1000, "read_errors": 0, "write_errors": 0,
             "leader_us_per_write": 300.0, "leader_cpu_idle": 0.01},
            {"label": "voters+2-replicas-0", "replicas": 2, "reads": _row(9900, 100), "writes": _row(850, 320),
             "reads_per_s": 9900, "writes_per_s": 850, "read_errors": 0, "write_errors": 0,
             "leader_us_per_write": 320.0, "leader_cpu_idle": 0.03}]
    res: dict[str, Any] = {
        "meta": {"seconds_per_load": 1.0, "clients": [1, 8], "worker_processes": 2, "cpus": 2, "noise": 0.1,
                 "project_cores": 16},
        "stock": {"meta": {"stock": "Apache RocketMQ 5.5.0 NameServer"}, "setups": setups},
        "scaling": {"1": {"reads": _row(3000, 150, 5), "registrations": _row(800, 500, 200)},
                    "2": {"reads": _row(4500, 160, 5), "registrations": _row(900, 520, 200)}},
        "replicas": {"rows": rows, "summary": {"leader_cores_idle_per_replica": 0.01,
                                               "leader_us_per_write_per_replica": 10.0,
                                               "writes_with_without": 0.85, "reads_with_without": 1.1,
                                               "writes_with_without_yielding": 0.95}}}
    res["projection"] = {**cores.projection(res["scaling"]["2"]), "from_workers": 2}
    res["targets"] = cores.targets(res)
    return res


def test_targets_against_issue_27s_thresholds() -> None:
    got = {t["target"]: (t["ratio"], t["threshold"], t["met"]) for t in _result()["targets"]}
    assert got == {
        "route reads, one node with its workers >= the stock NameServer, 1 connection": (0.8, 1.0, False),
        "route reads, one node with its workers >= the stock NameServer, 8 connections": (0.8, 1.0, False),
        "route reads, per core (pinned) >= the stock NameServer, 1 connection": (1.25, 1.0, True),
        "route reads, per core (pinned) >= the stock NameServer, 8 connections": (1.25, 1.0, True),
        "route reads, our 3-node cluster >= one stock node, 1 connection": (2.0, 1.0, True),
        "route reads, our 3-node cluster >= one stock node, 8 connections": (2.0, 1.0, True),
        "writes with 2 read replicas not lower beyond noise (their CPU yielding to the voters', as on machines "
        "of their own)": (0.95, 0.9, True),
        "writes with 2 read replicas not lower beyond noise (sharing the voters' CPUs)": (0.85, 0.9, False)}


def test_report_has_a_row_per_load_and_labels_the_projection() -> None:
    text = cores.markdown(_result())
    assert "| per node | 8 | 4,000 (1.0 / 2.0) | 80 | 3,200 (1.0 / 2.0) | 70 (5) | 20 / 20 | 0.80 |" in text
    assert "| route reads | 2 | 4,500 (1.0 / 2.0) | 160 | 5 | 20 | 1.50 |" in text
    assert "**A projection, not a measurement: 16 cores**" in text and "**100,000 reads/s**" in text
    assert "| voters+2-replicas-0 | 9,900 (1.0 / 2.0) | 100 | 20 | 850 (1.0 / 2.0) | 320 | 20 | 0.03 |" in text
    assert ("| writes with 2 read replicas not lower beyond noise (sharing the voters' CPUs) | 0.85 | 0.9 "
            "| NOT met |") in text
    assert "writes 0.85x (the replicas yielding the CPU: 0.95x)" in text
    assert "Errors: 0." in text


def test_the_route_seed_heartbeats_like_a_live_broker_until_it_leaves(monkeypatch) -> None:
    """A run past 120 s lost every route topic (the seed registered once and was expired as silent): the
    seed's unchanged registration repeats every HEARTBEAT_S while inside, and stops when it leaves."""
    import threading
    import time

    from bench import remoting

    calls: list[tuple[str, list[str], int]] = []

    class Seed:
        def register(self, addr: str, topics: list[str], counter: int = 1, **_: object) -> None:
            calls.append((addr, topics, counter))

    monkeypatch.setattr(remoting, "HEARTBEAT_S", 0.02)
    stop = threading.Event()
    beats = threading.Thread(target=remoting._heartbeats, args=(Seed(), "127.0.0.1:9876", stop), daemon=True)
    beats.start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    beats.join(5)
    assert not beats.is_alive()
    assert len(calls) >= 3 and all(c == ("127.0.0.1:9876", remoting.ROUTE_TOPICS, 1) for c in calls)
