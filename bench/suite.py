"""`python -m bench`: every benchmark of docs/benchmarks.md in one run, with JSON and a markdown report.

    .venv/bin/python -m bench --json bench.json --report bench.md       # the full run (~35 minutes; make bench)
    .venv/bin/python -m bench --quick                                   # a smoke run (~6 minutes; make bench-quick)

Parts (each starts its own fresh clusters, one system under load at a time):
- compare:    ours beside a 3-member etcd and a bare gRPC echo ceiling (bench/compare.py),
              once per --topics value; ours with --worker-processes worker processes per node
              (default: this machine's cores) and, in the same run, ours without them;
- cores:      issue 27's remoting yardsticks (bench/cores.py): route reads on the stock RocketMQ
              NameServer beside ours with --worker-processes workers per node, per node, per core
              (pinned) and per machine, at each --cores-clients count; one node with worker_processes
              1 vs 2 (route reads, registrations) and a projection to 16 cores from the CPU per
              operation; 3 voters with and without 2 read replicas;
- fsync:      our registration throughput with raft.fsync on and off (the durability cost);
- groups:     our changed-registration throughput with [sharding] groups = 2 against 1 (workers: 1 per node);
- failover:   leader SIGKILL to the first acknowledged write, --failover-trials times;
- huge:       one broker registering 70,000 topics;
- recovery:   restart recovery, catch-up from empty and memory at --records records; with
              --recovery-workers 0,2 also one node per worker count: PSS of core and workers, restarts;
- stability:  --stability-minutes of writes at 80% of the measured maximum, counting elections;
- costs:      CPU, bytes and memory per operation for the capacity model (bench/costs.py), written to
              --costs-file as well (make costs; docs/scaling.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import sys
import tempfile
import time
from typing import Any

import grpc

from bench import compare, cores, costs, durability, stability
from bench.load import cpu_model, new_channel, run_load
from bench.procs import LocalCluster
from bench.workloads import OursTarget

PARTS = ("compare", "cores", "fsync", "groups", "failover", "huge", "recovery", "stability", "costs")


def registrations_side_by_side(root: str, seconds: float, concurrency: list[int], topics: int,
                               variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Changed-registration throughput of one fresh 3-node cluster per variant (name -> LocalCluster
    keyword arguments), one after the other in one run, each loaded through its (group 0) leader."""
    out: dict[str, Any] = {}
    for name, kwargs in variants.items():
        with LocalCluster(tempfile.mkdtemp(prefix=f"{name}-", dir=root), **kwargs) as c:
            c.wait_ready()
            target = OursTarget(c, topics)
            _first_registration(target)

            def make(i: int, target: OursTarget = target) -> tuple[grpc.Channel, Any]:
                channel = new_channel(target.leader_endpoint())
                return channel, target.registration_op(channel, i)

            out[name] = {str(n): run_load(make, n, seconds, server_pids=target.pids()) for n in concurrency}
    return out


def _first_registration(target: OursTarget, timeout: float = 120.0) -> None:
    """Until one registration is acknowledged: a node is ready before every group of it is (sharding)."""
    deadline = time.monotonic() + timeout
    channel = new_channel(target.leader_endpoint())
    op = target.registration_op(channel, 10_000)
    try:
        while True:
            try:
                op()
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        channel.close()


def fsync_cost(root: str, seconds: float, concurrency: list[int], topics: int) -> dict[str, Any]:
    """Registration throughput of our cluster with the journal fsync on and off."""
    return registrations_side_by_side(root, seconds, concurrency, topics, {
        "on": {"sections": {"raft": {"fsync": True}}}, "off": {"sections": {"raft": {"fsync": False}}}})


def groups_cost(root: str, seconds: float, concurrency: list[int], topics: int) -> dict[str, Any]:
    """Changed-registration throughput with [sharding] groups = 2 against 1, one worker per node in both
    (sharding needs workers): issue 29's comparison, side by side in one run."""
    workers = {"node": {"worker_processes": 1}}
    return registrations_side_by_side(root, seconds, concurrency, topics, {
        "1": {"sections": workers}, "2": {"sections": workers, "groups": 2}})


