"""`python -m bench.applycpu`: the apply's CPU per registration entry, on a core's apply thread and on a worker's
read replica, in one process, without a cluster (issue 27: each registration is applied six times).

The entry stream is the registration load's (bench/workloads.py registration_request: a master of `--topics`
topics whose DataVersion and queue counts change every call, so each registration rewrites its live record and
every queue data), translated and wrapped in an Entry as the proposer does, `--per-entry` registrations an
entry, `--brokers` brokers in turn, made once before the runs. Each run then applies it from nothing:

- **core**: raftlog/applier.py Applier._apply, as the core's apply thread runs it: decode, the state lock
  (StateGuard's writer), MetadataState (digest and quota totals kept), the history ring, the core's entry
  listeners (the watch hub, the session clock, the metrics' count of the entry), the offset published;
- **replica**: nameserver/replica/follower.py ReadReplica._apply of each FollowMessage as a worker's Unix feed
  hands it over (the message decoded from its bytes), accounting=False, with a ReplicaNode's watch hub.

The first `--warm` entries of each run are applied untimed (every broker registered once: what is timed is
re-registrations). CPU is this thread's (time.thread_time); the best and the median of `--runs` runs, per entry.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import grpc
from prometheus_client import CollectorRegistry, Histogram

from bench.workloads import registration_request
from nameserver.core.node import StateMachineAdapter
from nameserver.core.sessionclock import SessionClock
from nameserver.core.stateguard import StateGuard
from nameserver.core.watch import WatchHub
from nameserver.ops.metrics import NodeMetrics
from nameserver.pb import api_pb2
from nameserver.replica import ReadReplica
from nameserver.state import MetadataState, translate
from raftlog.applier import Applier
from raftlog.codec import encode_entry
from raftlog.history import AppliedEntry
from raftlog.pb import entry_pb2


def entry_stream(brokers: int, topics: int, per_entry: int, entries: int) -> list[bytes]:
    """`brokers` first registrations, one an entry, then `entries` entries of `per_entry` re-registrations."""
    state = MetadataState()
    counters = [0] * brokers
    out: list[bytes] = []
    n = 0
    for count, size in ((brokers, 1), (entries, per_entry)):
        for _ in range(count):
            entry = entry_pb2.Entry(term=1, leader_time_ms=int(time.time() * 1000))
            for _ in range(size):
                b = n % brokers
                counters[b] += 1
                req = registration_request(f"reg-w{b}", f"10.0.{b // 250}.{b % 250 + 1}:10911", f"RegW{b}T",
                                           topics, counters[b])
                batch = translate.register_broker(state, req, 30000).batch
                batch.request_id = f"r{n}"
                entry.batches.append(batch)
                n += 1
            data = encode_entry(entry)
            out.append(data)
            state.apply_entry(len(out), entry)
    return out


class _EntryCount:
    """NodeMetrics' apply-thread counting (its on_entry) without a node."""

    def __init__(self) -> None:
        registry = CollectorRegistry()
        self.entry_batches = Histogram("batches", "", registry=registry)
        self.entry_bytes = Histogram("bytes", "", registry=registry)
        self._records_by_type: dict[int, int] = {}
        self.entries_applied = 0
        self.last_leader_time_ms = 0

    def on_entry(self, entry: AppliedEntry) -> None:
        NodeMetrics.on_entry(self, entry)  # type: ignore[arg-type]  # the attributes it counts in are here


def core_run(stream: list[bytes], warm: int) -> tuple[float, str]:
    """Seconds of this thread's CPU applying stream[warm:] as a core's apply thread; the digest at the end."""
    state = MetadataState()
    applier = Applier(StateMachineAdapter(state), StateGuard().writer)
    hub, clock, count = WatchHub(), SessionClock(), _EntryCount()
    applier.entry_listeners.extend([hub.on_entry, clock.on_entry, count.on_entry])
    apply = applier._apply
    for offset, data in enumerate(stream[:warm], 1):
        apply(offset, data)
    t0 = time.thread_time()
    for offset, data in enumerate(stream[warm:], warm + 1):
        apply(offset, data)
    return time.thread_time() - t0, state.kv.digest_hex


def replica_run(wires: list[bytes], warm: int) -> tuple[float, MetadataState]:
    """Seconds of this thread's CPU applying wires[warm:] (one FollowMessage each) as a worker's replica."""
    replica = ReadReplica("127.0.0.1:1", grpc.insecure_channel, name="bench", accounting=False)
    replica.entry_listeners.append(WatchHub().on_entry)
    apply, parse = replica._apply, api_pb2.FollowMessage.FromString
    for wire in wires[:warm]:
        apply(parse(wire))
    t0 = time.thread_time()
    for wire in wires[warm:]:
        apply(parse(wire))
    return time.thread_time() - t0, replica.state


def messages(stream: list[bytes]) -> list[bytes]:
    """Each entry as its own FollowMessage (a feed that keeps up), encoded."""
    return [api_pb2.FollowMessage(entries=[api_pb2.LogEntry(offset=offset, term=1, entry=data)],
                                  through_offset=offset, core_offset=offset).SerializeToString()
            for offset, data in enumerate(stream, 1)]


def _best(runs: int, fn: Callable[[], float], entries: int) -> tuple[float, float]:
    times = [fn() / entries * 1e6 for _ in range(runs)]
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.applycpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", type=int, default=1, help="registering brokers (the bench's clients)")
    parser.add_argument("--topics", type=int, default=8, help="topics per registration")
    parser.add_argument("--per-entry", type=int, default=1, help="registrations per entry (the proposer batches)")
    parser.add_argument("--entries", type=int, default=2000, help="timed entries per run")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    stream = entry_stream(args.brokers, args.topics, args.per_entry, args.entries)
    wires = messages(stream)
    warm = args.brokers
    digests: set[str] = set()

    def core() -> float:
        spent, digest = core_run(stream, warm)
        digests.add(digest)
        return spent

    core_best, core_median = _best(args.runs, core, args.entries)
    replica_best, replica_median = _best(args.runs, lambda: replica_run(wires, warm)[0], args.entries)
    records = sum(len(b.records) for b in entry_pb2.Entry.FromString(stream[-1]).batches)
    print(f"core apply: best {core_best:.1f} median {core_median:.1f} us an entry; "
          f"replica apply: best {replica_best:.1f} median {replica_median:.1f} us an entry "
          f"({args.entries} entries of {args.per_entry} registration(s), {records} records, {args.brokers} brokers, "
          f"{args.topics} topics; best of {args.runs}); digest {' '.join(sorted(digests))}")


if __name__ == "__main__":
    main()
