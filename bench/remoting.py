"""The remoting port side by side: Apache RocketMQ's stock NameServer (one node, its own jars) and ours,
driven by the compiled load generator (bench/loadgen/), per core, per node and per machine (the
performance anchor of docs/benchmarks.md). `python -m tests.interop.bench_remoting` (make bench-remoting)
runs it alone; bench/cores.py (`python -m bench --only cores`) runs it in the suite.

Setups (each measures the stock side, then ours, on a fresh server):
- core: the stock NameServer on the server CPUs (CPU 0) beside ONE node of ours (a 1-node cluster: Raft log,
  fsync on) on the same CPU; the load generator on the other CPU(s);
- node: the same two, each free to use every CPU (the load generator too);
- machine: our 3-node cluster (connections spread over its nodes) beside one stock node, every CPU free.
Each connection is one broker's or client's, sending one request at a time unless `inflight` says more:
- route reads: GET_ROUTEINFO_BY_TOPIC (105) for topics registered beforehand;
- registrations: REGISTER_BROKER (103) of a broker of its own with 8 topics, its DataVersion changed on
  every call, so every call is a write;
- unchanged re-registrations: the same DataVersion every time (ours writes nothing then).
Beside each throughput: the server's CPU per operation (user + system of its process(es) and their
children over the load, from /proc; of ours, a node's core and its worker processes), the core's alone,
and the load generator's own. On a shared machine compare the ratios.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

from bench import loadgen
from bench.brokerconn import BrokerConnections
from bench.load import proc_cpu_s
from bench.procnet import wait_listening
from bench.procs import LocalCluster, children_on, with_descendants
from bench.rocketmq import JavaProcesses, ensure

ROUTE_TOPICS = [f"BenchRoute{i}" for i in range(32)]
KINDS = {"reads": "reads", "registrations": "register", "unchanged": "unchanged"}  # ours -> loadgen's names
SETUPS = ("core", "node", "machine")
SEED_TIMEOUT_S = 30.0
HEARTBEAT_S = 30.0  # a RocketMQ broker's registration period (brokerHeartbeatInterval's default)


def cpus_of(spec: str) -> set[int]:
    return {int(c) for c in spec.split(",") if c != ""}


def _cpu_list(cpus: set[int] | None) -> str:
    return ",".join(map(str, sorted(cpus))) if cpus else "all"


def run_load(kind: str, addrs: list[str], clients: int, seconds: float, server_pids: list[int], inflight: int = 1,
             loadgen_cpus: set[int] | None = None, prefix: str = "bench") -> dict[str, Any]:
    """One load by the compiled generator, with the servers' CPU over it."""
    pids = with_descendants(server_pids)
    cpu0, core0 = proc_cpu_s(pids), proc_cpu_s(server_pids)
    g = loadgen.run(KINDS[kind], addrs, clients, seconds, inflight=inflight, topics=ROUTE_TOPICS,
                    prefix=f"{prefix}-{kind}-{clients}", cpus=loadgen_cpus)
    server_s, core_s = proc_cpu_s(pids) - cpu0, proc_cpu_s(server_pids) - core0
    n = g["ops"]
    return {"clients": clients, "inflight": inflight, "n": n, "per_s": g["ops_per_s"], "errors": g["errors"],
            "first_error": g["first_error"], "p50_ms": g["p50_ms"], "p90_ms": g["p90_ms"], "p99_ms": g["p99_ms"],
            "max_ms": g["max_ms"], "server_cpu_s": round(server_s, 3),
            "server_us_per_op": round(server_s / n * 1e6, 1) if n else 0.0,
            "core_us_per_op": round(core_s / n * 1e6, 1) if n else 0.0,
            "loadgen_cpu_s": g["cpu_s"], "loadgen_us_per_op": g["cpu_us_per_op"]}


def measure_side(addrs: list[str], server_pids: list[int], clients: list[int], seconds: float, inflight: int = 1,
                 loadgen_cpus: set[int] | None = None, settle: float = 1.0, prefix: str = "bench",
                 kinds: tuple[str, ...] = tuple(KINDS)) -> dict[str, Any]:
    with seeded(addrs[0], f"{prefix}-routes", settle):
        return {kind: {str(c): run_load(kind, addrs, c, seconds, server_pids, inflight, loadgen_cpus,
                                        f"{prefix}-{c}") for c in clients}
                for kind in kinds}


