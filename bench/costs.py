"""`python -m bench --only costs`: the server's CPU, bytes and memory per operation, measured on a real
3-node cluster, written as the costs file the capacity model reads (nameserver/ops/capacity.py,
docs/scaling.md "The costs file").

Method, the same for every CPU and byte figure: before and after a load, each node's processes (its core
and every process below it, e.g. its worker processes) are read from /proc: CPU (utime + stime of
/proc/<pid>/stat) and bytes (the kernel's bytes_received and bytes_sent of each of its established TCP
sockets, `ss -tinp`: TCP payload, headers of the protocols above TCP included). A socket closed during a
load is not seen, so the bytes of short-lived client connections come from the client instead: the
load generator counts the frames it writes and reads, and gRPC reads are counted on one persistent
channel. The idle cluster's own rate (Raft heartbeats, ticks), measured first, is subtracted for
the load's length, and what is left is divided by the operations the load completed. Each load runs
`repetitions` times; the file keeps every run, the median (the value), min, max and spread.

Loads come from the harness's Python threads (gRPC) or from the compiled remoting load generator
(bench/loadgen: reads and unchanged heartbeats, where Python would be the bound). The harness and the
generator share the machine with the nodes: per-operation figures stay valid (they are the nodes' CPU per
completed operation), throughputs here are not the product's.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from bench import loadgen
from bench.load import new_channel, proc_cpu_s, run_load
from bench.procs import BenchNode, LocalCluster, rss_bytes, with_descendants
from bench.workloads import HEARTBEAT_TIMEOUT_MS, OursTarget, registration_request
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2

SCHEMA = "rip18-costs/1"
IDLE_S = 3.0
SIZES = (8, 64)             # topics per registering broker: two sizes give a fixed and a per-topic cost
WATCHERS = 16               # watch streams open on one follower during the watch load
WATCH_WRITES_PER_S = 100    # paced, so the harness's consumers keep up
EXPIRY_TIMEOUT_MS = 30_000  # the expired brokers' heartbeat timeout
KV_VALUE_BYTES = 1_000


# ---- measuring ---------------------------------------------------------------------------------------

Sockets = dict[tuple[str, str], tuple[int, int]]  # (local, peer) -> (bytes received, bytes sent)


def tcp_sockets(pids: set[int]) -> Sockets:
    """The established TCP sockets of these processes with the kernel's byte counters (`ss -tinp`: TCP
    payload, what crosses the network; /proc/<pid>/io misses sendmsg and recvmsg, i.e. gRPC's sockets)."""
    text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                          timeout=30).stdout
    out: Sockets = {}
    head: list[str] = []
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            head = line.split()
            continue
        if not head or not any(f"pid={p}," in head[-1] for p in pids):
            continue
        fields = dict(f.split(":", 1) for f in line.split() if f.startswith(("bytes_received:", "bytes_sent:")))
        out[(head[2], head[3])] = (int(fields.get("bytes_received", 0)), int(fields.get("bytes_sent", 0)))
    return out


def socket_delta(before: Sockets, after: Sockets) -> tuple[int, int]:
    """Bytes (received, sent) on the sockets open at the end since the start (a socket opened in between
    counts from zero; one closed in between is not seen)."""
    rd = wr = 0
    for key, (r, w) in after.items():
        r0, w0 = before.get(key, (0, 0))
        rd, wr = rd + r - r0, wr + w - w0
    return rd, wr


@dataclass(frozen=True)
class Usage:
    """One node's totals so far: CPU seconds (its core, its other processes) and its sockets' bytes."""

    core_cpu: float
    other_cpu: float
    read_bytes: int
    written_bytes: int

    def minus(self, o: Usage) -> Usage:
        return Usage(self.core_cpu - o.core_cpu, self.other_cpu - o.other_cpu,
                     self.read_bytes - o.read_bytes, self.written_bytes - o.written_bytes)

    def scaled(self, k: float) -> Usage:
        return Usage(self.core_cpu * k, self.other_cpu * k, int(self.read_bytes * k), int(self.written_bytes * k))

    @property
    def cpu(self) -> float:
        return self.core_cpu + self.other_cpu


def usage(node: BenchNode, before: Sockets | None = None) -> tuple[Usage, Sockets]:
    """The node's CPU so far and, against `before`, its sockets' bytes; with the sockets to compare later."""
    pids = with_descendants([node.pid])
    others = [p for p in pids if p != node.pid]
    socks = tcp_sockets(set(pids))
    rd, wr = socket_delta(before, socks) if before is not None else (0, 0)
    return Usage(proc_cpu_s([node.pid]), proc_cpu_s(others), rd, wr), socks


