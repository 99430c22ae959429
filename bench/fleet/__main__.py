"""`python -m bench.fleet [--preset NAME] [--json FILE] [--html FILE]`: one simulator run (docs/scaling.md,
"Simulator runs"). Presets: `short` (make test's size, seconds), `s1000` and `s3000` (make simulate's two
fleet sizes); the flags after a preset change its fields (`--worker-processes 1`: every node with one worker
process, which holds its client ports)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import fields, replace
from typing import Any

from bench.fleet import Fleet
from bench.fleet.chart import page, svg
from bench.fleet.run import Simulation, simulate

# s3000 runs at the real periods: at time x2 it offered 600 heartbeats and 800 route reads a second, more than
# this shared 2-core machine gave the cluster (docs/scaling.md, "Simulator runs").
# Churn of the real fleet in the large presets: each broker restarts about once a day (a rolling upgrade
# a week, plus failures), 600 topic creations or deletions an hour.
PRESETS: dict[str, Simulation] = {
    "short": Simulation(Fleet(brokers=50, topics=500, clients=100, topics_per_client=2,
                              broker_restarts_per_hour=60, topic_changes_per_hour=120),
                        time_scale=30, seconds=7, window_s=1, mass_expiry_at_s=1, mass_expiry_fraction=0.2,
                        client_connections=8, expiry_probe_brokers=10),
    "s1000": Simulation(Fleet(brokers=1000, topics=50_000, clients=1000, topics_per_client=4,
                              broker_restarts_per_hour=40, topic_changes_per_hour=600),
                        time_scale=2, seconds=150, window_s=10, mass_expiry_at_s=30, mass_expiry_fraction=0.1),
    "s3000": Simulation(Fleet(brokers=3000, topics=150_000, clients=3000, topics_per_client=4,
                              broker_restarts_per_hour=120, topic_changes_per_hour=600),
                        time_scale=1, seconds=210, window_s=10, mass_expiry_at_s=30, mass_expiry_fraction=0.1),
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    p.add_argument("--preset", choices=sorted(PRESETS), default="short")
    for f in fields(Fleet):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(PRESETS["short"].fleet, f.name)))
    for name in ("time_scale", "seconds", "window_s", "mass_expiry_at_s", "mass_expiry_fraction"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float)
    for name in ("nodes", "client_connections", "expiry_probe_brokers", "seed", "worker_processes"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int)
    p.add_argument("--root", help="the cluster's directory (default: a temporary one)")
    p.add_argument("--json", help="write the report here (default: stdout)")
    p.add_argument("--html", help="write the chart (SVG inside an HTML page) here")
    return p.parse_args(argv)


def simulation(args: argparse.Namespace) -> Simulation:
    """The preset with the flags given applied."""
    base = PRESETS[args.preset]
    given: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    fleet = replace(base.fleet, **{f.name: given[f.name] for f in fields(Fleet) if f.name in given})
    return replace(base, fleet=fleet, **{f.name: given[f.name] for f in fields(Simulation)
                                         if f.name != "fleet" and f.name in given})


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    sim = simulation(args)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.root:
        report = simulate(sim, args.root, log)
    else:
        with tempfile.TemporaryDirectory(prefix="fleet-") as root:
            report = simulate(sim, root, log)
    report["command"] = "python -m bench.fleet " + " ".join(argv if argv is not None else sys.argv[1:])
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if args.html:
        with open(args.html, "w") as f:
            f.write(page(report, svg(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
