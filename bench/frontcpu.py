"""Server CPU per call, grpcio's port vs the Go front end ([node] grpc_front = "go"), on one node with its
worker processes, side by side in one run.

    python -m bench.frontcpu [--seconds 5] [--clients 16,64] [--rounds 3] [--worker-processes 2] [--json OUT]

Each round starts the node with grpc_front = "grpcio", loads it, stops it, then the same with "go" (one node
runs at a time: nothing else shares the cores). The node holds a 16-group route (a master and a slave each)
for its topic; the loads, from the compiled closed-loop generator (bench/gofront `load`: one connection per
client, prebuilt request bytes, every reply checked against the expected bytes), are:

- `route`: GetRoute of that topic (a worker answers from its replica);
- `reregister`: RegisterBroker of one of its brokers with its current DataVersion, the broker's periodic
  re-registration (the worker passes it to the core on the write channel; the leader refreshes the
  broker's liveness and appends nothing). A changed registration adds a Raft entry to both fronts alike.

Per load: calls/s, p50/p99, the server's CPU per call (the node's core, its workers and, with "go", the
front end: every process of the node, from /proc), the front end's share, the load generator's own CPU per
call, and each go figure over grpcio's of the same round and load (`vs_grpcio`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

from bench import loadgen
from bench.load import proc_cpu_s
from bench.procnet import children
from bench.procs import LocalCluster
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2

GOFRONT = Path(__file__).with_name("gofront")  # the spike's binary: its `load` role is the generator
SERVICE = "/rip18.nameserver.v1.NameServer"
TOPIC = "front-topic"
GROUPS = 16
FRONTS = ("grpcio", "go")
LOADS = ("route", "reregister")


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


def measure_node(root: str, front: str, workers: int, clients: list[int], seconds: float) -> list[dict[str, Any]]:
    """One node with `front`: every load at every client count; a row each."""
    cluster = LocalCluster(root, size=1, sections={"node": {"worker_processes": workers, "grpc_front": front}})
    rows = []
    try:
        cluster.start()
        node = cluster.wait_ready(timeout=120)
        stub = node.ns()
        files = _prepare(stub, Path(root))
        for load in LOADS:
            method, request, expect = files[load]
            for c in clients:
                pids = [node.pid, *children(node.pid)]
                go = _front_pid(node.pid) if front == "go" else None
                cpu0, go0 = proc_cpu_s(pids), proc_cpu_s([go] if go else [])
                res = _load(node.grpc_addr, method, request, expect, c, seconds)
                cpu, go_s = proc_cpu_s(pids) - cpu0, (proc_cpu_s([go]) - go0 if go else 0.0)
                calls = max(res["calls"], 1)
                rows.append({"front": front, "load": load, "clients": c, "calls_per_s": round(res["calls_per_s"]),
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


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {(r["round"], r["load"], r["clients"]): r["server_us_per_call"] for r in rows if r["front"] == "grpcio"}
    for r in rows:
        b = base.get((r["round"], r["load"], r["clients"]))
        if b:
            r["vs_grpcio"] = round(r["server_us_per_call"] / b, 2)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per load, clients and front, the median over rounds and [min-max]."""
    keys = ("calls_per_s", "p50_ms", "p99_ms", "server_us_per_call", "vs_grpcio", "front_us_per_call",
            "server_cores", "load_us_per_call", "load_cores")
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", default="16,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker-processes", type=int, default=2)
    p.add_argument("--json", default="", help="write the rows and the run's facts here")
    p.add_argument("--table", default="", help="tabulate a --json file again")
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["rows"]))
        return 0
    clients = [int(c) for c in args.clients.split(",")]
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "load_average_at_start": list(os.getloadavg()), "cores": len(os.sched_getaffinity(0)),
            "worker_processes": args.worker_processes, "seconds": args.seconds, "clients": clients}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="frontcpu-") as tmp:
        for r in range(args.rounds):
            for front in FRONTS:
                for row in measure_node(os.path.join(tmp, f"{front}-{r}"), front, args.worker_processes, clients,
                                        args.seconds):
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
