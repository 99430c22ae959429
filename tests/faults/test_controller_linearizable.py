"""Controller mode's elections and SyncStateSet changes stay linearizable while Raft nodes are killed and paused.

A broker set's record is a register whose versions are log offsets. Clients elect (a named broker, or by
policy as the leader's scan does), alter the SyncStateSet with the epochs they last saw, and read it, through
random nodes, while stand-in brokers heartbeat to every node and fall silent in turns, and the nemesis kills
and pauses nodes. Each write is an exactly-once call (x-client-id / x-client-seq), retried until it has a
definite answer, so every operation's outcome is known and spans all its attempts. Recorded as the checkers'
compare-and-set model: a decision that wrote is a compare-and-set from the version it read (the reply's
set_version) to its own offset; a refusal, a "nothing to change" and a read are reads of that version. Our
checker and porcupine must both accept the history, and along the log's order the master epoch only grows
and names one master per epoch. The leader's own scan is off here (its elections would be writes no client
made); clients elect by policy instead, which is the same call.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
import time
from dataclasses import dataclass, field

import grpc
import pytest

from nameserver import headers
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import Cluster, NodeProc
from tests.controllerview import epoch_problems, masters_by_epoch, summary
from tests.faults.harness import UNKNOWN_CODES, Nemesis
from tests.linearizability.checker import History, Op, check
from tests.linearizability.porcupine import check_with_porcupine

pytestmark = pytest.mark.cluster

RUN_SECONDS = float(os.environ.get("LIN_RUN_SECONDS", "10"))
SET = "broker-lin"
BROKERS = (1, 2, 3)
BEAT_TIMEOUT_MS = 1200


@dataclass
class ControllerWorkload:
    cluster: Cluster
    clients: int = 4
    history: History = field(default_factory=History)
    unexpected: list[str] = field(default_factory=list)
    writes: list[api_pb2.ControllerReply] = field(default_factory=list)  # every write's reply, for the epochs
    seen: list[api_pb2.BrokerSetView] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _silent: set[int] = field(default_factory=set)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def stub(self, node: NodeProc) -> api_pb2_grpc.ControllerStub:
        return api_pb2_grpc.ControllerStub(grpc.insecure_channel(node.grpc_addr))

    # ---- brokers' heartbeats ---------------------------------------------------------------------

    def _beats(self) -> None:
        stubs = [self.stub(n) for n in self.cluster.nodes]
        while not self._stop.is_set():
            for broker_id in BROKERS:
                if broker_id in self._silent:
                    continue
                for s in stubs:
                    with contextlib.suppress(grpc.RpcError):  # that node is down or paused
                        s.Heartbeat(api_pb2.ControllerHeartbeatRequest(
                            cluster_name="c", broker_name=SET, broker_address=f"127.0.0.1:{30000 + broker_id}",
                            broker_id=broker_id, epoch=1, max_offset=100 * broker_id, timeout_ms=BEAT_TIMEOUT_MS),
                            timeout=0.3)
            time.sleep(0.2)

    def _silencer(self, rng: random.Random) -> None:
        while not self._stop.wait(rng.uniform(1.0, 2.5)):
            self._silent = {rng.choice(BROKERS)} if rng.random() < 0.7 else set()

    # ---- clients ---------------------------------------------------------------------------------

    def call(self, p: int, method: str, request: object, seq: int | None) -> tuple[float, float, object]:
        """(invoke, complete, reply), retried on other nodes until definite (same seq: applied at most once)."""
        rng = random.Random()
        t0 = time.monotonic()
        md = [] if seq is None else [(headers.CLIENT_ID, f"lin-ctl-{p}"), (headers.CLIENT_SEQ, str(seq))]
        deadline = t0 + 120
        while True:
            node = rng.choice([n for n in self.cluster.nodes if n.alive] or self.cluster.nodes)
            try:
                reply = getattr(self.stub(node), method)(request, timeout=1.5, metadata=md)
                return t0, time.monotonic(), reply
            except grpc.RpcError as exc:
                if exc.code() not in UNKNOWN_CODES or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def record(self, p: int, t0: float, t1: float, reply: api_pb2.ControllerReply) -> None:
        if reply.offset:  # it wrote: a compare-and-set from the version it read to its own offset
            op = Op(p, SET, "bind", t0, t1, "ok", owner=summary(reply.set), expected=reply.set_version,
                    version=reply.offset)
            with self._lock:
                self.writes.append(reply)
        else:
            found = reply.HasField("set")
            op = Op(p, SET, "read", t0, t1, "ok", owner=summary(reply.set) if found else "",
                    version=reply.set_version, found=found)
        if reply.HasField("set"):
            with self._lock:
                self.seen.append(reply.set)
        self.history.add(op)

    def _client(self, p: int) -> None:
        rng = random.Random(100 + p)
        seqs = itertools.count(1)
        last: api_pb2.BrokerSetView | None = None
        while not self._stop.is_set():
            roll = rng.random()
            try:
                if roll < 0.3:
                    method, request, seq = "GetReplicaInfo", api_pb2.BrokerSetRequest(broker_name=SET), None
                elif roll < 0.5:
                    method, seq = "ElectMaster", next(seqs)
                    request = api_pb2.ElectMasterRequest(broker_name=SET, broker_id=-1)
                elif roll < 0.7:
                    method, seq = "ElectMaster", next(seqs)
                    request = api_pb2.ElectMasterRequest(broker_name=SET, broker_id=rng.choice(BROKERS),
                                                         designate_elect=True)
                else:
                    if last is None or not last.master_id:
                        continue
                    others = [b for b in BROKERS if b != last.master_id and rng.random() < 0.6]
                    method, seq = "AlterSyncStateSet", next(seqs)
                    request = api_pb2.AlterSyncStateSetRequest(
                        broker_name=SET, master_id=last.master_id, master_epoch=last.master_epoch,
                        sync_state_set=sorted([last.master_id, *others]),
                        sync_state_set_epoch=last.sync_state_set_epoch)
                t0, t1, reply = self.call(p, method, request, seq)
            except grpc.RpcError as exc:
                self.unexpected.append(f"{p}: {exc.code()} {exc.details()}")
                return
            self.record(p, t0, t1, reply)
            if reply.HasField("set"):
                last = reply.set

    def start(self) -> None:
        targets = [self._beats, lambda: self._silencer(random.Random(5))]
        targets += [lambda p=p: self._client(p) for p in range(self.clients)]
        for target in targets:
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=150)


def register_set(w: ControllerWorkload) -> None:
    stub = w.stub(w.cluster.leader() or w.cluster.nodes[0])
    for broker_id in BROKERS:
        reply = stub.ApplyBrokerId(api_pb2.ApplyBrokerIdRequest(
            cluster_name="c", broker_name=SET, broker_id=broker_id,
            register_check_code=f"127.0.0.1:{30000 + broker_id};1"), timeout=10)
        assert reply.code == 0, reply.remark
        w.record(99, 0.0, 0.0, reply)  # before every client: a write like any other


def check_epochs(w: ControllerWorkload) -> int:
    """Along the log (write offsets), the master epoch never goes back, moves with every new master, and
    each epoch names one master, whatever any client saw. Returns the number of elections."""
    problems = epoch_problems([(r.offset, r.set) for r in w.writes])
    assert not problems, problems
    masters = masters_by_epoch(w.seen)
    assert all(len(m) == 1 for m in masters.values()), masters
    return len({r.set.master_epoch for r in w.writes}) - 1


@pytest.mark.timeout(900)
def test_elections_and_sync_state_changes_are_linearizable_under_kills_and_pauses(fault_cluster) -> None:
    c = fault_cluster(controller=True, controller_scan_interval_ms=3_600_000)
    c.wait_ready()
    w = ControllerWorkload(c)
    register_set(w)
    nemesis = Nemesis(c, seed=11)
    w.start()
    nemesis.start()
    time.sleep(RUN_SECONDS)
    nemesis.stop()
    w.stop()
    assert not w.unexpected, w.unexpected[:5]
    ops = w.history.ops
    results = check(ops)
    bad = [(r.key, r.detail) for r in results if not r.ok]
    theirs = check_with_porcupine([ops], timeout_s=30)[0]
    print(f"\n{len(ops)} controller operations ({len(w.writes)} writes), faults: {nemesis.log}; ours: "
          f"{bad or 'ok'}; porcupine: {theirs}")
    assert not bad, bad
    assert theirs in ("ok", "unknown"), theirs  # "unknown": porcupine's time ran out, not a verdict
    elections = check_epochs(w)
    assert nemesis.log, "the nemesis injected no fault"
    assert elections >= 3 and len(ops) >= 100, (elections, len(ops))
    c.wait_converged(timeout=60)
