"""Ours beside etcd with the compiled gRPC load generator (bench/gofront `load`): issue 27's gRPC targets.

    python -m bench.compare --root DIR --worker-processes 1 [--seconds 5] [--concurrency 1,16,64] [--rounds 2]

`python -m bench.compare` (and `python -m bench --only compare`) runs this when the Go load generator
builds (`--loadgen go`, the default); `--loadgen python` is the compare's Python client threads
(bench/workloads.py), and the fallback, with the reason in the report, when Go does not build.

A Python client on the same 2 CPUs bounds the reads before either server does, so here the load comes from
one Go process per load: one HTTP/2 connection and one closed-loop caller per client, prebuilt request
bytes (serialized here from the same protos the Python compare uses), every reply checked (a field that must
be there, see below). It reports its own CPU per call; the servers' CPU is summed from /proc over every
process of the system under load (ours: each node's core, its workers and, with "go", its Go front end;
etcd: its 3 members) over the same window (the generator says when its clock starts).

Per round, one system at a time, each started fresh and stopped before the next: ours with
`[node] grpc_front = "grpcio"`, ours with "go" (both with --worker-processes workers per node; without
workers only grpcio), etcd 3.4 (3 members, WAL fsync on), and one grpcio echo server process (issue 27's
one-process ceiling for route reads). The loads, each at every --concurrency:

- registration (to the leader): ours RegisterBroker of the client's own broker with T topics, its
  DataVersion and queue counts alternating between two values (every call changes the live record and the T
  queue datas: T+1 records, the reply's `records`, summed); etcd a Txn of the same T+1 puts (the broker key
  and one key per topic, the same state.proto values the Python compare writes), without the Python
  compare's version compare (always applied; records = T+1 per Txn);
- linearizable reads, clients spread over the 3 nodes: ours GetBinding(LINEARIZABLE) (read index), etcd a
  linearizable single-key Range; a reply without the binding (`found`, `kvs`) is a mismatch;
- route reads (eventual), spread likewise: ours GetRoute over T topics of 4 brokers each, etcd a
  serializable Range over the topic's 4 route keys; the echo a route-reply-sized echo.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from bench import loadgen
from bench.echo import DEFAULT_WORKERS, EchoProcess
from bench.echo import METHOD as ECHO_METHOD
from bench.etcd import FSYNC_NOTE, EtcdCluster, etcd_version, prefix_end
from bench.load import cpu_model, machine_busy_s, proc_cpu_s
from bench.pb.etcd.etcdserverpb import rpc_pb2
from bench.procnet import wait_listening
from bench.procs import LocalCluster
from bench.workloads import (
    ROUTE_BROKERS,
    EtcdTarget,
    OursTarget,
    Target,
    _reg_names,
    _route_reply_size,
    registration_request,
)
from nameserver.ops import gobuild
from nameserver.pb import api_pb2

GOFRONT = Path(__file__).with_name("gofront")
NS = "/rip18.nameserver.v1.NameServer"
KV = "/etcdserverpb.KV"
FRONTS = ("grpcio", "go")
WORKLOADS = ("registration", "linearizable_reads", "route_reads")
SYSTEMS = ("ours-grpcio", "ours-go", "etcd", "echo")
DEFAULT_ROUNDS = 2
# top-level reply fields: a reply without the first is a mismatch; the second is summed (ours' records)
REGISTER_REPLY_RECORDS = 2     # RegisterBrokerReply.records
GET_BINDING_REPLY_FOUND = 1    # GetBindingReply.found (absent when false)
GET_ROUTE_REPLY_ROUTE = 1      # GetRouteReply.route
RANGE_RESPONSE_KVS = 2         # RangeResponse.kvs
TXN_RESPONSE_SUCCEEDED = 2     # TxnResponse.succeeded


class GoUnavailable(RuntimeError):
    """The Go load generator does not build here: the compare falls back to the Python one."""


def binary() -> str:
    """The load generator's binary (built once per version of bench/gofront), or GoUnavailable saying why."""
    try:
        return loadgen.build(GOFRONT)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        raise GoUnavailable(f"bench/gofront did not build: {exc}") from exc


