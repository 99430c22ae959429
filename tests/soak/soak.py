"""The soak: a real 3-node cluster under a mixed load at 70 % of its measured maximum for an hour, with a
fault every 2 minutes, sampling each node's resident memory and open file descriptors every minute.

`make soak` runs it for 60 minutes (`python -m tests.soak --minutes 60`); `tests/soak/test_soak.py` runs a
short version in `make test`. The load, each kind from its own client threads through random nodes:

- registrations: brokers re-registering with changing queue data (every call really writes);
- route reads: GetRoute of those brokers' topics;
- watches: streams on the brokers' KV namespace, resumed from their last offset on any error;
- KV writes, each writer cycling over 2,000 keys of its own so that the data stays bounded (the fault
  suite's AckLedger: the last acknowledged value of each key must survive, or one written since with
  an unknown outcome);
- binding compare-and-set and linearizable reads (the fault suite's Workload: checked by our checker
  and by porcupine).

Calibration first: the same mix closed-loop (each client calls as fast as answers come) for
`--calibrate` seconds gives each kind's maximum rate; the soak then paces registrations, route reads
and KV writes at 70 % of theirs (the binding clients stay closed-loop, as the fault suite runs them).
Faults come from the fault suite's Nemesis, `--fault-every` seconds after the last one healed, rotating
through: SIGKILL the leader, SIGSTOP the leader for 3 s, SIGKILL a node, SIGSTOP a node (a random one, any
role); a killed node restarts 2 s later.

At the end the load stops and the fault suite's after-checks run (no node wedged, digests equal, no
acknowledged write lost, bindings linearizable by both checkers, nothing unexpected), then the report:
per minute, memory and descriptors per node and operations per second per kind, with the plateau
verdict (the second half's peak within 10 % + 20 MiB of the first half's for memory, within 16
descriptors for descriptors), a JSON file of the samples and a PNG of the three series.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from bench.procs import with_descendants
from nameserver.pb import api_pb2
from tests.cluster import Cluster, NodeProc, register_request
from tests.faults.harness import Nemesis
from tests.faults.scenario import Run

KINDS = ("registration", "route_read", "kv_write", "watch_event", "binding")
BROKERS = 24
TOPICS_PER_BROKER = 4
WATCHERS = 12
LOAD_FACTOR = 0.7
_versions = itertools.count(1)


def proc_rss_mib(pid: int) -> float:
    """The resident memory of `pid` and every process below it (a node's workers and Go front end count as
    the node's; without workers it is the node's process alone)."""
    total = 0
    for p in with_descendants([pid]):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as f:
            total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
    return total / 1024


def proc_fds(pid: int) -> int:
    """Open descriptors of `pid` and every process below it."""
    total = 0
    for p in with_descendants([pid]):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{p}/fd"))
    return total


class Pacer:
    """At most `rate` calls per second over all threads sharing it (None: unpaced, closed loop)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def wait(self, stop: threading.Event) -> bool:
        if self.rate is None:
            return not stop.is_set()
        with self._lock:
            at = max(self._next, time.monotonic())
            self._next = at + 1 / self.rate
        delay = at - time.monotonic()
        return not stop.wait(delay) if delay > 0 else not stop.is_set()


