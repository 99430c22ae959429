"""The capacity model (nameserver/ops/capacity.py) and `nsctl plan`: given costs and a fleet, the plan is the
arithmetic worked by hand below, the same every time; bad fleets and costs files are refused naming the field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nameserver.cli import nsctl
from nameserver.ops.capacity import COST_KEYS, Fleet, PlanError, plan, read_costs

# Round numbers, so each expected figure below is checkable by hand.
COSTS: dict[str, float] = {
    "route_read_grpc_cpu_us": 300, "route_read_remoting_cpu_us": 200, "route_read_grpc_bytes_out": 300,
    "route_read_remoting_bytes_out": 1000, "route_read_remoting_bytes_in": 100, "route_brokers": 4,
    "heartbeat_receive_cpu_us_base": 400, "heartbeat_receive_cpu_us_per_topic": 10,
    "heartbeat_forwarded_leader_cpu_us_base": 50,
    "heartbeat_bytes_in_base": 400, "heartbeat_bytes_in_per_topic": 200,
    "changed_registration_leader_cpu_us_base": 2000, "changed_registration_leader_cpu_us_per_topic": 30,
    "changed_registration_follower_cpu_us_base": 200, "changed_registration_follower_cpu_us_per_topic": 20,
    "changed_registration_follower_bytes_in_base": 500, "changed_registration_follower_bytes_in_per_topic": 2,
    "changed_registration_worker_replica_cpu_us_base": 100, "changed_registration_worker_replica_cpu_us_per_topic": 10,
    "changed_registration_follower_cpu_us_with_workers_base": 300,
    "changed_registration_follower_cpu_us_with_workers_per_topic": 20, "worker_replicas_measured": 2,
    "linearizable_read_serving_cpu_us": 600, "linearizable_read_leader_cpu_us": 100,
    "watch_event_cpu_us": 100, "watch_event_bytes_out": 150, "expiry_leader_cpu_us": 2000,
    "memory_node_idle_rss_bytes": 60e6, "memory_worker_idle_rss_bytes": 60e6, "memory_per_broker_rss_bytes": 4000,
    "memory_per_queue_data_rss_bytes": 800, "memory_per_queue_rss_bytes": 5, "memory_per_kv_byte_rss": 5,
}
# 20 topics per broker, 1,000 route reads/s, 100 heartbeats/s per node, 1 changed registration and 1 expiry per s.
FLEET = {"brokers": 1000, "topics": 10_000, "brokers_per_topic": 2, "clients": 30_000, "heartbeat_s": 10,
         "broker_restarts_per_hour": 3600}


def costs_file(costs: dict[str, float] = COSTS) -> dict[str, object]:
    return {"schema": "rip18-costs/1", "costs": {k: {"value": v, "unit": "", "method": ""} for k, v in costs.items()}}


def test_the_plan_is_the_arithmetic_worked_by_hand() -> None:
    assert set(COSTS) == set(COST_KEYS)
    p = plan(Fleet.from_dict(FLEET), read_costs(costs_file()))
    steps = {s.name: s.value for s in p.steps}
    assert steps["topics per broker"] == 20
    assert steps["route reads"] == 1000
    assert steps["heartbeats per node"] == 100
    # 1 x (2000 + 30 x 20) + 100 x (400 + 10 x 20) + 100 x 2 x 50 (forwarded liveness: no topics) + 1 x 2000
    assert steps["leader core CPU for writes"] == pytest.approx(2600 + 60_000 + 10_000 + 2000)
    assert p.groups == 1
    # reads 1000 x 200 us over 3 cores beside the busiest core's 74,600 us fit 700,000: no worker
    assert steps["read-serving CPU, whole fleet"] == pytest.approx(200_000)
    assert (p.workers_per_node, p.read_replicas) == (0, 0)
    # 60e6 + 1000 x 4000 + 20,000 queue datas x 800 + 160,000 queues x 5
    assert p.memory_per_node_bytes == pytest.approx(60e6 + 4e6 + 16e6 + 0.8e6)
    # 1000/3 x (1000 x 2/4 + 100) + 100 x (400 + 200 x 20) + 1 x 2 x (500 + 2 x 20)
    assert p.network_per_node_bytes_per_s == pytest.approx(200_000 + 440_000 + 1080)
    assert p.saturates_first == "leader core CPU (writes)"
    # the leader's core also serves its third of the reads (no worker)
    assert p.saturation["leader core CPU (writes)"] == pytest.approx(700_000 / (74_600 + 200_000 / 3))
    assert p.saturation["read-serving CPU (voters' cores)"] == pytest.approx(3 * 7 * (700_000 - 300) / 200_000)
    assert plan(Fleet.from_dict(FLEET), read_costs(costs_file())).to_dict() == p.to_dict()  # deterministic


def test_the_leader_pays_a_forwarded_heartbeat_whatever_its_topics() -> None:
    # A follower forwards a heartbeat's liveness (names and address), not its topic table: 4x the topics per
    # broker raises what each node pays to receive a heartbeat, not what the leader pays per forwarded one.
    def forwarded(topics: int) -> float:
        steps = {s.name: s.value for s in plan(Fleet.from_dict({**FLEET, "topics": topics,
                                                                "broker_restarts_per_hour": 0}),
                                               read_costs(costs_file())).steps}
        received = steps["heartbeats per node"] * (400 + 10 * steps["topics per broker"])
        return steps["leader core CPU for writes"] - received

    assert forwarded(10_000) == forwarded(40_000) == pytest.approx(100 * 2 * 50)


def test_a_read_heavy_fleet_gets_workers_then_read_replicas() -> None:
    p = plan(Fleet.from_dict({**FLEET, "clients": 3_000_000}), read_costs(costs_file()))
    steps = {s.name: s.value for s in p.steps}
    # 100,000 reads/s x 200 us = 20e6 us/s, and each voter's 100 heartbeats/s x (400 + 10 x 20) us go to its
    # workers; a worker has 700,000 - 1 x (100 + 10 x 20) us/s
    assert steps["heartbeats a node's workers receive (CPU)"] == pytest.approx(60_000)
    assert steps["read-serving processes needed"] == math.ceil((20e6 + 3 * 60_000) / 699_700) == 29
    assert p.workers_per_node == 7  # cores_per_node 8 - 1
    assert p.read_replicas == 29 - 21
    assert p.saturates_first == "read-serving CPU (voters' cores)"
    assert p.saturation["read-serving CPU (voters' cores)"] == pytest.approx(3 * 7 * 699_700 / (20e6 + 3 * 60_000))
    assert p.memory_per_node_bytes == pytest.approx(60e6 + 20.8e6 + 7 * (60e6 + 20.8e6))


def test_with_workers_the_core_serves_no_read_and_pays_only_the_heartbeats_liveness() -> None:
    # The workers hold the node's ports (nameserver/worker.py): no client read reaches the core, and of each
    # heartbeat only its liveness note (no costs key here: the leader's 50 us per forwarded liveness stands in).
    p = plan(Fleet.from_dict({**FLEET, "clients": 3_000_000}), read_costs(costs_file()))
    steps = {s.name: s.value for s in p.steps}
    assert steps["the core's share of client reads"] == 0
    # 1 x (2000 + 30 x 20) + 100 x 50 noted + 100 x 2 x 50 forwarded + 1 x 2000; feeding 7 workers 1 x 50 us each
    assert steps["leader core CPU for writes, with workers"] == pytest.approx(2600 + 5000 + 10_000 + 2000)
    assert steps["the leader's core in one group, all it does"] == pytest.approx(19_600 + 7 * 50)
    assert steps["a follower core's CPU (with workers)"] == pytest.approx(1 * (200 + 20 * 20) + 5000 + 7 * 50)
    assert p.saturation["leader core CPU (writes)"] == pytest.approx(700_000 / 19_950)
    assert any("heartbeat_noted_core_cpu_us" in n for n in p.notes)
    assert any("heartbeat_worker_receive_cpu_us" in n for n in p.notes)
    # with no worker (the light fleet) those figures are not used, and the plan does not speak of them
    assert not any("heartbeat_noted_core_cpu_us" in n or "heartbeat_worker_receive_cpu_us" in n
                   for n in plan(Fleet.from_dict(FLEET), read_costs(costs_file())).notes)


def test_with_workers_the_measured_note_and_worker_receive_costs_are_used_when_given() -> None:
    doc = costs_file({**COSTS, "heartbeat_noted_core_cpu_us": 30, "heartbeat_worker_receive_cpu_us_base": 500,
                      "heartbeat_worker_receive_cpu_us_per_topic": 5, "remoting_heartbeat_alone_cpu_us": 300,
                      "remoting_read_alone_cpu_us": 0})
    doc["idle_cpu_cores_per_node"] = {"n1": 0.01, "n2": 0.01, "n3": 0.01}
    p = plan(Fleet.from_dict({**FLEET, "clients": 3_000_000}), read_costs(doc))
    steps = {s.name: s.value for s in p.steps}
    # the heartbeat's receive and its cost alone are the workers': 100 x (500 + 5 x 20 + 300)
    assert steps["heartbeats a node's workers receive (CPU)"] == pytest.approx(90_000)
    assert steps["leader core CPU for writes, with workers"] == pytest.approx(2600 + 100 * 30 + 10_000 + 2000 + 10_000)
    assert not p.notes


def test_a_plan_costs_the_workers_it_is_given() -> None:
    # bench/fleet/validate.py costs a cluster as run: one worker a node on a fleet that would need none
    p = plan(Fleet.from_dict(FLEET), read_costs(costs_file()), workers=1)
    steps = {s.name: s.value for s in p.steps}
    assert (p.workers_per_node, p.read_replicas) == (1, 0)
    assert steps["the core's share of client reads"] == 0
    # a voter's worker: its third of 200,000 us of reads + its node's 60,000 of heartbeats + 1 x 300 following
    assert steps["a voter's worker's CPU"] == pytest.approx(200_000 / 3 + 60_000 + 300)
    assert plan(Fleet.from_dict(FLEET), read_costs(costs_file()), workers=0).to_dict() == \
        plan(Fleet.from_dict(FLEET), read_costs(costs_file())).to_dict()


def test_writes_past_one_leader_core_need_groups_and_say_the_product_does_not_shard() -> None:
    # 400 changed registrations and 400 expiries per s: 400 x 2600 + 60,000 + 10,000 + 400 x 2000 = 1,910,000 us/s
    p = plan(Fleet.from_dict({**FLEET, "broker_restarts_per_hour": 400 * 3600}), read_costs(costs_file()))
    steps = {s.name: s.value for s in p.steps}
    assert steps["leader core CPU for writes"] == pytest.approx(1_910_000)
    # one worker a node: it receives the heartbeats and serves the reads; the core pays each heartbeat's liveness
    # note (100 x 50) and feeds its worker (400 x 50) whatever the groups
    fixed = 100 * 50 + 400 * 50
    assert p.workers_per_node == 1
    assert steps["of the leader's core, what every node's core pays whatever the groups"] == pytest.approx(fixed)
    # with workers: 400 x 2600 + 100 x 50 + 100 x 2 x 50 + 400 x 2000 = 1,855,000, and the feeding
    assert steps["leader core CPU for writes, with workers"] == pytest.approx(1_855_000)
    assert p.groups == math.ceil((1_855_000 + 400 * 50 - fixed) / (700_000 - fixed)) == 3
    assert any("does not shard yet" in n for n in p.notes)
    assert p.saturation["leader core CPU (writes)"] < 1
    # 4 groups over 3 voters: more than one leader on a node's core
    q = plan(Fleet.from_dict({**FLEET, "broker_restarts_per_hour": 600 * 3600}), read_costs(costs_file()))
    assert q.groups > 3 and any("more nodes are needed" in n for n in q.notes)


def test_a_small_machine_runs_out_of_memory_first() -> None:
    p = plan(Fleet.from_dict({**FLEET, "memory_per_node_bytes": 100_000_000}), read_costs(costs_file()))
    assert p.saturates_first == "memory per node"
    assert p.saturation["memory per node"] == pytest.approx(0.7 * 100e6 / 80.8e6)


@pytest.mark.parametrize(("raw", "named"), [
    ({**FLEET, "brokerz": 1}, "brokerz"),
    ({**FLEET, "brokers": -5}, "brokers"),
    ({**FLEET, "topics": "many"}, "topics"),
    ({**FLEET, "voters": 2.5}, "voters"),
    ({k: v for k, v in FLEET.items() if k != "topics"}, "topics"),
    ({**FLEET, "headroom": 1.5}, "headroom"),
])
def test_a_bad_fleet_is_refused_naming_the_field(raw: dict[str, object], named: str) -> None:
    with pytest.raises(PlanError, match=named):
        Fleet.from_dict(raw)


def test_a_costs_file_without_a_cost_is_refused_naming_it() -> None:
    doc = costs_file()
    costs = doc["costs"]
    assert isinstance(costs, dict)
    del costs["watch_event_cpu_us"]
    with pytest.raises(PlanError, match="watch_event_cpu_us"):
        read_costs(doc)


def test_nsctl_plan_prints_the_plan_and_its_arithmetic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("\n".join(f"{k} = {v}" for k, v in FLEET.items()) + "\n")
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(costs_file()))
    assert nsctl.main(["plan", "--fleet", str(fleet), "--costs", str(costs)]) == 0
    out = capsys.readouterr().out
    assert "Raft groups (shards) needed  1\n" in out
    assert "route reads = clients 30,000 x topics_per_client 1 / route_poll_s 30 = 1,000 /s" in out
    assert nsctl.main(["plan", "--fleet", str(fleet), "--costs", str(costs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["saturates_first"] == "leader core CPU (writes)"
    fleet.write_text('brokers = 10\ntopics = "x"\n')
    assert nsctl.main(["plan", "--fleet", str(fleet), "--costs", str(costs)]) == 2
    assert "topics must be" in capsys.readouterr().err


def test_heartbeats_every_node_receives_are_not_moved_by_groups_and_the_plan_says_so() -> None:
    # 20,000 heartbeats/s per node: their receive is the workers' (7 a node), but each one's liveness note
    # (50 us) reaches the core: 1,000,000 us/s and the feeding of 7 workers (1 x 50 each), past the budget
    p = plan(Fleet.from_dict({**FLEET, "brokers": 10_000, "heartbeat_s": 0.5}), read_costs(costs_file()))
    assert p.workers_per_node == 7
    assert {s.name: s.value for s in p.steps}["of the leader's core, what every node's core pays whatever the groups"] \
        == pytest.approx(20_000 * 50 + 7 * 50)
    assert p.groups == 0
    assert any("no number of groups moves it" in n for n in p.notes)
    # and 20,000 x (400 + 10 x 2) us is more than a node's 7 workers can receive: the plan says so
    assert any("heartbeats alone" in n for n in p.notes)
    assert not any("no number of groups" in n for n in plan(Fleet.from_dict(FLEET), read_costs(costs_file())).notes)


def test_a_request_alone_and_the_idle_node_are_costed_when_the_costs_file_gives_them() -> None:
    # 100 us per remoting request arriving alone on its connection, on each heartbeat and each remoting read;
    # 0.01 core idle on every node's core
    doc = costs_file({**COSTS, "remoting_request_alone_cpu_us": 100})
    doc["idle_cpu_cores_per_node"] = {"n1": 0.01, "n2": 0.01, "n3": 0.01}
    p = plan(Fleet.from_dict(FLEET), read_costs(doc))
    steps = {s.name: s.value for s in p.steps}
    received = 100 * (400 + 10 * 20 + 100)  # heartbeats per node x (receive cost + alone)
    assert steps["leader core CPU for writes"] == pytest.approx(2600 + received + 10_000 + 2000 + 10_000)
    assert steps["CPU per route read"] == pytest.approx(300)
    assert steps["a follower core's CPU (no worker)"] == pytest.approx(1 * (200 + 20 * 20) + received + 10_000)
    assert not p.notes
    # without them, the plan says what it leaves out
    bare = plan(Fleet.from_dict(FLEET), read_costs(costs_file()))
    assert any("remoting_request_alone_cpu_us" in n for n in bare.notes)
    assert any("idle_cpu_cores_per_node" in n for n in bare.notes)


def test_a_heartbeat_and_a_read_alone_are_costed_each_by_its_own_figure_when_given() -> None:
    # remoting_heartbeat_alone_cpu_us / remoting_read_alone_cpu_us (each derived from a run of that load
    # alone) win over the one remoting_request_alone_cpu_us
    doc = costs_file({**COSTS, "remoting_request_alone_cpu_us": 100, "remoting_heartbeat_alone_cpu_us": 300,
                      "remoting_read_alone_cpu_us": 50})
    doc["idle_cpu_cores_per_node"] = {"n1": 0.01, "n2": 0.01, "n3": 0.01}
    p = plan(Fleet.from_dict(FLEET), read_costs(doc))
    steps = {s.name: s.value for s in p.steps}
    received = 100 * (400 + 10 * 20 + 300)  # heartbeats per node x (receive cost + the heartbeat's alone)
    assert steps["leader core CPU for writes"] == pytest.approx(2600 + received + 10_000 + 2000 + 10_000)
    assert steps["CPU per route read"] == pytest.approx(250)  # the read's alone, not the request's 100
    assert not p.notes