def frame(messages: Sequence[bytes]) -> bytes:
    """The generator's -requests file: each message as a uvarint length and its bytes."""
    out = bytearray()
    for m in messages:
        n = len(m)
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        out.append(n)
        out += m
    return bytes(out)


# ---- one load ------------------------------------------------------------------------------------

def load_command(exe: str, addrs: Sequence[str], method: str, requests: str, clients: int, seconds: float, *,
                 group: int = 0, require_field: int = 0, sum_field: int = 0, expect: str = "") -> list[str]:
    cmd = [exe, "load", "-addrs", ",".join(addrs), "-method", method, "-requests", requests,
           "-clients", str(clients), "-seconds", str(seconds), "-announce"]
    if group:
        cmd += ["-group", str(group)]
    if require_field:
        cmd += ["-require-field", str(require_field)]
    if sum_field:
        cmd += ["-sum-field", str(sum_field)]
    if expect:
        cmd += ["-expect", expect]
    return cmd


def parse_result(line: str, server_cpu_s: float | None, records_per_call: int = 0,
                 machine_cpu_s: float | None = None) -> dict[str, Any]:
    """One row from the generator's JSON line and the servers' CPU seconds over its window.

    records: the reply field it summed (ours' registrations) or `records_per_call` per answered call (etcd's).
    machine_cpu_s: the whole machine's busy CPU seconds over the window: what was neither the servers' nor the
    generator's is the row's other_cores (another process on the machine took them from the load)."""
    try:
        g = json.loads(line)
    except ValueError as exc:
        raise RuntimeError(f"the load generator's report is not JSON: {line.strip()[:200]!r}") from exc
    missing = [k for k in ("calls", "seconds", "calls_per_s", "p50_ms", "p99_ms", "cpu_s", "errors", "mismatches")
               if k not in g]
    if missing:
        raise RuntimeError(f"the load generator's report lacks {', '.join(missing)}: {line.strip()[:200]!r}")
    calls, secs = g["calls"], g["seconds"] or 1e-9
    records = records_per_call * calls if records_per_call else g.get("field_sum", 0)
    # with the untimed first call of each client, which writes too: what the system's own count should show
    written = records + (records_per_call * g.get("untimed_ok", 0) if records_per_call
                         else g.get("untimed_field_sum", 0))
    row: dict[str, Any] = {
        "clients": g.get("clients"), "calls": calls, "seconds": round(secs, 3), "per_s": round(g["calls_per_s"], 1),
        "p50_ms": round(g["p50_ms"], 3), "p99_ms": round(g["p99_ms"], 3),
        "records": records, "records_per_s": round(records / secs, 1), "records_written": written,
        "errors": g["errors"] + g["mismatches"], "first_error": g.get("first_error", ""),
        "loadgen_us_per_op": round(g["cpu_s"] / calls * 1e6, 1) if calls else None,
        "loadgen_cores": round(g["cpu_s"] / secs, 2),
        "calls_per_addr": g.get("calls_per_addr", {})}
    if server_cpu_s is not None:
        row["server_us_per_op"] = round(server_cpu_s / calls * 1e6, 1) if calls else None
        row["server_cores"] = round(server_cpu_s / secs, 2)
        if machine_cpu_s is not None:
            row["other_cores"] = round(max(0.0, machine_cpu_s - server_cpu_s - g["cpu_s"]) / secs, 2)
    return row


def run_load(exe: str, addrs: Sequence[str], method: str, requests: str, clients: int, seconds: float,
             server_pids: list[int], *, records_per_call: int = 0, **flags: Any) -> dict[str, Any]:
    """One Go load; the servers' CPU from its clock's start (its announcement) to its report, and the rest
    of the machine's over the same window (other_cores: a compare's figures hold for a quiet machine only)."""
    cmd = load_command(exe, addrs, method, requests, clients, seconds, **flags)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        cpu0, machine0 = proc_cpu_s(server_pids), machine_busy_s()
        if '"phase"' not in first:
            proc.wait(timeout=60)
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"gofront load failed ({proc.returncode}): {(err or first).strip()[-500:]}")
        report = proc.stdout.readline() if proc.stdout else ""
        cpu, machine = proc_cpu_s(server_pids) - cpu0, machine_busy_s() - machine0
        proc.wait(timeout=60)
        if proc.returncode != 0:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"gofront load failed ({proc.returncode}): {err.strip()[-500:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return parse_result(report, cpu, records_per_call, machine)


