"""3 voters with and without 2 read replicas, side by side in one run, alone (bench/replicas.py has the
loads; `python -m bench --only cores` runs them in the suite with issue 27's yardsticks).

    .venv/bin/python -m tests.interop.bench_replicas --seconds 10 --connections 8 [--rounds 1] [--report out.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.replicas import report, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_replicas", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--report", help="also write the table to this file")
    args = p.parse_args(argv)
    text = report(run(args.seconds, args.connections, args.rounds),
                  "python -m tests.interop.bench_replicas " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(text)
    if args.report:
        Path(args.report).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
