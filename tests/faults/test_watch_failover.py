"""Many watchers and writers while the leader is killed: every watch stream resumes from its last offset,
with no gap and no duplicate (issue 15, point 2).

500 Watch streams (10 per KV namespace, 50 namespaces) are spread over the three nodes, and 200 writers put
keys through any node; the leader is SIGKILLed and later restarted. A watcher whose stream fails resumes on
another node with start_offset = the last offset it saw, events or progress, as a client library does.
After the writers stop, every watcher must reach the final offset and then hold, for its namespace:

- every acknowledged write, once, at the offset its writer was told;
- nothing else but writes whose outcome was unknown, each at most once, with the value written;
- exactly the same events as the other watchers of that namespace (they all started at one offset);
- and its stream's offsets never went backwards, nor repeated with events.

WATCH_FAILOVER_WATCHERS / WATCH_FAILOVER_WRITERS scale it (defaults 500 and 200).
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import threading
import time

import grpc
import pytest

from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from tests.cluster import Cluster, NodeProc
from tests.faults.scenario import SEED, pick

pytestmark = pytest.mark.cluster

WATCHERS = int(os.environ.get("WATCH_FAILOVER_WATCHERS", "500"))
WRITERS = int(os.environ.get("WATCH_FAILOVER_WRITERS", "200"))
NAMESPACES = max(1, WATCHERS // 10)
PHASE_S = pick(2, 20)  # writes before the kill, while the leader is down, after its restart
STREAMS_PER_CHANNEL = 50


def namespace(i: int) -> str:
    return f"wf{i % NAMESPACES}"


class Channels:
    """A few channels per node (HTTP/2 connections), each carrying at most STREAMS_PER_CHANNEL watches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, int], grpc.Channel] = {}

    def stub(self, node: NodeProc, slot: int) -> api_pb2_grpc.NameServerStub:
        key = (node.grpc_addr, slot // STREAMS_PER_CHANNEL)
        with self._lock:
            if key not in self._channels:
                self._channels[key] = grpc.insecure_channel(node.grpc_addr)
            return api_pb2_grpc.NameServerStub(self._channels[key])

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()


class StreamWatcher(threading.Thread):
    def __init__(self, slot: int, cluster: Cluster, channels: Channels, start: int, stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"watcher-{slot}")
        self.slot = slot
        self.prefix = f"kv/{namespace(slot)}/"
        self.cluster = cluster
        self.channels = channels
        self.last = start
        self.stop = stop
        self.target: int | None = None
        self.events: list[tuple[int, str, bytes]] = []
        self.errors: list[str] = []  # what the checks found wrong
        self.resumes = 0
        self.answered = threading.Event()
        self.done = threading.Event()
        self._call: grpc.Future | None = None

    def run(self) -> None:
        nodes = itertools.cycle(range(len(self.cluster.nodes)))
        for _ in range(self.slot):
            next(nodes)
        while not self.done.is_set():
            node = self.cluster.nodes[next(nodes)]
            if not node.alive:
                continue
            request = api_pb2.WatchRequest(key_prefixes=[self.prefix], start_offset=self.last,
                                           progress_interval_ms=200)
            try:
                self._call = stream = self.channels.stub(node, self.slot).Watch(request)
                for reply in stream:
                    self.answered.set()
                    self._take(reply)
                    if self.target is not None and self.last >= self.target:
                        self.done.set()
                        stream.cancel()
                        return
            except grpc.RpcError:
                if self.done.is_set():
                    return
                self.resumes += 1
                time.sleep(0.05)

    def _take(self, reply: api_pb2.WatchResponse) -> None:
        if reply.events:
            if reply.offset <= self.last:
                self.errors.append(f"events at offset {reply.offset} after offset {self.last} (a duplicate)")
            for e in reply.events:
                self.events.append((reply.offset, e.key, e.value))
            self.last = max(self.last, reply.offset)
        elif reply.offset < self.last:
            self.errors.append(f"progress went back from {self.last} to {reply.offset}")
        else:
            self.last = reply.offset


class Writers:
    def __init__(self, cluster: Cluster, count: int) -> None:
        self.cluster = cluster
        self.acked: dict[str, int] = {}  # event key -> offset
        self.unknown: set[str] = set()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(count)]

    def _run(self, w: int) -> None:
        rng = random.Random(SEED * 1000 + w)
        for i in itertools.count():
            if self.stop.is_set():
                return
            ns, key = namespace(rng.randrange(NAMESPACES)), f"w{w}-{i}"
            full = f"kv/{ns}/{key}"
            live = [n for n in self.cluster.nodes if n.alive]
            node = live[rng.randrange(len(live))]
            try:
                reply = node.ns.PutKv(api_pb2.PutKvRequest(namespace=ns, key=key, value=full), timeout=3)
                self.acked[full] = reply.offset
            except grpc.RpcError:
                self.unknown.add(full)  # it may or may not have been applied
                time.sleep(0.05)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