@contextmanager
def seeded(addr: str, name: str, settle: float = 1.0) -> Iterator[None]:
    """ROUTE_TOPICS registered at `addr` by one broker whose connection stays open while inside (a nameserver
    unregisters a broker whose connection closes); `settle`: time for the seed to reach every node."""
    seed = BrokerConnections(name, "BenchCluster", "127.0.0.1:1")
    stop = threading.Event()
    beats = threading.Thread(target=_heartbeats, args=(seed, addr, stop), name="seed-heartbeats", daemon=True)
    try:
        deadline = time.monotonic() + SEED_TIMEOUT_S
        # A follower forwards the registration to the leader: on a loaded machine an election may be under way.
        while (resp := seed.register(addr, ROUTE_TOPICS, counter=1, compressed=False)).code != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"seeding the route topics at {addr}: code {resp.code}, {resp.remark}")
            time.sleep(0.5)
        beats.start()
        time.sleep(settle)
        yield
    finally:
        stop.set()
        if beats.is_alive():
            beats.join(timeout=SEED_TIMEOUT_S)
        seed.close_channels()


def _heartbeats(seed: BrokerConnections, addr: str, stop: threading.Event) -> None:
    """The seed's unchanged registration every HEARTBEAT_S, as a live broker sends it: a nameserver, ours or
    the stock one, expires a broker silent for 120 s, and a run longer than that lost every route topic
    (the replicas part's last phase read nothing but "No topic route info", session 24)."""
    while not stop.wait(HEARTBEAT_S):
        with suppress(OSError):  # a node restarting under a fault: the next beat reconnects
            seed.register(addr, ROUTE_TOPICS, counter=1, compressed=False, timeout=10.0)


def _check_pinned(pids: list[int], cpus: set[int] | None) -> None:
    for pid in with_descendants(pids):
        if cpus is not None and os.sched_getaffinity(pid) != cpus:
            raise RuntimeError(f"server process {pid} runs on CPUs {os.sched_getaffinity(pid)}, not {cpus}")


@contextmanager
def stock_server(version: str, root: str, cpus: set[int] | None) -> Iterator[tuple[list[str], list[int]]]:
    """The stock NameServer started on `cpus`: ([address], [JVM pid])."""
    rmq = JavaProcesses(version, root)
    try:
        with children_on(cpus):
            proc, addr = rmq.namesrv()
        _check_pinned([proc.pid], cpus)
        yield [addr], [proc.pid]
    finally:
        rmq.stop_all()


@contextmanager
def our_cluster(root: str, size: int, cpus: set[int] | None,
                workers: int = 0) -> Iterator[tuple[list[str], list[int]]]:
    """Our cluster of `size` nodes started on `cpus`, each with `workers` worker processes: (remoting
    addresses, node pids; their workers are counted as their descendants)."""
    c = LocalCluster(root, size, sections={"node": {"worker_processes": workers}}, remoting=True)
    try:
        with children_on(cpus):
            c.start()
        c.wait_ready(timeout=60)
        pids = [n.pid for n in c.nodes]
        for n in c.nodes:  # every worker listening (the core holds no port then)
            wait_listening(n.pid, n.remoting_addr, max(workers, 1))
        _check_pinned(pids, cpus)
        yield [n.remoting_addr for n in c.nodes], pids
    finally:
        c.stop()