# ---- the systems ---------------------------------------------------------------------------------

def _write(directory: Path, name: str, messages: Sequence[bytes]) -> str:
    path = directory / f"{name}.reqs"
    path.write_bytes(frame(messages))
    return str(path)


def _ours_loads(target: OursTarget, directory: Path, clients: int) -> dict[str, dict[str, Any]]:
    """Per workload: method, requests file and the generator's flags (ours)."""
    t = target.topics
    regs = []
    for i in range(clients):
        name, addr, prefix = _reg_names(i)
        regs += [registration_request(name, addr, prefix, t, k).SerializeToString() for k in (1, 2)]
    lin = api_pb2.GetBindingRequest(topic=target.bind_topic, queue_id=0, consistency=api_pb2.LINEARIZABLE)
    return {
        "registration": {"method": f"{NS}/RegisterBroker", "requests": _write(directory, f"ours-reg-{clients}", regs),
                         "group": 2, "require_field": REGISTER_REPLY_RECORDS, "sum_field": REGISTER_REPLY_RECORDS},
        "linearizable_reads": {"method": f"{NS}/GetBinding", "require_field": GET_BINDING_REPLY_FOUND,
                               "requests": _write(directory, "ours-lin", [lin.SerializeToString()])},
        "route_reads": {"method": f"{NS}/GetRoute", "require_field": GET_ROUTE_REPLY_ROUTE,
                        "requests": _write(directory, "ours-route", [
                            api_pb2.GetRouteRequest(topic=x).SerializeToString() for x in target.route_topics])}}


def etcd_registration_txn(target: EtcdTarget, worker: int, counter: int) -> rpc_pb2.TxnRequest:
    """The Python compare's registration Txn (the same T+1 puts and values) without its version compare."""
    name, addr, prefix = _reg_names(worker)
    txn = target._registration_txn(name, addr, prefix, counter, 0)
    txn.ClearField("compare")
    return txn


def _etcd_loads(target: EtcdTarget, directory: Path, clients: int) -> dict[str, dict[str, Any]]:
    regs = [etcd_registration_txn(target, i, k).SerializeToString() for i in range(clients) for k in (1, 2)]
    routes = []
    for x in target.route_topics:
        p = f"topic/{x}/".encode()
        routes.append(rpc_pb2.RangeRequest(key=p, range_end=prefix_end(p), serializable=True).SerializeToString())
    return {
        "registration": {"method": f"{KV}/Txn", "requests": _write(directory, f"etcd-reg-{clients}", regs),
                         "group": 2, "require_field": TXN_RESPONSE_SUCCEEDED, "records_per_call": target.topics + 1},
        "linearizable_reads": {"method": f"{KV}/Range", "require_field": RANGE_RESPONSE_KVS,
                               "requests": _write(directory, "etcd-lin",
                                                  [rpc_pb2.RangeRequest(key=target.bind_key).SerializeToString()])},
        "route_reads": {"method": f"{KV}/Range", "require_field": RANGE_RESPONSE_KVS,
                        "requests": _write(directory, "etcd-route", routes)}}


def run_system(exe: str, target: Target, loads: Callable[[Path, int], dict[str, dict[str, Any]]], directory: Path,
               seconds: float, concurrency: list[int], log: Callable[[str], None], label: str) -> dict[str, Any]:
    """Registrations at every concurrency (each checked against the system's own count), then the reads."""
    directory.mkdir(parents=True, exist_ok=True)
    pids = target.pids()
    leader = target.leader_endpoint()
    nodes = list(target.endpoints())
    out: dict[str, Any] = {w: {} for w in WORKLOADS} | {"processes": len(pids)}
    checks = []
    for c in concurrency:
        mark = target.registration_mark()
        spec = dict(loads(directory, c)["registration"])
        row = run_load(exe, [leader], spec.pop("method"), spec.pop("requests"), c, seconds, pids, **spec)
        check = target.registration_check(mark)
        if check:
            checks.append({**check, "counted": row["records_written"],
                           "ok": check.get("in_cluster") == row["records_written"]})
        out["registration"][str(c)] = row
        log(f"  {label} registration c={c}: {row['records_per_s']:.0f} records/s ({row['per_s']:.0f}/s), "
            f"p99 {row['p99_ms']} ms, server {row.get('server_us_per_op')} µs/op, loadgen "
            f"{row['loadgen_us_per_op']} µs/op, others {row.get('other_cores')} cores, errors {row['errors']}")
    if checks:
        out["registration_check"] = checks
    target.setup_reads()
    for w in ("linearizable_reads", "route_reads"):
        for c in concurrency:
            spec = dict(loads(directory, c)[w])
            row = run_load(exe, nodes, spec.pop("method"), spec.pop("requests"), c, seconds, pids, **spec)
            out[w][str(c)] = row
            log(f"  {label} {w} c={c}: {row['per_s']:.0f}/s, p99 {row['p99_ms']} ms, server "
                f"{row.get('server_us_per_op')} µs/op, loadgen {row['loadgen_us_per_op']} µs/op, "
                f"others {row.get('other_cores')} cores, errors {row['errors']}")
    return out


