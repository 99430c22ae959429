"""gRPC reads of one checkout, with the servers' CPU per read: the two read rows of `bench --only compare`
without etcd and the registrations, short enough to alternate two checkouts run after run on a noisy
machine (docs/benchmarks.md, "The call guard's cost").

    cd <checkout> && /work/main/.venv/bin/python -m tests.interop.bench_grpc_reads --nodes 3 --mode lin

--mode route: GetRoute (eventual); lin: GetBinding LINEARIZABLE (a read index per read). Clients are
threads of this process (4 on 1 node, 12 over 3 nodes), 6,000 reads after 100 per node of warm-up; CPU is
user + system of every node from /proc over the load. One line per run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

from bench.load import proc_cpu_s
from nameserver.pb import api_pb2
from tests.cluster import Cluster


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, choices=(1, 3), default=3)
    p.add_argument("--mode", choices=("route", "lin"), default="route")
    p.add_argument("--reads", type=int, default=6000)
    args = p.parse_args()
    c = Cluster(tempfile.mkdtemp(prefix="grpc-reads-"), size=args.nodes)
    c.start()
    try:
        leader = c.wait_ready()
        c.wait_converged()
        leader.ns.RegisterBroker(api_pb2.RegisterBrokerRequest(
            cluster_name="C", broker_name="b", broker_addr="127.0.0.1:10911",
            topics=[api_pb2.TopicConfig(topic_name=f"T{i}", read_queue_nums=4, write_queue_nums=4, perm=6)
                    for i in range(8)]), timeout=10)
        leader.ns.BindQueue(api_pb2.BindQueueRequest(topic="T1", queue_id=0, owner="o"), timeout=10)
        time.sleep(1)
        route = api_pb2.GetRouteRequest(topic="T1")
        binding = api_pb2.GetBindingRequest(topic="T1", queue_id=0, consistency=api_pb2.LINEARIZABLE)

        def read(ns) -> None:  # type: ignore[no-untyped-def]
            if args.mode == "route":
                ns.GetRoute(route, timeout=5)
            else:
                ns.GetBinding(binding, timeout=5)

        for n in c.nodes:
            for _ in range(100):
                read(n.ns)
        threads = 4 if args.nodes == 1 else 12
        pids = [n.proc.pid for n in c.nodes if n.proc is not None]
        cpu0, t0 = proc_cpu_s(pids), time.monotonic()

        def client(i: int) -> None:
            ns = c.nodes[i % args.nodes].ns
            for _ in range(args.reads // threads):
                read(ns)

        workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        cpu1, t1 = proc_cpu_s(pids), time.monotonic()
        done = args.reads // threads * threads
        print(f"{os.path.basename(os.getcwd())} {args.mode}, {args.nodes} node(s): {done / (t1 - t0):.0f} reads/s, "
              f"server CPU {(cpu1 - cpu0) / done * 1e6:.0f} us/read")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
