"""Our cluster side by side with etcd and with a bare gRPC echo server, in one run.

    python -m bench.compare --root DIR [--seconds 10] [--concurrency 1,4,16,64] \\
        [--read-threads 12] [--topics 8] [--json OUT] [--raft-fsync true|false] [--worker-processes N] \\
        [--grpc-front go] [--loadgen go|python] [--rounds 2]

The load generator: `--loadgen go` (the default) is the compiled one of bench/gocompare.py (its docstring
says what it runs: registrations, linearizable and route reads at every --concurrency, ours with grpcio and
with the Go front end alternated over --rounds, beside etcd and one echo process); when it does not build,
the run falls back to the Python client threads below, naming why. `--loadgen python`:

One system at a time, each started fresh under DIR and stopped before the next starts (so only one
is ever using the CPU): our 3-node cluster (bench/procs.py), a 3-member etcd cluster
(Debian's etcd-server, installed when missing; WAL fsync on, etcd's default), then the echo server.
Each runs the workloads of bench/workloads.py. Prints a markdown table with the ratios
ours / etcd and ours / ceiling, and writes the whole result as JSON. Processes are always stopped,
on errors and on SIGTERM/Ctrl-C too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import grpc

from bench import gocompare
from bench.echo import DEFAULT_WORKERS, EchoProcess
from bench.etcd import FSYNC_NOTE, EtcdCluster, ensure_etcd, etcd_version
from bench.load import cpu_model, run_load
from bench.procnet import wait_listening
from bench.procs import LocalCluster
from bench.workloads import CLIENT_MODEL, ROUTE_BROKERS, EchoTarget, EtcdTarget, OursTarget, run_target, with_channel

DEFAULT_CONCURRENCY = [1, 4, 16, 64]
DEFAULT_READ_THREADS = 12  # 4 per node
ECHO_SERVERS = 3  # one per node: reads spread over 3 server processes on every side
WATCH_P99_TARGET_MS = 50.0
AT_CEILING = 0.9
LOADGENS = ("go", "python")


def run_compare(root: str, seconds: float, concurrency: list[int], sections: dict | None = None, *,
                topics: int = 8, read_threads: int = DEFAULT_READ_THREADS, worker_processes: int = 0,
                grpc_front: str = "grpcio", loadgen: str = "go", rounds: int = gocompare.DEFAULT_ROUNDS,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every workload on ours, etcd and the echo ceiling, one system at a time; the result dict.

    `loadgen` "go": the compiled load generator (bench/gocompare.py; `rounds`, both fronts when
    worker_processes > 0; `read_threads` and `grpc_front` unused), or, when it does not build, the Python
    one with meta["loadgen_fallback"] saying why; "python": the Python client threads.

    `sections` is extra TOML for our nodes (e.g. {"raft": {"fsync": False}}). `worker_processes` > 0: "ours"
    is our cluster with that many worker processes per node ([node] worker_processes), and "ours_no_workers"
    the same without, measured first; `grpc_front` "go": ours with workers behind the Go front end ([node]
    grpc_front). Raises EtcdUnavailable (before starting anything) when etcd is
    missing and cannot be installed: no silent skip.
    """
    if loadgen not in LOADGENS:
        raise ValueError(f"loadgen: {loadgen!r} is not one of {', '.join(LOADGENS)}")
    sections = sections or {}
    binary = ensure_etcd()  # fail before spending minutes on our side
    fallback = ""
    if loadgen == "go":
        try:
            exe = gocompare.binary()
        except gocompare.GoUnavailable as exc:
            fallback = f"the compiled load generator did not build, so the Python one ran: {exc}"
            log(fallback)
    os.makedirs(root, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="compare-", dir=root)  # fresh data dirs: never recover an old run
    if loadgen == "go" and not fallback:
        return gocompare.run(root, run_dir, seconds, concurrency, sections, topics=topics,
                             worker_processes=worker_processes, rounds=rounds, etcd_binary=binary, exe=exe,
                             meta=gocompare.meta_base(run_dir, sections, binary), log=log)
    ours_fsync = sections.get("raft", {}).get("fsync", True)
    workers = sections.get("grpc", {}).get("workers", DEFAULT_WORKERS)
    result: dict[str, Any] = {"meta": {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "run_dir": run_dir, "seconds_per_workload": seconds, "concurrency": concurrency,
        "read_threads": read_threads, "topics_per_broker": topics, "route_brokers": ROUTE_BROKERS,
        "records_per_registration": topics + 1,
        "machine": {"cores": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
                    "grpcio": grpc.__version__, "load_average_at_start": list(os.getloadavg())},
        "etcd_version": etcd_version(binary),
        "ours_sections": sections,
        "ours_worker_processes": worker_processes,
        "loadgen": "python", **({"loadgen_fallback": fallback} if fallback else {}),
        "ours_grpc_front": grpc_front if worker_processes else "grpcio",
        "durability": {"ours": f"raft.fsync = {str(ours_fsync).lower()}", "etcd": FSYNC_NOTE},
        "server_workers": workers,
        "client_model": CLIENT_MODEL,
        "notes": [
            "clients, servers and (for ours and etcd) all 3 replicas share this machine's cores: "
            "client_cpu_cores near 1 means the Python client (GIL) is the bottleneck, not the server",
            "one system runs at a time; each is started fresh and stopped before the next",
            "re-registration (unchanged): ours RegisterBroker with the broker's current DataVersion (the "
            "leader refreshes liveness, appends nothing); etcd a Txn comparing the broker key's value, with "
            "the puts in the failure branch (etcd runs any Txn holding a put through Raft and its WAL)",
            f"etcd's route read is one serializable range over topic/<t>/ ({ROUTE_BROKERS} queue datas); ours "
            "also resolves the broker datas: etcd would need a second read per broker for the same reply",
            f"ceiling: {ECHO_SERVERS} bare grpcio echo server processes (one per node, same worker pool as a "
            "node); registrations go to the first (the leader's role) echoing a registration-sized request, "
            "reads are spread over all, echoing a route-reply-sized payload; registration ratios compare "
            "registrations/s with calls/s",
        ]}}

    # With worker processes, ours runs twice, without them first: the gain shows in the same run.
    for key, workers in ([("ours_no_workers", 0), ("ours", worker_processes)] if worker_processes
                         else [("ours", 0)]):
        node = sections.get("node", {}) | ({"worker_processes": workers, "grpc_front": grpc_front} if workers else {})
        ours_sections = sections | ({"node": node} if node else {})
        log(f"ours: 3 nodes under {run_dir}/{key} (sections {ours_sections})")
        cluster = LocalCluster(os.path.join(run_dir, key), sections=ours_sections)
        try:
            cluster.start()
            cluster.wait_ready()
            for n in cluster.nodes:  # every worker listening (the core holds no gRPC port then), or the Go front end
                wait_listening(n.pid, n.grpc_addr, 1 if workers and grpc_front == "go" else max(1, workers))
            result[key] = run_target(OursTarget(cluster, topics), seconds, concurrency, read_threads, log)
            result[key]["worker_processes"] = workers
            result[key]["rss_bytes"] = {n.name: n.rss_bytes() for n in cluster.nodes}
        finally:
            cluster.stop()

    log(f"etcd {result['meta']['etcd_version']}: 3 members under {run_dir}/etcd")
    etcd = EtcdCluster(os.path.join(run_dir, "etcd"), binary=binary, max_txn_ops=max(128, topics + 1))
    try:
        etcd.start()
        etcd.wait_ready()
        result["etcd"] = run_target(EtcdTarget(etcd, topics), seconds, concurrency, read_threads, log)
        result["etcd"]["rss_bytes"] = {m.name: m.rss_bytes() for m in etcd.members}
    finally:
        etcd.stop()

    log(f"ceiling: {ECHO_SERVERS} gRPC echo server processes ({workers} workers each)")
    echos = [EchoProcess(workers=workers, log_path=os.path.join(run_dir, f"echo{i + 1}.log"))
             for i in range(ECHO_SERVERS)]
    try:
        for e in echos:
            e.start()
        target = EchoTarget([e.addr for e in echos], [e.proc.pid for e in echos if e.proc], topics)
        result["ceiling"] = run_target(target, seconds, concurrency, read_threads, log)
        # issue 27's yardstick for route reads: what ONE server process can answer (every read to echo1)
        one = EchoTarget([echos[0].addr], target.pids()[:1], topics)
        res = run_load(lambda i: with_channel(echos[0].addr, one.route_read_op, i), read_threads, seconds,
                       one.pids())
        result["ceiling_one_process"] = {"route_reads": res}
        log(f"  ceiling, one process: route reads ({read_threads} threads): {res['per_s']:.0f}/s")
    finally:
        for e in echos:
            e.stop()

    result["ratios"], result["targets"] = ratios(result)
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or a != a or b != b:  # missing, zero or NaN
        return None
    return round(a / b, 3)


