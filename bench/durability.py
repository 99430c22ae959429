"""Benchmarks of a cluster's life cycle: failover, restart, catch-up, memory, huge registrations.

    .venv/bin/python -m bench.durability --root /tmp/nsbench --records 1000000 --json out.json

Each measurement starts its own local 3-node cluster (bench/procs.py) of real
`nameserver serve` processes on 127.0.0.1 and times what an operator or a client would see:
- failover: leader SIGKILL -> first write acknowledged through a surviving node (a client retrying
  every 20 ms, as nameserver.client does), over N trials;
- restart recovery: a follower killed with SIGKILL and restarted -> ready and caught up;
- follower catch-up: a follower whose data directory was deleted -> converged (snapshot transfer);
- resident memory of each node holding the records;
- one broker registering 70,000 topics (streamed), and the route read of one of them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

import grpc

from bench.load import proc_cpu_s
from bench.procnet import wait_grpc_serving
from bench.procs import BenchNode, LocalCluster, rss_bytes, with_descendants
from nameserver import headers
from nameserver.api import corelink
from nameserver.chunking import register_chunks
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2

RETRY_EVERY_S = 0.02
TOPICS_PER_BROKER = 10_000


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))]


def registration(broker: int, topics: int, prefix: str = "T", counter: int = 1) -> api_pb2.RegisterBrokerRequest:
    return api_pb2.RegisterBrokerRequest(
        cluster_name="BenchCluster", broker_name=f"broker-{broker}",
        broker_addr=f"10.{broker // 65536 % 256}.{broker // 256 % 256}.{broker % 256}:10911", broker_id=0,
        ha_server_addr="10.0.0.1:10912", heartbeat_timeout_ms=3_600_000,
        data_version=state_pb2.DataVersion(counter=counter, timestamp=1_700_000_000_000),
        topics=[api_pb2.TopicConfig(topic_name=f"{prefix}{broker}-{t}", read_queue_nums=4, write_queue_nums=4,
                                    perm=6) for t in range(topics)])


def register(node: BenchNode, req: api_pb2.RegisterBrokerRequest, timeout: float = 300) -> api_pb2.RegisterBrokerReply:
    return node.ns().RegisterBrokerStream(iter(register_chunks(req)), timeout=timeout)


def fill(cluster: LocalCluster, records: int) -> dict[str, Any]:
    """Register brokers of TOPICS_PER_BROKER topics until the state holds `records` records."""
    term0 = cluster.wait_ready().require_status().term
    t0 = time.monotonic()
    written, broker, retries = 0, 0, 0
    while written < records:
        topics = min(TOPICS_PER_BROKER, max(1, records - written - 2))
        req = registration(broker, topics)
        retried = False
        while True:  # as a broker would: retry (idempotent: same DataVersion) on the current leader
            try:
                got = register(cluster.leader() or cluster.wait_ready(), req, timeout=60).records
                # a retry's reply counts only what the attempt it retries had not written: a new broker's
                # registration writes its topics, its broker and its live record (else the fill went on past
                # the records asked for, into limits.max_queue_datas, on a loaded machine)
                written += max(got, topics + 2) if retried else got
                break
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                        or retries > 20:
                    raise
                retries += 1
                retried = True
                time.sleep(0.2)
        broker += 1
    seconds = time.monotonic() - t0
    sts = cluster.wait_converged(timeout=600)
    return {"records": written, "keys": sts[0].keys, "brokers": broker, "seconds": round(seconds, 1),
            "retried_registrations": retries, "elections": max(s.term for s in sts) - term0,
            "records_per_s": round(written / seconds), "apply_offset": sts[0].apply_offset}


def _write_until_acked(nodes: list[BenchNode], key: str, deadline: float) -> float:
    """Put a KV through `nodes` in turn until one acknowledges; the time it was acknowledged."""
    i = 0
    while time.monotonic() < deadline:
        node = nodes[i % len(nodes)]
        i += 1
        try:
            node.ns().PutKv(api_pb2.PutKvRequest(namespace="bench", key=key, value="v"), timeout=1.0)
            return time.monotonic()
        except grpc.RpcError:
            time.sleep(RETRY_EVERY_S)
    raise TimeoutError(f"no write acknowledged for {key}")


def failover(root: str, trials: int, sections: dict | None = None) -> dict[str, Any]:
    """Leader SIGKILL to the first acknowledged write, `trials` times (the killed node rejoins). Each trial
    starts from a steady cluster: every node converged and, with worker processes, every worker serving
    (the node killed last time restarts its workers one after another: killing the next leader while they
    still load timed the machine's two cores shared with that restart, not the failover)."""
    times: list[float] = []
    elections: list[int] = []
    workers = (sections or {}).get("node", {}).get("worker_processes", 0)
    with LocalCluster(os.path.join(root, "failover"), sections=sections or {}) as c:
        for trial in range(trials):
            leader = c.wait_ready()
            c.wait_converged()
            for n in c.nodes if workers else ():
                wait_grpc_serving(n.pid, n.grpc_addr, workers)  # either front end ([node] grpc_front)
            term = leader.require_status().term
            survivors = [n for n in c.nodes if n is not leader]
            c.kill(leader)
            t0 = time.monotonic()
            acked = _write_until_acked(survivors, f"failover-{trial}", t0 + 30)
            times.append(acked - t0)
            new_leader = c.wait_ready(survivors)
            elections.append(new_leader.require_status().term - term)
            c.start(leader)
    return {"trials": trials, "worker_processes": workers,
            "p50_s": round(percentile(times, 50), 3), "p99_s": round(percentile(times, 99), 3),
            "max_s": round(max(times), 3), "min_s": round(min(times), 3),
            "times_s": [round(t, 3) for t in times], "terms_per_failover": elections}


def _ready_and_caught_up(c: LocalCluster, node: BenchNode, target: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = node.status(timeout=1.0)
        if st is not None and st.ready and st.apply_offset >= target:
            return time.monotonic()
        if node.proc is not None and node.proc.poll() is not None:
            raise RuntimeError(f"{node.name} exited; see {node.log_path}")
        time.sleep(0.02)
    raise TimeoutError(f"{node.name} not caught up within {timeout}s; see {node.log_path}")


def recovery(root: str, records: int, sections: dict | None = None, workers: list[int] | None = None,
             restarts: int = 3) -> dict[str, Any]:
    """Fill to `records`, then time a follower's restart and a wiped follower's catch-up; then for each of
    `workers`, one node with that many worker processes (node_with_workers), under "nodes"."""
    out: dict[str, Any] = {}
    with LocalCluster(os.path.join(root, "recovery"), sections=sections or {}) as c:
        out["fill"] = fill(c, records)
        leader = c.wait_ready()
        out["rss_mib_after_fill"] = {n.name: n.rss_bytes() >> 20 for n in c.nodes}
        for n in c.nodes:  # what a node restarting after a while finds: a snapshot, a short journal
            n.admin().TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=300)
        target = leader.require_status().commit_offset
        follower = next(n for n in c.nodes if n is not leader)

        c.kill(follower)
        t0 = time.monotonic()
        c.start(follower)
        out["restart_recovery_s"] = round(_ready_and_caught_up(c, follower, target, 300) - t0, 2)
        out["restart_rss_mib"] = follower.rss_bytes() >> 20

        c.kill(follower)
        shutil.rmtree(follower.data_dir)
        t0 = time.monotonic()
        c.start(follower)
        out["catch_up_from_empty_s"] = round(_ready_and_caught_up(c, follower, target, 600) - t0, 2)
        sts = c.wait_converged(timeout=300)
        out["digests_equal"] = len({s.digest for s in sts}) == 1
        out["rss_mib_after_catch_up"] = {n.name: n.rss_bytes() >> 20 for n in c.nodes}
        out["snapshot_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in
                                    os.walk(os.path.join(follower.data_dir)) for f in fs if f.endswith(".mdb"))
    for count in workers or ():
        out.setdefault("nodes", {})[str(count)] = node_with_workers(root, records, count, restarts, sections)
    return out


def nodes_markdown(nodes: dict[str, dict[str, Any]]) -> list[str]:
    """The table of node_with_workers' results, one row per worker count."""
    lines = ["| worker_processes | PSS MiB after the fill: core / workers / total | after the restarts: core / "
             "workers / total | restart to core ready, s | restart to the node serving (a worker), s | restart to "
             "every worker serving, s | CPU s used by then: core + workers |",
             "|---|---|---|---|---|---|---|"]
    for n, v in nodes.items():
        cells = []
        for when in ("memory_after_fill", "memory_after_restart"):
            m = v[when]
            cells.append(f"{m['pss_core_mib']} / {', '.join(map(str, m['pss_workers_mib'])) or '-'} / "
                         f"**{m['pss_total_mib']}**")
        cpu = ", ".join(" + ".join(map(str, each)) for each in v.get("restart_cpu_s_core_then_workers", []))
        lines.append(f"| {n} | {cells[0]} | {cells[1]} | {', '.join(map(str, v['restart_core_ready_s']))} | "
                     f"{', '.join(map(str, v.get('restart_node_serving_s', [])))} | "
                     f"{', '.join(map(str, v['restart_all_serving_s']))} | {cpu} |")
    return lines


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process (Linux /proc smaps_rollup): its private pages plus its share of
    the pages it maps with others (a node's core and workers sharing a file map count it once in all)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _node_memory(node: BenchNode) -> dict[str, Any]:
    """PSS and RSS (MiB) of a node's core and of each of its worker processes."""
    core, *workers = with_descendants([node.pid])
    pss = {pid: pss_bytes(pid) >> 20 for pid in (core, *workers)}
    return {"pss_core_mib": pss[core], "pss_workers_mib": [pss[w] for w in workers],
            "pss_total_mib": sum(pss.values()), "rss_core_mib": rss_bytes(core) >> 20,
            "rss_workers_mib": [rss_bytes(w) >> 20 for w in workers]}


def _all_serving(node: BenchNode, workers: int, log_from: int, target: int,
                 timeout: float) -> tuple[float, float, float]:
    """After a restart: (when the core answered ready at `target`, when the first worker and when every
    worker logged that it serves), monotonic: from the first, the node's ports answer (SO_REUSEPORT hands
    every connection to the workers listening). The core is asked on its private socket; the workers'
    ports open only once their replica is ready, and each says so in the node's log (nameserver/worker.py)."""
    deadline = time.monotonic() + timeout
    core_at = first_at = serving_at = 0.0
    private = "unix:" + os.path.abspath(os.path.join(node.data_dir, corelink.SOCKET_NAME))
    channel = grpc.insecure_channel(private if workers else node.grpc_addr, options=[
        ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 100)])
    admin = api_pb2_grpc.AdminStub(channel)
    try:
        while time.monotonic() < deadline and not (core_at and serving_at):
            if not core_at:
                try:
                    st = admin.Status(api_pb2.StatusRequest(), timeout=1.0, metadata=[(headers.WORKER_CALLER,
                                                                                      '{"self": true}')])
                    if st.ready and st.apply_offset >= target:
                        core_at = time.monotonic()
                except grpc.RpcError:
                    pass
            if not serving_at:
                with open(node.log_path, "rb") as f:
                    f.seek(log_from)
                    served = set(re.findall(rb"worker (\d+) \(pid \d+\) serving gRPC", f.read()))
                if served and not first_at:
                    first_at = time.monotonic()
                if len(served) >= workers:
                    serving_at = time.monotonic()
                    first_at = first_at or serving_at
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(f"{node.name} exited; see {node.log_path}")
            time.sleep(0.02)
    finally:
        channel.close()
    if not (core_at and serving_at):
        raise TimeoutError(f"{node.name} not serving within {timeout}s; see {node.log_path}")
    return core_at, first_at, serving_at


def node_with_workers(root: str, records: int, workers: int, restarts: int = 3,
                      sections: dict | None = None) -> dict[str, Any]:
    """One node with `workers` worker processes ([node] worker_processes), filled to `records` as the
    recovery part fills: the memory of its core and of each worker (PSS: what the node costs the machine,
    pages shared between them counted once), and its restart (SIGKILL, start) to the core ready and every
    worker serving, `restarts` times."""
    sections = {k: dict(v) for k, v in (sections or {}).items()}
    sections.setdefault("node", {})["worker_processes"] = workers
    out: dict[str, Any] = {"workers": workers}
    with LocalCluster(os.path.join(root, f"workers-{workers}"), size=1, sections=sections) as c:
        node = c.nodes[0]
        if workers:
            _all_serving(node, workers, 0, 0, 60)
        out["fill"] = fill(c, records)
        node.admin().TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=300)
        target = node.require_status().commit_offset
        time.sleep(2)  # the workers' replicas reach the end
        out["memory_after_fill"] = _node_memory(node)
        core_s, node_s, serving_s, cpu_s = [], [], [], []
        for _ in range(restarts):
            c.kill(node)
            log_from = os.path.getsize(node.log_path)
            t0 = time.monotonic()
            c.start(node)
            core_at, first_at, serving_at = _all_serving(node, workers, log_from, target, 300)
            core_s.append(round(core_at - t0, 2))
            node_s.append(round(max(core_at, first_at) - t0, 2))
            serving_s.append(round(max(core_at, serving_at) - t0, 2))
            # CPU used to get there (the time depends on what else runs on the machine; this much less)
            core, *procs = with_descendants([node.pid])
            cpu_s.append([round(proc_cpu_s([core]), 2), *(round(proc_cpu_s([w]), 2) for w in procs)])
        time.sleep(2)
        out["memory_after_restart"] = _node_memory(node)
        out["restart_core_ready_s"] = core_s
        out["restart_node_serving_s"] = node_s
        out["restart_all_serving_s"] = serving_s
        out["restart_cpu_s_core_then_workers"] = cpu_s
        out["digest"] = node.require_status().digest
    return out