def run_ours(exe: str, root: Path, front: str, workers: int, sections: dict[str, Any], topics: int, seconds: float,
             concurrency: list[int], log: Callable[[str], None], label: str) -> dict[str, Any]:
    node = sections.get("node", {}) | ({"worker_processes": workers, "grpc_front": front} if workers else {})
    ours_sections = sections | ({"node": node} if node else {})
    log(f"{label}: 3 nodes under {root} (sections {ours_sections})")
    cluster = LocalCluster(str(root), sections=ours_sections)
    try:
        cluster.start()
        cluster.wait_ready()
        for n in cluster.nodes:
            wait_listening(n.pid, n.grpc_addr, 1 if workers and front == "go" else max(1, workers))
        target = OursTarget(cluster, topics)
        return run_system(exe, target, lambda d, c: _ours_loads(target, d, c), root / "loads", seconds,
                          concurrency, log, label)
    finally:
        cluster.stop()


def run_etcd(exe: str, root: Path, etcd_binary: str, topics: int, seconds: float, concurrency: list[int],
             log: Callable[[str], None], label: str) -> dict[str, Any]:
    log(f"{label}: 3 members under {root}")
    etcd = EtcdCluster(str(root), binary=etcd_binary, max_txn_ops=max(128, topics + 1))
    try:
        etcd.start()
        etcd.wait_ready()
        target = EtcdTarget(etcd, topics)
        return run_system(exe, target, lambda d, c: _etcd_loads(target, d, c), root / "loads", seconds,
                          concurrency, log, label)
    finally:
        etcd.stop()


def run_echo(exe: str, root: Path, topics: int, seconds: float, concurrency: list[int],
             log: Callable[[str], None], label: str) -> dict[str, Any]:
    """Issue 27's yardstick for route reads: what one grpcio server process answers, route-reply-sized."""
    root.mkdir(parents=True, exist_ok=True)
    payload = b"r" * _route_reply_size(topics)
    expect = root / "echo.reply"
    expect.write_bytes(payload)
    requests = _write(root, "echo", [payload])
    echo = EchoProcess(workers=DEFAULT_WORKERS, log_path=str(root / "echo.log"))
    out: dict[str, Any] = {"route_reads": {}}
    try:
        echo.start()
        pids = [echo.proc.pid] if echo.proc else []
        for c in concurrency:
            row = run_load(exe, [echo.addr], ECHO_METHOD, requests, c, seconds, pids, expect=str(expect))
            out["route_reads"][str(c)] = row
            log(f"  {label} route-reply echo c={c}: {row['per_s']:.0f}/s, server {row.get('server_us_per_op')} µs/op, "
                f"others {row.get('other_cores')} cores")
    finally:
        echo.stop()
    return out


# ---- the run -------------------------------------------------------------------------------------

