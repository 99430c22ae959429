"""gRPC route reads, linearizable reads (GetBinding(LINEARIZABLE)) and registrations against a node with
[node] worker_processes = 0, 2, ... side by side in one run, with the server's CPU per operation: the
core's and its workers' together (user + system from /proc over the load; with --nodes 3 every node's
processes), and the core's alone.

    .venv/bin/python -m tests.interop.bench_workers_grpc --seconds 10 --clients 8[,16,...] [--workers 0,2]
        [--nodes 1|3] [--at follower|leader] [--kinds reads,linearizable,registrations] [--rounds 2]
        [--report out.md]

The load comes from --procs client processes (spawned, so no gRPC state crosses a fork), each running
clients/procs threads with their own connection and one call in flight (bench/load.py). A Python client
is GIL-bound: on a small machine it is part of the figure, which is why CPU per operation is reported
beside throughput. With --nodes 3 the load goes to a follower (or, --at leader, to the leader): from a
follower a registration is forwarded to the leader, which with workers is two extra process hops (the
follower's worker to its core, the leader's worker to its core); the difference between the two
targets is the forwarding's cost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.load import new_channel, proc_cpu_s, run_load
from bench.procnet import children, wait_grpc_serving
from bench.remoting import ROUTE_TOPICS
from bench.workloads import registration_request
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import Cluster, NodeProc

from .bench_workers import medians

KINDS = ("reads", "linearizable", "registrations")
BIND_TOPIC = "LinBench"  # the binding the linearizable reads read (GetBinding(LINEARIZABLE): a read index each)


@contextmanager
def cluster_with_workers(root: str, nodes: int, workers: int, at: str = "follower"
                         ) -> Iterator[tuple[Cluster, NodeProc]]:
    """A fresh cluster whose nodes run `workers` workers each, every gRPC listener up: (cluster, the node
    the load goes to: `at` "follower" (when there are several) or "leader")."""
    os.makedirs(root)
    c = Cluster(root, nodes, worker_processes=workers)
    try:
        c.start()
        leader = c.wait_ready(timeout=60)
        for n in c.nodes:
            assert n.proc is not None
            wait_grpc_serving(n.proc.pid, n.grpc_addr, workers)  # either front end ([node] grpc_front)
        yield c, leader if at == "leader" else next((n for n in c.nodes if n is not leader), leader)
    finally:
        c.stop()


def _client(addr: str, kind: str, threads: int, seconds: float, proc: int) -> dict[str, Any]:
    """One client process's load (runs in a spawned process)."""
    def make(i: int) -> tuple[Any, Any]:
        channel = new_channel(addr)
        stub = api_pb2_grpc.NameServerStub(channel)
        if kind == "reads":
            request = api_pb2.GetRouteRequest(topic=ROUTE_TOPICS[(proc * threads + i) % len(ROUTE_TOPICS)])
            return channel, lambda: (stub.GetRoute(request, timeout=10), 0)[1]
        if kind == "linearizable":
            bound = api_pb2.GetBindingRequest(topic=BIND_TOPIC, queue_id=0, consistency=api_pb2.LINEARIZABLE)

            def read() -> int:
                if not stub.GetBinding(bound, timeout=10).found:
                    raise RuntimeError("binding not found")
                return 0
            return channel, read
        counter = [0]
        name, broker = f"bench-p{proc}-w{i}", f"10.9.{proc}.{i + 1}:10911"

        def register() -> int:
            counter[0] += 1  # a new DataVersion: every call is a write
            return stub.RegisterBroker(registration_request(name, broker, f"BenchG{proc}x{i}T", 8, counter[0]),
                                       timeout=10).records
        return channel, register

    return run_load(make, threads, seconds)