def _side_by_side_rows(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Table rows: clients | a's reg/s, p50 / p99 ms, µs CPU/op | b's | a / b."""
    rows = []
    for n, one in a.items():
        two = b[n]
        rows.append(f"| {n} | {one['per_s']:,.0f}, {one['p50_ms']:.2f} / {one['p99_ms']:.2f}, "
                    f"{one.get('server_us_per_op', 0):,.0f} | {two['per_s']:,.0f}, {two['p50_ms']:.2f} / "
                    f"{two['p99_ms']:.2f}, {two.get('server_us_per_op', 0):,.0f} | "
                    f"{one['per_s'] / two['per_s'] if two['per_s'] else 0:.2f} |")
    return rows


def _machine() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def report(r: dict[str, Any]) -> str:
    m = r["meta"]
    lines = [f"Run {m['date']} with `{m['command']}`; {m['machine']['cores']} cores ({m['machine']['cpu']}), "
             f"Python {m['machine']['python']}, load average at start {m['machine']['load_average_at_start']}.", ""]
    for key, res in r.get("compare", {}).items():
        lines += [f"**Side by side, {key} topics per registration**", "", compare.markdown(res), ""]
    if "cores" in r:
        lines += [cores.markdown(r["cores"]), ""]
    if "fsync" in r:
        lines += ["**The cost of the journal fsync** (registrations, "
                  f"{r['meta']['fsync_topics']} topics each)", "",
                  "| clients | fsync on: reg/s, p50 / p99 ms, servers' µs CPU/op | fsync off: the same | on / off |",
                  "|---|---|---|---|", *_side_by_side_rows(r["fsync"]["on"], r["fsync"]["off"]), ""]
    if "groups" in r:
        lines += ["**Sharding: 2 Raft groups against 1** (changed registrations through group 0's leader node, "
                  f"{r['meta']['fsync_topics']} topics each, one worker per node in both)", "",
                  "| clients | 2 groups: reg/s, p50 / p99 ms, servers' µs CPU/op | 1 group: the same | 2 / 1 |",
                  "|---|---|---|---|", *_side_by_side_rows(r["groups"]["2"], r["groups"]["1"]), ""]
    if "failover" in r:
        f = r["failover"]
        lines += [f"**Failover** (leader SIGKILL to the first acknowledged write, {f['trials']} trials, "
                  f"worker_processes = {f.get('worker_processes', 0)}): "
                  f"p50 {f['p50_s']} s, p99 {f['p99_s']} s, max {f['max_s']} s, min {f['min_s']} s; "
                  f"terms per failover {f['terms_per_failover']}.", ""]
    if "huge_registration" in r:
        h = r["huge_registration"]
        lines += [f"**One registration of {h['topics']:,} topics** ({h['request_bytes']:,} bytes, streamed, "
                  f"through a follower): {h['seconds']} s, {h['records']:,} records; the first route read of one of "
                  f"them on that follower (waiting, with min_offset, for it to apply the registration) "
                  f"{h['route_read_ms']} ms, the next {h.get('route_read_after_ms', 'n/a')} ms; "
                  f"re-registering it unchanged wrote {h['re_registration_records']} "
                  "records.", ""]
    if "recovery" in r:
        v = r["recovery"]
        fill = v["fill"]
        lines += [f"**Recovery at {fill['records']:,} records** (filled in {fill['seconds']} s, "
                  f"{fill['records_per_s']:,} records/s): restart (SIGKILL, restart, snapshot + journal) "
                  f"{v['restart_recovery_s']} s; a follower with an empty data directory caught up in "
                  f"{v['catch_up_from_empty_s']} s; digests equal: {v['digests_equal']}. Resident memory "
                  f"(MiB): after the fill {v['rss_mib_after_fill']}, restarted node {v['restart_rss_mib']}, "
                  f"after catch-up {v['rss_mib_after_catch_up']}; snapshot {v['snapshot_bytes'] >> 20} MiB.", ""]
        if v.get("nodes"):
            lines += durability.nodes_markdown(v["nodes"]) + [""]
    if "stability" in r:
        s = r["stability"]
        ld = s["load"]
        lines += [f"**Load stability**: {s['minutes']} min at {s['fraction']:.0%} of the measured maximum "
                  f"({s['max_registrations_per_s']:,.0f} registrations/s with 64 clients): achieved "
                  f"{ld['per_s']:,.0f}/s (target {ld['target_per_s']:,.0f}), p50 {ld['p50_ms']} / p99 "
                  f"{ld['p99_ms']} ms, {ld['errors']} errors; **elections during the load: "
                  f"{s['elections_during_load']}**; digests equal after: {s['digests_equal']}.", ""]
    if "costs" in r:
        lines += [f"**Costs per operation** ({r['costs']['repetitions']} repetitions; value [min-max])", "",
                  "| cost | value | unit |", "|---|---|---|"]
        for key, c in r["costs"]["costs"].items():
            if isinstance(c, dict):
                lines.append(f"| {key} | {c['value']:,} [{c['min']:,}-{c['max']:,}] | {c['unit']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="", help="work directory (default: a new temporary one)")
    p.add_argument("--only", action="append", choices=PARTS, help="run only these parts (repeatable)")
    p.add_argument("--quick", action="store_true", help="short loads and small sizes: a smoke run")
    p.add_argument("--seconds", type=float, default=10.0, help="duration of each throughput load")
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--topics", default="8,128", help="topics per registration for the comparison")
    p.add_argument("--worker-processes", type=int, default=len(os.sched_getaffinity(0)),
                   help="[node] worker_processes of ours in compare, cores and failover (default: this "
                        "machine's cores; 0: none, and compare has no row without them to add)")
    p.add_argument("--cluster-worker-processes", type=int, default=None,
                   help="worker_processes per node of cores' 3-node cluster beside one stock node (default: this "
                        "machine's cores divided among its 3 nodes, at least 1)")
    p.add_argument("--cores-clients", default=",".join(map(str, cores.DEFAULT_CLIENTS)),
                   help="connection counts of the cores part's loads (the scaling and replica loads use the largest)")
    p.add_argument("--replica-rounds", type=int, default=1, help="rounds of the cores part's replica loads")
    p.add_argument("--idle-seconds", type=float, default=5.0, help="the replica loads' idle leader CPU window")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--recovery-workers", default="", help="recovery: also one node with each of these "
                   "worker_processes (e.g. 0,2): PSS of its core and workers, restart to every worker serving")
    p.add_argument("--restarts", type=int, default=3, help="restarts of each --recovery-workers node")
    p.add_argument("--failover-trials", type=int, default=20)
    p.add_argument("--stability-minutes", type=float, default=10.0)
    p.add_argument("--repetitions", type=int, default=3, help="runs of each costs load")
    p.add_argument("--costs-file", default="", help="write the costs part's file here (docs/scaling.md)")
    p.add_argument("--grpc-front", choices=("grpcio", "go"), default="grpcio",
                   help="compare: [node] grpc_front of ours with workers (go: the Go front end)")
    p.add_argument("--loadgen", choices=compare.LOADGENS, default="go",
                   help="compare: the load generator (go: compiled, falling back to python, saying why, when it "
                        "does not build)")
    p.add_argument("--compare-rounds", type=int, default=compare.gocompare.DEFAULT_ROUNDS,
                   help="compare with --loadgen go: rounds of ours (grpcio, go), etcd and the echo")
    p.add_argument("--json", default="", help="write every result here")
    p.add_argument("--report", default="", help="write the markdown report here (it is printed too)")
    if p.parse_known_args(argv)[0].quick:  # smaller defaults; what the command line says still wins
        p.set_defaults(seconds=2.0, records=100_000, failover_trials=5, stability_minutes=0.5,
                       concurrency="1,16", topics="8", repetitions=1, idle_seconds=1.0,
                       compare_rounds=1)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every cluster is stopped
    root = args.root or tempfile.mkdtemp(prefix="nsbench-")
    os.makedirs(root, exist_ok=True)
    parts = set(args.only or PARTS)
    concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    topics = [int(t) for t in args.topics.split(",") if t.strip()]
    cores_clients = [int(c) for c in args.cores_clients.split(",") if c.strip()]
    recovery_workers = [int(w) for w in args.recovery_workers.split(",") if w.strip()]
    r: dict[str, Any] = {"meta": {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m bench " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "machine": _machine(), "root": root, "fsync_topics": topics[0]}}

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def save() -> None:  # after every part: a failure later never loses what was measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=2)

    steps: list[tuple[str, str, Any]] = [
        ("compare", "compare", lambda: {str(t): compare.run_compare(root, args.seconds, concurrency, topics=t,
                                                                    worker_processes=args.worker_processes,
                                                                    grpc_front=args.grpc_front,
                                                                    loadgen=args.loadgen, rounds=args.compare_rounds,
                                                                    log=log)
                                        for t in topics}),
        ("cores", "cores", lambda: cores.run_cores(root, args.seconds, cores_clients, args.worker_processes,
                                                   replica_rounds=args.replica_rounds, idle_s=args.idle_seconds,
                                                   cluster_workers=args.cluster_worker_processes, log=log)),
        ("fsync", "fsync", lambda: fsync_cost(root, args.seconds, concurrency, topics[0])),
        ("groups", "groups", lambda: groups_cost(root, args.seconds, concurrency, topics[0])),
        ("failover", "failover", lambda: durability.failover(
            root, args.failover_trials, sections={"node": {"worker_processes": args.worker_processes}})),
        ("huge", "huge_registration", lambda: durability.huge_registration(root)),
        ("recovery", "recovery", lambda: durability.recovery(root, args.records, workers=recovery_workers,
                                                             restarts=args.restarts)),
        ("stability", "stability", lambda: stability.stability(root, args.stability_minutes,
                                                               probe_seconds=min(20.0, 4 * args.seconds))),
        ("costs", "costs", lambda: costs.run_costs(root, args.seconds, args.repetitions, args.quick, log=log)),
    ]
    for part, key, run in steps:
        if part not in parts:
            continue
        log(f"== {part}")
        try:
            r[key] = run()
            if part == "costs" and args.costs_file:
                with open(args.costs_file, "w") as f:
                    json.dump(r[key], f, indent=2)
        except Exception as exc:  # recorded and reported: a failed part is a finding, not a crash
            log(f"{part} failed: {exc!r}")
            r.setdefault("failed", {})[part] = repr(exc)
        save()
    text = report(r)
    if "failed" in r:
        text += "\n**Failed parts:** " + "; ".join(f"{k}: {v}" for k, v in r["failed"].items()) + "\n"
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 1 if "failed" in r else 0


__all__ = ["main", "report"]


if __name__ == "__main__":
    sys.exit(main())
