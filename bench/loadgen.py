"""The compiled remoting load generator (bench/loadgen/, Go, stdlib only): built here on first use, run
here, its one-line JSON report parsed.

A Python client process tops out near the nameserver it measures (it reported 1.10x the stock NameServer
where a compiled one measured 0.37-0.41x per node), so the remoting benchmark's load comes from this binary.
`build()` compiles it once per version of its sources (nameserver/ops/gobuild.py); `run()` starts it,
optionally pinned to some CPUs, and returns its figures.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.procs import children_on
from nameserver.ops import gobuild

SOURCE = Path(__file__).with_name("loadgen")
WORKLOADS = ("reads", "register", "unchanged")


def build(source: Path = SOURCE) -> str:
    """The binary of the Go module at `source` (the load generator's by default): nameserver/ops/gobuild.py."""
    return gobuild.build(source)


def run(workload: str, addrs: Sequence[str], connections: int, seconds: float, inflight: int = 1,
        topics: Sequence[str] = (), prefix: str = "", cpus: Iterable[int] | None = None,
        broker_topics: int = 0) -> dict[str, Any]:
    """One load: `connections` connections spread over `addrs`, each with `inflight` calls outstanding, for
    `seconds`. `cpus`: the CPUs the generator may run on (None: any). `broker_topics`: topics of each
    registering broker (0: the generator's default). Returns the generator's JSON: ops,
    errors, first_error, ops_per_s, p50/p90/p99/max_ms, its own cpu_s and cpu_us_per_op, and the bytes_sent and
    bytes_received of its frames."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: not one of {', '.join(WORKLOADS)}")
    cmd = [build(), "-workload", workload, "-addrs", ",".join(addrs), "-connections", str(connections),
           "-seconds", str(seconds), "-inflight", str(inflight)]
    if topics:
        cmd += ["-topics", ",".join(topics)]
    if prefix:
        cmd += ["-prefix", prefix]
    if broker_topics:
        cmd += ["-broker-topics", str(broker_topics)]
    with children_on(set(cpus) if cpus is not None else None):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if res.returncode != 0:
        raise RuntimeError(f"loadgen {workload} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out
