"""Server CPU per call, grpcio's port vs the Go front end ([node] grpc_front = "go"), on one node with its
worker processes, side by side in one run.

    python -m bench.frontcpu [--seconds 5] [--clients 16,64] [--rounds 3] [--worker-processes 2]
                             [--fronts grpcio,go,go+cache] [--loads route,reregister] [--json OUT]

Each round starts the node with grpc_front = "grpcio", loads it, stops it, then the same with "go" (its reply
cache off: [node] grpc_front_cache_mb = 0) and "go+cache" (the cache on, the default 32 MiB: a repeated route
read is answered by the Go process alone, front/cache.go), one node at a time: nothing else shares the cores.
The node holds a 16-group route (a master and a slave each) for its topic; the loads, from the compiled
closed-loop generator (bench/gofront `load`: one connection per client, prebuilt request bytes, every reply
checked against the expected bytes), are:

- `route`: GetRoute of that topic (a worker answers from its replica);
- `reregister`: RegisterBroker of one of its brokers with its current DataVersion, the broker's periodic
  re-registration (the worker passes it to the core on the write channel; the leader refreshes the
  broker's liveness and appends nothing). A changed registration adds a Raft entry to both fronts alike.

Per load: calls/s, p50/p99, the server's CPU per call (the node's core, its workers and, with "go", the
front end: every process of the node, from /proc), the front end's share, the load generator's own CPU per
call, each go figure over grpcio's of the same round and load (`vs_grpcio`), and with "go+cache" the share
of calls answered from the cache (`hit_share`, from the front end's counters file).

The node appends nothing while it is loaded (no idle no-op): every reply is checked against the bytes read
at the start, apply offset included, so a cached reply is exactly the worker's. (A node that applies entries
voids the cache at each apply: a route read then costs a worker once per worker and apply.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench import loadgen
from bench.load import proc_cpu_s
from bench.procnet import children
from bench.procs import LocalCluster
from nameserver.ops import gofront
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2

GOFRONT = Path(__file__).with_name("gofront")  # the spike's binary: its `load` role is the generator
SERVICE = "/rip18.nameserver.v1.NameServer"
TOPIC = "front-topic"
GROUPS = 16
FRONTS = ("grpcio", "go", "go+cache")
LOADS = ("route", "reregister")
# each front's [node] settings
FRONT_SETTINGS: dict[str, dict[str, Any]] = {"grpcio": {"grpc_front": "grpcio"},
                                             "go": {"grpc_front": "go", "grpc_front_cache_mb": 0},
                                             "go+cache": {"grpc_front": "go", "grpc_front_cache_mb": 32}}


def _registration(i: int) -> api_pb2.RegisterBrokerRequest:
    return api_pb2.RegisterBrokerRequest(
        cluster_name="FrontCluster", broker_name=f"broker-{i:02d}", broker_addr=f"10.0.{i}.1:10911",
        broker_id=0, ha_server_addr=f"10.0.{i}.1:10912", heartbeat_timeout_ms=120_000,
        data_version=state_pb2.DataVersion(counter=1, timestamp=1_700_000_000_000),
        topics=[api_pb2.TopicConfig(topic_name=TOPIC, read_queue_nums=8, write_queue_nums=8, perm=6)])


def _prepare(stub: api_pb2_grpc.NameServerStub, root: Path) -> dict[str, tuple[str, Path, Path]]:
    """Register the route's brokers; per load, (method, request file, expected reply file)."""
    for i in range(GROUPS):
        stub.RegisterBroker(_registration(i), timeout=30)
    files: dict[str, tuple[str, Path, Path]] = {}
    route_req = api_pb2.GetRouteRequest(topic=TOPIC)
    reg_req = _registration(0)
    for name, method, request, reply in (
            ("route", "GetRoute", route_req, stub.GetRoute(route_req, timeout=30)),
            ("reregister", "RegisterBroker", reg_req, stub.RegisterBroker(reg_req, timeout=30))):
        (root / f"{name}.req").write_bytes(request.SerializeToString())
        (root / f"{name}.reply").write_bytes(reply.SerializeToString())
        files[name] = (f"{SERVICE}/{method}", root / f"{name}.req", root / f"{name}.reply")
    return files


def _front_pid(core: int) -> int | None:
    for pid in children(core):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"nameserver" not in f.read():
                    return pid  # the node's one child that is not Python: the Go front end
        except OSError:
            continue
    return None


