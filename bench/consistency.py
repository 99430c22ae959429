"""What each consistency mode costs, measured on a live cluster.

    make run                                        # in one shell
    .venv/bin/python -m bench.consistency [--endpoints ...] [--seconds 5] [--json]

Measures: serializable vs linearizable binding reads (leader and follower), how many concurrent
linearizable reads one read-index barrier serves, write-then-read-your-write across nodes, watch
propagation from a write's acknowledgement to a watcher on another node, and the cost of
exactly-once (client id + sequence) on writes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import grpc

from nameserver import headers
from nameserver.pb import api_pb2, api_pb2_grpc


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def summary(lat_s: list[float], seconds: float) -> dict[str, float]:
    ms = [x * 1000 for x in lat_s]
    return {"n": len(ms), "per_s": round(len(ms) / seconds, 1), "p50_ms": round(pct(ms, 50), 2),
            "p99_ms": round(pct(ms, 99), 2), "mean_ms": round(statistics.fmean(ms), 2) if ms else float("nan")}


def timed_loop(fn: Callable[[], object], seconds: float, threads: int = 1) -> dict[str, float]:
    lat: list[float] = []
    stop = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            fn()
            lat.append(time.perf_counter() - t0)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return summary(lat, seconds)


class Nodes:
    def __init__(self, endpoints: list[str]) -> None:
        self.channels = {e: grpc.insecure_channel(e) for e in endpoints}
        self.ns = {e: api_pb2_grpc.NameServerStub(c) for e, c in self.channels.items()}
        self.admin = {e: api_pb2_grpc.AdminStub(c) for e, c in self.channels.items()}

    def leader_and_follower(self) -> tuple[str, str]:
        roles = {e: a.Status(api_pb2.StatusRequest(), timeout=5).role for e, a in self.admin.items()}
        leader = next(e for e, r in roles.items() if r == api_pb2.ROLE_LEADER)
        follower = next(e for e, r in roles.items() if r != api_pb2.ROLE_LEADER)
        return leader, follower


def run(endpoints: list[str], seconds: float) -> dict[str, object]:
    nodes = Nodes(endpoints)
    leader, follower = nodes.leader_and_follower()
    topic = f"Bench{uuid.uuid4().hex[:8]}"
    nodes.ns[leader].BindQueue(api_pb2.BindQueueRequest(topic=topic, queue_id=0, owner="broker-a"), timeout=5)
    out: dict[str, object] = {"endpoints": endpoints, "leader": leader, "seconds_per_case": seconds}

    def read(ep: str, mode: api_pb2.Consistency) -> Callable[[], object]:
        req = api_pb2.GetBindingRequest(topic=topic, queue_id=0, consistency=mode)
        return lambda: nodes.ns[ep].GetBinding(req, timeout=5)

    for name, ep in (("leader", leader), ("follower", follower)):
        out[f"serializable_read_{name}"] = timed_loop(read(ep, api_pb2.SERIALIZABLE), seconds)
        out[f"linearizable_read_{name}"] = timed_loop(read(ep, api_pb2.LINEARIZABLE), seconds)
    end_before = nodes.admin[leader].Status(api_pb2.StatusRequest(), timeout=5).end_offset
    many = timed_loop(read(follower, api_pb2.LINEARIZABLE), seconds, 16)
    end_after = nodes.admin[leader].Status(api_pb2.StatusRequest(), timeout=5).end_offset
    out["linearizable_read_follower_16_threads"] = many
    # Each read-index round is one log entry; with nothing else writing, entries appended meanwhile
    # bound the number of barriers from above (idle no-ops count too), so this is a lower bound.
    out["reads_per_barrier_16_threads_at_least"] = round(many["n"] / max(1, end_after - end_before), 1)

    def ryw() -> None:
        put = nodes.ns[leader].PutKv(api_pb2.PutKvRequest(namespace="bench", key="ryw", value=str(time.time())),
                                     timeout=5)
        nodes.ns[follower].GetKv(api_pb2.GetKvRequest(namespace="bench", key="ryw", min_offset=put.offset),
                                 timeout=5)

    out["write_then_read_your_write_on_follower"] = timed_loop(ryw, seconds)
    counter = iter(range(1, 10**9))
    cid = f"bench-{uuid.uuid4().hex[:8]}"

    def plain_write() -> None:
        nodes.ns[leader].PutKv(api_pb2.PutKvRequest(namespace="bench", key="k", value=str(time.time())), timeout=5)

    def once_write() -> None:
        md = [(headers.CLIENT_ID, cid), (headers.CLIENT_SEQ, str(next(counter)))]
        nodes.ns[leader].PutKv(api_pb2.PutKvRequest(namespace="bench", key="k", value=str(time.time())),
                               timeout=5, metadata=md)

    out["write_plain"] = timed_loop(plain_write, seconds)
    out["write_exactly_once"] = timed_loop(once_write, seconds)
    out["watch_propagation"] = watch_propagation(nodes, leader, follower, seconds)
    return out


def watch_propagation(nodes: Nodes, leader: str, follower: str, seconds: float) -> dict[str, float]:
    """From a write's acknowledgement by the leader to its event on a follower's watch stream."""
    ns = f"watch{uuid.uuid4().hex[:6]}"
    arrived: dict[str, float] = {}
    ready = threading.Event()
    stream = nodes.ns[follower].Watch(api_pb2.WatchRequest(key_prefixes=[f"kv/{ns}/"], progress_interval_ms=500),
                                      timeout=seconds + 30)

    def consume() -> None:
        try:
            for msg in stream:
                if msg.initial_state_done:
                    ready.set()
                now = time.perf_counter()
                for e in msg.events:
                    arrived.setdefault(e.key, now)
        except grpc.RpcError:
            pass

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    ready.wait(10)
    acked: dict[str, float] = {}
    stop = time.monotonic() + seconds
    i = 0
    while time.monotonic() < stop:
        key = f"k{i}"
        nodes.ns[leader].PutKv(api_pb2.PutKvRequest(namespace=ns, key=key, value="v"), timeout=5)
        acked[f"kv/{ns}/{key}"] = time.perf_counter()
        i += 1
        time.sleep(0.01)
    time.sleep(1.0)
    stream.cancel()
    lat = [max(0.0, arrived[k] - t0) for k, t0 in acked.items() if k in arrived]
    res = summary(lat, seconds)
    res["missing"] = len(acked) - len(lat)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", default="127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    res = run([e.strip() for e in args.endpoints.split(",") if e.strip()], args.seconds)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for k, v in res.items():
            print(f"{k:45} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
