"""`python -m bench --only cores`: issue 27's remoting and scaling yardsticks, side by side in one run.

Every load comes from the compiled load generator (bench/loadgen/), one request in flight per connection;
every row has ops/s, p50 / p99, the servers' CPU per operation (ours: a node's core and its worker processes
together, from /proc), the load generator's own CPU per operation and the ratio to its yardstick:

- stock: route reads (GET_ROUTEINFO_BY_TOPIC) on Apache RocketMQ's stock NameServer beside ours with
  `workers` worker processes per node (bench/remoting.py), at each connection count: per node (one node
  each, every CPU free), per core (each pinned to one CPU, the load generator on the others) and per
  machine (our 3-node cluster beside one stock node). Yardstick: the stock NameServer; target >= 1.0x.
- scaling: one node with worker_processes = 1, then the larger count (`workers`, at least 2): route reads
  and registrations (REGISTER_BROKER, DataVersion changed each call) at the largest connection count.
  Yardstick: worker_processes = 1; no threshold (issue 27 asks for the figures).
- projection: from the scaling part's CPU per operation at the larger worker count, what PROJECT_CORES
  cores would carry. A projection, not a measurement: reads cores x 1e6 / µs-per-read (the workers answer
  reads, the core does not); writes (cores - 1) x 1e6 / the workers' µs-per-write, and at most 1e6 / the
  core's µs-per-write (every write passes through the one core process, which runs on one core).
- replicas: 3 voters, then 3 voters + 2 read replicas (bench/replicas.py): route reads over every endpoint,
  registrations on the leader, the leader's CPU per replica. Yardstick: the voters alone; target: writes
  not lower beyond `noise` (the write ratio >= 1 - noise).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from bench import remoting, replicas
from bench.rocketmq import LINE_5
from nameserver.config import usable_cpus

PROJECT_CORES = 16
DEFAULT_CLIENTS = [1, 8]
NOISE = 0.10  # write throughput with replicas may be this much lower and still count as "not lower"


def scaling(root: str, workers: list[int], clients: int, seconds: float) -> dict[str, Any]:
    """Route reads and registrations on one fresh node per worker count: {workers: {kind: row}}."""
    out: dict[str, Any] = {}
    for w in workers:
        with remoting.our_cluster(os.path.join(root, f"scaling-w{w}"), 1, None, w) as (addrs, pids):
            side = remoting.measure_side(addrs, pids, [clients], seconds, prefix=f"sc-w{w}",
                                         kinds=("reads", "registrations"))
        out[str(w)] = {kind: per[str(clients)] for kind, per in side.items()}
    return out


def projection(rows: dict[str, Any], cores: int = PROJECT_CORES) -> dict[str, Any]:
    """Throughput on `cores` cores from one worker count's measured CPU per operation (a projection)."""
    reads, writes = rows["reads"], rows["registrations"]
    out: dict[str, Any] = {"cores": cores}
    if reads["server_us_per_op"]:
        out["reads_per_s"] = round(cores * 1e6 / reads["server_us_per_op"])
    workers_us = writes["server_us_per_op"] - writes["core_us_per_op"]
    spread = (cores - 1) * 1e6 / workers_us if workers_us > 0 else float("inf")
    core_bound = 1e6 / writes["core_us_per_op"] if writes["core_us_per_op"] else float("inf")
    if spread != float("inf") or core_bound != float("inf"):
        out["writes_per_s"] = round(min(spread, core_bound))
        out["writes_bound"] = "the core process (one core)" if core_bound <= spread else "the workers"
    return out


