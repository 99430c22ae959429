"""Apache RocketMQ's jars for the interop tests: fetched by Maven (tests/interop/pom.xml), cached per version.

    python -m tests.interop.jars            # fetch both lines (what `make interop-setup` runs)
    python -m tests.interop.jars 5.5.0      # one version

The fetching and the cache are bench/rocketmq.py's (the benchmarks run the stock NameServer too); the two
lines, LINE_4 and LINE_5, are described there.
"""

from __future__ import annotations

import glob
import os
import sys

from bench.rocketmq import LINE_4, LINE_5, LINES, STAMP, cache_root, classpath, ensure, is_5x, jars_dir


def main(argv: list[str]) -> int:
    versions = argv or list(LINES)
    for v in versions:
        cached = os.path.exists(os.path.join(jars_dir(v), STAMP))
        d = ensure(v)
        n = len(glob.glob(os.path.join(d, "*.jar")))
        print(f"RocketMQ {v}: {n} jars in {d}" + (" (cached)" if cached else " (fetched)"))
    return 0


__all__ = ["LINE_4", "LINE_5", "LINES", "cache_root", "classpath", "ensure", "is_5x", "jars_dir", "main"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