def ratios(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    ours, etcd, ceil = r["ours"], r["etcd"], r["ceiling"]
    out: dict[str, Any] = {"registration": {}}
    for c, o in ours["registration"].items():
        e, x = etcd["registration"][c], ceil["registration"][c]
        out["registration"][c] = {
            "records_per_s_ours_etcd": _ratio(o["records_per_s"], e["records_per_s"]),
            "p99_ours_etcd": _ratio(o["p99_ms"], e["p99_ms"]),
            "ops_per_s_ours_ceiling": _ratio(o["per_s"], x["per_s"])}
    for w in ("reregistration", "reregistration_spread"):
        out[w] = {
            c: {"ops_per_s_ours_etcd": _ratio(o["per_s"], etcd[w][c]["per_s"]),
                "ops_per_s_ours_ceiling": _ratio(o["per_s"], ceil[w][c]["per_s"]) if c in ceil.get(w, {}) else None}
            for c, o in ours.get(w, {}).items() if c in etcd.get(w, {})}
    for w in ("route_reads", "linearizable_reads"):
        out[w] = {"per_s_ours_etcd": _ratio(ours[w]["per_s"], etcd[w]["per_s"]),
                  "p99_ours_etcd": _ratio(ours[w]["p99_ms"], etcd[w]["p99_ms"]),
                  "per_s_ours_ceiling": _ratio(ours[w]["per_s"], ceil["route_reads"]["per_s"])}
    out["watch"] = {"p50_ours_etcd": _ratio(ours["watch"]["p50_ms"], etcd["watch"]["p50_ms"]),
                    "p99_ours_etcd": _ratio(ours["watch"]["p99_ms"], etcd["watch"]["p99_ms"])}
    reg = {c: (v["records_per_s_ours_etcd"] or 0) >= 1 for c, v in out["registration"].items()}
    # Both sides within 10% of the echo ceiling: the client and the shared CPU set the figure, not the
    # servers, so this comparison cannot tell them apart on this machine.
    at_ceiling = min(_ratio(ours["route_reads"]["per_s"], ceil["route_reads"]["per_s"]) or 0,
                     _ratio(etcd["route_reads"]["per_s"], ceil["route_reads"]["per_s"]) or 0) >= AT_CEILING
    targets: dict[str, Any] = {
        "registration_records_per_s_ge_etcd": {"per_concurrency": reg, "met": all(reg.values())},
        "route_reads_per_s_ge_etcd": {"met": (out["route_reads"]["per_s_ours_etcd"] or 0) >= 1,
                                      "both_at_ceiling": at_ceiling},
        "watch_p99_le_50ms": {"p99_ms": ours["watch"]["p99_ms"],
                              "met": ours["watch"]["p99_ms"] <= WATCH_P99_TARGET_MS and ours["watch"]["missing"] == 0},
    }
    if "ours_no_workers" in r:
        none = r["ours_no_workers"]
        out["workers_gain"] = {f"registration {c}": _ratio(o["per_s"], none["registration"][c]["per_s"])
                               for c, o in ours["registration"].items()}
        out["workers_gain"] |= {w: _ratio(ours[w]["per_s"], none[w]["per_s"])
                                for w in ("route_reads", "linearizable_reads")}
    targets["issue27"] = issue27(r, out)
    return out, targets


ISSUE27_REGISTRATION_CLIENTS = ("1", "16", "64")
ISSUE27_ROUTE_READS_X_ETCD = 1.5


def issue27(r: dict[str, Any], rat: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 27's gRPC targets, each with its measured ratio, its threshold and whether it is met: ours
    (with its worker processes, when the run had them) beside etcd and the one-process echo ceiling."""
    rows = [{"target": f"registration records/s >= etcd, {c} client{'s' if c != '1' else ''}",
             "ratio": rat["registration"][c]["records_per_s_ours_etcd"], "threshold": 1.0}
            for c in ISSUE27_REGISTRATION_CLIENTS if c in rat["registration"]]
    rows.append({"target": "linearizable reads/s >= etcd", "ratio": rat["linearizable_reads"]["per_s_ours_etcd"],
                 "threshold": 1.0})
    rows.append({"target": f"route reads/s >= {ISSUE27_ROUTE_READS_X_ETCD}x etcd",
                 "ratio": rat["route_reads"]["per_s_ours_etcd"], "threshold": ISSUE27_ROUTE_READS_X_ETCD})
    one = r.get("ceiling_one_process", {}).get("route_reads")
    if one:
        rows.append({"target": "route reads/s above the one-process echo ceiling",
                     "ratio": _ratio(r["ours"]["route_reads"]["per_s"], one["per_s"]), "threshold": 1.0,
                     "strict": True})
    for row in rows:
        x = row["ratio"]
        row["met"] = x is not None and (x > row["threshold"] if row.pop("strict", False) else x >= row["threshold"])
    return rows


# ---- the report ----------------------------------------------------------------------------------

def _n(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _lat(d: dict[str, Any]) -> str:
    """Latencies, and the servers' CPU per operation where the load measured it (every process of the
    system: ours, a node's core and its worker processes)."""
    cpu = f", {_n(d['server_us_per_op'])} µs CPU/op" if "server_us_per_op" in d else ""
    return f"p50 {d['p50_ms']:.2f} / p99 {d['p99_ms']:.2f} ms{cpu}"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def workers_table(r: dict[str, Any]) -> list[str]:
    """Ours with its worker processes beside ours without, the same loads in the same run."""
    ours, none, gain = r["ours"], r["ours_no_workers"], r["ratios"]["workers_gain"]
    w = ours["worker_processes"]
    lines = [f"**Ours with {w} worker processes per node beside ours without** (the same loads, this run; "
             "server CPU summed over each node's core and workers)", "",
             f"| workload | workers = {w} | workers = 0 | {w} / 0 |", "|---|---|---|---|"]
    for c, o in ours["registration"].items():
        z = none["registration"][c]
        lines.append(f"| registration, {c} client{'s' if c != '1' else ''} | {_n(o['per_s'])} reg/s, {_lat(o)} | "
                     f"{_n(z['per_s'])} reg/s, {_lat(z)} | {_r(gain[f'registration {c}'])} |")
    for wl, label in (("route_reads", "route read, eventual"), ("linearizable_reads", "linearizable read")):
        o, z = ours[wl], none[wl]
        lines.append(f"| {label} | {_n(o['per_s'])}/s, {_lat(o)} | {_n(z['per_s'])}/s, {_lat(z)} | "
                     f"{_r(gain[wl])} |")
    return lines


def issue27_table(r: dict[str, Any]) -> list[str]:
    w = r["ours"].get("worker_processes", 0)
    lines = [f"**Issue 27's gRPC targets** (ours with {w} worker processes per node)", "",
             "| target | ours / yardstick | threshold | |", "|---|---|---|---|"]
    for row in r["targets"]["issue27"]:
        lines.append(f"| {row['target']} | {_r(row['ratio'])} | {row['threshold']:g} | {_met(row['met'])} |")
    return lines


def _r(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def markdown(r: dict[str, Any]) -> str:
    if r["meta"].get("loadgen") == "go":
        return gocompare.markdown(r)
    ours, etcd, ceil, rat = r["ours"], r["etcd"], r["ceiling"], r["ratios"]
    m = r["meta"]
    t = m["topics_per_broker"]
    rows = ["| workload | ours | etcd | ceiling (gRPC echo) | ours / etcd | ours / ceiling |",
            "|---|---|---|---|---|---|"]
    for c, o in ours["registration"].items():
        e, x, q = etcd["registration"][c], ceil["registration"][c], rat["registration"][c]
        rows.append(f"| registration ({t} topics, {t + 1} records), {c} client{'s' if c != '1' else ''} | "
                    f"**{_n(o['records_per_s'])} records/s** ({_n(o['per_s'])} reg/s), {_lat(o)} | "
                    f"**{_n(e['records_per_s'])} records/s** ({_n(e['per_s'])} txn/s), {_lat(e)} | "
                    f"{_n(x['per_s'])} calls/s, {_lat(x)} | {_r(q['records_per_s_ours_etcd'])} | "
                    f"{_r(q['ops_per_s_ours_ceiling'])} |")
    for w, where in (("reregistration", "to the leader"), ("reregistration_spread", "over every node")):
        for c, o in ours.get(w, {}).items():
            if c not in rat.get(w, {}):
                continue
            e, x, q = etcd[w][c], ceil.get(w, {}).get(c), rat[w][c]
            rows.append(f"| re-registration, unchanged ({t} topics), {where}, {c} client{'s' if c != '1' else ''} | "
                        f"**{_n(o['per_s'])} reg/s**, {_lat(o)} | **{_n(e['per_s'])} txn/s**, {_lat(e)} | "
                        + (f"{_n(x['per_s'])} calls/s, {_lat(x)}" if x else "—")
                        + f" | {_r(q['ops_per_s_ours_etcd'])} | {_r(q['ops_per_s_ours_ceiling'])} |")
    rt = m["read_threads"]
    for w, label in (("route_reads", "route read, eventual"), ("linearizable_reads", "linearizable read")):
        o, e, x, q = ours[w], etcd[w], ceil["route_reads"], rat[w]
        rows.append(f"| {label}, {rt} clients over 3 nodes | **{_n(o['per_s'])}/s**, {_lat(o)} | "
                    f"**{_n(e['per_s'])}/s**, {_lat(e)} | {_n(x['per_s'])} calls/s, {_lat(x)} | "
                    f"{_r(q['per_s_ours_etcd'])} | {_r(q['per_s_ours_ceiling'])} |")
        if w == "route_reads":
            for (on, od), (en, ed) in zip(o["per_node"].items(), e["per_node"].items(), strict=False):
                rows.append(f"| — per node ({on} / {en}) | {_n(od['per_s'])}/s, p99 {od['p99_ms']:.2f} ms | "
                            f"{_n(ed['per_s'])}/s, p99 {ed['p99_ms']:.2f} ms | | | |")
    o, e = ours["watch"], etcd["watch"]
    rows.append(f"| watch propagation (ack → event on another node) | {_lat(o)} ({o['missing']} missed) | "
                f"{_lat(e)} ({e['missing']} missed) | — | p99 {_r(rat['watch']['p99_ours_etcd'])} | — |")
    cpu = ["", "CPU busy during each load, in cores (client: the harness process; servers: the system's processes):",
           "", "| load | ours client / servers | etcd client / servers | ceiling client / server |",
           "|---|---|---|---|"]
    loads = [(f"registration, {c}", ("registration", c)) for c in ours["registration"]]
    loads += [("route reads", ("route_reads", None)), ("linearizable reads", ("linearizable_reads", None))]
    for label, (w, c) in loads:
        cells = []
        for side in (ours, etcd, ceil):
            d = side.get(w if side is not ceil or w != "linearizable_reads" else "route_reads")
            d = d.get(c) if (d is not None and c is not None) else d
            cells.append(f"{d['client_cpu_cores']:.2f} / {d.get('server_cpu_cores', 0):.2f}" if d else "—")
        cpu.append(f"| {label} | " + " | ".join(cells) + " |")
    tg = r["targets"]
    reads = tg["route_reads_per_s_ge_etcd"]
    reads_note = (f" ({_r(rat['route_reads']['per_s_ours_etcd'])}; both sides are within "
                  f"{100 - AT_CEILING * 100:.0f}% of the echo ceiling, so the client and the shared CPU bound "
                  "this figure, not the servers)") if reads.get("both_at_ceiling") else ""
    verdict = ["", "Targets: registration records/s >= etcd at every concurrency: "
               f"{'met' if tg['registration_records_per_s_ge_etcd']['met'] else 'NOT met'}; route reads/s >= etcd: "
               f"{'met' if reads['met'] else 'NOT met'}{reads_note}; watch p99 <= 50 ms: "
               f"{'met' if tg['watch_p99_le_50ms']['met'] else 'NOT met'}."]
    checks = []
    for side in ("ours", "etcd"):
        ch = r[side].get("registration_check")
        if ch:
            checks.append(f"{side}: {ch['counted']} records counted, {ch['in_cluster']} in the cluster "
                          f"({'equal' if ch['ok'] else 'MISMATCH'})")
    head = [f"{m['date']}, {m['machine']['cores']} cores ({m['machine']['cpu']}), Python {m['machine']['python']}, "
            f"grpcio {m['machine']['grpcio']}, etcd {m['etcd_version']}; {m['seconds_per_workload']} s per load; "
            f"durability: ours {m['durability']['ours']}, etcd WAL fsync on (default); ours with "
            f"{m.get('ours_worker_processes', 0)} worker processes per node"
            f"{' behind the Go front end' if m.get('ours_grpc_front') == 'go' else ''}. Load average at start "
            f"{', '.join(f'{x:.2f}' for x in m['machine']['load_average_at_start'])}.", ""]
    extra = ["", *workers_table(r)] if "ours_no_workers" in r else []
    if "issue27" in tg:
        extra += ["", *issue27_table(r)]
    if m.get("loadgen_fallback"):
        head.insert(1, f"Load generator: Python client threads ({m['loadgen_fallback']}).")
    return "\n".join(head + rows + cpu + verdict + ["Registration cross-check: " + "; ".join(checks) + "."] + extra)


def _parse_bool(s: str) -> bool:
    if s.lower() in ("true", "1", "yes", "on"):
        return True
    if s.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {s}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="directory for data dirs and logs (a fresh subdirectory per run)")
    p.add_argument("--seconds", type=float, default=10.0, help="duration of each load")
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)),
                   help="registration client counts, comma-separated")
    p.add_argument("--read-threads", type=int, default=DEFAULT_READ_THREADS)
    p.add_argument("--topics", type=int, default=8, help="topics per registered broker")
    p.add_argument("--raft-fsync", type=_parse_bool, default=None, help="set our nodes' raft.fsync")
    p.add_argument("--worker-processes", type=int, default=0,
                   help="[node] worker_processes of ours (> 0: ours without them is measured too)")
    p.add_argument("--grpc-front", choices=("grpcio", "go"), default="grpcio",
                   help="[node] grpc_front of ours with workers (go: the Go front end)")
    p.add_argument("--loadgen", choices=LOADGENS, default="go",
                   help="go: the compiled load generator (falls back to python, saying why, when it does not "
                        "build); python: the harness's client threads")
    p.add_argument("--rounds", type=int, default=gocompare.DEFAULT_ROUNDS,
                   help="--loadgen go: rounds of ours (grpcio, go), etcd and the echo, one after another")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, not {args.rounds}")
    # SIGTERM unwinds like Ctrl-C, so every `finally` stops the processes it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sections: dict[str, dict[str, Any]] = {}
    if args.raft_fsync is not None:
        sections["raft"] = {"fsync": args.raft_fsync}
    concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    result = run_compare(args.root, args.seconds, concurrency, sections, topics=args.topics,
                         read_threads=args.read_threads, worker_processes=args.worker_processes,
                         grpc_front=args.grpc_front, loadgen=args.loadgen, rounds=args.rounds,
                         log=lambda s: print(s, file=sys.stderr, flush=True))
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
