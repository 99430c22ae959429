"""The remoting port side by side, alone: Apache RocketMQ's stock NameServer and ours, driven by the compiled
load generator, per core, per node and per machine (bench/remoting.py has the setups and loads; `python -m
bench --only cores` runs them in the suite with issue 27's yardsticks).

    .venv/bin/python -m tests.interop.bench_remoting --seconds 10 --clients 1,8 [--setups core,node,machine]
        [--server-cpus 0 --loadgen-cpus 1] [--workers N] [--kinds reads,...] [--json out.json] [--report out.md]
"""

from __future__ import annotations

import argparse
import sys

from bench.remoting import KINDS, SETUPS, cpus_of, markdown, run

from . import jars


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.bench_remoting",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per load")
    parser.add_argument("--clients", default="1,8", help="connection counts, comma-separated")
    parser.add_argument("--inflight", type=int, default=1, help="requests outstanding per connection")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"some of {', '.join(SETUPS)}")
    parser.add_argument("--server-cpus", default="", help="CPUs of the servers in the core setup (default: the first)")
    parser.add_argument("--loadgen-cpus", default="", help="CPUs of the load generator in the core setup "
                                                           "(default: the others)")
    parser.add_argument("--version", default=jars.LINE_5, choices=jars.LINES)
    parser.add_argument("--workers", type=int, default=0, help="[node] worker_processes of each node of ours")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"some of {', '.join(KINDS)}")
    parser.add_argument("--json", default="", help="write the results here too")
    parser.add_argument("--report", default="", help="write the markdown tables here (they are printed too)")
    args = parser.parse_args(argv)
    setups = tuple(s for s in args.setups.split(",") if s)
    unknown = set(setups) - set(SETUPS)
    if unknown:
        parser.error(f"--setups: unknown {', '.join(sorted(unknown))} (known: {', '.join(SETUPS)})")
    res = run(args.version, [int(c) for c in args.clients.split(",")], args.seconds, args.json, setups,
              cpus_of(args.server_cpus) or None, cpus_of(args.loadgen_cpus) or None, args.inflight, args.workers,
              tuple(k for k in args.kinds.split(",") if k))
    report = markdown(res)
    if args.report:
        with open(args.report, "w") as f:
            f.write(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