@dataclass
class Load:
    """Registrations, route reads and watches (the KV writes and bindings come from the fault suite's Run)."""

    cluster: Cluster
    rates: dict[str, float | None]
    threads: int = 3
    counts: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)
    problems: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        pacers = {k: Pacer(self.rates.get(k)) for k in ("registration", "route_read")}
        for i in range(self.threads):
            self._spawn(self._registrations, i, pacers["registration"])
            self._spawn(self._route_reads, i, pacers["route_read"])
        for i in range(WATCHERS):
            self._spawn(self._watch, i, None)

    def _spawn(self, target: Any, i: int, pacer: Pacer | None) -> None:
        t = threading.Thread(target=target, args=(i, pacer), daemon=True, name=f"{target.__name__}-{i}")
        t.start()
        self._threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(15)

    def _node(self, rng: random.Random) -> NodeProc | None:
        live = [n for n in self.cluster.nodes if n.alive]
        return rng.choice(live) if live else None

    def _registrations(self, i: int, pacer: Pacer) -> None:
        rng = random.Random(100 + i)
        while pacer.wait(self.stop):
            b = rng.randrange(BROKERS)
            node = self._node(rng)
            if node is None:
                continue
            version = next(_versions)  # one sequence for every thread: a broker's data version only grows
            req = register_request("SoakCluster", f"soak-b{b}", f"10.9.{b // 250}.{b % 250 + 1}:10911",
                                   [f"SoakT{b}-{t}" for t in range(TOPICS_PER_BROKER)], counter=version,
                                   queues=4 + version % 5)
            try:
                node.ns.RegisterBroker(req, timeout=3)
                self.counts["registration"] += 1
            except grpc.RpcError as err:
                self.errors[f"registration {err.code().name}"] += 1

    def _route_reads(self, i: int, pacer: Pacer) -> None:
        rng = random.Random(200 + i)
        while pacer.wait(self.stop):
            node = self._node(rng)
            if node is None:
                continue
            topic = f"SoakT{rng.randrange(BROKERS)}-{rng.randrange(TOPICS_PER_BROKER)}"
            try:
                node.ns.GetRoute(api_pb2.GetRouteRequest(topic=topic), timeout=3)
                self.counts["route_read"] += 1
            except grpc.RpcError as err:
                code = err.code()
                if code != grpc.StatusCode.NOT_FOUND:  # a topic not registered yet
                    self.errors[f"route_read {code.name}"] += 1

    def _watch(self, i: int, _pacer: None) -> None:
        """A stream on the ledger's KV namespace and the live records, resumed from its last offset."""
        rng = random.Random(300 + i)
        last = 0
        while not self.stop.is_set():
            node = self._node(rng)
            if node is None:
                time.sleep(0.1)
                continue
            request = api_pb2.WatchRequest(key_prefixes=["kv/", "live/"], start_offset=last,
                                           progress_interval_ms=500)
            stream = node.ns.Watch(request, timeout=30)
            try:
                for reply in stream:
                    if reply.events:
                        if reply.offset <= last and last:
                            self.problems.append(f"watch {i}: events at {reply.offset} after {last}")
                        self.counts["watch_event"] += len(reply.events)
                    elif reply.offset < last:
                        self.problems.append(f"watch {i}: progress back from {last} to {reply.offset}")
                    if not reply.initial_state:
                        last = max(last, reply.offset)
                    elif reply.initial_state_done:
                        last = reply.offset
                    if self.stop.is_set():
                        stream.cancel()
                        return
            except grpc.RpcError as err:
                code = err.code()
                if code == grpc.StatusCode.OUT_OF_RANGE:
                    last = 0  # the node no longer keeps that far back: re-list, as the API says
                elif code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                    self.errors[f"watch {code.name}"] += 1
                time.sleep(0.05)


def counts(load: Load, run: Run) -> dict[str, int]:
    """Operations done so far, per kind."""
    return dict(load.counts) | {"kv_write": run.ledger.acknowledged(),
                                "binding": sum(len(w.history.ops) for w in run.segments)}


def measure(load: Load, run: Run, seconds: float) -> dict[str, float]:
    """Operations per second of each kind over `seconds`."""
    before = counts(load, run)
    time.sleep(seconds)
    after = counts(load, run)
    return {k: (after.get(k, 0) - before.get(k, 0)) / seconds for k in KINDS}


