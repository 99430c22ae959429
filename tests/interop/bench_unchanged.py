"""The core's CPU per unchanged registration (a RocketMQ broker's periodic re-registration: REGISTER_BROKER
with the same DataVersion) on a node with remoting worker processes, driven by the compiled load generator
(bench/loadgen, workload `unchanged`), beside its workers' CPU. One run prints one JSON line.

    .venv/bin/python -m tests.interop.bench_unchanged --seconds 10 [--workers 2] [--topics 40]

Each run is a fresh 1-node cluster (its core leads), every worker listening before the load. To compare two
versions of the code, run this module from each tree in turn (the cluster starts the nodes from the tree it
is run from): the machine's load then falls on both alike (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from bench import loadgen
from bench.load import proc_cpu_s
from bench.procnet import children

from .bench_workers import node_with_workers


def run(root: str, workers: int, seconds: float, topics: int) -> dict[str, float]:
    with node_with_workers(root, workers) as (addr, core):
        crew = children(core)
        # a short warm-up load: the broker registered and every process's first answers made
        loadgen.run("unchanged", [addr], 4, 1, inflight=4, prefix="warm", broker_topics=topics)
        core_before, crew_before = proc_cpu_s([core]), proc_cpu_s(crew)
        out = loadgen.run("unchanged", [addr], 4, seconds, inflight=4, prefix="bench", broker_topics=topics)
        core_s, crew_s = proc_cpu_s([core]) - core_before, proc_cpu_s(crew) - crew_before
    if out["errors"] or not out["ops"]:
        raise RuntimeError(f"loadgen: {out['errors']} errors: {out['first_error']}")
    ops = int(out["ops"])
    return {"ops": ops, "ops_per_s": round(ops / seconds, 1), "core_us_per_op": round(core_s * 1e6 / ops, 1),
            "workers_us_per_op": round(crew_s * 1e6 / ops, 1), "p50_ms": out["p50_ms"],
            "loadavg_1m": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--topics", type=int, default=40, help="topics of the registering broker")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-unchanged-") as tmp:
        row = run(os.path.join(tmp, "c"), args.workers, args.seconds, args.topics)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
