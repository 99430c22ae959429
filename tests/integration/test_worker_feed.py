"""A worker's replica fed over its core's Unix feed (nameserver/localfeed.py) instead of Log.Follow: the
socket is private, the worker follows over it, a link that carries garbage is closed with a logged reason on
either end and the replica reconnects, and a replica on the feed receives every entry in order across a core
SIGKILL and restart and a snapshot resend. The replicas here are built as a worker builds its own
(nameserver/worker.py: ReadReplica(..., feed=LocalFeed(...))), in the test's process so their entries can be
counted; the node is a real core process with a real worker."""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from bench.procnet import socket_inodes
from nameserver import framing, localfeed
from nameserver.config import NodeConfig
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.replica import ReadReplica
from raftlog.history import AppliedEntry
from tests.cluster import Cluster, NodeProc, register_request, retry, running

pytestmark = pytest.mark.cluster

SNAPSHOT_EVERY = 100  # small: a restarted core's history starts past a stopped replica's offset
MAX_MESSAGE = NodeConfig.max_message_bytes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("feed")), 1, worker_processes=1, snapshot_every_entries=SNAPSHOT_EVERY)
    with running(c) as c:
        yield c


def feed_path(c: Cluster, node: NodeProc) -> str:
    return localfeed.socket_path(os.path.join(c.root, f"{node.name}-data"))


class Received:
    """What a replica applied, in order: each entry's offset, and each snapshot's offset as a reset."""

    def __init__(self, replica: ReadReplica) -> None:
        self.events: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        replica.entry_listeners.append(self._entry)
        replica.reset_listeners.append(self._reset)

    def _entry(self, e: AppliedEntry) -> None:
        with self._lock:
            self.events.append(("entry", e.offset))

    def _reset(self, offset: int) -> None:
        with self._lock:
            self.events.append(("snapshot", offset))

    def entries_since_last_snapshot(self) -> tuple[int, list[int]]:
        with self._lock:
            events = list(self.events)
        last = max(i for i, (kind, _) in enumerate(events) if kind == "snapshot")
        return events[last][1], [offset for _, offset in events[last + 1:]]

    def entries_after(self, offset: int) -> list[int]:
        with self._lock:
            return [o for kind, o in self.events if kind == "entry" and o > offset]


def feed_replica(c: Cluster, node: NodeProc, name: str, path: str | None = None) -> ReadReplica:
    """A replica as a worker makes its own, on the core's feed (or on `path`)."""
    return ReadReplica(node.grpc_addr, grpc.insecure_channel, name=name,
                       feed=localfeed.LocalFeed(path or feed_path(c, node), MAX_MESSAGE))


def write(node: NodeProc, i: int, tag: str) -> int:
    if i % 2:
        req = register_request("FC", f"{tag}-b{i % 5}", f"10.2.{i % 5}.1:10911", [f"{tag}-t{i % 7}"], counter=i + 1)
        return retry(lambda: node.ns.RegisterBroker(req, timeout=10), timeout=60).offset
    kv = api_pb2.PutKvRequest(namespace=f"{tag}-ns", key=f"k{i % 11}", value=f"v{i}")
    return retry(lambda: node.ns.PutKv(kv, timeout=10), timeout=60).offset


def writes(node: NodeProc, count: int, tag: str) -> int:
    return max(write(node, i, tag) for i in range(count))


def log_offsets(node: NodeProc, after: int, upto: int) -> list[int]:
    """The offsets of the entries the core applied in (after, upto], from its history (ReadLog)."""
    stub = api_pb2_grpc.LogStub(node._channel())
    batches = retry(lambda: list(stub.ReadLog(api_pb2.ReadLogRequest(from_offset=after + 1, to_offset=upto),
                                              timeout=10)))
    return [e.offset for b in batches for e in b.entries]


def core_digest(node: NodeProc, offset: int) -> str:
    stub = api_pb2_grpc.LogStub(node._channel())
    return retry(lambda: stub.DigestAt(api_pb2.DigestAtRequest(offset=offset), timeout=10)).digest


def caught_up(replica: ReadReplica, offset: int) -> Callable[[], bool]:
    return lambda: replica.ready and replica.offset >= offset


def digest_of(replica: ReadReplica, offset: int) -> str | None:
    with replica.lock:
        return replica.state.kv.digest_at(offset)


def connected_feed_links(pid: int, path: str) -> int:
    """The connected sockets of process `pid` bound to the Unix path `path` (a listener's accepted links)."""
    inodes = socket_inodes(pid)
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(1 for r in rows if len(r) >= 8 and r[7] == path and r[5] == "03" and int(r[6]) in inodes)


