"""`python -m bench.fleet.validate REPORT.json --costs COSTS.json`: the capacity model (`nsctl plan`,
nameserver/ops/capacity.py) against a simulator run (docs/scaling.md, "Validation against the simulator").

Each row is one quantity both sides give, in the same unit, with the ratio measured / predicted and a flag
when it is outside +-20 %. Honest by construction:
- only the run's steady windows count: a window overlapping the mass expiry's removals (from the silenced
  brokers' earliest expiry to when the last was gone, or the run's end) or in which the leader changed is
  left out, as the model models neither a mass expiry nor an election; set-up is outside the windows;
- the rate rows compare the load the fleet as run asks for (the model's arithmetic: the silenced brokers
  offer nothing after they fall silent) with what the cluster served: they test the cluster's capacity;
- the CPU rows run the model at the rates the cluster served in those windows (its fleet with brokers and
  clients scaled to the heartbeats and reads served, churn from the changed registrations counted), so they
  test the model's costs, not the machine's share of them;
- memory compares the model's per-node RSS on the fleet's state with the largest RSS a node had in those
  windows; the simulator does not count network bytes, so network is not compared;
- a cluster run with worker processes (`[node] worker_processes`, the report's cluster.worker_processes) is
  costed with that many (capacity.plan's `workers`), and each node's core and its workers are compared apart:
  the core's CPU (the report's core_cpu_s) and the rest of its processes'.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from typing import Any

from nameserver.ops.capacity import Fleet, Plan, plan, read_costs

TOLERANCE = 0.2  # issue 29: the model within +-20 % of the simulator


@dataclass(frozen=True)
class Row:
    quantity: str
    predicted: float
    measured: float
    unit: str
    includes: str  # what each side counts

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted if self.predicted else float("inf")

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE


def steady_windows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The windows the model speaks for: no mass-expiry removal in them, the same leader as the window
    before, and the nodes sampled at both ends."""
    width = float(report["simulation"]["window_s"])
    run_s = float(report["simulation"]["seconds"])
    e = report.get("expiry") or {}
    if e:
        gone = e.get("all_nodes_s")
        tail = (e["at_s"] + e["earliest_s"], e["at_s"] + (gone if gone is not None else run_s))
    else:
        tail = (float("inf"), float("inf"))
    out, before = [], None
    for w in report["windows"]:
        leader = w.get("leader")
        start = float(w["t_s"])
        in_tail = start < tail[1] and start + width > tail[0]
        if "nodes" in w and leader and leader == (before or leader) and not in_tail:
            out.append(w)
        before = leader or before
    return out


def model_fleet(report: dict[str, Any]) -> Fleet:
    """The simulator's fleet as run, in the model's shape: each topic on one broker (bench/loadgen/fleet.go
    deals topics out round-robin), every broker registering with every node, every read over remoting, and
    headroom 1: the question is what the load costs, not what a plan should leave spare (a plan's margin
    would hand the load worker processes the simulator's cluster does not run; one run with them is costed
    with its own number: compare)."""
    f = report["fleet"]
    return Fleet(brokers=f["brokers"], topics=f["topics"], queues_per_topic=f["queues_per_topic"], brokers_per_topic=1,
                 clients=f["clients"], topics_per_client=f["topics_per_client"], route_poll_s=f["route_poll_period_s"],
                 heartbeat_s=f["heartbeat_period_s"], remoting_share=1.0,
                 broker_restarts_per_hour=f["broker_restarts_per_hour"],
                 topic_changes_per_hour=f["topic_changes_per_hour"], voters=report["cluster"]["nodes"], headroom=1.0)


def _live_share(report: dict[str, Any], w: dict[str, Any]) -> float:
    """The share of brokers still heartbeating through window w (the silenced ones offer nothing)."""
    at = report["simulation"]["mass_expiry_at_s"]
    if at < 0:
        return 1.0
    width = report["simulation"]["window_s"]
    silent_s = min(width, max(0.0, w["t_s"] + width - at))
    return 1 - report["simulation"]["mass_expiry_fraction"] * silent_s / width


def _step(p: Plan, name: str) -> float:
    return next(s.value for s in p.steps if s.name == name)


