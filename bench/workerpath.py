"""`python -m bench.workerpath`: one client's registrations and LINEARIZABLE reads through a node with
0, 1 or 2 worker processes (issue 27, "every core": a write and a read through a worker as fast as through
the core alone). Focused where `python -m bench --only compare` runs every load and etcd too.

A 3-node cluster per worker count (bench/procs.LocalCluster). One client thread calls the leader for
`seconds`: RegisterBroker (each call a changed DataVersion: one entry each), then GetBinding LINEARIZABLE.
Each figure: the calls' p50/p99 latency, and the leader's CPU (its core and workers) per call. `--rounds`
repeats the worker counts in turn (A B A B) so the machine's load falls on each alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.load import proc_cpu_s
from bench.procnet import wait_grpc_serving
from bench.procs import LocalCluster, with_descendants
from bench.workloads import registration_request
from nameserver.pb import api_pb2, api_pb2_grpc


def _timed(op: Callable[[], object], seconds: float) -> list[float]:
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        op()
        latencies.append(time.perf_counter() - t)
    return latencies


def _figures(latencies: list[float], cpu_s: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"calls": len(ordered), "p50_ms": round(1000 * statistics.median(ordered), 3),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "cpu_ms_per_call": round(1000 * cpu_s / max(1, len(ordered)), 3)}


def measure(root: str, workers: int, seconds: float, topics: int) -> dict[str, Any]:
    """One cluster with `workers` worker processes a node: its registrations' and reads' figures."""
    cluster = LocalCluster(root, sections={"node": {"worker_processes": workers}} if workers else {})
    try:
        cluster.start()
        leader = cluster.wait_ready()
        for n in cluster.nodes:
            wait_grpc_serving(n.pid, n.grpc_addr, workers)  # either front end ([node] grpc_front)
        stub = api_pb2_grpc.NameServerStub(leader._channel())
        pids = with_descendants([leader.pid])
        counter = iter(range(1, 1 << 62))

        def register() -> None:
            stub.RegisterBroker(registration_request("wp-b0", "10.79.0.1:10911", "WpT", topics, next(counter)),
                                timeout=10)

        stub.BindQueue(api_pb2.BindQueueRequest(topic="WpBind", queue_id=0, owner="wp-b0"), timeout=10)
        read = api_pb2.GetBindingRequest(topic="WpBind", queue_id=0, consistency=api_pb2.LINEARIZABLE)
        out: dict[str, Any] = {"workers": workers}
        for name, op in (("registration", register), ("linearizable_read", lambda: stub.GetBinding(read, timeout=10))):
            _timed(op, min(1.0, seconds / 4))  # warm: connections, caches
            cpu = proc_cpu_s(pids)
            latencies = _timed(op, seconds)
            out[name] = _figures(latencies, proc_cpu_s(pids) - cpu)
        return out
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.workerpath", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="0,1,2", help="worker counts, comma-separated (default 0,1,2)")
    p.add_argument("--seconds", type=float, default=5.0, help="each load's length (default 5)")
    p.add_argument("--topics", type=int, default=8, help="topics per registration (default 8)")
    p.add_argument("--rounds", type=int, default=1, help="times the worker counts are run in turn (default 1)")
    p.add_argument("--label", default="", help="a name printed with each result line (e.g. before/after)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-workerpath-") as root:
        for r in range(args.rounds):
            for w in (int(x) for x in args.workers.split(",")):
                result = measure(os.path.join(root, f"r{r}w{w}"), w, args.seconds, args.topics)
                result.update(label=args.label, round=r, loadavg=round(os.getloadavg()[0], 2))
                print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