def _load(addr: str, method: str, request: Path, expect: Path, clients: int, seconds: float) -> dict[str, Any]:
    cmd = [loadgen.build(GOFRONT), "load", "-addr", addr, "-method", method, "-request", str(request),
           "-expect", str(expect), "-clients", str(clients), "-seconds", str(seconds)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if res.returncode != 0:
        raise RuntimeError(f"gofront load failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def _hits(data_dir: str) -> int:
    """The calls the running Go front end answered from its cache (its counters file, written each second)."""
    try:
        with open(gofront.counters_path(data_dir)) as f:
            return sum(int(row[2]) for row in (line.split() for line in f) if len(row) == 3 and row[0] == "hit")
    except OSError:
        return 0


def measure_node(root: str, front: str, workers: int, clients: list[int], seconds: float,
                 loads: tuple[str, ...] = LOADS) -> list[dict[str, Any]]:
    """One node with `front`: every load at every client count; a row each."""
    cluster = LocalCluster(root, size=1, sections={"node": {"worker_processes": workers, **FRONT_SETTINGS[front]}})
    rows = []
    try:
        cluster.start()
        node = cluster.wait_ready(timeout=120)
        data_dir = node.data_dir
        stub = node.ns()
        files = _prepare(stub, Path(root))
        for load in loads:
            method, request, expect = files[load]
            for c in clients:
                pids = [node.pid, *children(node.pid)]
                go = _front_pid(node.pid) if front != "grpcio" else None
                hits0 = _counted_hits(data_dir) if front == "go+cache" else 0
                cpu0, go0 = proc_cpu_s(pids), proc_cpu_s([go] if go else [])
                res = _load(node.grpc_addr, method, request, expect, c, seconds)
                cpu, go_s = proc_cpu_s(pids) - cpu0, (proc_cpu_s([go]) - go0 if go else 0.0)
                calls = max(res["calls"], 1)
                hit_share = {"hit_share": round((_counted_hits(data_dir) - hits0) / calls, 3)} \
                    if front == "go+cache" else {}
                rows.append({"front": front, "load": load, "clients": c, **hit_share,
                             "calls_per_s": round(res["calls_per_s"]),
                             "p50_ms": round(res["p50_ms"], 3), "p99_ms": round(res["p99_ms"], 3),
                             "server_us_per_call": round(cpu / calls * 1e6, 1),
                             "front_us_per_call": round(go_s / calls * 1e6, 1),
                             "server_cores": round(cpu / res["seconds"], 2),
                             "load_us_per_call": round(res["cpu_us_per_call"], 1),
                             "load_cores": round(res["cpu_cores"], 2),
                             "errors": res["errors"] + res["mismatches"], "first_error": res["first_error"]})
    finally:
        cluster.stop()
    return rows


def _counted_hits(data_dir: str) -> int:
    """_hits once the front end has written what it counted so far (it writes each second)."""
    time.sleep(1.2)
    return _hits(data_dir)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {(r["round"], r["load"], r["clients"]): r["server_us_per_call"] for r in rows if r["front"] == "grpcio"}
    for r in rows:
        b = base.get((r["round"], r["load"], r["clients"]))
        if b:
            r["vs_grpcio"] = round(r["server_us_per_call"] / b, 2)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per load, clients and front, the median over rounds and [min-max]."""
    keys = ("calls_per_s", "p50_ms", "p99_ms", "server_us_per_call", "vs_grpcio", "front_us_per_call",
            "server_cores", "load_us_per_call", "load_cores", "hit_share")
    lines = ["| load | clients | front | " + " | ".join(keys) + " | errors |", "|---" * (len(keys) + 4) + "|"]
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["load"], r["clients"], r["front"]), []).append(r)
    for (load, c, front), group in sorted(groups.items(), key=lambda g: (LOADS.index(g[0][0]), g[0][1],
                                                                       FRONTS.index(g[0][2]))):
        cells = []
        for k in keys:
            vals = [float(g[k]) for g in group if k in g]
            cells.append("" if not vals else f"{median(vals):g} [{min(vals):g}-{max(vals):g}]" if len(vals) > 1
                         else f"{vals[0]:g}")
        lines.append(f"| {load} | {c} | {front} | " + " | ".join(cells) + f" | {sum(g['errors'] for g in group)} |")
    return "\n".join(lines)


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", default="16,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker-processes", type=int, default=2)
    p.add_argument("--fronts", default=",".join(FRONTS), help="of " + ", ".join(FRONTS))
    p.add_argument("--loads", default=",".join(LOADS), help="of " + ", ".join(LOADS))
    p.add_argument("--json", default="", help="write the rows and the run's facts here")
    p.add_argument("--table", default="", help="tabulate a --json file again")
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["rows"]))
        return 0
    clients = [int(c) for c in args.clients.split(",")]
    fronts, loads = tuple(args.fronts.split(",")), tuple(args.loads.split(","))
    for name, chosen, known in (("--fronts", fronts, FRONTS), ("--loads", loads, LOADS)):
        if not set(chosen) <= set(known):
            p.error(f"{name}: {', '.join(sorted(set(chosen) - set(known)))} is not one of {', '.join(known)}")
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "load_average_at_start": list(os.getloadavg()), "cores": len(os.sched_getaffinity(0)),
            "worker_processes": args.worker_processes, "seconds": args.seconds, "clients": clients,
            "commit": _commit()}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="frontcpu-") as tmp:
        for r in range(args.rounds):
            for front in fronts:
                for row in measure_node(os.path.join(tmp, f"{front}-{r}"), front, args.worker_processes, clients,
                                        args.seconds, loads):
                    rows.append({"round": r + 1, **row})
                    print(json.dumps(rows[-1]), flush=True)
    meta["load_average_at_end"] = list(os.getloadavg())
    add_ratios(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(json.dumps(meta))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