def run(root: str, run_dir: str, seconds: float, concurrency: list[int], sections: dict[str, Any], *, topics: int,
        worker_processes: int, rounds: int, etcd_binary: str, exe: str, meta: dict[str, Any],
        log: Callable[[str], None]) -> dict[str, Any]:
    """Every round: ours with each front, etcd, the echo; the rows of each, medians, ratios, targets."""
    fronts: list[str] = list(FRONTS) if worker_processes else ["grpcio"]
    notes = []
    if "go" in fronts:
        try:
            gobuild.build()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            fronts = ["grpcio"]
            notes.append(f"ours with the Go front end not measured: front/ did not build ({exc})")
            log(notes[-1])
    result: dict[str, Any] = {"meta": meta | {
        "loadgen": "go", "loadgen_binary": exe, "rounds": rounds, "fronts": fronts, "concurrency": concurrency,
        "seconds_per_load": seconds, "topics_per_broker": topics, "records_per_registration": topics + 1,
        "route_brokers": ROUTE_BROKERS, "ours_worker_processes": worker_processes, "notes": notes + [
            "one Go load generator process per load, on the same cores as the servers: its own CPU per op "
            "(loadgen_us_per_op) and cores busy are reported beside the servers'",
            "server CPU: user + system of every process of the system under load (ours: each node's core, "
            "its workers and, with go, its Go front end; etcd: 3 members), from /proc over the load's window",
            "etcd registration: the Python compare's Txn of T+1 puts without its version compare",
            "reads: clients spread round-robin over the 3 nodes (1 client: node 1 only)"]},
        "runs": []}
    for r in range(1, rounds + 1):
        for front in fronts:
            key = f"ours-{front}"
            res = run_ours(exe, Path(run_dir) / f"{key}-{r}", front, worker_processes, sections, topics, seconds,
                           concurrency, log, f"round {r} {key}")
            result["runs"].append({"round": r, "system": key, **res})
        res = run_etcd(exe, Path(run_dir) / f"etcd-{r}", etcd_binary, topics, seconds, concurrency, log,
                       f"round {r} etcd")
        result["runs"].append({"round": r, "system": "etcd", **res})
        res = run_echo(exe, Path(run_dir) / f"echo-{r}", topics, seconds, concurrency, log, f"round {r} echo")
        result["runs"].append({"round": r, "system": "echo", **res})
    result["meta"]["load_average_at_end"] = list(os.getloadavg())
    result["summary"] = summarize(result["runs"])
    result["ratios"] = ratios(result["summary"], fronts)
    result["targets"] = {"issue27": {f: issue27(result["ratios"], f) for f in fronts}}
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """system -> workload -> clients -> the median over rounds of each figure, and its [min, max] of per_s."""
    keys = ("per_s", "records_per_s", "p50_ms", "p99_ms", "server_us_per_op", "server_cores", "loadgen_us_per_op",
            "loadgen_cores", "other_cores")
    out: dict[str, Any] = {}
    for run_ in runs:
        for w in WORKLOADS:
            for c, row in run_.get(w, {}).items():
                out.setdefault(run_["system"], {}).setdefault(w, {}).setdefault(c, []).append(row)
    for system in out.values():
        for per_c in system.values():
            for c, rows in per_c.items():
                m: dict[str, Any] = {k: round(median(row[k] for row in rows), 3) for k in keys
                                     if all(row.get(k) is not None for row in rows)}
                m["per_s_range"] = [min(row["per_s"] for row in rows), max(row["per_s"] for row in rows)]
                m["errors"] = sum(row["errors"] for row in rows)
                m["rounds"] = len(rows)
                per_c[c] = m
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def ratios(summary: dict[str, Any], fronts: Sequence[str]) -> dict[str, Any]:
    """Per front, workload and clients: ours / etcd (records/s for registrations, calls/s for reads) and the
    servers' CPU per op ours / etcd; route reads over the one-process echo; go / grpcio."""
    etcd, echo = summary.get("etcd", {}), summary.get("echo", {})
    out: dict[str, Any] = {}
    for f in fronts:
        ours = summary.get(f"ours-{f}", {})
        per: dict[str, Any] = {}
        for w in WORKLOADS:
            for c, o in ours.get(w, {}).items():
                e = etcd.get(w, {}).get(c, {})
                k = "records_per_s" if w == "registration" else "per_s"
                row = {"throughput_ours_etcd": _ratio(o.get(k), e.get(k)),
                       "server_us_per_op_ours_etcd": _ratio(o.get("server_us_per_op"), e.get("server_us_per_op"))}
                if w == "route_reads":
                    row["per_s_ours_echo"] = _ratio(o.get("per_s"), echo.get("route_reads", {}).get(c, {}).get("per_s"))
                per.setdefault(w, {})[c] = row
        out[f] = per
    if "go" in fronts:
        go, grpcio = summary.get("ours-go", {}), summary.get("ours-grpcio", {})
        out["go_over_grpcio"] = {}
        for w in WORKLOADS:
            k = "records_per_s" if w == "registration" else "per_s"
            out["go_over_grpcio"][w] = {
                c: {"throughput": _ratio(o.get(k), grpcio.get(w, {}).get(c, {}).get(k)),
                    "server_us_per_op": _ratio(o.get("server_us_per_op"),
                                               grpcio.get(w, {}).get(c, {}).get("server_us_per_op"))}
                for c, o in go.get(w, {}).items()}
    return out


