"""The acknowledged-writes ledger: "no acknowledged write lost", checked on every node after healing.

Writer threads put unique KV keys through random nodes with short deadlines and record each outcome:
ok (with the entry's offset), unknown (timeout, no leader, node down: it may or may not have applied)
or unexpected (any other error, reported as a failure). After healing, every node must hold every
acknowledged key with its value, read with `min_offset` = the highest acknowledged offset so a node
that is merely behind waits instead of being reported.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import grpc

from nameserver.pb import api_pb2
from tests.cluster import Cluster, NodeProc
from tests.faults.harness import UNKNOWN_CODES


@dataclass(frozen=True)
class Write:
    key: str
    value: str
    node: str          # the node the client called
    invoke: float      # time.monotonic()
    complete: float
    status: str        # "ok" | "unknown"
    offset: int = 0    # ok: the offset of the entry holding the write
    code: str = ""     # unknown: the gRPC status code


@dataclass
class AckLedger:
    cluster: Cluster
    writers: int = 2
    timeout_s: float = 1.0
    namespace: str = "ledger"
    pause_s: float = 0.005   # between writes of one writer: keeps the 2-core machine usable
    value_bytes: int = 64
    seed: int = 1
    rate: float | None = None      # writes per second over all writers (None: each pauses pause_s)
    key_space: int = 0             # > 0: each writer cycles over this many keys of its own (a soak's data
    #                                stays bounded); a key must then hold its last acknowledged value, or
    #                                the value of a write of it whose outcome is unknown (a timed-out write
    #                                may take effect at any time after it was sent)
    writes: list[Write] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _pace_lock: threading.Lock = field(default_factory=threading.Lock)
    _next_at: float = 0.0

    def start(self) -> None:
        for p in range(self.writers):
            t = threading.Thread(target=self._writer, args=(p,), daemon=True, name=f"ledger-{p}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _writer(self, p: int) -> None:
        rng = random.Random(self.seed * 1000 + p)
        i = 0
        while not self._stop.is_set():
            node = rng.choice(self.cluster.nodes)
            key = f"w{p}-{i % self.key_space if self.key_space else i:07d}"
            self.put(node, key, f"{p}:{i}:" + "x" * self.value_bytes)
            i += 1
            self._pace()

    def _pace(self) -> None:
        if self.rate is None:
            if self.pause_s:
                self._stop.wait(self.pause_s)
            return
        with self._pace_lock:
            at = max(self._next_at, time.monotonic())
            self._next_at = at + 1 / self.rate
        self._stop.wait(max(0.0, at - time.monotonic()))

    def put(self, node: NodeProc, key: str, value: str, timeout: float | None = None) -> Write:
        """One recorded write (also used by tests to aim a write at one node, e.g. an isolated leader)."""
        t0 = time.monotonic()
        try:
            r = node.ns.PutKv(api_pb2.PutKvRequest(namespace=self.namespace, key=key, value=value),
                              timeout=timeout or self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            w = Write(key, value, node.name, t0, time.monotonic(), "unknown", code=code.name)
            if code not in UNKNOWN_CODES:
                self.unexpected.append(f"PutKv {key} via {node.name}: {code} {exc.details()}")
        else:
            w = Write(key, value, node.name, t0, time.monotonic(), "ok", offset=r.offset)
        self.writes.append(w)  # list.append is atomic under the GIL
        return w

    # ---- queries ---------------------------------------------------------------------------------

    def acked(self) -> dict[str, Write]:
        """Each key's last acknowledged write."""
        return {w.key: w for w in self.writes if w.status == "ok"}

    def acknowledged(self) -> int:
        """How many writes were acknowledged (with key_space, more than acked() has keys)."""
        return sum(1 for w in self.writes if w.status == "ok")

    def _may_hold(self) -> dict[str, set[str]]:
        """Per key, the values it may hold besides the last acknowledged one: those of its writes with an
        unknown outcome (only with key_space: otherwise every key is written once)."""
        out: dict[str, set[str]] = {}
        for w in self.writes:
            if w.status == "unknown":
                out.setdefault(w.key, set()).add(w.value)
        return out

    def acked_between(self, t_from: float, t_to: float, nodes: set[str] | None = None) -> list[Write]:
        """Acknowledged writes invoked in [t_from, t_to], optionally only those sent to `nodes`."""
        return [w for w in self.writes if w.status == "ok" and t_from <= w.invoke <= t_to
                and (nodes is None or w.node in nodes)]

    def summary(self) -> str:
        ok = sum(1 for w in self.writes if w.status == "ok")
        return f"{len(self.writes)} writes, {ok} acknowledged, {len(self.writes) - ok} unknown"

    # ---- the check ---------------------------------------------------------------------------------

    def check(self, nodes: list[NodeProc], timeout: float = 30.0) -> dict[str, list[str]]:
        """Problems per node: acknowledged keys missing or with another value. Empty lists: all good."""
        acked = self.acked()
        if not acked:
            return {n.name: ["no write was acknowledged at all"] for n in nodes}
        floor = max(w.offset for w in acked.values())
        later = self._may_hold() if self.key_space else {}
        out: dict[str, list[str]] = {}
        for n in nodes:
            problems: list[str] = []
            try:
                table = dict(n.ns.ListKv(api_pb2.ListKvRequest(namespace=self.namespace, min_offset=floor),
                                         timeout=timeout).table)
            except grpc.RpcError as exc:
                out[n.name] = [f"ListKv(min_offset={floor}) failed: {exc.code()} {exc.details()}"]
                continue
            for key, w in sorted(acked.items()):
                got = table.get(key)
                if got is None:
                    problems.append(f"{key} (acked at offset {w.offset} via {w.node}) missing")
                elif got != w.value and got not in later.get(key, ()):
                    problems.append(f"{key} has {got!r}, acked {w.value!r}")
            out[n.name] = problems
        return out
