"""3 voters with and without 2 read replicas on other machines (`nameserver replica`), side by side in one
run: remoting route-read capacity over every endpoint, write (registration) throughput on the leader, and
the leader's CPU with the replicas following it, driven by the compiled load generator (bench/loadgen/).

    .venv/bin/python -m tests.interop.bench_replicas --seconds 10 --connections 8 [--rounds 1] [--report out.md]

Per round: route reads over the 3 voters; registrations against the leader; the leader's CPU idle; then 2
replicas are started (following the voters, listed first so both follow the leader: the worst case for
it), and the same three loads run with the replicas' endpoints added to the reads. On one machine the
replicas share its cores with the voters: read capacity here shows what they cost and serve, not what
they add on machines of their own; each process's CPU per read is reported so that can be projected.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.load import proc_cpu_s
from nameserver.localports import free_ports
from tests.cluster import ROOT, Cluster
from tests.fakebroker import FakeBroker

from .bench_remoting import ROUTE_TOPICS, run_load

REPLICAS = 2
IDLE_S = 5.0


@contextmanager
def replicas(root: str, follow: list[str], n: int) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    """`n` read replica processes following `follow`, each ready: (remoting address, process)."""
    procs: list[tuple[str, subprocess.Popen]] = []
    try:
        for i in range(n):
            grpc_port, remoting_port = free_ports(2)
            config = os.path.join(root, f"replica{i}.toml")
            Path(config).write_text(f'[node]\ngrpc_addr = "127.0.0.1:{grpc_port}"\n\n[remoting]\n'
                                    f'listen = "127.0.0.1:{remoting_port}"\n\n'
                                    f'[replica]\nfollow = {json.dumps(follow)}\n')
            with open(os.path.join(root, f"replica{i}.log"), "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "nameserver.cli.serve", "replica", "--config", config],
                                        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                        env=os.environ | {"PYTHONPATH": ROOT})
            procs.append((f"127.0.0.1:{remoting_port}", proc))
            _wait_ready(f"127.0.0.1:{grpc_port}")
        yield procs
    finally:
        for _, proc in procs:
            proc.terminate()
            proc.wait(timeout=15)


def _wait_ready(grpc_addr: str, timeout: float = 60.0) -> None:
    import grpc

    from nameserver.pb import api_pb2, api_pb2_grpc
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(grpc_addr) as ch:
        while time.monotonic() < deadline:
            try:
                if api_pb2_grpc.AdminStub(ch).Status(api_pb2.StatusRequest(), timeout=1).ready:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"read replica {grpc_addr} not ready within {timeout} s")


def idle_cpu(pid: int) -> float:
    """The process's CPU (share of one core) over IDLE_S with no load."""
    cpu0 = proc_cpu_s([pid])
    time.sleep(IDLE_S)
    return (proc_cpu_s([pid]) - cpu0) / IDLE_S


def measure(cluster: Cluster, leader_pid: int, leader_remoting: str, extra: list[str], extra_pids: list[int],
            args: argparse.Namespace, label: str) -> dict[str, Any]:
    voters = [n.remoting_addr for n in cluster.nodes]
    voter_pids = [n.proc.pid for n in cluster.nodes if n.proc is not None]
    reads = run_load("reads", voters + extra, args.connections, args.seconds, voter_pids + extra_pids,
                     prefix=f"r-{label}")
    cpu0 = proc_cpu_s([leader_pid])
    writes = run_load("registrations", [leader_remoting], args.connections, args.seconds, [leader_pid],
                      prefix=f"w-{label}")
    leader_write_cpu = (proc_cpu_s([leader_pid]) - cpu0) / args.seconds
    return {"label": label, "reads_per_s": reads["per_s"], "read_errors": reads["errors"],
            "read_p99_ms": reads["p99_ms"], "servers_us_per_read": reads["server_us_per_op"],
            "writes_per_s": writes["per_s"], "write_errors": writes["errors"], "write_p99_ms": writes["p99_ms"],
            "leader_cpu_writing": round(leader_write_cpu, 3),
            "leader_us_per_write": round(leader_write_cpu / writes["per_s"] * 1e6, 1) if writes["per_s"] else 0.0,
            "leader_cpu_idle": round(idle_cpu(leader_pid), 3)}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as root:
        cluster = Cluster(root, 3, remoting=True)
        cluster.start()
        try:
            leader = cluster.wait_ready(timeout=60)
            assert leader.proc is not None
            seed = FakeBroker(name="seed", cluster="BenchCluster")  # its connection stays open: routes stay
            assert seed.register(leader.remoting_addr, ROUTE_TOPICS, counter=1, compressed=False).code == 0
            # the leader first: both replicas follow it, the worst case for the leader
            follow = [leader.grpc_addr] + [n.grpc_addr for n in cluster.nodes if n is not leader]
            for r in range(args.rounds):
                rows.append(measure(cluster, leader.proc.pid, leader.remoting_addr, [], [], args, f"voters-{r}"))
                with replicas(root, follow, REPLICAS) as reps:
                    rows.append(measure(cluster, leader.proc.pid, leader.remoting_addr, [a for a, _ in reps],
                                        [p.pid for _, p in reps], args, f"voters+{REPLICAS}-replicas-{r}"))
        finally:
            cluster.stop()
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    cols = ["label", "reads_per_s", "read_p99_ms", "servers_us_per_read", "writes_per_s", "write_p99_ms",
            "leader_cpu_writing", "leader_us_per_write", "leader_cpu_idle", "read_errors", "write_errors"]
    out = [f"`python -m tests.interop.bench_replicas --seconds {args.seconds} --connections {args.connections} "
           f"--rounds {args.rounds}`", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    without = [r for r in rows if "replicas" not in r["label"]]
    with_ = [r for r in rows if "replicas" in r["label"]]
    if without and with_:
        def mean(rs: list[dict[str, Any]], key: str) -> float:
            return statistics.mean(r[key] for r in rs)
        per_replica = (mean(with_, "leader_cpu_idle") - mean(without, "leader_cpu_idle")) / REPLICAS
        per_replica_w = (mean(with_, "leader_us_per_write") - mean(without, "leader_us_per_write")) / REPLICAS
        writes = mean(with_, "writes_per_s") / mean(without, "writes_per_s")
        reads = mean(with_, "reads_per_s") / mean(without, "reads_per_s")
        out += ["", f"leader CPU per replica: {per_replica:+.3f} cores idle, {per_replica_w:+.1f} us per write under "
                f"the write load; writes with/without replicas: {writes:.2f}x; route reads with/without: {reads:.2f}x"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_replicas", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--report", help="also write the table to this file")
    args = p.parse_args(argv)
    text = report(run(args), args)
    print(text)
    if args.report:
        Path(args.report).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
