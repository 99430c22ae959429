"""`python -m bench.replicaapply`: the CPU a worker's read replica spends per applied registration, and the
core's per follower to send it, in one process, without a cluster.

What it feeds is what a core applies for the bench's registration load (bench/workloads.py
registration_request: a master of `--topics` topics whose DataVersion and queue counts change every call,
so each registration writes its live record and every queue data): translate.register_broker against the
core's state, wrapped in an Entry as the proposer does (raftlog/proposer.py), applied by the core's
MetadataState and appended to its history ring. Then, timed apart:

- **send**: the core's Log.Follow generator (nameserver/api/follow.py) for one follower, as the gRPC
  server drives it, and the message's encoding (what grpc's response serializer does), per follower;
- **core apply**: the core's own applying of each entry (digest and quota totals kept), beside;
- **receive**: the worker's decoding of the message (grpc's deserializer) and ReadReplica's apply
  (nameserver/replica/follower.py, accounting=False as a worker's, with a watch hub listening as in a
  worker) of its entries: Entry decode, KVState, MetadataState's indexes, the change list, the history ring.

`--entries-per-message`: how many entries the core has applied when the follower's stream wakes (1: a
stream that keeps up; more: one that wakes behind). CPU is this thread's (time.thread_time), the best and
the median of `--runs` runs. `--profile` prints cProfile's top functions of the receive side. On a shared
machine the times move by a third between runs: `--no-receive` leaves the receive side out, so two runs
under `valgrind --tool=callgrind`, with and without it, give its instructions per registration exactly.

`--streamed K`: instead, K replicas follow over real Log.Follow streams (an in-process gRPC server on
127.0.0.1; `--transport unix`: a worker's Unix feed, nameserver/localfeed.py) while the core applies at
`--rate`, beside none: the process's CPU per registration and follower, the transport's per-message work on
both ends included (`--threads`: each thread's share).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from bench.workloads import registration_request
from nameserver import localfeed
from nameserver.api.follow import FollowFeed
from nameserver.api.logservice import LogService
from nameserver.core.watch import WatchHub
from nameserver.localfeed import FeedServer
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.replica import ReadReplica
from nameserver.state import MetadataState, translate
from raftlog.codec import encode_entry
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.kvstate import ChangeTuple
from raftlog.pb import entry_pb2


class StandInLog:
    """What Log.Follow reads of a core's log: the apply offset, a wait on it (woken as the applier's), the
    history ring of `keep` entries (tests/unit/test_replica_follow.py's stand-in core uses it too)."""

    def __init__(self, keep: int = 100_000) -> None:
        self.ready = True
        self.apply_error = ""
        self.apply_offset = 0
        self.history = EntryHistory(max_entries=keep)
        self.restores = 0  # snapshots restored: Log.Follow sends its followers the state again after one
        self.cv = threading.Condition()

    def wait_applied(self, offset: int, timeout: float, alive: Callable[[], bool] | None = None) -> bool:
        with self.cv:
            return self.cv.wait_for(lambda: self.apply_offset >= offset, timeout)

    def publish(self, offset: int) -> None:
        with self.cv:
            self.apply_offset = offset
            self.cv.notify_all()


class _Core:
    """A core's state and log, applying the registrations the bench feeds (on this thread)."""

    def __init__(self) -> None:
        self.state = MetadataState()
        self.log = StandInLog()
        self.cfg = type("Cfg", (), {"max_message_bytes": 4 << 20, "max_followers": 8})()

    apply_cpu_s = 0.0  # the applying's alone (not translating), as the core's apply thread does it

    def apply(self, batches: list[entry_pb2.Batch]) -> None:
        start = time.thread_time()
        offset = self.log.apply_offset + 1
        entry = entry_pb2.Entry(term=1, leader_time_ms=int(time.time() * 1000))
        entry.batches.extend(batches)
        data = encode_entry(entry)
        changes: list[ChangeTuple] = []
        self.state.apply_entry(offset, entry, changes)
        self.log.history.append(AppliedEntry(offset, 1, data, tuple(changes)))
        self.log.publish(offset)
        self.apply_cpu_s += time.thread_time() - start

    def inspect(self, fn: Callable[[MetadataState], Any]) -> Any:
        return fn(self.state)

    def not_ready_reason(self) -> str:
        return ""


def _always() -> bool:
    return True


def _registrations(core: _Core, brokers: int, topics: int, per_entry: int, count: int) -> None:
    """Apply `count` entries of `per_entry` registrations each, brokers in turn."""
    counters = [0] * brokers
    n = 0
    for _ in range(count):
        batches = []
        for _ in range(per_entry):
            b = n % brokers
            counters[b] += 1
            req = registration_request(f"reg-w{b}", f"10.0.{b // 250}.{b % 250 + 1}:10911", f"RegW{b}T", topics,
                                       counters[b])
            batches.append(translate.register_broker(core.state, req, 30000).batch)
            n += 1
        core.apply(batches)


def _replica() -> ReadReplica:
    replica = ReadReplica("127.0.0.1:1", grpc.insecure_channel, name="bench", accounting=False)
    replica.entry_listeners.append(WatchHub().on_entry)
    return replica


def run(args: argparse.Namespace) -> dict[str, float]:
    core = _Core()
    # the brokers registered once, then the state at rest: what is timed is re-registrations
    _registrations(core, args.brokers, args.topics, 1, args.brokers)
    feed = FollowFeed(core)  # type: ignore[arg-type]  # the node's parts Follow uses
    replica = _replica()
    first = next(feed.messages(0, _always))  # the snapshot (one chunk at this size)
    replica._install(iter([first.snapshot]))
    start = core.log.apply_offset

    before = core.apply_cpu_s
    _registrations(core, args.brokers, args.topics, args.per_entry, args.entries)
    regs = args.entries * args.per_entry
    core_apply = core.apply_cpu_s - before
    stream = feed.messages(start, _always)
    per_message = args.entries_per_message
    # the core's stream: woken with `per_message` new entries each time
    core.log.apply_offset, last = start, core.log.apply_offset
    wires: list[bytes] = []
    t0 = time.thread_time()
    while core.log.apply_offset < last:
        core.log.apply_offset = min(last, core.log.apply_offset + per_message)
        wires.append(next(stream).SerializeToString())
    send = time.thread_time() - t0

    profiler = cProfile.Profile() if args.profile else None
    t0 = time.thread_time()
    if profiler:
        profiler.enable()
    for wire in wires if args.receive else ():
        replica._apply(api_pb2.FollowMessage.FromString(wire))
    if profiler:
        profiler.disable()
    receive = time.thread_time() - t0
    if args.receive:
        assert replica.offset == last, (replica.offset, last)
        with replica.lock:
            assert replica.state.route("RegW0T0") == core.state.route("RegW0T0")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    return {"core_apply_us_per_reg": core_apply / regs * 1e6, "send_us_per_reg": send / regs * 1e6,
            "receive_us_per_reg": receive / regs * 1e6,
            "messages": len(wires), "bytes_per_reg": sum(map(len, wires)) / regs}


class _CountingReplica(ReadReplica):
    messages = 0

    def _apply(self, msg: api_pb2.FollowMessage) -> None:
        self.messages += 1
        super()._apply(msg)


def streamed(args: argparse.Namespace, followers: int) -> dict[str, float]:
    """The process's CPU (every thread: the core's applying, its Follow streams or feed links, the
    replicas' receiving and applying) over `--entries` registrations applied at `--rate` per second with
    `followers` read replicas following over real Log.Follow streams on 127.0.0.1 (`--transport grpc`) or
    a worker's Unix feed (`--transport unix`, nameserver/localfeed.py)."""
    core = _Core()
    _registrations(core, args.brokers, args.topics, 1, args.brokers)
    feed = FollowFeed(core)  # type: ignore[arg-type]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=followers + 2))
    api_pb2_grpc.add_LogServicer_to_server(LogService(core, feed=feed), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    folder = tempfile.mkdtemp(prefix="replicaapply-")
    unix = FeedServer(localfeed.socket_path(folder), feed.messages, 10.0)
    unix.start()
    local = localfeed.LocalFeed(unix.path, core.cfg.max_message_bytes) if args.transport == "unix" else None
    replicas = [_CountingReplica(f"127.0.0.1:{port}", grpc.insecure_channel, name=f"r{i}", accounting=False,
                                 feed=local) for i in range(followers)]
    try:
        for r in replicas:
            r.entry_listeners.append(WatchHub().on_entry)
            r.start()
        _until(lambda: all(r.ready and r.offset == core.log.apply_offset for r in replicas),
               lambda: "; ".join(r.not_ready_reason() or f"at {r.offset} of {core.log.apply_offset}" for r in replicas))
        base = [r.messages for r in replicas]
        threads0 = _thread_cpu()
        t0, c0 = time.monotonic(), time.process_time()
        for i in range(args.entries):
            _registrations(core, args.brokers, args.topics, args.per_entry, 1)
            ahead = t0 + (i + 1) / args.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        _until(lambda: all(r.offset == core.log.apply_offset for r in replicas))
        cpu = time.process_time() - c0
        if args.threads:
            _print_threads(threads0, _thread_cpu(), args.entries * args.per_entry)
        messages = sum(r.messages - b for r, b in zip(replicas, base, strict=True))
    finally:
        for r in replicas:
            r.stop()
        server.stop(None)
        unix.stop()
        shutil.rmtree(folder, ignore_errors=True)
    regs = args.entries * args.per_entry
    return {"cpu_us_per_reg": cpu / regs * 1e6, "messages_per_follower": messages / max(1, followers)}


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by name (Python's, else the kernel's)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid), comm)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _print_threads(before: dict[str, float], after: dict[str, float], regs: int) -> None:
    for name, cpu in sorted(after.items(), key=lambda kv: kv[1] - before.get(kv[0], 0.0), reverse=True):
        used = cpu - before.get(name, 0.0)
        if used > 0:
            print(f"  {name}: {used / regs * 1e6:.0f} us/reg")


