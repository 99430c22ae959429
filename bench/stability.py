"""Load stability: minutes of writes at 80% of the measured maximum, without a spurious election.

    .venv/bin/python -m bench.stability --minutes 10 --json out.json

The risk on this stack is the GIL and pysyncobj's single tick thread: a node busy applying or
serving can miss its heartbeats, and a follower that times out would depose a healthy leader.
This starts a local 3-node cluster, measures the maximum registration rate (64 clients for
`--probe-seconds`), then runs registrations paced at `--fraction` of it for `--minutes` while
polling every node's term and leader twice a second. Any term change is an election; with no
node failing, every election is spurious.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import grpc

from bench.consistency import summary
from bench.load import new_channel, run_load
from bench.procs import LocalCluster
from bench.workloads import OursTarget
from nameserver.pb import api_pb2


def paced_load(target: OursTarget, rate_per_s: float, threads: int, seconds: float) -> dict[str, Any]:
    """`threads` workers sharing `rate_per_s` registrations per second, each on a fixed schedule."""
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    late = [0] * threads
    records = [0] * threads
    interval = threads / rate_per_s
    t_start = time.monotonic() + 1.0

    def worker(i: int) -> None:
        channel = new_channel(target.leader_endpoint())
        op = target.registration_op(channel, 1000 + i)
        next_at = t_start + i * interval / threads  # stagger the workers evenly
        stop = t_start + seconds
        try:
            while next_at < stop:
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    late[i] += 1
                t0 = time.perf_counter()
                try:
                    records[i] += op()
                    lat[i].append(time.perf_counter() - t0)
                except grpc.RpcError:
                    errors[i] += 1
                next_at += interval
        finally:
            channel.close()

    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    all_lat = [x for per in lat for x in per]
    out = {"target_per_s": round(rate_per_s, 1), **summary(all_lat, seconds)}
    out.update(errors=sum(errors), late_starts=sum(late), records=sum(records))
    return out


class TermWatch:
    """Polls every node's term and leader; records each change with its time."""

    def __init__(self, cluster: LocalCluster, every_s: float = 0.5) -> None:
        self.cluster = cluster
        self.every_s = every_s
        self.changes: list[dict[str, Any]] = []
        self.unreachable = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last: dict[str, tuple[int, str]] = {}
        while not self._stop.wait(self.every_s):
            for n in self.cluster.nodes:
                st = n.status(timeout=2.0)
                if st is None:
                    self.unreachable += 1
                    continue
                now = (st.term, st.leader_id)
                if n.name in last and last[n.name] != now:
                    self.changes.append({"at_s": round(time.monotonic() - self._t0, 1), "node": n.name,
                                         "term": st.term, "leader": st.leader_id})
                last[n.name] = now

    @property
    def elections(self) -> int:
        return len({c["term"] for c in self.changes})


def stability(root: str, minutes: float, fraction: float = 0.8, probe_seconds: float = 20,
              threads: int = 32, sections: dict | None = None) -> dict[str, Any]:
    with LocalCluster(os.path.join(root, "stability"), sections=sections or {}) as c:
        c.wait_ready()
        target = OursTarget(c)

        def make(i: int) -> tuple[grpc.Channel, Any]:
            channel = new_channel(target.leader_endpoint())
            return channel, target.registration_op(channel, i)

        probe = run_load(make, 64, probe_seconds, server_pids=target.pids())
        max_rate = probe["per_s"]
        terms_before = sorted({n.require_status().term for n in c.nodes})
        watch = TermWatch(c)
        watch.start()
        load = paced_load(target, fraction * max_rate, threads, minutes * 60)
        watch.stop()
        try:
            sts = c.wait_converged(timeout=120)
        except TimeoutError:
            sts = [n.status(timeout=2.0) or api_pb2.NodeStatus() for n in c.nodes]
        return {"converged": len({(s.apply_offset, s.digest) for s in sts}) == 1,
                "final_status": {n.name: {"apply": s.apply_offset, "commit": s.commit_offset, "ready": s.ready,
                                          "term": s.term, "apply_error": s.apply_error}
                                 for n, s in zip(c.nodes, sts, strict=True)},
                "max_registrations_per_s": max_rate, "probe": probe, "fraction": fraction,
                "minutes": minutes, "load": load, "terms_before": terms_before,
                "elections_during_load": watch.elections, "term_changes": watch.changes,
                "status_polls_unanswered": watch.unreachable, "digests_equal": len({s.digest for s in sts}) == 1,
                "rss_mib": {n.name: n.rss_bytes() >> 20 for n in c.nodes}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--fraction", type=float, default=0.8)
    p.add_argument("--probe-seconds", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="nsstab-")
    out = stability(root, args.minutes, args.fraction, args.probe_seconds, args.threads)
    print(json.dumps({k: v for k, v in out.items() if k != "probe"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if out["elections_during_load"] == 0 and out["digests_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