def test_the_feed_socket_is_private_and_the_worker_follows_over_it(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.wait_ready()
    path = feed_path(cluster, node)
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert node.proc is not None
    cluster.wait_for("the worker's link on the core's feed", lambda: connected_feed_links(node.proc.pid, path) == 1)


class GarbageThenProxy:
    """A Unix socket that answers its first connections with garbage, one kind each, then passes every later
    one through to the core's feed: what a torn or corrupt link looks like to a worker's replica."""

    def __init__(self, path: str, core_feed: str, garbage: list[bytes]) -> None:
        self.path, self.core_feed, self.garbage = path, core_feed, list(garbage)
        self.sock = framing.listen_private(path)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                link, _ = self.sock.accept()
            except OSError:
                return
            if self.garbage:
                framing.read_frame(link, 64)  # the replica's request
                link.sendall(self.garbage.pop(0))
                link.close()
                continue
            core = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            core.connect(self.core_feed)
            for a, b in ((link, core), (core, link)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    framing.close(dst)


def test_garbage_on_the_feed_closes_the_link_with_a_reason_and_the_replica_reconnects(
        cluster: Cluster, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    node = cluster.nodes[0]
    cluster.wait_ready()
    top = writes(node, 4, "garbage")
    torn = framing.pack([[api_pb2.FollowMessage(core_offset=1).SerializeToString()]])
    garbage = [
        framing.pack([[b"\xff\xff not a FollowMessage"]]),       # a record that does not decode
        torn[:len(torn) - 3],                                      # a frame cut short
        (1 << 31).to_bytes(4, "big") + b"x" * 16,                  # a length past the bound
        framing.pack([[b"a", b"b", b"c"]]),                        # a record of the wrong shape
    ]
    proxy = GarbageThenProxy(str(tmp_path / "feed.sock"), feed_path(cluster, node), garbage)
    replica = feed_replica(cluster, node, "garbled", proxy.path)
    caplog.set_level(logging.WARNING, logger="nameserver.localfeed")
    replica.start()
    try:
        cluster.wait_for("the replica past the garbage", caught_up(replica, top), timeout=60)
        reasons = [r.getMessage() for r in caplog.records if "closing the link" in r.getMessage()]
        assert len(reasons) == 4, reasons
        for said in ("does not decode", "closed inside a frame", "past its", "of 3 fields"):
            assert any(said in r for r in reasons), (said, reasons)
        assert replica.reconnects >= 4
        assert digest_of(replica, replica.offset) == core_digest(node, replica.offset)
    finally:
        replica.stop()
        proxy.close()


def test_a_request_that_is_not_one_closes_the_link_and_the_core_keeps_feeding(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.wait_ready()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(feed_path(cluster, node))
        sock.sendall(framing.pack([[b"not an offset"]]))
        assert sock.recv(1) == b""  # closed, nothing sent
    cluster.wait_for("the core's reason",
                     lambda: "closing a worker's link: a feed request of the wrong shape" in cluster.logs())
    replica = feed_replica(cluster, node, "after-garbage")
    replica.start()
    try:
        top = writes(node, 2, "after")
        cluster.wait_for("a replica fed after it", caught_up(replica, top))
    finally:
        replica.stop()


@pytest.mark.slow
def test_a_replica_on_the_feed_gets_every_entry_in_order_across_a_core_kill_and_a_snapshot_resend(
        cluster: Cluster) -> None:
    c = cluster
    node = c.nodes[0]
    c.wait_ready()
    replica = feed_replica(c, node, "in-order")
    received = Received(replica)
    replica.start()
    try:
        top = writes(node, 30, "a")
        c.wait_for("caught up", caught_up(replica, top))
        loaded, got = received.entries_since_last_snapshot()
        assert got == log_offsets(node, loaded, replica.offset)  # every entry after its snapshot, in order
        assert digest_of(replica, top) == core_digest(node, top)

        # the core is killed under it and restarted: the replica resumes from its offset on the new core
        before = replica.offset
        c.kill(node, signal.SIGKILL)
        c.wait_for("the replica notices", lambda: not replica.ready, timeout=replica.max_silence_s + 10)
        c.start(node)
        c.wait_ready(timeout=120)
        top = writes(node, 30, "b")
        c.wait_for("caught up after the restart", caught_up(replica, top), timeout=60)
        assert replica.reconnects >= 1 and replica.bootstraps == 1  # resumed: no snapshot needed
        assert received.entries_after(before) == log_offsets(node, before, replica.offset)
        assert digest_of(replica, top) == core_digest(node, top)
        stopped_at = replica.offset
    finally:
        replica.stop()
    # More than a snapshot's worth of writes, then a restart: the core's history starts at its snapshot,
    # past the stopped replica's offset, so the feed sends it a snapshot again, then the entries after it.
    top = writes(node, 3 * SNAPSHOT_EVERY, "c")
    c.kill(node, signal.SIGKILL)
    c.start(node)
    c.wait_ready(timeout=120)
    replica.start()
    try:
        top = max(top, writes(node, 10, "d"))
        c.wait_for("caught up after the resend", caught_up(replica, top), timeout=60)
        assert replica.bootstraps == 2
        loaded, got = received.entries_since_last_snapshot()
        assert loaded > stopped_at
        assert got == log_offsets(node, loaded, replica.offset)
        assert digest_of(replica, top) == core_digest(node, top)
    finally:
        replica.stop()