ISSUE27_CLIENTS = ("1", "16", "64")
ROUTE_READS_X_ETCD = 1.5


def issue27(rat: dict[str, Any], front: str) -> list[dict[str, Any]]:
    """Issue 27's gRPC targets for ours with `front`: registration records/s >= etcd at 1, 16 and 64 clients;
    linearizable reads/s >= etcd, route reads/s >= 1.5x etcd and above the one-process echo, each at every
    measured concurrency (a read target is met when it holds at all of them)."""
    per = rat.get(front, {})
    rows: list[dict[str, Any]] = [{"target": f"registration records/s >= etcd, {c} client{'s' if c != '1' else ''}",
             "ratios": {c: per.get("registration", {}).get(c, {}).get("throughput_ours_etcd")}, "threshold": 1.0}
            for c in ISSUE27_CLIENTS if c in per.get("registration", {})]
    rows.append({"target": "linearizable reads/s >= etcd", "threshold": 1.0,
                 "ratios": {c: v["throughput_ours_etcd"] for c, v in per.get("linearizable_reads", {}).items()}})
    rows.append({"target": f"route reads/s >= {ROUTE_READS_X_ETCD:g}x etcd", "threshold": ROUTE_READS_X_ETCD,
                 "ratios": {c: v["throughput_ours_etcd"] for c, v in per.get("route_reads", {}).items()}})
    rows.append({"target": "route reads/s above the one-process echo ceiling", "threshold": 1.0, "strict": True,
                 "ratios": {c: v.get("per_s_ours_echo") for c, v in per.get("route_reads", {}).items()}})
    for row in rows:
        strict, threshold = row.pop("strict", False), row["threshold"]
        vals: list[float | None] = list(row["ratios"].values())
        row["met"] = bool(vals) and all(x is not None and (x > threshold if strict else x >= threshold) for x in vals)
    return rows


# ---- the report ----------------------------------------------------------------------------------