def _until(cond: Callable[[], bool], why: Callable[[], str] = str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the replicas did not catch up: {why()}")
        time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replicaapply", description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", type=int, default=16, help="registering brokers (the bench's clients)")
    parser.add_argument("--topics", type=int, default=8, help="topics per registration")
    parser.add_argument("--entries", type=int, default=2000, help="entries applied per run")
    parser.add_argument("--per-entry", type=int, default=1, help="registrations per entry (the proposer batches)")
    parser.add_argument("--entries-per-message", type=int, default=1,
                        help="entries applied when the follower's stream wakes")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-receive", dest="receive", action="store_false",
                        help="leave the replica's side out: run once with and once without under valgrind "
                             "--tool=callgrind, and the difference is the receive side's instructions, free of the "
                             "noise of a shared machine")
    parser.add_argument("--streamed", type=int, default=0, metavar="K",
                        help="instead: K replicas over real Follow streams beside none, paced at --rate; the "
                             "process's CPU per registration and follower (K - none) / K")
    parser.add_argument("--threads", action="store_true", help="with --streamed: each thread's CPU")
    parser.add_argument("--transport", choices=("grpc", "unix"), default="grpc",
                        help="with --streamed: Log.Follow over gRPC (a remote replica's) or a worker's Unix feed")
    parser.add_argument("--rate", type=float, default=500.0, help="entries per second, with --streamed")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print cProfile's top N functions of one run's receive side")
    args = parser.parse_args()
    threading.current_thread().name = "bench"
    if args.streamed:
        extra = []
        for _ in range(args.runs):  # paired: without, then with, each run
            without, with_k = streamed(args, 0), streamed(args, args.streamed)
            extra.append((with_k["cpu_us_per_reg"] - without["cpu_us_per_reg"]) / args.streamed)
            print(f"without {without['cpu_us_per_reg']:.0f} us/reg, with {args.streamed}: "
                  f"{with_k['cpu_us_per_reg']:.0f} us/reg ({with_k['messages_per_follower']:.0f} messages per "
                  f"follower): "
                  f"{extra[-1]:.0f} us per registration per follower", flush=True)
        print(f"per registration per follower: best {min(extra):.0f} median {statistics.median(extra):.0f}")
        return
    results = [run(args) for _ in range(args.runs)]
    if args.profile:
        return
    for name in ("core_apply_us_per_reg", "send_us_per_reg", "receive_us_per_reg"):
        values = [r[name] for r in results]
        print(f"{name}: best {min(values):.1f} median {statistics.median(values):.1f} "
              f"(runs: {', '.join(f'{v:.1f}' for v in values)})")
    print(f"messages per run {results[0]['messages']:.0f}, bytes per registration {results[0]['bytes_per_reg']:.0f}; "
          f"{args.entries} entries of {args.per_entry} registration(s), {args.topics} topics, "
          f"{args.entries_per_message} entr(ies) per Follow message")


if __name__ == "__main__":
    main()