def compare(report: dict[str, Any], costs_doc: dict[str, Any]) -> tuple[list[Row], dict[str, Any]]:
    """The rows, and what they were computed over (windows, the fleets the model was given)."""
    costs = read_costs(costs_doc)
    windows = steady_windows(report)
    if not windows:
        raise ValueError("the report has no steady window (every one overlaps the mass expiry or a leader change)")
    nodes = report["cluster"]["nodes"]
    seconds = len(windows) * report["simulation"]["window_s"]
    fleet = model_fleet(report)

    def served(op: str) -> float:
        return sum(w["ops"].get(op, {}).get("count", 0) for w in windows) / seconds

    hb, route, changed, unreg = served("heartbeat"), served("route"), served("register_changed"), served("unregister")
    workers = int(report["cluster"].get("worker_processes", 0))
    as_run = plan(fleet, costs, workers=workers if workers else None)
    live = sum(_live_share(report, w) for w in windows) / len(windows)
    rows = [
        Row("heartbeats served, all nodes", _step(as_run, "heartbeats per node") * nodes * live, hb, "/s",
            "model: brokers still heartbeating / heartbeat_s x nodes; simulator: REGISTER_BROKER (unchanged) answered"),
        Row("route reads served, all nodes", _step(as_run, "route reads"), route, "/s",
            "model: clients x topics_per_client / route_poll_s; simulator: GET_ROUTEINFO_BY_TOPIC answered"),
    ]
    # The model at the load served: brokers and routes per client scaled to it, topics per broker kept; each changed
    # registration and restart reaches every node (one change of the fleet is `nodes` calls).
    brokers = max(1, round(hb * fleet.heartbeat_s / nodes))
    at_served = replace(fleet, brokers=brokers, topics=brokers * fleet.topics // fleet.brokers,
                        topics_per_client=route * fleet.route_poll_s / fleet.clients,
                        broker_restarts_per_hour=unreg / nodes * 3600,
                        topic_changes_per_hour=max(0.0, changed - unreg) / nodes * 3600)
    p = plan(at_served, costs, workers=workers if workers else None)
    if p.workers_per_node and not workers:
        raise ValueError("the model gives this load worker processes (past one core a node): the simulator's "
                         "cluster has none, so the CPU rows would not compare like with like")
    if workers:
        return rows + _worker_rows(report, windows, p, as_run, workers), {
            "windows": [w["t_s"] for w in windows], "seconds": seconds, "fleet_as_run": fleet,
            "fleet_at_served_load": at_served}
    leader_pred = _step(p, "the leader's core in one group, all it does") / 1e6
    reads_share = _step(p, "read-serving CPU, whole fleet") / nodes
    follower_pred = (_step(p, "a follower core's CPU (no worker)") + reads_share) / 1e6
    leader_cpu, follower_cpu, rss_max = 0.0, 0.0, 0
    for w in windows:
        for name, n in w["nodes"].items():
            if name == w["leader"]:
                leader_cpu += n["cpu_s"]
            else:
                follower_cpu += n["cpu_s"] / (nodes - 1)
            rss_max = max(rss_max, n["rss_bytes"])
    rows += [
        Row("leader node CPU", leader_pred, leader_cpu / seconds, "cores",
            "model: its core's writes (changed registrations, heartbeats received and forwarded, expiries) + a third "
            "of the route reads + each request's cost alone + idle; simulator: the leader's processes, user + system"),
        Row("follower node CPU (mean)", follower_pred, follower_cpu / seconds, "cores",
            "model: changed registrations applied + heartbeats received + a third of the route reads + each "
            "request's cost alone + idle; simulator: each follower's processes, user + system, mean of the followers"),
        Row("all nodes CPU", leader_pred + (nodes - 1) * follower_pred,
            (leader_cpu + (nodes - 1) * follower_cpu) / seconds, "cores", "the two rows above summed over the nodes"),
        Row("memory per node (RSS)", as_run.memory_per_node_bytes / 2**20, rss_max / 2**20, "MiB",
            "model: idle core + brokers, queue datas, queues (fleet as run); simulator: the largest node RSS "
            "sampled at a steady window's end"),
    ]
    info = {"windows": [w["t_s"] for w in windows], "seconds": seconds, "fleet_as_run": fleet,
            "fleet_at_served_load": at_served}
    return rows, info