@pytest.mark.timeout(600)
def test_watchers_resume_without_gap_or_duplicate_across_a_leader_kill(fault_cluster) -> None:
    per_node = WATCHERS // 2 + 50  # two survivors carry them all while the third is down
    # Sized for its watchers, as an operator would: gRPC channels to one address share one connection, so
    # every watch to a node is a stream on one HTTP/2 connection (limits.grpc_max_streams_per_connection).
    c: Cluster = fault_cluster(start=True, security={
        "grpc": {"workers": per_node + WRITERS + 64, "max_watchers": per_node},
        "limits": {"grpc_max_streams_per_connection": per_node + WRITERS + 64}})
    leader = c.wait_ready()
    start = max(s.apply_offset for s in c.wait_converged())
    stop = threading.Event()
    channels = Channels()
    watchers = [StreamWatcher(i, c, channels, start, stop) for i in range(WATCHERS)]
    writers = Writers(c, WRITERS)
    try:
        for w in watchers:
            w.start()
        deadline = time.monotonic() + 60
        for w in watchers:
            assert w.answered.wait(max(0.1, deadline - time.monotonic())), f"watcher {w.slot} never answered"
        writers.start()
        time.sleep(PHASE_S)
        c.kill(leader)
        killed_at = time.monotonic()
        time.sleep(PHASE_S)
        c.start(leader)
        time.sleep(PHASE_S)
        writers.join()
        converged = c.wait_converged(timeout=60)
        final = max(s.apply_offset for s in converged)
        for w in watchers:
            w.target = final
        deadline = time.monotonic() + 120
        for w in watchers:
            assert w.done.wait(max(0.1, deadline - time.monotonic())), \
                f"watcher {w.slot} stuck at offset {w.last} of {final} ({w.resumes} resumes)"
    finally:
        stop.set()
        writers.stop.set()
        for w in watchers:
            w.done.set()
            if w._call is not None:
                w._call.cancel()
        channels.close()

    written = set(writers.acked) | writers.unknown
    by_namespace: dict[str, list[StreamWatcher]] = collections.defaultdict(list)
    problems: list[str] = []
    for w in watchers:
        by_namespace[w.prefix].append(w)
        problems += [f"watcher {w.slot}: {e}" for e in w.errors[:3]]
        seen = collections.Counter((off, key) for off, key, _ in w.events)
        problems += [f"watcher {w.slot}: {k} seen {n} times" for k, n in seen.items() if n > 1][:3]
        keys = {key: off for off, key, _ in w.events}
        for key, off in writers.acked.items():
            if key.startswith(w.prefix) and keys.get(key) != off:
                problems.append(f"watcher {w.slot}: acknowledged {key} at offset {off}, seen at {keys.get(key)}")
        for off, key, value in w.events:
            if key not in written or state_pb2.KvValue.FromString(value).value != key:
                problems.append(f"watcher {w.slot}: event {key}={value!r} at {off} was never written")
    for prefix, group in by_namespace.items():
        first = group[0].events
        for w in group[1:]:
            if w.events != first:
                problems.append(f"watchers {group[0].slot} and {w.slot} of {prefix} saw different events "
                                f"({len(first)} and {len(w.events)})")
    resumes = sum(w.resumes for w in watchers)
    print(f"\nwatch failover: {WATCHERS} watchers, {WRITERS} writers; {len(writers.acked)} writes acknowledged, "
          f"{len(writers.unknown)} unknown; {sum(len(w.events) for w in watchers)} events delivered; "
          f"{resumes} resumes; offsets {start}..{final}; leader killed {time.monotonic() - killed_at:.0f} s "
          f"before the end")
    assert not problems, f"{len(problems)} problems, first: {problems[:20]}"
    assert len(writers.acked) >= WRITERS, writers.acked
    assert resumes >= WATCHERS // 4, "the kill should have broken a third of the streams"
