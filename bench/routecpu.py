"""`python -m bench.routecpu`: server CPU per route read (GET_ROUTEINFO_BY_TOPIC), two source trees A/B.

For a shared, noisy machine: one node of each tree runs at once (each started from its own source root),
and loads of the compiled generator (bench/loadgen) alternate between them, round after round, at fixed
connection counts (the order flipped each round), so both sides see the same background. The figure is
the node's CPU (its workers' too, from /proc) per read; the median over the rounds is reported.

    python -m bench.routecpu --a /tmp/before --b . --workers 0 --clients 1,8 --rounds 5 --seconds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

from bench import remoting
from bench.procnet import wait_listening
from bench.procs import LocalCluster


@contextlib.contextmanager
def node_from(source: str, root: str, workers: int) -> Iterator[tuple[str, int]]:
    """One node running the code under `source` (its cwd, so `-m nameserver...` imports that tree)."""
    c = LocalCluster(root, 1, sections={"node": {"worker_processes": workers}}, remoting=True)
    here = os.getcwd()
    try:
        os.chdir(source)
        try:
            c.start()
        finally:
            os.chdir(here)
        c.wait_ready(timeout=60)
        n = c.nodes[0]
        wait_listening(n.pid, n.remoting_addr, max(workers, 1))
        yield n.remoting_addr, n.pid
    finally:
        c.stop()


def run(sources: dict[str, str], workers: int, clients: list[int], rounds: int, seconds: float) -> dict[str, Any]:
    samples: dict[str, dict[int, list[float]]] = {side: {c: [] for c in clients} for side in sources}
    rates: dict[str, dict[int, list[float]]] = {side: {c: [] for c in clients} for side in sources}
    with tempfile.TemporaryDirectory(prefix="routecpu-") as tmp, contextlib.ExitStack() as stack:
        nodes = {side: stack.enter_context(node_from(src, os.path.join(tmp, side), workers))
                 for side, src in sources.items()}
        for side, (addr, _) in nodes.items():
            stack.enter_context(remoting.seeded(addr, f"rc-{side}"))
        order = list(sources)
        for r in range(rounds):
            for c in clients:
                for side in order if r % 2 == 0 else reversed(order):
                    addr, pid = nodes[side]
                    row = remoting.run_load("reads", [addr], c, seconds, [pid], prefix=f"rc-{side}")
                    if row["errors"]:
                        raise RuntimeError(f"{side}: {row['errors']} errors: {row['first_error']}")
                    samples[side][c].append(row["server_us_per_op"])
                    rates[side][c].append(row["per_s"])
    out: dict[str, Any] = {"workers": workers, "rounds": rounds, "seconds": seconds, "sources": sources,
                           "load_average": os.getloadavg(), "sides": {}}
    for side in sources:
        out["sides"][side] = {str(c): {"median_us_per_read": statistics.median(samples[side][c]),
                                       "us_per_read": samples[side][c],
                                       "median_reads_per_s": round(statistics.median(rates[side][c]))}
                              for c in clients}
    if len(sources) == 2:
        a, b = list(sources)
        out["b_over_a"] = {str(c): round(out["sides"][b][str(c)]["median_us_per_read"]
                                         / out["sides"][a][str(c)]["median_us_per_read"], 3) for c in clients}
        # each round's pair (run one after the other): the median of their ratios, and how many B won
        pairs = {c: [y / x for x, y in zip(samples[a][c], samples[b][c], strict=True)] for c in clients}
        out["b_over_a_paired"] = {str(c): round(statistics.median(r), 3) for c, r in pairs.items()}
        out["b_lower_rounds"] = {str(c): sum(x < 1 for x in r) for c, r in pairs.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="source root of side A (e.g. the code before)")
    p.add_argument("--b", default=".", help="source root of side B")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--clients", default="1,8")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    sources = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    res = run(sources, args.workers, [int(c) for c in args.clients.split(",")], args.rounds, args.seconds)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