def sample(cluster: Cluster, load: Load, run: Run, t0: float, previous: dict[str, Any] | None) -> dict[str, Any]:
    now = time.monotonic()
    done = counts(load, run)
    nodes = {}
    for n in cluster.nodes:
        if n.alive and n.proc is not None:
            with contextlib.suppress(OSError):
                nodes[n.name] = {"rss_mib": round(proc_rss_mib(n.proc.pid), 1), "fds": proc_fds(n.proc.pid)}
    statuses = [s for s in cluster.statuses() if s is not None]
    rates = {}
    if previous is not None:
        dt = now - t0 - previous["t"]
        rates = {k: round((done.get(k, 0) - previous["counts"].get(k, 0)) / dt, 1) for k in KINDS}
    return {"t": round(now - t0, 1), "nodes": nodes, "counts": done, "rates": rates,
            "term": max((s.term for s in statuses), default=0), "errors": sum(load.errors.values())}


def plateau(samples: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """Each node's peak of `metric` in the first and the second half of the samples."""
    half = len(samples) // 2
    out = {}
    names = sorted({name for s in samples for name in s["nodes"]})
    for name in names:
        first = [s["nodes"][name][metric] for s in samples[:half] if name in s["nodes"]]
        second = [s["nodes"][name][metric] for s in samples[half:] if name in s["nodes"]]
        if first and second:
            out[name] = (max(first), max(second))
    return out


def verdicts(samples: list[dict[str, Any]]) -> list[str]:
    """Plateau failures, as sentences (empty: memory and descriptors plateaued)."""
    bad = []
    for name, (a, b) in plateau(samples, "rss_mib").items():
        if b > a * 1.10 + 20:
            bad.append(f"{name}: resident memory peaked at {a:.0f} MiB in the first half and {b:.0f} MiB in the second")
    for name, (a, b) in plateau(samples, "fds").items():
        if b > a + 16:
            bad.append(f"{name}: open descriptors peaked at {a} in the first half and {b} in the second")
    return bad


def plot(samples: list[dict[str, Any]], faults: list[tuple[float, str]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    minutes = [s["t"] / 60 for s in samples]
    names = sorted({name for s in samples for name in s["nodes"]})
    for name in names:
        xs = [m for m, s in zip(minutes, samples, strict=True) if name in s["nodes"]]
        axes[0].plot(xs, [s["nodes"][name]["rss_mib"] for s in samples if name in s["nodes"]], marker=".", label=name)
        axes[1].plot(xs, [s["nodes"][name]["fds"] for s in samples if name in s["nodes"]], marker=".", label=name)
    for kind in KINDS:
        axes[2].plot(minutes[1:], [s["rates"].get(kind, 0) for s in samples[1:]], marker=".", label=kind)
    axes[0].set_ylabel("resident memory (MiB)")
    axes[1].set_ylabel("open file descriptors")
    axes[2].set_ylabel("operations / s (log)")
    axes[2].set_yscale("symlog", linthresh=10)
    axes[2].set_xlabel("minutes")
    for ax in axes:
        for at, _ in faults:
            ax.axvline(at / 60, color="grey", alpha=0.3, linewidth=0.8)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def soak(root: str, minutes: float, fault_every_s: float = 120, sample_every_s: float = 60,
         calibrate_s: float = 20, out: str | None = None, workers: int = 0,
         grpc_front: str = "") -> dict[str, Any]:
    """Run the soak in `root`; return the report (raises AssertionError if an after-check fails).
    `workers`, `grpc_front`: each node's [node] worker_processes and grpc_front ("": the node's default)."""
    out = out or root
    os.makedirs(out, exist_ok=True)
    os.makedirs(root, exist_ok=True)
    cluster = Cluster(root, 3, snapshot_every_entries=5000, worker_processes=workers, grpc_front=grpc_front)
    cluster.start()
    try:
        cluster.wait_ready()
        run = Run(cluster, binding_clients=4, ledger_writers=3)
        run.ledger.key_space = 2000  # per writer: the data stays bounded, so memory must plateau
        calib = Load(cluster, rates={})
        run.start()
        calib.start()
        time.sleep(3)
        maxima = measure(calib, run, calibrate_s)
        calib.join()
        rates = {k: max(1.0, maxima[k] * LOAD_FACTOR) for k in ("registration", "route_read")}
        run.ledger.rate = max(1.0, maxima["kv_write"] * LOAD_FACTOR)
        load = Load(cluster, rates=rates)
        print(f"soak: maxima (closed loop, {calibrate_s:.0f} s): { {k: round(v) for k, v in maxima.items()} }; "
              f"paced at {LOAD_FACTOR:.0%}", flush=True)
        load.start()
        nemesis = Nemesis(cluster, pause_s=3.0, down_s=2.0, settle_s=fault_every_s)
        t0 = time.monotonic()
        samples = [sample(cluster, load, run, t0, None)]
        nemesis.start()
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(max(0.0, min(sample_every_s, t0 + minutes * 60 - time.monotonic())))
            samples.append(sample(cluster, load, run, t0, samples[-1]))
            last = samples[-1]
            print(f"soak {last['t'] / 60:5.1f} min: " + ", ".join(
                f"{name} {v['rss_mib']:.0f} MiB {v['fds']} fds" for name, v in sorted(last["nodes"].items()))
                + f"; ops/s {last['rates']}; term {last['term']}; errors {last['errors']}", flush=True)
        nemesis.stop()
        healed = time.monotonic()
        for n in cluster.nodes:
            if not n.alive:
                cluster.start(n)
        load.join()
        run.stop()
        checks = run.verify(healed_at=healed)
        faults = [(start - t0, f"{fault} ({name})") for start, _, fault, name in nemesis.events]
        plot(samples, faults, os.path.join(out, "soak.png"),
             f"soak: {minutes:g} min, {len(faults)} faults, load at {LOAD_FACTOR:.0%} of the measured maximum")
        report = {"minutes": minutes, "workers": workers, "grpc_front": grpc_front,
                  "maxima": maxima, "paced": rates | {"kv_write": run.ledger.rate},
                  "faults": faults, "samples": samples, "checks": checks, "errors": dict(load.errors),
                  "watch_problems": load.problems[:20], "plateau_failures": verdicts(samples),
                  "memory_peaks_mib": plateau(samples, "rss_mib"), "fd_peaks": plateau(samples, "fds")}
        with open(os.path.join(out, "soak.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(f"soak: {len(faults)} faults; elections (term) {samples[0]['term']} -> {samples[-1]['term']}; "
              f"errors {dict(load.errors)}; memory peaks (first half, second half) {report['memory_peaks_mib']}; "
              f"descriptor peaks {report['fd_peaks']}; digests equal at offset {checks['apply_offset']} "
              f"({checks['digest']}); plot {os.path.join(out, 'soak.png')}", flush=True)
        assert not load.problems, load.problems[:10]
        return report
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--fault-every", type=float, default=120, help="seconds between faults")
    p.add_argument("--sample-every", type=float, default=60, help="seconds between samples")
    p.add_argument("--calibrate", type=float, default=20, help="seconds of closed-loop load to find the maximum")
    p.add_argument("--out", default="data/soak", help="where soak.json and soak.png go")
    p.add_argument("--workers", type=int, default=0,
                   help="[node] worker_processes of each node (default 0; memory and descriptors then count the "
                        "node's core, workers and Go front end together)")
    p.add_argument("--grpc-front", default="", choices=["", "grpcio", "go"],
                   help='[node] grpc_front with --workers ("": the node\'s default)')
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as root:
        report = soak(root, args.minutes, args.fault_every, args.sample_every, args.calibrate, args.out,
                      workers=args.workers, grpc_front=args.grpc_front)
    if report["plateau_failures"]:
        print("soak: did not plateau: " + "; ".join(report["plateau_failures"]), file=sys.stderr)
        return 1
    return 0


__all__ = ["main", "soak", "verdicts"]