def shared_machine_workers(nodes: int) -> int:
    """Worker processes per node when `nodes` nodes share this machine's CPUs: its CPUs divided among them,
    at least one (what `worker_processes = "auto"` gives a node alone on the machine, split)."""
    return max(1, usable_cpus() // nodes)


def run_cores(root: str, seconds: float, clients: list[int], workers: int, *, version: str = LINE_5,
              replica_rounds: int = 1, idle_s: float = replicas.IDLE_S, noise: float = NOISE,
              cluster_workers: int | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every part of this module in turn, each on fresh servers; the result with its targets.
    `cluster_workers`: worker processes per node of the 3-node cluster beside one stock node (default:
    `shared_machine_workers`, the machine's CPUs shared by its 3 nodes, as an operator co-locating them sets)."""
    if cluster_workers is None:
        cluster_workers = shared_machine_workers(3)
    os.makedirs(root, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="cores-", dir=root)
    for part in ("stock", "replicas"):
        os.makedirs(os.path.join(run_dir, part))
    res: dict[str, Any] = {"meta": {"seconds_per_load": seconds, "clients": clients, "worker_processes": workers,
                                    "cluster_worker_processes": cluster_workers,
                                    "cpus": len(os.sched_getaffinity(0)), "noise": noise,
                                    "project_cores": PROJECT_CORES}}
    log(f"cores: stock NameServer beside ours with {workers} worker processes per node, route reads")
    res["stock"] = remoting.run(version, clients, seconds, workers=workers, kinds=("reads",),
                                work_dir=os.path.join(run_dir, "stock"), cluster_workers=cluster_workers)
    scaled = sorted({1, max(2, workers)})
    log(f"cores: one node with worker_processes = {' vs '.join(map(str, scaled))}")
    res["scaling"] = scaling(run_dir, scaled, max(clients), seconds)
    res["projection"] = {**projection(res["scaling"][str(scaled[-1])]), "from_workers": scaled[-1]}
    log("cores: 3 voters with and without 2 read replicas")
    rows = replicas.run(seconds, max(clients), replica_rounds, idle_s, work_dir=os.path.join(run_dir, "replicas"))
    res["replicas"] = {"rows": rows, "summary": replicas.summary(rows),
                       "summary_on_leader": replicas.summary(rows, on_leader=True)}
    res["targets"] = targets(res)
    return res


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 27's remoting targets: each with its measured ratio, its threshold and whether it is met."""
    out = []
    for setup, what in (("node", "one node with its workers >= the stock NameServer"),
                        ("core", "per core (pinned) >= the stock NameServer"),
                        ("machine", "our 3-node cluster >= one stock node")):
        for clients, ratio in res["stock"]["setups"].get(setup, {}).get("ratios", {}).get("reads", {}).items():
            out.append({"target": f"route reads, {what}, {clients} connection{'s' if clients != '1' else ''}",
                        "ratio": ratio, "threshold": 1.0, "met": ratio >= 1.0})
    s = res["replicas"]["summary"]
    if s is not None:
        floor = round(1 - res["meta"]["noise"], 2)
        for key, how in (("writes_with_without_yielding", "their CPU yielding to the voters', as on machines of "
                                                          "their own"),
                         ("writes_with_without", "sharing the voters' CPUs")):
            if key in s:
                out.append({"target": f"writes with 2 read replicas not lower beyond noise ({how})",
                            "ratio": s[key], "threshold": floor, "met": s[key] >= floor})
    return out


# ---- the report ----------------------------------------------------------------------------------

def _lat(d: dict[str, Any]) -> str:
    return f"{d['per_s']:,.0f} ({d['p50_ms']} / {d['p99_ms']})"


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    w = m["worker_processes"]
    lines = [f"**Route reads: ours with {w} worker processes per node beside the stock NameServer** "
             f"(the 3-node cluster: {m.get('cluster_worker_processes', w)} per node) "
             f"({res['stock']['meta']['stock']}; bench/loadgen, 1 request in flight per connection; "
             f"{m['seconds_per_load']:g} s per load; {m['cpus']} CPUs)", "",
             "| setup | conns | stock ops/s (p50 / p99 ms) | stock CPU µs/op | ours ops/s (p50 / p99 ms) "
             "| ours CPU µs/op (core) | load generator µs/op (stock / ours) | ours / stock |",
             "|---|---|---|---|---|---|---|---|"]
    for setup, out in res["stock"]["setups"].items():
        for clients, ours in out["ours"]["reads"].items():
            stock = out["stock"]["reads"][clients]
            ratio = out["ratios"]["reads"][clients]
            lines.append(f"| {remoting.SETUP_LABELS.get(setup, setup)} | {clients} | {_lat(stock)} | "
                         f"{stock['server_us_per_op']:,.0f} | {_lat(ours)} | {ours['server_us_per_op']:,.0f} "
                         f"({ours['core_us_per_op']:,.0f}) | {stock['loadgen_us_per_op']:,.0f} / "
                         f"{ours['loadgen_us_per_op']:,.0f} | {ratio:.2f} |")
    lines += ["", *(remoting.describe(setup, out) for setup, out in res["stock"]["setups"].items()), ""]
    sc = res["scaling"]
    base = sc[min(sc, key=int)]
    lines += ["**Scaling: one node, worker_processes " + " vs ".join(sc) + f"** ({max(m['clients'])} connections)",
              "", "| load | worker_processes | ops/s (p50 / p99 ms) | server CPU µs/op | of which the core "
              "| load generator µs/op | / worker_processes = 1 |", "|---|---|---|---|---|---|---|"]
    for kind in ("reads", "registrations"):
        for workers, rows in sc.items():
            row = rows[kind]
            lines.append(f"| {remoting.LABELS[kind]} | {workers} | {_lat(row)} | {row['server_us_per_op']:,.0f} | "
                         f"{row['core_us_per_op']:,.0f} | {row['loadgen_us_per_op']:,.0f} | "
                         f"{row['per_s'] / max(base[kind]['per_s'], 1e-9):.2f} |")
    p = res["projection"]
    lines += ["", f"**A projection, not a measurement: {p['cores']} cores** from the CPU per operation measured "
              f"above with worker_processes = {p['from_workers']}: route reads {p['cores']} x 1e6 / server "
              f"µs per read = **{p.get('reads_per_s', 0):,} reads/s**; registrations min(({p['cores']} - 1) x 1e6 "
              f"/ the workers' µs per write, 1e6 / the core's µs per write) = **{p.get('writes_per_s', 0):,} "
              f"writes/s** (bound by {p.get('writes_bound', 'n/a')}). It assumes CPU per operation stays as "
              "measured and the load generator and network are elsewhere.", ""]
    rep = res["replicas"]
    lines += [f"**3 voters with and without 2 read replicas** ({max(m['clients'])} connections; route reads over "
              "every endpoint, registrations on the leader)", "",
              "| endpoints | route reads/s (p50 / p99 ms) | servers µs/read | load generator µs/read | "
              "writes/s (p50 / p99 ms) | leader µs/write | load generator µs/write | leader cores idle |",
              "|---|---|---|---|---|---|---|---|"]
    for row in rep["rows"]:
        rd, wr = row["reads"], row["writes"]
        lines.append(f"| {row['label']} | {_lat(rd)} | {rd['server_us_per_op']:,.0f} | "
                     f"{rd['loadgen_us_per_op']:,.0f} | {_lat(wr)} | {row['leader_us_per_write']:,.0f} | "
                     f"{wr['loadgen_us_per_op']:,.0f} | {row['leader_cpu_idle']} |")
    for key, which in (("summary", "following followers (the default)"),
                       ("summary_on_leader", "on the leader (follow_leader = true)")):
        s = rep.get(key)
        if s is not None:
            lines += ["", f"With / without the replicas {which}: route reads {s['reads_with_without']:.2f}x, writes "
                      f"{s['writes_with_without']:.2f}x (the replicas yielding the CPU: "
                      f"{s.get('writes_with_without_yielding', 0.0):.2f}x); the leader's CPU per replica: "
                      f"{s['leader_cores_idle_per_replica']:+.3f} cores idle, "
                      f"{s['leader_us_per_write_per_replica']:+.1f} µs per write."]
    lines += ["", "On one machine the replicas share its cores with the voters."]
    lines += ["", "**Issue 27's remoting targets**", "", "| target | ours / yardstick | threshold | |",
              "|---|---|---|---|"]
    for t in res["targets"]:
        lines.append(f"| {t['target']} | {t['ratio']:.2f} | {t['threshold']:g} | {'met' if t['met'] else 'NOT met'} |")
    errors = sum(v["errors"] for out in res["stock"]["setups"].values() for side in ("stock", "ours")
                 for per in out[side].values() for v in per.values())
    errors += sum(row["errors"] for rows in sc.values() for row in rows.values())
    errors += sum(row["read_errors"] + row["write_errors"] for row in rep["rows"])
    lines += ["", f"Errors: {errors}."]
    return "\n".join(lines) + "\n"


__all__ = ["PROJECT_CORES", "markdown", "projection", "run_cores", "targets"]
