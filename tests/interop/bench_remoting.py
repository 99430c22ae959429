"""The remoting port side by side: Apache RocketMQ's stock NameServer (one node, its own jars) and our
3-node cluster, driven by one load generator (the performance anchor of docs/benchmarks.md).

    .venv/bin/python -m tests.interop.bench_remoting --seconds 10 --clients 1,8 [--json out.json]

Each client is a process with one persistent connection (as a broker or client keeps one), sending one
request at a time:
- route reads: GET_ROUTEINFO_BY_TOPIC (105) for topics registered beforehand; our clients are spread
  over the 3 nodes, the stock ones all go to its single node;
- registrations: REGISTER_BROKER (103) of a broker of its own with 8 topics, its DataVersion changed on
  every call, so every call is a write;
- unchanged re-registrations: the same DataVersion every time (ours writes nothing then).
The two sides run one after the other in one invocation; on a shared machine compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from tests.cluster import Cluster
from tests.fakebroker import FakeBroker

from . import jars
from .launcher import RocketMQ

TOPICS_PER_BROKER = 8
ROUTE_TOPICS = [f"BenchRoute{i}" for i in range(32)]


def _register(b: FakeBroker, ns: str, counter: int) -> None:
    resp = b.register(ns, [f"{b.name}-T{t}" for t in range(TOPICS_PER_BROKER)], counter=counter, compressed=False)
    if resp.code != 0:
        raise RuntimeError(f"register answered {resp.code}: {resp.remark}")


def _client(args: tuple[str, str, float, int]) -> dict[str, Any]:
    """One client process: (workload, nameserver address, seconds, index) -> counts and latencies."""
    kind, ns, seconds, index = args
    b = FakeBroker(name=f"bench-{os.getpid()}-{index}", cluster="BenchCluster")
    lat: list[float] = []
    errors, first_error = 0, ""
    counter = 1
    try:
        if kind == "unchanged":
            _register(b, ns, counter)  # the first one writes; the measured ones do not
        end = time.perf_counter() + seconds
        i = index
        while (now := time.perf_counter()) < end:
            try:
                if kind == "reads":
                    resp = b.call(ns, 105, {"topic": ROUTE_TOPICS[i % len(ROUTE_TOPICS)]})
                    if resp is None or resp.code != 0:
                        raise RuntimeError(f"route answered {resp and resp.code}: {resp and resp.remark}")
                else:
                    if kind == "registrations":
                        counter += 1
                    _register(b, ns, counter)
                lat.append(time.perf_counter() - now)
            except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                errors += 1
                first_error = first_error or repr(exc)[:300]
            i += 1
    finally:
        b.close_channels()
        b.stop()
    return {"lat": lat, "errors": errors, "first_error": first_error}


def run_load(kind: str, addrs: list[str], clients: int, seconds: float) -> dict[str, Any]:
    jobs = [(kind, addrs[i % len(addrs)], seconds, i) for i in range(clients)]
    with multiprocessing.get_context("spawn").Pool(clients) as pool:
        results = pool.map(_client, jobs)
    lat = sorted(x for r in results for x in r["lat"])
    n = len(lat)
    return {"clients": clients, "n": n, "per_s": round(n / seconds, 1), "errors": sum(r["errors"] for r in results),
            "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
            "p50_ms": round(statistics.median(lat) * 1000, 2) if lat else 0.0,
            "p99_ms": round(lat[min(n - 1, int(n * 0.99))] * 1000, 2) if lat else 0.0}


def measure_side(addrs: list[str], clients: list[int], seconds: float, settle: float = 1.0) -> dict[str, Any]:
    # The topics route reads ask for, held by one broker whose connection stays open (a nameserver
    # unregisters a broker whose connection closes).
    seed = FakeBroker(name="bench-routes", cluster="BenchCluster")
    try:
        resp = seed.register(addrs[0], ROUTE_TOPICS, counter=1, compressed=False)
        assert resp.code == 0, resp.remark
        time.sleep(settle)  # the seed reaches every node
        out: dict[str, Any] = {}
        for kind in ("reads", "registrations", "unchanged"):
            out[kind] = {str(c): run_load(kind, addrs, c, seconds) for c in clients}
        return out
    finally:
        seed.close_channels()
        seed.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.bench_remoting",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per load")
    parser.add_argument("--clients", default="1,8", help="client counts, comma-separated")
    parser.add_argument("--version", default=jars.LINE_5, choices=jars.LINES)
    parser.add_argument("--json", default="", help="write the results here too")
    parser.add_argument("--report", default="", help="write the markdown table here (it is printed too)")
    args = parser.parse_args(argv)
    res = run(args.version, [int(c) for c in args.clients.split(",")], args.seconds, args.json)
    report = markdown(res)
    if args.report:
        with open(args.report, "w") as f:
            f.write(report)
    print(report)
    return 0


_LABELS = {"reads": "route reads", "registrations": "registrations (changed)",
           "unchanged": "registrations (unchanged)"}


def markdown(res: dict[str, Any]) -> str:
    """The docs/benchmarks.md table of one run: each load, stock beside ours, and the ratio."""
    meta = res["meta"]
    lines = [f"**Remoting: ours beside the stock NameServer** ({meta['date']}; {meta['stock']}; ours: "
             f"{meta['ours']}; {meta['seconds_per_load']:g} s per load)", "",
             "| workload | clients | stock ops/s (p50 / p99 ms) | ours ops/s (p50 / p99 ms) | ours / stock |",
             "|---|---|---|---|---|"]
    for kind, per_clients in res["ours"].items():
        for clients, ours in per_clients.items():
            stock = res["stock"][kind][clients]
            lines.append(f"| {_LABELS.get(kind, kind)} | {clients} | {stock['per_s']:,.0f} ({stock['p50_ms']} / "
                         f"{stock['p99_ms']}) | {ours['per_s']:,.0f} ({ours['p50_ms']} / {ours['p99_ms']}) | "
                         f"{res['ratios'][kind][clients]:.2f} |")
    errors = sum(v["errors"] for side in ("stock", "ours") for per in res[side].values() for v in per.values())
    lines += ["", f"Errors: {errors}."]
    return "\n".join(lines) + "\n"


def run(version: str, clients: list[int], seconds: float, json_path: str = "") -> dict[str, Any]:
    jars.ensure(version)
    res: dict[str, Any] = {"meta": {"seconds_per_load": seconds, "clients": clients,
                                    "stock": f"Apache RocketMQ {version} NameServer, 1 node, -Xmx128m",
                                    "ours": "3 nodes (Raft, fsync on), remoting on each",
                                    "date": time.strftime("%Y-%m-%d %H:%M:%S")}}
    with tempfile.TemporaryDirectory(prefix="bench-remoting-") as root:
        rmq = RocketMQ(version, os.path.join(root, "rmq"))
        try:
            _, stock = rmq.namesrv()
            res["stock"] = measure_side([stock], clients, seconds)
        finally:
            rmq.stop_all()
        os.makedirs(os.path.join(root, "ours"))
        c = Cluster(os.path.join(root, "ours"), 3, remoting=True)
        c.start()
        try:
            c.wait_ready(timeout=60)
            res["ours"] = measure_side([n.remoting_addr for n in c.nodes], clients, seconds)
        finally:
            c.stop()
    res["ratios"] = {kind: {cl: round(res["ours"][kind][cl]["per_s"] / max(res["stock"][kind][cl]["per_s"], 1e-9), 2)
                            for cl in res["ours"][kind]} for kind in res["ours"]}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    sys.exit(main())