def huge_registration(root: str, topics: int = 70_000, sections: dict | None = None) -> dict[str, Any]:
    """One broker registering `topics` topics in one (streamed) registration, then a route read."""
    with LocalCluster(os.path.join(root, "huge"), sections=sections or {}) as c:
        leader = c.wait_ready()
        follower = next(n for n in c.nodes if n is not leader)
        req = registration(0, topics, prefix="Huge")
        t0 = time.monotonic()
        reply = register(follower, req)  # through a follower: forwarding included
        seconds = time.monotonic() - t0
        t1 = time.monotonic()
        route = follower.ns().GetRoute(api_pb2.GetRouteRequest(topic=f"Huge0-{topics - 1}", min_offset=reply.offset),
                                       timeout=30)
        read_ms = (time.monotonic() - t1) * 1000  # includes waiting for the follower to apply it
        t2 = time.monotonic()
        follower.ns().GetRoute(api_pb2.GetRouteRequest(topic=f"Huge0-{topics // 2}"), timeout=30)
        steady_ms = (time.monotonic() - t2) * 1000
        again = register(follower, req)  # unchanged DataVersion: nothing to write
        return {"topics": topics, "request_bytes": req.ByteSize(), "seconds": round(seconds, 2),
                "records": reply.records, "route_read_ms": round(read_ms, 2),
                "route_read_after_ms": round(steady_ms, 2),
                "route_queue_datas": len(route.route.queue_datas), "re_registration_records": again.records}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="", help="work directory (default: a new temporary one)")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--failover-trials", type=int, default=20)
    p.add_argument("--topics", type=int, default=70_000, help="topics of the single huge registration")
    p.add_argument("--only", choices=("failover", "recovery", "huge"), action="append")
    p.add_argument("--workers", default="", help="recovery: also one node with each of these worker_processes "
                   "(comma-separated, e.g. 0,2): PSS of core and workers, restart to every worker serving")
    p.add_argument("--restarts", type=int, default=3, help="restarts of each --workers node")
    p.add_argument("--no-fsync", action="store_true", help="run the cluster with raft.fsync = false")
    p.add_argument("--worker-processes", type=int, default=0, help="every cluster's nodes with this "
                   "many worker processes ([node] worker_processes; --workers sets its own nodes)")
    p.add_argument("--json", default="", help="write the results here too")
    args = p.parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="nsbench-")
    sections: dict[str, dict[str, Any]] = {"raft": {"fsync": False}} if args.no_fsync else {}
    if args.worker_processes:
        sections["node"] = {"worker_processes": args.worker_processes}
    only = set(args.only or ("failover", "recovery", "huge"))
    results: dict[str, Any] = {}
    if "failover" in only:
        results["failover"] = failover(root, args.failover_trials, sections)
        print(json.dumps({"failover": results["failover"]}), flush=True)
    if "huge" in only:
        results["huge_registration"] = huge_registration(root, args.topics, sections)
        print(json.dumps({"huge_registration": results["huge_registration"]}), flush=True)
    if "recovery" in only:
        results["recovery"] = recovery(root, args.records, sections,
                                       [int(w) for w in args.workers.split(",") if w.strip()], args.restarts)
        print(json.dumps({"recovery": results["recovery"]}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the clusters' cleanup
    sys.exit(main())