def measure(root: str, nodes: int, workers: int, clients: list[int], procs: int, seconds: float,
            at: str = "follower", kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    """Each load of `kinds` at each of `clients` connections, on one fresh cluster."""
    rows = []
    with cluster_with_workers(root, nodes, workers, at) as (cluster, target):
        seed = api_pb2_grpc.NameServerStub(new_channel(target.grpc_addr))
        seed.RegisterBroker(api_pb2.RegisterBrokerRequest(
            cluster_name="BenchCluster", broker_name="seed", broker_addr="10.8.0.1:10911",
            topics=[api_pb2.TopicConfig(topic_name=t, read_queue_nums=4, write_queue_nums=4, perm=6)
                    for t in ROUTE_TOPICS]), timeout=30)
        seed.BindQueue(api_pb2.BindQueueRequest(topic=BIND_TOPIC, queue_id=0, owner="seed"), timeout=30)
        time.sleep(1.0)  # every replica has it
        core_pids = [n.proc.pid for n in cluster.nodes if n.proc is not None]
        ctx = multiprocessing.get_context("spawn")
        for kind, conns in ((k, c) for k in kinds for c in clients):
            every = core_pids + [w for pid in core_pids for w in children(pid)]
            all0, core0 = proc_cpu_s(every), proc_cpu_s(core_pids)
            spread = min(procs, conns)  # one connection: one client process
            with ctx.Pool(spread) as pool:
                parts = pool.starmap(_client, [(target.grpc_addr, kind, conns // spread, seconds, p)
                                               for p in range(spread)])
            all_s, core_s = proc_cpu_s(every) - all0, proc_cpu_s(core_pids) - core0
            n = sum(p["n"] for p in parts)
            rows.append({"kind": kind, "workers": workers, "nodes": nodes, "clients": conns, "n": n,
                         "per_s": round(sum(p["per_s"] for p in parts)),
                         "p50_ms": round(statistics.median(p["p50_ms"] for p in parts), 2),
                         "p99_ms": max(p["p99_ms"] for p in parts), "errors": sum(p["errors"] for p in parts),
                         "first_error": next((p["first_error"] for p in parts if p.get("first_error")), ""),
                         "server_us_per_op": round(all_s / n * 1e6) if n else 0,
                         "core_us_per_op": round(core_s / n * 1e6) if n else 0})
    return rows


def run(workers: list[int], nodes: int, clients: list[int], procs: int, seconds: float, rounds: int,
        at: str = "follower", kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-grpc-") as root:
        for r in range(rounds):
            for w in workers:
                rows += [row | {"round": r} for row in measure(os.path.join(root, f"r{r}-w{w}"), nodes, w, clients,
                                                               procs, seconds, at, kinds)]
    return rows


def markdown(rows: list[dict[str, Any]], seconds: float, nodes: int, at: str = "follower") -> str:
    where = "one node" if nodes == 1 else f"the {at} of a {nodes}-node cluster"
    lines = [f"gRPC, load on {where}, 1 call in flight per connection, {seconds:g} s per load; {os.cpu_count()} CPUs; "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}", "",
             "| load | connections | worker_processes | round | ops/s | p50 / p99 ms | server CPU µs/op "
             "(cores + workers) | of which the core(s) | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (r["kind"], r["clients"], r["workers"], r["round"])):
        error = f" ({row['first_error']})" if row["errors"] else ""
        lines.append(f"| {row['kind']} | {row['clients']} | {row['workers']} | {row['round'] + 1} | {row['per_s']:,} | "
                     f"{row['p50_ms']} / {row['p99_ms']} | {row['server_us_per_op']:,} | {row['core_us_per_op']:,} | "
                     f"{row['errors']}{error} |")
    lines.append("")
    for (kind, clients, workers), m in medians(rows, ("kind", "clients", "workers")):
        lines.append(f"- {kind}, {clients} connections, worker_processes = {workers}: median {m['per_s']:,.0f} ops/s, "
                     f"{m['server_us_per_op']:,.0f} µs of server CPU per op ({m['core_us_per_op']:,.0f} in the core)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.bench_workers_grpc",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per load")
    parser.add_argument("--clients", default="8", help="connections, over all client processes; comma-separated")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--workers", default="0,2", help="worker_processes values, comma-separated")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    parser.add_argument("--at", default="follower", choices=("follower", "leader"), help="with --nodes 3")
    parser.add_argument("--kinds", default=",".join(KINDS), help="loads, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--report", default="", help="write the markdown table here too")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds: each one of {', '.join(KINDS)}")
    rows = run([int(w) for w in args.workers.split(",")], args.nodes, [int(c) for c in args.clients.split(",")],
               args.procs, args.seconds,
               args.rounds, args.at, kinds)
    print(report := markdown(rows, args.seconds, args.nodes, args.at))
    if args.report:
        Path(args.report).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