class Meter:
    """Per-node usage of a load, the idle rate measured at the start taken out."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        t0 = time.monotonic()
        def idle() -> int:
            time.sleep(IDLE_S)
            return 0

        used = self._measure(idle)[0]
        elapsed = time.monotonic() - t0
        self.idle = {k: v.scaled(1 / elapsed) for k, v in used.items()}

    def _measure(self, load: Callable[[], int]) -> tuple[dict[str, Usage], int, float]:
        before = {n.name: usage(n) for n in self.cluster.nodes}
        t0 = time.monotonic()
        ops = load()
        elapsed = time.monotonic() - t0
        after = {n.name: usage(n, before[n.name][1])[0] for n in self.cluster.nodes}
        return {k: v.minus(before[k][0]) for k, v in after.items()}, ops, elapsed

    def run(self, load: Callable[[], int]) -> tuple[dict[str, Usage], int]:
        """(per node usage beyond idle, operations) of one run of `load` (which returns its operations)."""
        used, ops, elapsed = self._measure(load)
        return {k: v.minus(self.idle[k].scaled(elapsed)) for k, v in used.items()}, ops


def stat(values: list[float], unit: str, method: str, digits: int = 1) -> dict[str, Any]:
    """One cost: the median of the runs as its value, with every run and the spread."""
    med = statistics.median(values)
    spread = (max(values) - min(values)) / abs(med) * 100 if med else 0.0
    return {"value": round(med, digits), "unit": unit, "method": method, "repetitions": len(values),
            "runs": [round(v, digits) for v in values], "min": round(min(values), digits),
            "max": round(max(values), digits), "spread_pct": round(spread, 1)}


def fit(small: list[float], large: list[float], sizes: tuple[int, int]) -> tuple[list[float], list[float]]:
    """Per-run (fixed part, per-topic part) of a cost measured at two sizes: a straight line through them."""
    a, b = sizes
    slopes = [(y - x) / (b - a) for x, y in zip(small, large, strict=True)]
    return [x - s * a for x, s in zip(small, slopes, strict=True)], slopes


# ---- the cluster -------------------------------------------------------------------------------------

def _cluster(root: str, workers: int) -> LocalCluster:
    # Longer election timeouts than the default 400-1400 ms: on a machine shared by other work a starved
    # leader would otherwise lose its term mid-load (an election is not a cost of the operations measured).
    return LocalCluster(root, sections={"node": {"worker_processes": workers}, "liveness": {"scan_interval_ms": 500},
                                        "raft": {"election_min_ms": 3000, "election_max_ms": 6000}},
                        remoting=True)


def retried(call: Callable[[], Any], tries: int = 5) -> Any:
    """A set-up write (idempotent: a registration, a KV put) again after UNAVAILABLE or a deadline, as a
    leader change on a busy machine leaves it."""
    for attempt in range(tries):
        try:
            return call()
        except grpc.RpcError as exc:
            if attempt == tries - 1 or exc.code() not in (grpc.StatusCode.UNAVAILABLE,
                                                          grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            time.sleep(1.0)
    return None


def _wait_remoting(c: LocalCluster, timeout: float = 30.0) -> None:
    """A remoting port opens just after its node turns ready (docs/remoting.md, "A starting node")."""
    deadline = time.monotonic() + timeout
    for n in c.nodes:
        host, port = n.remoting_addr.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _ready(c: LocalCluster) -> None:
    """Every node ready, converged and listening for remoting; a node that exited is reported with the end of
    its log (the log's directory may be gone by the time anyone reads the error)."""
    try:
        c.wait_ready()
    except RuntimeError as exc:
        tails = []
        for n in c.nodes:
            if n.proc is not None and n.proc.poll() is not None:
                with open(n.log_path, errors="replace") as f:
                    tails.append(f"{n.name}: " + " | ".join(f.read().splitlines()[-5:]))
        raise RuntimeError(f"{exc}; {'; '.join(tails)}") from None
    c.wait_converged()
    _wait_remoting(c)


def _leader_and_followers(c: LocalCluster) -> tuple[BenchNode, list[BenchNode]]:
    leader = c.leader() or c.wait_ready()
    return leader, [n for n in c.nodes if n is not leader]


# ---- the loads ---------------------------------------------------------------------------------------

def grpc_load(addr: str, op_for: Callable[[grpc.Channel, int], Callable[[], int]], threads: int,
              seconds: float) -> Callable[[], int]:
    def load() -> int:
        res = run_load(lambda i: (ch := new_channel(addr), op_for(ch, i)), threads, seconds)
        if res["errors"]:
            raise RuntimeError(f"load had {res['errors']} errors: {res.get('first_error')}")
        return int(res["n"])
    return load


def remoting_load(workload: str, addr: str, seconds: float, broker_topics: int, topics: list[str],
                  prefix: str, reports: list[dict[str, Any]], connections: int = 4,
                  inflight: int = 4) -> Callable[[], int]:
    """A bench/loadgen run; its report (own CPU per op, bytes sent and received) goes to `reports`."""
    def load() -> int:
        cmd_topics = topics if workload == "reads" else []
        out = loadgen.run(workload, [addr], connections, seconds, inflight=inflight, topics=cmd_topics, prefix=prefix,
                          broker_topics=broker_topics)
        if out["errors"] or not out["ops"]:
            raise RuntimeError(f"loadgen {workload}: {out['errors']} errors: {out['first_error']}")
        reports.append(out)
        return int(out["ops"])
    return load


def grpc_bytes(node: BenchNode, call: Callable[[api_pb2_grpc.NameServerStub], object],
               calls: int) -> tuple[float, float]:
    """(bytes received, bytes sent) by `node` per call, `calls` calls in a row on one persistent channel."""
    channel = new_channel(node.grpc_addr)
    try:
        stub = api_pb2_grpc.NameServerStub(channel)
        call(stub)  # connected and warm: the handshake is not a call's
        pids = set(with_descendants([node.pid]))
        before = tcp_sockets(pids)
        for _ in range(calls):
            call(stub)
        rd, wr = socket_delta(before, tcp_sockets(pids))
    finally:
        channel.close()
    return rd / calls, wr / calls


def _per_op(u: Usage, ops: int, what: str) -> float:
    if ops <= 0:
        raise RuntimeError("a load completed no operation")
    value: float = {"cpu": u.cpu * 1e6, "core": u.core_cpu * 1e6, "other": u.other_cpu * 1e6,
                    "in": float(u.read_bytes), "out": float(u.written_bytes)}[what]
    return value / ops


def measure_reads(c: LocalCluster, meter: Meter, reps: int, seconds: float) -> dict[str, Any]:
    target = OursTarget(c, topics=8)
    target.setup_reads()
    _, followers = _leader_and_followers(c)
    node = followers[0]
    out: dict[str, Any] = {}
    runs: dict[str, list[float]] = {k: [] for k in ("g_cpu", "g_out", "g_in", "r_cpu", "r_out", "r_in")}
    lg: list[dict[str, Any]] = []
    request = api_pb2.GetRouteRequest(topic=target.route_topics[0])
    for _ in range(reps):
        use, ops = meter.run(grpc_load(node.grpc_addr, target.route_read_op, 4, seconds))
        runs["g_cpu"].append(_per_op(use[node.name], ops, "cpu"))
        rd, wr = grpc_bytes(node, lambda stub: stub.GetRoute(request, timeout=5), 200)
        runs["g_in"].append(rd)
        runs["g_out"].append(wr)
        use, ops = meter.run(remoting_load("reads", node.remoting_addr, seconds, 0, target.route_topics,
                                           "costs-reads", lg))
        runs["r_cpu"].append(_per_op(use[node.name], ops, "cpu"))
        runs["r_out"].append(lg[-1]["bytes_received"] / ops)
        runs["r_in"].append(lg[-1]["bytes_sent"] / ops)
    route = "a route of 4 brokers and 4 queue datas, served by a follower"
    how = f"{reps} x {seconds:g} s; CPU of the serving node's processes per read, idle rate subtracted"
    g_byt = "TCP payload (ss) of the serving node over 200 GetRoute calls on one persistent channel, per call"
    r_byt = "frames counted by bench/loadgen during the load, per read"
    out["route_read_grpc_cpu_us"] = stat(runs["g_cpu"], "us CPU per read", f"GetRoute, {route}; 4 Python client "
                                         f"threads; {how}")
    out["route_read_grpc_bytes_out"] = stat(runs["g_out"], "bytes sent per read", f"{g_byt} (sent)", 0)
    out["route_read_grpc_bytes_in"] = stat(runs["g_in"], "bytes received per read", f"{g_byt} (received)", 0)
    out["route_read_remoting_cpu_us"] = stat(runs["r_cpu"], "us CPU per read", f"GET_ROUTEINFO_BY_TOPIC, {route}; "
                                             f"bench/loadgen 4 connections x 4 in flight; {how}")
    out["route_read_remoting_bytes_out"] = stat(runs["r_out"], "bytes sent per read", f"{r_byt} (replies)", 0)
    out["route_read_remoting_bytes_in"] = stat(runs["r_in"], "bytes received per read", f"{r_byt} (requests)", 0)
    out["route_read_remoting_loadgen_cpu_us"] = stat([x["cpu_us_per_op"] for x in lg],
                                                     "us CPU of the load generator per read",
                                                     "bench/loadgen's own report (getrusage), beside the server's")
    out["route_brokers"] = stat([4.0], "brokers in the route read", "the route the reads above asked for", 0)
    return out


def measure_heartbeats(c: LocalCluster, meter: Meter, reps: int, seconds: float) -> dict[str, Any]:
    """Unchanged registrations (a RocketMQ broker's periodic heartbeat) sent to a follower: its own cost and
    what reaches the leader (forwarded liveness)."""
    leader, followers = _leader_and_followers(c)
    node = followers[0]
    runs: dict[tuple[int, str], list[float]] = {}
    lg: list[dict[str, Any]] = []
    for size in SIZES:
        for r in range(reps):
            use, ops = meter.run(remoting_load("unchanged", node.remoting_addr, seconds, size, [],
                                               f"costs-hb{size}-{r}", lg))
            runs.setdefault((size, "recv"), []).append(_per_op(use[node.name], ops, "cpu"))
            runs.setdefault((size, "lead"), []).append(_per_op(use[leader.name], ops, "cpu"))
            runs.setdefault((size, "in"), []).append(lg[-1]["bytes_sent"] / ops)
    how = (f"unchanged REGISTER_BROKER (same DataVersion) to one follower's remoting port, bench/loadgen 4 "
           f"connections x 4 in flight, brokers of {SIZES[0]} and {SIZES[1]} topics, {reps} x {seconds:g} s each; "
           "a straight line through the two sizes")
    out: dict[str, Any] = {}
    for part, label in (("recv", "the receiving node"), ("lead", "the leader (forwarded liveness)")):
        base, per = fit(runs[(SIZES[0], part)], runs[(SIZES[1], part)], SIZES)
        key = "heartbeat_receive" if part == "recv" else "heartbeat_forwarded_leader"
        out[f"{key}_cpu_us_base"] = stat(base, "us CPU per heartbeat", f"{label}: fixed part; {how}")
        out[f"{key}_cpu_us_per_topic"] = stat(per, "us CPU per heartbeat per topic of the broker",
                                              f"{label}: per-topic part; {how}", 2)
    base, per = fit(runs[(SIZES[0], "in")], runs[(SIZES[1], "in")], SIZES)
    byt = "request frames counted by bench/loadgen (JSON body, uncompressed)"
    out["heartbeat_bytes_in_base"] = stat(base, "bytes received per heartbeat", f"{byt}; {how}", 0)
    out["heartbeat_bytes_in_per_topic"] = stat(per, "bytes received per heartbeat per topic", f"{byt}; {how}", 1)
    out["heartbeat_loadgen_cpu_us"] = stat([x["cpu_us_per_op"] for x in lg],
                                           "us CPU of the load generator per heartbeat",
                                           "bench/loadgen's own report (getrusage), beside the server's")
    return out


def measure_noted_heartbeats(c: LocalCluster, meter: Meter, reps: int, seconds: float,
                             workers: int) -> dict[str, Any]:
    """Unchanged registrations sent to a follower whose `workers` worker processes hold its remoting port
    (nameserver/worker.py): a worker decodes each, finds it unchanged in its replica and answers it; its core
    hears a liveness note (NOTE_ALIVE, nameserver/remoting/corechannel.py), buffers it and forwards it to the
    leader every forward_interval_ms. Two loads at each size:
    - pipelined, bench/loadgen 4 connections x 4 in flight, as measure_heartbeats: the workers' CPU per
      heartbeat (the counterpart of heartbeat_receive_cpu_us);
    - one at a time, 1 connection x 1 in flight: each note alone in its frame to the core, as a fleet's are
      (a broker's heartbeat reaches a node every 30 s: at 10,000 brokers 333 a second, far apart beside a
      note's round trip): the core's CPU per heartbeat, the model's heartbeat_noted_core_cpu_us; the leader's
      beside it.
    The core's note carries no topic table, so its figure is the median over both sizes' runs."""
    leader, followers = _leader_and_followers(c)
    node = followers[0]
    runs: dict[tuple[int, str], list[float]] = {}
    lg: list[dict[str, Any]] = []
    add = runs.setdefault
    for size in SIZES:
        for r in range(reps):
            use, ops = meter.run(remoting_load("unchanged", node.remoting_addr, seconds, size, [],
                                               f"costs-nhb{size}-{r}", lg))
            add((size, "worker"), []).append(_per_op(use[node.name], ops, "other"))
            add((size, "core_pipelined"), []).append(_per_op(use[node.name], ops, "core"))
            use, ops = meter.run(remoting_load("unchanged", node.remoting_addr, seconds, size, [],
                                               f"costs-nhb1-{size}-{r}", lg, connections=1, inflight=1))
            add((size, "core"), []).append(_per_op(use[node.name], ops, "core"))
            add((size, "worker_alone"), []).append(_per_op(use[node.name], ops, "other"))
            add((size, "leader"), []).append(_per_op(use[leader.name], ops, "cpu"))
    where = (f"unchanged REGISTER_BROKER (same DataVersion) to one follower's remoting port, held by its {workers} "
             f"worker process{'es' if workers != 1 else ''}, brokers of {SIZES[0]} and {SIZES[1]} topics, {reps} x "
             f"{seconds:g} s each; idle rate subtracted")
    piped, alone = "bench/loadgen 4 connections x 4 in flight", "bench/loadgen 1 connection x 1 in flight"
    out: dict[str, Any] = {}
    base, per = fit(runs[(SIZES[0], "worker")], runs[(SIZES[1], "worker")], SIZES)
    label = (f"the follower's worker processes (their CPU summed); {where}, {piped}; a straight line through the two "
             "sizes")
    out["heartbeat_worker_receive_cpu_us_base"] = stat(base, "us CPU per heartbeat", f"{label}: fixed part")
    out["heartbeat_worker_receive_cpu_us_per_topic"] = stat(per, "us CPU per heartbeat per topic of the broker",
                                                           f"{label}: per-topic part", 2)
    both = runs[(SIZES[0], "core")] + runs[(SIZES[1], "core")]
    by_size = ", ".join(f"{statistics.median(runs[(n, 'core')]):.1f} us at {n} topics" for n in SIZES)
    out["heartbeat_noted_core_cpu_us"] = stat(
        both, "us CPU of the receiving node's core per heartbeat its worker answered",
        f"the follower's core process alone (its liveness note, buffered and forwarded to the leader); {where}, "
        f"{alone} (each note alone in its frame); the median of both sizes' runs ({by_size})")
    out["heartbeat_noted_core_cpu_us_pipelined"] = stat(
        runs[(SIZES[0], "core_pipelined")] + runs[(SIZES[1], "core_pipelined")],
        "us CPU of the receiving node's core per heartbeat its worker answered",
        f"as heartbeat_noted_core_cpu_us but {piped} (notes that wait go together in one frame): not the model's")
    out["heartbeat_worker_one_at_a_time_cpu_us"] = stat(
        runs[(SIZES[0], "worker_alone")] + runs[(SIZES[1], "worker_alone")],
        "us CPU of the worker processes per heartbeat", f"{where}, {alone}; the median of both sizes' runs: "
        "for reference, not the model's")
    out["heartbeat_noted_leader_cpu_us"] = stat(
        runs[(SIZES[0], "leader")] + runs[(SIZES[1], "leader")], "us CPU of the leader per heartbeat noted",
        f"the leader's processes (the forwarded liveness); {where}, {alone}; the median of both sizes' runs: "
        "for reference (the model's is heartbeat_forwarded_leader_cpu_us_base)")
    return out


def run_noted_costs(root: str, seconds: float, reps: int, workers: int = 1,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """measure_noted_heartbeats alone, on a fresh cluster of `workers` worker processes per node (`python -m
    bench.costs noted`): a costs document holding those keys only."""
    costs: dict[str, Any] = {}
    doc: dict[str, Any] = {"schema": SCHEMA, **_commit(),
                           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "machine": _machine(), "seconds_per_load": seconds, "repetitions": reps, "costs": costs}
    with _cluster(tempfile.mkdtemp(prefix="costs-n-", dir=root), workers) as c:
        _ready(c)
        time.sleep(2.0)
        log(f"costs: noted heartbeats ({workers} worker process(es) per node)")
        costs.update(measure_noted_heartbeats(c, Meter(c), reps, seconds, workers))
    return doc


class _Registrations:
    """Changed registrations through gRPC to the leader: each rewrites the live record and every queue data."""

    def __init__(self, topics: int, tag: str) -> None:
        self.topics, self.tag = topics, tag
        self.counters: dict[int, int] = {}
        self.records = 0
        self.lock = threading.Lock()

    def op(self, channel: grpc.Channel, worker: int) -> Callable[[], int]:
        stub = api_pb2_grpc.NameServerStub(channel)
        name, addr, prefix = f"cost-{self.tag}-{worker}", f"10.79.{worker}.1:10911", f"Cost{self.tag}W{worker}T"

        def op() -> int:
            n = self.counters.get(worker, 0) + 1
            self.counters[worker] = n
            reply = stub.RegisterBroker(registration_request(name, addr, prefix, self.topics, n), timeout=10)
            with self.lock:
                self.records += reply.records
            return reply.records
        return op


def measure_writes(c: LocalCluster, meter: Meter, reps: int, seconds: float, workers: int) -> dict[str, Any]:
    """Changed registrations at two sizes: the leader's, each follower's and (with workers) each worker
    replica's CPU, per registration and per Raft entry; bytes the leader sends and a follower receives."""
    leader, followers = _leader_and_followers(c)
    runs: dict[tuple[int, str], list[float]] = {}
    for size in SIZES:
        for r in range(reps):
            reg = _Registrations(size, f"w{workers}s{size}r{r}")
            start = leader.require_status().commit_offset
            use, ops = meter.run(grpc_load(leader.grpc_addr, reg.op, 8, seconds))
            c.wait_converged()
            entries = leader.require_status().commit_offset - start
            fol = [use[f.name] for f in followers]
            add = runs.setdefault
            add((size, "leader"), []).append(_per_op(use[leader.name], ops, "cpu"))
            add((size, "leader_out"), []).append(_per_op(use[leader.name], ops, "out"))
            add((size, "follower"), []).append(statistics.fmean(_per_op(u, ops, "core") for u in fol))
            add((size, "follower_in"), []).append(statistics.fmean(_per_op(u, ops, "in") for u in fol))
            add((size, "replica"), []).append(statistics.fmean(_per_op(u, ops, "other") for u in fol) / max(workers, 1))
            add((size, "records"), []).append(reg.records / ops)
            add((size, "entries"), []).append(entries / ops)
            add((size, "entry_follower"), []).append(
                statistics.fmean(u.core_cpu * 1e6 for u in fol) / max(entries, 1))
    how = (f"RegisterBroker to the leader with a new DataVersion and toggled queue counts (every queue data "
           f"rewritten), 8 Python client threads, brokers of {SIZES[0]} and {SIZES[1]} topics, {reps} x "
           f"{seconds:g} s each; idle rate subtracted; a straight line through the two sizes")
    out: dict[str, Any] = {}
    parts = [("leader", "changed_registration_leader_cpu_us", "us CPU", "the leader's processes"),
             ("leader_out", "changed_registration_leader_bytes_out", "bytes sent",
              "the leader's TCP bytes sent on its persistent sockets (Raft links to 2 followers)"),
             ("follower", "changed_registration_follower_cpu_us", "us CPU", "each follower's core (mean of 2)"),
             ("follower_in", "changed_registration_follower_bytes_in", "bytes received",
              "each follower's TCP bytes received (its Raft link from the leader)")]
    if workers:  # a worker replica costs its own CPU and what its core spends feeding it (the follower's core
        # here beside the same key measured with no worker: the capacity model takes the difference)
        parts = [("replica", "changed_registration_worker_replica_cpu_us", "us CPU",
                  f"each worker replica of a follower, its own CPU ({workers} per node: their CPU / {workers})"),
                 ("follower", "changed_registration_follower_cpu_us_with_workers", "us CPU",
                  f"each follower's core (mean of 2) while it feeds {workers} worker replicas")]
    for part, key, unit, label in parts:
        base, per = fit(runs[(SIZES[0], part)], runs[(SIZES[1], part)], SIZES)
        out[f"{key}_base"] = stat(base, f"{unit} per changed registration", f"{label}: fixed part; {how}")
        out[f"{key}_per_topic"] = stat(per, f"{unit} per changed registration per topic", f"{label}: per topic; {how}",
                                       2)
    if workers:
        out["worker_replicas_measured"] = stat([float(workers)], "worker processes per node",
                                               "the worker-replica costs' cluster", 0)
    else:
        for size in SIZES:
            out[f"changed_registration_records_at_{size}"] = stat(runs[(size, "records")], "records per registration",
                                                                  "the replies' record counts", 2)
            out[f"changed_registration_entries_at_{size}"] = stat(runs[(size, "entries")],
                                                                  "Raft entries per registration",
                                                                  "commit offset advance / registrations", 3)
        out["raft_entry_follower_cpu_us"] = stat(runs[(SIZES[0], "entry_follower")], "us CPU per entry per follower",
                                                 f"each follower's core CPU / entries committed, brokers of "
                                                 f"{SIZES[0]} topics; {how}")
    return out


def measure_linearizable(c: LocalCluster, meter: Meter, reps: int, seconds: float) -> dict[str, Any]:
    target = OursTarget(c, topics=8)
    target.setup_reads()
    leader, followers = _leader_and_followers(c)
    node = followers[0]
    serve, lead = [], []
    for _ in range(reps):
        use, ops = meter.run(grpc_load(node.grpc_addr, target.linearizable_read_op, 4, seconds))
        serve.append(_per_op(use[node.name], ops, "cpu"))
        lead.append(_per_op(use[leader.name], ops, "cpu"))
    how = f"GetBinding(LINEARIZABLE) on a follower, 4 Python client threads, {reps} x {seconds:g} s"
    return {"linearizable_read_serving_cpu_us": stat(serve, "us CPU per read", f"the serving follower; {how}"),
            "linearizable_read_leader_cpu_us": stat(lead, "us CPU per read", f"the leader (read index); {how}")}


def _open_watchers(node: BenchNode, prefix: str) -> tuple[Callable[[], int], Callable[[], None]]:
    """WATCHERS streams on `node`, each consumed by its own thread once it has started: (events delivered so
    far, cancel)."""
    delivered = [0]
    lock = threading.Lock()
    ready = threading.Barrier(WATCHERS + 1)
    streams = [node.ns().Watch(api_pb2.WatchRequest(key_prefixes=[prefix]), timeout=600) for _ in range(WATCHERS)]

    def consume(stream: Any) -> None:
        first = True
        try:
            for msg in stream:
                if first:
                    first = False
                    ready.wait(10)
                with lock:
                    delivered[0] += len(msg.events)
        except grpc.RpcError:
            pass

    for stream in streams:
        threading.Thread(target=consume, args=(stream,), daemon=True).start()
    ready.wait(10)

    def cancel() -> None:
        for stream in streams:
            stream.cancel()
    return (lambda: delivered[0]), cancel


def measure_watch(c: LocalCluster, meter: Meter, reps: int, seconds: float) -> dict[str, Any]:
    """PutKv writes paced on the leader, with and without WATCHERS streams on a follower: the difference on
    that follower per event delivered."""
    leader, followers = _leader_and_followers(c)
    node = followers[0]
    ns = f"costwatch{os.getpid()}"
    writer = leader.ns()

    def writes(tag: str) -> Callable[[], int]:
        def load() -> int:
            n, stop = 0, time.monotonic() + seconds
            while time.monotonic() < stop:
                writer.PutKv(api_pb2.PutKvRequest(namespace=ns, key=f"{tag}{n}", value="v" * 100), timeout=5)
                n += 1
                time.sleep(1 / WATCH_WRITES_PER_S)
            c.wait_converged()
            return n
        return load

    cpu, out_bytes = [], []
    for r in range(reps):
        base, n0 = meter.run(writes(f"b{r}-"))
        count, cancel = _open_watchers(node, f"kv/{ns}/w{r}-")
        with_w, n1 = meter.run(writes(f"w{r}-"))
        time.sleep(0.5)
        cancel()
        events = max(count(), 1)
        b, w = base[node.name], with_w[node.name]
        cpu.append((w.cpu * 1e6 - b.cpu * 1e6 * n1 / n0) / events)
        out_bytes.append((w.written_bytes - b.written_bytes * n1 / n0) / events)
    how = (f"{WATCHERS} Watch streams on a follower, PutKv paced at {WATCH_WRITES_PER_S}/s on the leader, "
           f"{reps} x {seconds:g} s; the follower's usage with the streams minus without (same writes, scaled), "
           "per event delivered")
    return {"watch_event_cpu_us": stat(cpu, "us CPU per event delivered", how),
            "watch_event_bytes_out": stat(out_bytes, "bytes sent per event delivered", f"TCP (ss); {how}", 0)}


def measure_expiry(c: LocalCluster, meter: Meter, brokers: int) -> dict[str, Any]:
    """`brokers` brokers registered (8 threads) with a heartbeat timeout of EXPIRY_TIMEOUT_MS, then silent;
    the usage from just before the first can expire until the last has left the routes, per broker."""
    leader, followers = _leader_and_followers(c)
    stub, watcher = leader.ns(), followers[0].ns()

    def register(i: int) -> None:
        retried(functools.partial(stub.RegisterBroker, api_pb2.RegisterBrokerRequest(
            cluster_name="Expiry", broker_name=f"exp-{i}", broker_addr=f"10.80.{i // 250}.{i % 250 + 1}:10911",
            broker_id=0, heartbeat_timeout_ms=EXPIRY_TIMEOUT_MS,
            data_version=state_pb2.DataVersion(counter=1, timestamp=1700000000000),
            topics=[api_pb2.TopicConfig(topic_name=f"ExpT{i}", read_queue_nums=4, write_queue_nums=4, perm=6)]),
            timeout=10))

    def left() -> int:  # asked of a follower once a second: the leader's figure carries none of it
        info = watcher.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)
        return len(info.cluster_addr_table["Expiry"].names) if "Expiry" in info.cluster_addr_table else 0

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(register, range(brokers)))
    first_expiry = t0 + EXPIRY_TIMEOUT_MS / 1000
    if time.monotonic() > first_expiry - 2:
        raise RuntimeError(f"registering {brokers} brokers took {time.monotonic() - t0:.1f} s: some expire "
                           "before the window opens")
    c.wait_converged()
    time.sleep(max(0.0, first_expiry - 1 - time.monotonic()))

    def wait_gone() -> int:
        deadline = time.monotonic() + EXPIRY_TIMEOUT_MS / 1000 + 60
        while left() and time.monotonic() < deadline:
            time.sleep(1.0)
        if left():
            raise RuntimeError("expiry: brokers still registered a minute past their timeout")
        c.wait_converged()
        return brokers

    use, n = meter.run(wait_gone)
    total = [sum(u.cpu for u in use.values()) * 1e6 / n]
    lead = [use[leader.name].cpu * 1e6 / n]
    how = (f"{brokers} brokers of 1 topic registered with a {EXPIRY_TIMEOUT_MS} ms timeout, then silent; usage "
           "from 1 s before the first could expire until the last left the routes (a follower asked once a second), "
           "idle rate subtracted, per broker; one repetition")
    return {"expiry_cluster_cpu_us": stat(total, "us CPU per broker expired (all 3 nodes)", how),
            "expiry_leader_cpu_us": stat(lead, "us CPU per broker expired (the leader)", how)}


