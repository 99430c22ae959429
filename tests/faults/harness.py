"""Record client histories against a real cluster while a nemesis kills and pauses nodes.

Clients (threads) do linearizable reads, compare-and-set binds and releases on a few queue
bindings through random nodes, with short deadlines, recording invoke/complete times and
outcomes: ok, fail (compare-and-set refused) or unknown (timeout, no leader, leader changed).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field

import grpc

from nameserver.pb import api_pb2
from tests.cluster import Cluster, NodeProc
from tests.faults import workers
from tests.linearizability.checker import INF, History, Op

UNKNOWN_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                 grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


@dataclass
class Workload:
    cluster: Cluster
    keys: int = 4
    clients: int = 6
    timeout_s: float = 1.0
    topic: str = "Lin"
    history: History = field(default_factory=History)
    unexpected: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for p in range(self.clients):
            t = threading.Thread(target=self._client, args=(p,), daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _client(self, p: int) -> None:
        rng = random.Random(p)
        seen: dict[int, int] = {}  # queue id -> last version this client saw (0: unbound)
        while not self._stop.is_set():
            node = rng.choice(self.cluster.nodes)
            qid = rng.randrange(self.keys)
            roll = rng.random()
            if roll < 0.5:
                self._read(p, node, qid, seen)
            elif roll < 0.9:
                self._bind(p, node, qid, f"owner-{p}-{rng.randrange(1000)}", seen.get(qid, 0), seen)
            else:
                self._release(p, node, qid, seen.get(qid, 0), seen)

    def _key(self, qid: int) -> str:
        return f"{self.topic}/{qid}"

    def _read(self, p: int, node: NodeProc, qid: int, seen: dict[int, int]) -> None:
        t0 = time.monotonic()
        try:
            r = node.ns.GetBinding(api_pb2.GetBindingRequest(topic=self.topic, queue_id=qid), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() not in UNKNOWN_CODES:
                self.unexpected.append(f"read: {exc.code()} {exc.details()}")
            return  # a failed read has no effect: nothing to record
        t1 = time.monotonic()
        seen[qid] = r.binding.version if r.found else 0
        self.history.add(Op(p, self._key(qid), "read", t0, t1, "ok", owner=r.binding.owner,
                            version=r.binding.version, found=r.found))

    def _bind(self, p: int, node: NodeProc, qid: int, owner: str, expected: int, seen: dict[int, int]) -> None:
        t0 = time.monotonic()
        try:
            r = node.ns.BindQueue(api_pb2.BindQueueRequest(topic=self.topic, queue_id=qid, owner=owner,
                                                           expected_version=expected), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self._record_error(p, qid, "bind", t0, exc, owner=owner, expected=expected)
            return
        seen[qid] = r.binding.version
        self.history.add(Op(p, self._key(qid), "bind", t0, time.monotonic(), "ok", owner=owner,
                            expected=expected, version=r.binding.version))

    def _release(self, p: int, node: NodeProc, qid: int, expected: int, seen: dict[int, int]) -> None:
        if expected == 0:
            return
        t0 = time.monotonic()
        try:
            node.ns.ReleaseQueue(api_pb2.ReleaseQueueRequest(topic=self.topic, queue_id=qid,
                                                             expected_version=expected), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self._record_error(p, qid, "release", t0, exc, expected=expected)
            return
        seen[qid] = 0
        self.history.add(Op(p, self._key(qid), "release", t0, time.monotonic(), "ok", expected=expected))

    def _record_error(self, p: int, qid: int, kind: str, t0: float, exc: grpc.RpcError, **kw: object) -> None:
        code = exc.code()
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            self.history.add(Op(p, self._key(qid), kind, t0, time.monotonic(), "fail", **kw))
        elif code in UNKNOWN_CODES:
            self.history.add(Op(p, self._key(qid), kind, t0, INF, "unknown", **kw))
        else:
            self.unexpected.append(f"{kind}: {code} {exc.details()}")


@dataclass
class Nemesis:
    """Cycles faults: SIGKILL then restart, or SIGSTOP past the election timeout then SIGCONT.

    `faults` is the cycle, in order: "kill-leader", "pause-leader" (the current leader), or any other
    "kill-..."/"pause-..." name ("kill-follower", "kill-any", ...: a node chosen at random, any role).
    A kill reaches the node's workers too (the kernel kills them with their core); a pause stops the core
    only, its workers keep their connections and wait for it. With `worker_kills` (the default when the
    cluster's nodes run worker processes: FAULTS_WORKERS), halfway through each fault one worker process
    of another node, at random, is SIGKILLed as well ("worker-kill" in `events`); its core restarts it.
    """

    cluster: Cluster
    pause_s: float = 3.0
    down_s: float = 2.0
    settle_s: float = 2.0
    seed: int = 7
    faults: tuple[str, ...] = ("kill-leader", "pause-leader", "kill-follower", "pause-follower")
    worker_kills: bool | None = None  # None: when the cluster runs workers
    log: list[str] = field(default_factory=list)
    # (start, end, fault, node name) per injected fault, in time.monotonic() seconds
    events: list[tuple[float, float, str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        if self.worker_kills is None:
            self.worker_kills = self.cluster.worker_processes > 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _target(self, rng: random.Random, leader: bool) -> NodeProc:
        if leader:
            found = self.cluster.leader()
            if found is not None:
                return found
        return rng.choice(self.cluster.nodes)

    def _run(self) -> None:
        rng = random.Random(self.seed)
        other = random.Random(-self.seed)  # the worker kills' own: the node faults stay those of the seed
        faults = list(self.faults)
        i = 0
        while not self._stop.wait(self.settle_s):
            fault = faults[i % len(faults)]
            i += 1
            node = self._target(rng, fault.endswith("leader"))
            started = time.monotonic()
            if fault.startswith("kill"):
                self.cluster.kill(node)
                self.log.append(f"{time.monotonic():.1f} kill -9 {node.name} ({fault})")
                self._meanwhile(other, node, self.down_s)
                self.cluster.start(node)
            else:
                self.cluster.kill(node, signal.SIGSTOP)
                self.log.append(f"{time.monotonic():.1f} SIGSTOP {node.name} ({fault})")
                self._meanwhile(other, node, self.pause_s)
                node.proc.send_signal(signal.SIGCONT)
            self.log.append(f"{time.monotonic():.1f} healed {node.name}")
            self.events.append((started, time.monotonic(), fault, node.name))

    def _meanwhile(self, rng: random.Random, faulted: NodeProc, seconds: float) -> None:
        """Wait out a fault of `faulted`; with worker kills, SIGKILL a worker of another node halfway."""
        if not self.worker_kills:
            self._stop.wait(seconds)
            return
        if self._stop.wait(seconds / 2):
            return
        # a node restarted a moment ago may not have started its workers yet
        running = [n for n in self.cluster.nodes if n is not faulted and workers.workers_of(n)]
        at = time.monotonic()
        node = rng.choice(running) if running else None
        pid = workers.kill_one(node, rng) if node is not None else None
        if node is not None and pid is not None:
            self.log.append(f"{at:.1f} kill -9 worker {pid} of {node.name}")
            self.events.append((at, at, "worker-kill", node.name))
        else:
            self.log.append(f"{at:.1f} no other node had a worker running to kill")
        self._stop.wait(seconds / 2)
