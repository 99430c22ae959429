"""One node's remoting route reads with [node] worker_processes = 0, 1, 2, ... side by side in one run,
driven by the compiled load generator (bench/loadgen/), with the server's CPU per read: the core's and
its workers' together (user + system from /proc over the load), and the core's alone.

    .venv/bin/python -m tests.interop.bench_workers --seconds 10 --connections 8 [--workers 0,1,2]
        [--rounds 2] [--report out.md]

--connections takes a list (1,3,8): each node is loaded with each count in turn.

Each configuration is a fresh 1-node cluster (Raft log, fsync on) with [remoting] on; its workers are
waited for (listening on the port) before the load. Rounds run the configurations in turn, so load from
elsewhere on the machine falls on all of them alike; each row is one load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.load import proc_cpu_s
from bench.procnet import wait_listening
from bench.remoting import ROUTE_TOPICS, run_load
from tests.cluster import Cluster
from tests.fakebroker import FakeBroker


@contextmanager
def node_with_workers(root: str, workers: int) -> Iterator[tuple[str, int]]:
    """A 1-node cluster with `workers` remoting workers, every worker listening (the core itself when there
    is none): (remoting address, pid)."""
    os.makedirs(root)
    c = Cluster(root, 1, remoting=True, worker_processes=workers)
    try:
        c.start()
        c.wait_ready(timeout=60)
        node = c.nodes[0]
        assert node.proc is not None
        pid = node.proc.pid
        wait_listening(pid, node.remoting_addr, max(workers, 1))
        yield node.remoting_addr, pid
    finally:
        c.stop()


def measure(root: str, workers: int, connections: list[int], seconds: float) -> list[dict[str, Any]]:
    rows = []
    with node_with_workers(root, workers) as (addr, pid):
        seed = FakeBroker(name=f"seed-{workers}", cluster="BenchCluster")  # its connection stays open
        try:
            resp = seed.register(addr, ROUTE_TOPICS, counter=1, compressed=False)
            assert resp.code == 0, resp.remark
            time.sleep(1.0)  # every worker's replica has it
            for n in connections:
                core0 = proc_cpu_s([pid])
                row = run_load("reads", [addr], n, seconds, [pid], prefix=f"w{workers}")
                core_s = proc_cpu_s([pid]) - core0
                rows.append(row | {"workers": workers,
                                   "core_us_per_op": round(core_s / row["n"] * 1e6, 1) if row["n"] else 0.0})
        finally:
            seed.close_channels()
            seed.stop()
    return rows


def run(workers: list[int], connections: list[int], seconds: float, rounds: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as root:
        for r in range(rounds):
            for w in workers:
                node_root = os.path.join(root, f"r{r}-w{w}")
                rows += [row | {"round": r} for row in measure(node_root, w, connections, seconds)]
    return rows


def markdown(rows: list[dict[str, Any]], seconds: float) -> str:
    lines = [f"One node, route reads (105), 1 request in flight per connection, {seconds:g} s per load; "
             f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M:%S')}", "",
             "| connections | worker_processes | round | reads/s | p50 / p99 ms | server CPU µs/read "
             "(core + workers) | of which the core | load generator µs/read | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (r["clients"], r["workers"], r["round"])):
        lines.append(f"| {row['clients']} | {row['workers']} | {row['round'] + 1} | {row['per_s']:,.0f} | "
                     f"{row['p50_ms']} / {row['p99_ms']} | {row['server_us_per_op']:,.0f} | "
                     f"{row['core_us_per_op']:,.0f} | {row['loadgen_us_per_op']:,.0f} | {row['errors']}{_first(row)} |")
    lines.append("")
    for (clients, workers), m in medians(rows, ("clients", "workers")):
        lines.append(f"- {clients} connection(s), worker_processes = {workers}: median {m['per_s']:,.0f} reads/s, "
                     f"{m['server_us_per_op']:,.0f} µs of server CPU per read")
    return "\n".join(lines) + "\n"


def medians(rows: list[dict[str, Any]], by: tuple[str, ...]) -> list[tuple[tuple[Any, ...], dict[str, float]]]:
    """Per value of the `by` fields, in order: the rounds' medians of throughput and CPU per operation."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    return [(key, {k: statistics.median(r[k] for r in mine) for k in ("per_s", "server_us_per_op", "core_us_per_op")})
            for key, mine in sorted(groups.items())]


def _first(row: dict[str, Any]) -> str:
    return f" ({row['first_error']})" if row["errors"] else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.bench_workers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per load")
    parser.add_argument("--connections", default="8", help="connection counts, comma-separated")
    parser.add_argument("--workers", default="0,1,2", help="worker_processes values, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--report", default="", help="write the markdown table here too")
    args = parser.parse_args(argv)
    rows = run([int(w) for w in args.workers.split(",")], [int(c) for c in args.connections.split(",")],
               args.seconds, args.rounds)
    print(report := markdown(rows, args.seconds))
    if args.report:
        Path(args.report).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