# ---- memory ------------------------------------------------------------------------------------------

def pss_bytes(pid: int) -> int:
    """Proportional set size of a process (shared pages split among their sharers), /proc smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def memory(node: BenchNode) -> tuple[int, int]:
    """(RSS, PSS) of a node's core process."""
    return rss_bytes(node.pid), pss_bytes(node.pid)


def measure_memory(c: LocalCluster, brokers: int, topics: int, kv_keys: int) -> dict[str, Any]:
    """Each node's core RSS and PSS before and after loading brokers, then topics (queue datas), then more
    queues per topic, then KV bytes; per unit: each node's delta / units (the runs are the 3 nodes)."""
    leader, _ = _leader_and_followers(c)
    stub = leader.ns()

    def snap() -> list[tuple[int, int]]:
        c.wait_converged()
        time.sleep(1.0)
        return [memory(n) for n in c.nodes]

    def per_unit(before: list[tuple[int, int]], after: list[tuple[int, int]], units: int, k: int) -> list[float]:
        return [(a[k] - b[k]) / units for b, a in zip(before, after, strict=True)]

    def reg(name: str, i: int, topic_names: list[str], queues: int) -> None:
        retried(lambda: stub.RegisterBroker(api_pb2.RegisterBrokerRequest(
            cluster_name="Mem", broker_name=name, broker_addr=f"10.81.{i // 250}.{i % 250 + 1}:10911", broker_id=0,
            heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
            data_version=state_pb2.DataVersion(counter=queues, timestamp=1700000000000 + queues),
            topics=[api_pb2.TopicConfig(topic_name=t, read_queue_nums=queues, write_queue_nums=queues, perm=6)
                    for t in topic_names]), timeout=60))

    out: dict[str, Any] = {}
    idle = snap()
    out["memory_node_idle_rss_bytes"] = stat([float(m[0]) for m in idle], "bytes", "each node's core RSS, idle", 0)
    s0 = idle
    for i in range(brokers):
        reg(f"memb-{i}", i, [], 1)
    s1 = snap()
    holders = max(1, topics // 500)  # 500 topics a registration: small writes, as brokers make them
    per = topics // holders
    for h in range(holders):
        reg(f"memt-{h}", brokers + h, [f"MemT{h}x{k}" for k in range(per)], 1)
    s2 = snap()
    for h in range(holders):
        reg(f"memt-{h}", brokers + h, [f"MemT{h}x{k}" for k in range(per)], 64)
    s3 = snap()
    for k in range(kv_keys):
        put = api_pb2.PutKvRequest(namespace="costmem", key=f"k{k}", value="x" * KV_VALUE_BYTES)
        retried(functools.partial(stub.PutKv, put, timeout=10))
    s4 = snap()
    queue_datas = holders * per
    how = "each node's core process: its delta / units (runs: the 3 nodes, value: their median); one load"
    for k, kind in ((0, "rss"), (1, "pss")):
        out[f"memory_per_broker_{kind}_bytes"] = stat(
            per_unit(s0, s1, brokers, k), "bytes per broker",
            f"{brokers} brokers with no topic registered; {kind.upper()}, {how}", 0)
        out[f"memory_per_queue_data_{kind}_bytes"] = stat(
            per_unit(s1, s2, queue_datas, k), "bytes per topic on one broker (a queue data)",
            f"{holders} brokers registering {per} topics of 1 queue each; {kind.upper()}, {how}", 0)
        out[f"memory_per_queue_{kind}_bytes"] = stat(
            per_unit(s2, s3, queue_datas * 63, k), "bytes per queue",
            f"the same topics re-registered with 64 queues each instead of 1 (a queue is a count in its queue "
            f"data); {kind.upper()}, {how}", 1)
        out[f"memory_per_kv_byte_{kind}"] = stat(
            per_unit(s3, s4, kv_keys * KV_VALUE_BYTES, k), "bytes per KV value byte",
            f"{kv_keys} PutKv of {KV_VALUE_BYTES}-byte values (key overhead included); {kind.upper()}, {how}", 2)
    return out


def measure_worker_memory(c: LocalCluster, workers: int) -> dict[str, Any]:
    sizes = []
    for n in c.nodes:
        for pid in with_descendants([n.pid]):
            if pid != n.pid:
                sizes.append(float(rss_bytes(pid)))
    return {"memory_worker_idle_rss_bytes": stat(sizes, "bytes", f"each worker process's RSS, idle "
                                                 f"({workers} per node x 3 nodes)", 0)}


# ---- the part ----------------------------------------------------------------------------------------

def _commit() -> dict[str, Any]:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True,
                                    timeout=10).stdout.strip())
    except OSError:
        return {"commit": "unknown", "dirty": None}
    return {"commit": sha or "unknown", "dirty": dirty}


