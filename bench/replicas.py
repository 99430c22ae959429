"""3 voters with and without 2 read replicas on other machines (`nameserver replica`), side by side in one
run: remoting route-read capacity over every endpoint, write (registration) throughput on the leader, and
the leader's CPU with the replicas following it, driven by the compiled load generator (bench/loadgen/).
`python -m tests.interop.bench_replicas` runs it alone; bench/cores.py in the suite.

Per round: route reads over the 3 voters; registrations against the leader; the leader's CPU idle; then 2
replicas are started (the leader listed first in their `follow`), as the product runs them: each moves to
a voter that does not lead ([replica] follow_leader false, nameserver/replica/voters.py), and the same three
loads run with the replicas' endpoints added to the reads; then the same with `follow_leader = true`, both
replicas on the leader (the worst case for it, and what every replica did before). On one machine the
replicas share its cores with the voters: read capacity here shows what they cost and serve, not what
they add on machines of their own; each process's CPU per read is reported so that can be projected. The
registrations run twice with the replicas up: as they are, and with the replicas under SCHED_IDLE
(`yielding`: they run on what CPU the voters leave, standing in for machines of their own; the entries
still reach them over real sockets), so the leader's own cost of replicas shows apart from their apply
taking the voters' CPU.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

import grpc

from bench.load import proc_cpu_s
from bench.procnet import wait_listening
from bench.procs import LocalCluster
from bench.remoting import run_load, seeded
from nameserver.localports import free_ports
from nameserver.pb import api_pb2, api_pb2_grpc

REPLICAS = 2
IDLE_S = 5.0


@contextmanager
def replicas(root: str, follow: list[str], n: int, follow_leader: bool = False
             ) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    """`n` read replica processes following `follow`, each ready and, unless `follow_leader`, off the
    first of `follow` (the leader): (remoting address, process)."""
    procs: list[tuple[str, subprocess.Popen]] = []
    try:
        for i in range(n):
            grpc_port, remoting_port = free_ports(2)
            config = os.path.join(root, f"replica{i}.toml")
            Path(config).write_text(f'[node]\ngrpc_addr = "127.0.0.1:{grpc_port}"\n\n[remoting]\n'
                                    f'listen = "127.0.0.1:{remoting_port}"\n\n'
                                    f'[replica]\nfollow = {json.dumps(follow)}\n'
                                    f'follow_leader = {"true" if follow_leader else "false"}\n')
            with open(os.path.join(root, f"replica{i}.log"), "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "nameserver.cli.serve", "replica", "--config", config],
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append((f"127.0.0.1:{remoting_port}", proc))
            _wait_ready(f"127.0.0.1:{grpc_port}", avoid="" if follow_leader else follow[0])
        yield procs
    finally:
        for _, proc in procs:
            proc.terminate()
            proc.wait(timeout=15)


def _wait_ready(grpc_addr: str, timeout: float = 60.0, avoid: str = "") -> None:
    """Until the replica answers ready, following another voter than `avoid` when given."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(grpc_addr) as ch:
        while time.monotonic() < deadline:
            try:
                st = api_pb2_grpc.AdminStub(ch).Status(api_pb2.StatusRequest(), timeout=1)
                if st.ready and st.following != avoid:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"read replica {grpc_addr} not ready within {timeout} s")


def idle_cpu(pid: int, seconds: float = IDLE_S) -> float:
    """The process's CPU (share of one core) over `seconds` with no load."""
    cpu0 = proc_cpu_s([pid])
    time.sleep(seconds)
    return (proc_cpu_s([pid]) - cpu0) / seconds


@contextmanager
def yielding(pids: list[int]) -> Iterator[None]:
    """The processes (their threads) under SCHED_IDLE while inside: they run only on CPU the others leave,
    as replicas on machines of their own take none of the voters'. Their network traffic stays real."""
    def threads() -> list[int]:  # listed again on the way out: threads started inside inherit SCHED_IDLE
        out = []
        for pid in pids:
            with suppress(FileNotFoundError):
                out += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        return out

    for tid in threads():
        with suppress(ProcessLookupError):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    try:
        yield
    finally:
        for tid in threads():
            with suppress(ProcessLookupError):  # PermissionError (no CAP_SYS_NICE) is not hidden
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def measure(cluster: LocalCluster, leader_pid: int, leader_remoting: str, extra: list[str], extra_pids: list[int],
            seconds: float, connections: int, label: str, idle_s: float = IDLE_S) -> dict[str, Any]:
    """Route reads over every endpoint, registrations on the leader, the leader's idle CPU; with replicas
    (`extra_pids`) also the registrations again with the replicas yielding the CPU (`yielding`)."""
    voters = [n.remoting_addr for n in cluster.nodes]
    voter_pids = [n.pid for n in cluster.nodes]
    reads = run_load("reads", voters + extra, connections, seconds, voter_pids + extra_pids, prefix=f"r-{label}")
    cpu0 = proc_cpu_s([leader_pid])
    writes = run_load("registrations", [leader_remoting], connections, seconds, [leader_pid], prefix=f"w-{label}")
    leader_write_cpu = (proc_cpu_s([leader_pid]) - cpu0) / seconds
    yielded: dict[str, Any] = {}
    if extra_pids:
        with yielding(extra_pids):
            w = run_load("registrations", [leader_remoting], connections, seconds, [leader_pid],
                         prefix=f"wy-{label}")
        yielded = {"writes_replicas_yielding": w, "writes_per_s_replicas_yielding": w["per_s"]}
    return {"label": label, **yielded, "replicas": len(extra), "on_leader": "on-leader" in label, "reads": reads,
            "writes": writes,
            "reads_per_s": reads["per_s"], "read_errors": reads["errors"],
            "read_p99_ms": reads["p99_ms"], "servers_us_per_read": reads["server_us_per_op"],
            "writes_per_s": writes["per_s"], "write_errors": writes["errors"], "write_p99_ms": writes["p99_ms"],
            "leader_cpu_writing": round(leader_write_cpu, 3),
            "leader_us_per_write": round(leader_write_cpu / writes["per_s"] * 1e6, 1) if writes["per_s"] else 0.0,
            "leader_cpu_idle": round(idle_cpu(leader_pid, idle_s), 3)}