def run(version: str, clients: list[int], seconds: float, json_path: str = "", setups: tuple[str, ...] = SETUPS,
        server_cpus: set[int] | None = None, loadgen_cpus: set[int] | None = None,
        inflight: int = 1, workers: int = 0, kinds: tuple[str, ...] = tuple(KINDS), work_dir: str = "",
        cluster_workers: int | None = None) -> dict[str, Any]:
    """Each setup's stock side, then ours; `work_dir`: where the servers' data and logs go, kept (default: a
    temporary directory, removed); `cluster_workers`: worker processes per node of the 3-node (machine) setup
    (default `workers`)."""
    ensure(version)
    every = os.sched_getaffinity(0)
    server_cpus = server_cpus or {min(every)}
    loadgen_cpus = loadgen_cpus or (every - server_cpus) or every
    res: dict[str, Any] = {"meta": {"seconds_per_load": seconds, "clients": clients, "inflight": inflight,
                                    "stock": f"Apache RocketMQ {version} NameServer, 1 node, -Xmx128m",
                                    "ours": "Raft, fsync on, remoting on each node"
                                            + (f", worker_processes = {workers}" if workers else ""),
                                    "loadgen": "bench/loadgen (Go), one goroutine per connection",
                                    "cpus": len(every), "date": time.strftime("%Y-%m-%d %H:%M:%S")},
                           "setups": {}}
    with nullcontext(work_dir) if work_dir else tempfile.TemporaryDirectory(prefix="bench-remoting-") as root:
        for setup in setups:
            pinned = setup == "core"
            srv, gen = (server_cpus, loadgen_cpus) if pinned else (None, None)
            size = 3 if setup == "machine" else 1
            per_node = cluster_workers if setup == "machine" and cluster_workers is not None else workers
            out: dict[str, Any] = {"server_cpus": _cpu_list(srv), "loadgen_cpus": _cpu_list(gen),
                                   "ours_nodes": size, "ours_worker_processes": per_node}
            with stock_server(version, os.path.join(root, f"rmq-{setup}"), srv) as (addrs, pids):
                out["stock"] = measure_side(addrs, pids, clients, seconds, inflight, gen, prefix=f"s-{setup}",
                                            kinds=kinds)
            with our_cluster(os.path.join(root, f"ours-{setup}"), size, srv, per_node) as (addrs, pids):
                out["ours"] = measure_side(addrs, pids, clients, seconds, inflight, gen, prefix=f"o-{setup}",
                                           kinds=kinds)
            out["ratios"] = {kind: {cl: round(ours["per_s"] / max(out["stock"][kind][cl]["per_s"], 1e-9), 2)
                                    for cl, ours in per.items()} for kind, per in out["ours"].items()}
            out["cpu_ratios"] = {kind: {cl: round(ours["server_us_per_op"]
                                                  / max(out["stock"][kind][cl]["server_us_per_op"], 1e-9), 2)
                                        for cl, ours in per.items()} for kind, per in out["ours"].items()}
            res["setups"][setup] = out
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)
    return res


LABELS = {"reads": "route reads", "registrations": "registrations (changed)",
           "unchanged": "registrations (unchanged)"}
SETUP_LABELS = {"core": "per core", "node": "per node", "machine": "per machine"}


def describe(setup: str, out: dict[str, Any]) -> str:
    ours = "our 3-node cluster" if out["ours_nodes"] == 3 else "one node of ours (a 1-node cluster)"
    where = (f"each server on CPU {out['server_cpus']}, the load generator on CPU {out['loadgen_cpus']}"
             if out["server_cpus"] != "all" else "servers and load generator free to use every CPU")
    return f"**{SETUP_LABELS.get(setup, setup)}**: one stock NameServer beside {ours}; {where}."


def markdown(res: dict[str, Any]) -> str:
    """The docs/benchmarks.md tables of one run: per setup, each load, stock beside ours, the ratios of
    throughput and of server CPU per operation, and the load generator's own CPU per operation."""
    meta = res["meta"]
    lines = [f"**Remoting: ours beside the stock NameServer** ({meta['date']}; {meta['stock']}; ours: "
             f"{meta['ours']}; load: {meta['loadgen']}, {meta['inflight']} request(s) in flight per connection; "
             f"{meta['seconds_per_load']:g} s per load; {meta['cpus']} CPUs)", ""]
    errors = 0
    for setup, out in res["setups"].items():
        lines += [describe(setup, out), "",
                  "| workload | conns | stock ops/s (p50 / p99 ms) | stock CPU µs/op | ours ops/s (p50 / p99 ms) "
                  "| ours CPU µs/op | ours / stock ops/s | ours / stock CPU per op | load generator µs/op "
                  "(stock / ours) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for kind, per_clients in out["ours"].items():
            for clients, ours in per_clients.items():
                stock = out["stock"][kind][clients]
                lines.append(
                    f"| {LABELS.get(kind, kind)} | {clients} | {stock['per_s']:,.0f} ({stock['p50_ms']} / "
                    f"{stock['p99_ms']}) | {stock['server_us_per_op']:,.0f} | {ours['per_s']:,.0f} "
                    f"({ours['p50_ms']} / {ours['p99_ms']}) | {ours['server_us_per_op']:,.0f} | "
                    f"{out['ratios'][kind][clients]:.2f} | {out['cpu_ratios'][kind][clients]:.2f} | "
                    f"{stock['loadgen_us_per_op']:,.0f} / {ours['loadgen_us_per_op']:,.0f} |")
        errors += sum(v["errors"] for side in ("stock", "ours") for per in out[side].values() for v in per.values())
        lines.append("")
    lines.append(f"Errors: {errors}.")
    return "\n".join(lines) + "\n"