def _n(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _r(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _others(summary: dict[str, Any]) -> str:
    """The header's word on the rest of the machine: the most cores other processes took over one load (the
    median over the rounds), and where; "" when no row measured it."""
    worst = max(((d["other_cores"], f"{w.replace('_', ' ')} at {c} on {sys_}")
                 for sys_, per_w in summary.items() for w, per_c in per_w.items() for c, d in per_c.items()
                 if d.get("other_cores") is not None), default=None)
    if worst is None:
        return ""
    return (f" Other processes on the machine took at most {worst[0]:.2f} cores during a load ({worst[1]}): "
            "every figure here is for a machine that busy.")


def markdown(r: dict[str, Any]) -> str:
    m, s, rat = r["meta"], r["summary"], r["ratios"]
    fronts = m["fronts"]
    systems = [f"ours-{f}" for f in fronts] + ["etcd", "echo"]
    head = [f"{m['date']}, {m['machine']['cores']} cores ({m['machine']['cpu']}), etcd {m['etcd_version']}; "
            f"compiled load generator (bench/gofront load); {m['rounds']} round(s) of "
            f"{', '.join(systems)}, {m['seconds_per_load']} s per load; ours with {m['ours_worker_processes']} "
            f"worker process(es) per node; {m['topics_per_broker']} topics per registration "
            f"({m['records_per_registration']} records); durability: ours {m['durability']['ours']}, etcd WAL "
            f"fsync on. Load average {', '.join(f'{x:.2f}' for x in m['machine']['load_average_at_start'])} at the "
            f"start, {', '.join(f'{x:.2f}' for x in m.get('load_average_at_end', []))} at the end. Medians over "
            "the rounds; throughput [min-max]; server and load generator CPU in µs per op (cores busy)."
            + _others(s), ""]
    rows = ["| workload | clients | system | throughput | p50 / p99 ms | server µs/op (cores) | "
            "load generator µs/op (cores) | ours / etcd: throughput, server µs/op | errors |",
            "|---|---|---|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        cs = sorted({c for sys_ in systems for c in s.get(sys_, {}).get(w, {})}, key=int)
        for c in cs:
            for sys_ in systems:
                d = s.get(sys_, {}).get(w, {}).get(c)
                if d is None:
                    continue
                lo, hi = d["per_s_range"]
                tp = (f"{_n(d['records_per_s'])} records/s ({_n(d['per_s'])}/s)" if w == "registration"
                      else f"{_n(d['per_s'])}/s") + (f" [{_n(lo)}-{_n(hi)}]" if d["rounds"] > 1 else "")
                front = sys_.removeprefix("ours-")
                q = rat.get(front, {}).get(w, {}).get(c) if sys_.startswith("ours-") else None
                vs = f"{_r(q['throughput_ours_etcd'])}, {_r(q['server_us_per_op_ours_etcd'])}" if q else ""
                if q and w == "route_reads":
                    vs += f"; / echo {_r(q.get('per_s_ours_echo'))}"
                rows.append(f"| {w.replace('_', ' ')} | {c} | {sys_} | {tp} | {d['p50_ms']:.2f} / {d['p99_ms']:.2f} | "
                            f"{_n(d.get('server_us_per_op'))} ({d.get('server_cores', 0):.2f}) | "
                            f"{_n(d.get('loadgen_us_per_op'))} ({d.get('loadgen_cores', 0):.2f}) | {vs} | "
                            f"{d['errors']} |")
    out = head + rows
    if "go_over_grpcio" in rat:
        out += ["", "**The Go front end over grpcio in the workers** (ours-go / ours-grpcio, this run)", "",
                "| workload | clients | throughput | server µs/op |", "|---|---|---|---|"]
        for w, per in rat["go_over_grpcio"].items():
            for c, v in per.items():
                out.append(f"| {w.replace('_', ' ')} | {c} | {_r(v['throughput'])} | {_r(v['server_us_per_op'])} |")
    for f in fronts:
        out += ["", f"**Issue 27's gRPC targets, ours with grpc_front = \"{f}\"**", "",
                "| target | ours / yardstick per clients | threshold | |", "|---|---|---|---|"]
        for row in r["targets"]["issue27"][f]:
            vals = ", ".join(f"{c}: {_r(x)}" for c, x in row["ratios"].items())
            out.append(f"| {row['target']} | {vals} | {row['threshold']:g} | {'met' if row['met'] else 'NOT met'} |")
    checks = [(run_["system"], run_["round"], ch) for run_ in r["runs"] for ch in run_.get("registration_check", [])]
    if checks:
        bad = [f"{sys_} round {rnd}: {ch['counted']} counted, {ch.get('in_cluster')} in the cluster"
               for sys_, rnd, ch in checks if not ch["ok"]]
        out += ["", "Registration cross-check, per load (the records the load generator counted, each client's "
                "untimed first call included, against the system's own count: ours the watch events on a "
                "follower, etcd the sum of the keys' versions): "
                f"{len(checks) - len(bad)} of {len(checks)} loads equal" + ("; " + "; ".join(bad) if bad else "")
                + "."]
    if m.get("notes"):
        out += ["", *(f"- {note}" for note in m["notes"])]
    return "\n".join(out)


def meta_base(run_dir: str, sections: dict[str, Any], etcd_binary: str) -> dict[str, Any]:
    ours_fsync = sections.get("raft", {}).get("fsync", True)
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "run_dir": run_dir,
            "machine": {"cores": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
                        "load_average_at_start": list(os.getloadavg())},
            "etcd_version": etcd_version(etcd_binary), "ours_sections": sections,
            "durability": {"ours": f"raft.fsync = {str(ours_fsync).lower()}", "etcd": FSYNC_NOTE}}