def run(seconds: float, connections: int, rounds: int, idle_s: float = IDLE_S, work_dir: str = ""
        ) -> list[dict[str, Any]]:
    """Per round, the loads on the 3 voters, then on the voters and REPLICAS replicas (a row each); the
    leader's idle CPU over `idle_s` after each. `work_dir`: where data and logs go, kept (default: a
    temporary directory, removed)."""
    rows: list[dict[str, Any]] = []
    with nullcontext(work_dir) if work_dir else tempfile.TemporaryDirectory(prefix="bench-replicas-") as root:
        cluster = LocalCluster(os.path.join(root, "voters"), 3, remoting=True)
        cluster.start()
        try:
            leader = cluster.wait_ready(timeout=60)
            for n in cluster.nodes:
                wait_listening(n.pid, n.remoting_addr, 1)
            with seeded(leader.remoting_addr, "seed"):  # its connection stays open: routes stay
                # the leader first: both replicas follow it, the worst case for the leader
                follow = [leader.grpc_addr] + [n.grpc_addr for n in cluster.nodes if n is not leader]
                for r in range(rounds):
                    rows.append(measure(cluster, leader.pid, leader.remoting_addr, [], [], seconds, connections,
                                        f"voters-{r}", idle_s))
                    for on_leader in (False, True):
                        with replicas(root, follow, REPLICAS, follow_leader=on_leader) as reps:
                            rows.append(measure(cluster, leader.pid, leader.remoting_addr, [a for a, _ in reps],
                                                [p.pid for _, p in reps], seconds, connections,
                                                f"voters+{REPLICAS}-replicas{'-on-leader' if on_leader else ''}-{r}",
                                                idle_s))
        finally:
            cluster.stop()
    return rows


def summary(rows: list[dict[str, Any]], on_leader: bool = False) -> dict[str, float] | None:
    """Over the rounds (means): the leader's CPU per replica idle (cores) and per write (µs), and the
    ratios with / without the replicas of writes/s and route reads/s, for the replicas as the product runs
    them (off the leader), or `on_leader`; None without both kinds of rows."""
    without = [r for r in rows if not r["replicas"]]
    with_ = [r for r in rows if r["replicas"] and r.get("on_leader", False) == on_leader]
    if not (without and with_):
        return None

    def mean(rs: list[dict[str, Any]], key: str) -> float:
        return statistics.mean(r[key] for r in rs)
    return {"leader_cores_idle_per_replica": round((mean(with_, "leader_cpu_idle")
                                                    - mean(without, "leader_cpu_idle")) / REPLICAS, 4),
            "leader_us_per_write_per_replica": round((mean(with_, "leader_us_per_write")
                                                      - mean(without, "leader_us_per_write")) / REPLICAS, 1),
            "writes_with_without": round(mean(with_, "writes_per_s") / max(mean(without, "writes_per_s"), 1e-9), 3),
            "writes_with_without_yielding": round(mean(with_, "writes_per_s_replicas_yielding")
                                                  / max(mean(without, "writes_per_s"), 1e-9), 3),
            "reads_with_without": round(mean(with_, "reads_per_s") / max(mean(without, "reads_per_s"), 1e-9), 3)}


def report(rows: list[dict[str, Any]], command: str) -> str:
    cols = ["label", "reads_per_s", "read_p99_ms", "servers_us_per_read", "writes_per_s", "write_p99_ms",
            "leader_cpu_writing", "leader_us_per_write", "leader_cpu_idle", "read_errors", "write_errors"]
    out = [f"`{command}`", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    for on_leader in (False, True):
        s = summary(rows, on_leader)
        if s is not None:
            out += ["", f"replicas {'on the leader' if on_leader else 'on followers'}: leader CPU per replica: "
                    f"{s['leader_cores_idle_per_replica']:+.3f} cores idle, {s['leader_us_per_write_per_replica']:+.1f}"
                    f" us per write under the write load; writes with/without replicas: "
                    f"{s['writes_with_without']:.2f}x; route reads with/without: {s['reads_with_without']:.2f}x"]
    return "\n".join(out)