def _machine() -> dict[str, Any]:
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cores": os.cpu_count(), "model": model, "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def run_costs(root: str, seconds: float, reps: int, quick: bool, workers: int = 2,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every cost on fresh clusters (one with no worker process, one with `workers` per node)."""
    costs: dict[str, Any] = {}
    doc: dict[str, Any] = {"schema": SCHEMA, **_commit(),
                           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "machine": _machine(), "seconds_per_load": seconds, "repetitions": reps, "costs": costs}
    brokers, topics, kv = (200, 2_000, 200) if quick else (2_000, 40_000, 2_000)
    with _cluster(tempfile.mkdtemp(prefix="costs-", dir=root), 0) as c:
        _ready(c)
        meter = Meter(c)
        doc["idle_cpu_cores_per_node"] = {k: round(v.cpu, 3) for k, v in meter.idle.items()}
        for name, step in (("memory", lambda: measure_memory(c, brokers, topics, kv)),
                           ("reads", lambda: measure_reads(c, meter, reps, seconds)),
                           ("heartbeats", lambda: measure_heartbeats(c, meter, reps, seconds)),
                           ("writes", lambda: measure_writes(c, meter, reps, seconds, 0)),
                           ("linearizable reads", lambda: measure_linearizable(c, meter, reps, seconds)),
                           ("watch", lambda: measure_watch(c, meter, reps, seconds)),
                           ("expiry", lambda: measure_expiry(c, meter, 200 if quick else 1000))):
            log(f"costs: {name}")
            try:
                costs.update(step())
            except Exception as exc:  # recorded: the other costs are still worth having
                log(f"costs: {name} failed: {exc!r}")
                doc.setdefault("failed", {})[name] = repr(exc)
    with _cluster(tempfile.mkdtemp(prefix="costs-w-", dir=root), workers) as c:
        _ready(c)
        time.sleep(2.0)
        log(f"costs: worker replicas ({workers} per node)")
        meter = Meter(c)
        costs.update(measure_worker_memory(c, workers))
        try:
            costs.update(measure_writes(c, meter, reps, seconds, workers))
        except Exception as exc:
            log(f"costs: worker replicas failed: {exc!r}")
            doc.setdefault("failed", {})["worker replicas"] = repr(exc)
        log(f"costs: noted heartbeats ({workers} per node)")
        try:
            costs.update(measure_noted_heartbeats(c, meter, reps, seconds, workers))
        except Exception as exc:
            log(f"costs: noted heartbeats failed: {exc!r}")
            doc.setdefault("failed", {})["noted heartbeats"] = repr(exc)
    return doc


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.costs noted [--workers 1] [--seconds 5] [--repetitions 3] [--out FILE]`: the costs of
    heartbeats a node's worker processes answer (measure_noted_heartbeats) on their own, as a costs document."""
    import argparse
    import json
    import sys
    p = argparse.ArgumentParser(prog="python -m bench.costs", description=main.__doc__)
    p.add_argument("part", choices=["noted"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--root", default=None, help="where the cluster's directory goes (default: the system's temp)")
    p.add_argument("--out", default="", help="write the document here (default: stdout)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be at least 1 (the measurement is of a node's worker processes)")
    doc = run_noted_costs(args.root or tempfile.gettempdir(), args.seconds, args.repetitions, args.workers,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
    text = json.dumps(doc, indent=1) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


__all__ = ["SCHEMA", "main", "measure_noted_heartbeats", "run_costs", "run_noted_costs", "stat", "fit"]


if __name__ == "__main__":
    raise SystemExit(main())
