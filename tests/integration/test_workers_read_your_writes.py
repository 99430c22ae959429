"""Read-your-writes across worker processes under worker kills, core pauses and a core restart (slow).

docs/faults.md, finding 13: with workers, a read through one node with `min_offset` = the offset an
acknowledged write returned missed that write. Here a 3-node cluster with 2 workers a node and a snapshot
every 100 entries (so restarted workers seed from their core's snapshot file, and a paused core may be
sent the leader's snapshot) takes unique writes through every node; each acknowledged write is read back
through every node, each time on a new connection (another worker, as the kernel spreads them), with
`min_offset` = its offset. Meanwhile a worker is SIGKILLed every few seconds (its core starts another), a
core is paused past the election timeout now and then, and one core is killed and restarted. Every
read that answers must hold the write; at the end every node, through each of its workers, holds every
acknowledged write.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from bench.procnet import children, listener_pids
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import Cluster, NodeProc, running

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORKERS = 2
CHAOS_S = 60.0
WRITERS = 3
READ_TIMEOUT_S = 10.0


def workers_of(node: NodeProc) -> list[int]:
    if not node.alive:
        return []
    assert node.proc is not None
    return [pid for pid in children(node.proc.pid) if _is_worker(pid)]


def _is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"nameserver.worker" in f.read()
    except OSError:
        return False


def serving(node: NodeProc) -> int:
    """How many of the node's workers listen on its gRPC port."""
    assert node.proc is not None
    port = int(node.grpc_addr.rsplit(":", 1)[1])
    return sum(1 for pid in listener_pids(node.proc.pid, port) if pid != node.proc.pid)


def fresh_stub(node: NodeProc) -> tuple[grpc.Channel, api_pb2_grpc.NameServerStub]:
    """A new connection (the kernel hands it to one of the node's workers)."""
    channel = grpc.insecure_channel(node.grpc_addr, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, api_pb2_grpc.NameServerStub(channel)


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # grpcio's port: a new connection is another worker as the kernel spreads them (the Go front end, the
    # default once built, spreads calls itself)
    c = Cluster(str(tmp_path_factory.mktemp("ryw")), 3, worker_processes=WORKERS, snapshot_every_entries=100,
                grpc_front="grpcio")
    with running(c, timeout=c.ready_timeout) as started:  # its stop() resumes a paused core first
        yield started


class Run:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.stop = threading.Event()
        self.acked: dict[str, int] = {}  # key -> the offset its write returned
        self.reads = 0
        self.missing: list[str] = []
        self.chaos: list[str] = []

    def writer(self, p: int) -> None:
        rng = random.Random(p)
        i = 0
        while not self.stop.is_set():
            node = rng.choice(self.cluster.nodes)
            if not node.alive:
                time.sleep(0.05)
                continue
            key = f"w{p}-{i}"
            i += 1
            try:
                offset = node.ns.PutKv(api_pb2.PutKvRequest(namespace="ryw", key=key, value=key), timeout=2).offset
            except grpc.RpcError:
                continue  # unknown outcome: not checked
            self.acked[key] = offset
            for reader in self.cluster.nodes:
                self.read_back(reader, key, offset, node.name)

    def read_back(self, reader: NodeProc, key: str, offset: int, via: str) -> None:
        if not reader.alive:
            return
        channel, stub = fresh_stub(reader)
        try:
            stub.GetKv(api_pb2.GetKvRequest(namespace="ryw", key=key, min_offset=offset), timeout=READ_TIMEOUT_S)
            self.reads += 1
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                self.missing.append(f"{key} (acked at {offset} via {via}) not found through {reader.name}")
        finally:
            channel.close()

    def nemesis(self) -> None:
        rng = random.Random(7)
        restarted = False
        started = time.monotonic()
        while not self.stop.wait(rng.uniform(1.0, 3.0)):
            node = rng.choice(self.cluster.nodes)
            if not restarted and time.monotonic() - started > CHAOS_S / 2:
                restarted = True
                self.chaos.append(f"restart {node.name}")
                self.cluster.kill(node)
                self.cluster.start(node)
            elif rng.random() < 0.3:
                self.chaos.append(f"pause {node.name}")
                assert node.proc is not None
                node.proc.send_signal(signal.SIGSTOP)
                self.stop.wait(rng.uniform(1.5, 5.0))
                node.proc.send_signal(signal.SIGCONT)
            elif pids := workers_of(node):
                victim = rng.choice(pids)
                try:
                    os.kill(victim, signal.SIGKILL)
                    self.chaos.append(f"kill a worker of {node.name}")
                except ProcessLookupError:
                    pass


def test_every_read_with_min_offset_holds_the_acknowledged_write_through_every_worker(cluster: Cluster) -> None:
    run = Run(cluster)
    threads = [threading.Thread(target=run.writer, args=(p,), daemon=True) for p in range(WRITERS)]
    threads.append(threading.Thread(target=run.nemesis, daemon=True))
    for t in threads:
        t.start()
    deadline = time.monotonic() + CHAOS_S
    while time.monotonic() < deadline and not run.missing:
        time.sleep(1.0)
    run.stop.set()
    for t in threads:
        t.join(timeout=30)
    print(f"\n{len(run.acked)} writes acknowledged, {run.reads} read back; chaos: {len(run.chaos)} "
          f"({sum('worker' in c for c in run.chaos)} worker kills, {sum('pause' in c for c in run.chaos)} pauses)")
    assert not run.missing, run.missing[:5]
    assert len(run.acked) > 100 and run.reads > 300, "too little was written and read to show anything"
    assert any("worker" in c for c in run.chaos) and any("restart" in c for c in run.chaos)
    # at rest: every node holds them all, through each of its workers (ten new connections a node: the
    # kernel spreads them over both)
    cluster.wait_ready(timeout=120)
    cluster.wait_for("every worker back on its port", lambda: all(serving(n) == WORKERS for n in cluster.nodes),
                     timeout=120)
    floor = max(run.acked.values())
    for node in cluster.nodes:
        for _ in range(10):
            channel, stub = fresh_stub(node)
            try:
                table = stub.ListKv(api_pb2.ListKvRequest(namespace="ryw", min_offset=floor),
                                    timeout=READ_TIMEOUT_S).table
            finally:
                channel.close()
            lost = sorted(k for k in run.acked if k not in table)
            assert not lost, f"{node.name} lacks {len(lost)} acknowledged writes at offset >= {floor}: {lost[:5]}"