def _worker_rows(report: dict[str, Any], windows: list[dict[str, Any]], p: Plan, as_run: Plan,
                 workers: int) -> list[Row]:
    """A cluster with worker processes: each node's core and its workers apart (the model at the load served,
    costed with the cluster's `workers` a node), then the nodes whole, then memory."""
    nodes = report["cluster"]["nodes"]
    seconds = len(windows) * report["simulation"]["window_s"]
    if any("core_cpu_s" not in n for w in windows for n in w["nodes"].values()):
        raise ValueError("the report has no core_cpu_s per node (a simulator run before cores and workers were "
                         "sampled apart): its CPU cannot be split")
    leader_core = _step(p, "the leader's core in one group, all it does") / 1e6
    follower_core = _step(p, "a follower core's CPU (with workers)") / 1e6
    node_workers = workers * _step(p, "a voter's worker's CPU") / 1e6  # the same on every voter
    m = {"leader core": 0.0, "leader workers": 0.0, "follower core": 0.0, "follower workers": 0.0}
    rss_max = 0
    for w in windows:
        for name, n in w["nodes"].items():
            role, share = ("leader", 1.0) if name == w["leader"] else ("follower", 1 / (nodes - 1))
            m[f"{role} core"] += n["core_cpu_s"] * share
            m[f"{role} workers"] += (n["cpu_s"] - n["core_cpu_s"]) * share
            rss_max = max(rss_max, n["rss_bytes"])
    m = {k: v / seconds for k, v in m.items()}
    wk = (f"model: its {workers} worker(s): heartbeats received (decoded, compared, answered; each one's cost "
          "alone) + a third of the route reads (each one's cost alone) + following the writes; no idle figure; "
          "simulator: the node's processes but its core, user + system")
    return [
        Row("leader core CPU", leader_core, m["leader core"], "cores",
            "model: changed registrations + each heartbeat's liveness note (heartbeat_noted_core_cpu_us) + forwarded "
            "liveness + expiries + feeding its workers + idle; no client read; simulator: the leader's core process"),
        Row("leader's workers CPU", node_workers, m["leader workers"], "cores", wk),
        Row("follower core CPU (mean)", follower_core, m["follower core"], "cores",
            "model: changed registrations applied + each heartbeat's liveness note + feeding its workers + idle; "
            "simulator: each follower's core process, mean of the followers"),
        Row("followers' workers CPU (mean)", node_workers, m["follower workers"], "cores", wk),
        Row("leader node CPU", leader_core + node_workers, m["leader core"] + m["leader workers"], "cores",
            "the leader's core and workers"),
        Row("follower node CPU (mean)", follower_core + node_workers, m["follower core"] + m["follower workers"],
            "cores", "a follower's core and workers, mean of the followers"),
        Row("all nodes CPU", leader_core + (nodes - 1) * follower_core + nodes * node_workers,
            m["leader core"] + m["leader workers"] + (nodes - 1) * (m["follower core"] + m["follower workers"]),
            "cores", "every node's processes"),
        Row("memory per node (RSS)", as_run.memory_per_node_bytes / 2**20, rss_max / 2**20, "MiB",
            f"model: idle core + {workers} idle worker(s), each with the brokers, queue datas, queues (fleet as run); "
            "simulator: the largest node RSS (core and workers) sampled at a steady window's end"),
    ]


def table(rows: list[Row]) -> str:
    out = ["| quantity | predicted (model) | measured (simulator) | measured / predicted | within +-20 % "
           "| each side counts |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.quantity} | {_fmt(r.predicted)} {r.unit} | {_fmt(r.measured)} {r.unit} | {r.ratio:.2f} | "
                   f"{'yes' if r.within else '**no**'} | {r.includes} |")
    return "\n".join(out)


def _fmt(x: float) -> str:
    return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(prog="python -m bench.fleet.validate", description=__doc__)
    a.add_argument("reports", nargs="+", help="simulator reports (python -m bench.fleet --json)")
    a.add_argument("--costs", required=True, help="the costs file (make costs)")
    args = a.parse_args(argv)
    with open(args.costs) as fh:
        costs_doc = json.load(fh)
    for path in args.reports:
        with open(path) as fh:
            report = json.load(fh)
        rows, info = compare(report, costs_doc)
        f = info["fleet_at_served_load"]
        print(f"### {path} ({report.get('commit', '')}, {report.get('date', '')})\n")
        print(f"Steady windows starting at {', '.join(f'{t:g}' for t in info['windows'])} s ({info['seconds']:g} s). "
              f"The model's CPU rows at the load served: {f.brokers:,} brokers heartbeating every {f.heartbeat_s:g} s, "
              f"{f.clients:,} clients x {f.topics_per_client:.2f} routes every {f.route_poll_s:g} s, "
              f"{f.broker_restarts_per_hour:,.0f} restarts and {f.topic_changes_per_hour:,.0f} topic changes an "
              "hour.\n")
        print(table(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
