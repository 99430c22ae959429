"""raftlog/peerguard.py in-process: real sockets against real pysyncobj nodes using the guarded transport."""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator

import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.poller
import pysyncobj.tcp_server
import pysyncobj.transport
import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.encryptor import getEncryptor

from raftlog import binding, peerguard
from raftlog.peerguard import GuardedTcpConnection, GuardedTcpServer, GuardedTransport
from tests.cluster import free_ports

PASSWORD = "peerguard-test-password"

binding.install()  # the guarded connections, as the first RaftNode installs them in the product


class Store(SyncObj):
    # Generous Raft timeouts: the nodes of these tests share one process (one GIL), and pysyncobj's
    # tick thread spends about a second pickling, compressing and encrypting a 10 MiB entry for each
    # follower; with the defaults that alone starts elections (guard or not).
    def __init__(self, addr: str, partners: list[str], password: str | None) -> None:
        conf = SyncObjConf(password=password, connectionRetryTime=0.5, raftMinTimeout=3.0, raftMaxTimeout=6.0,
                           connectionTimeout=15.0)
        super().__init__(addr, partners, conf=conf, transportClass=GuardedTransport)
        self.sizes: list[int] = []
        self.last: bytes = b""

    @replicated
    def put(self, data: bytes) -> None:
        self.sizes.append(len(data))
        self.last = data[:64]


@pytest.fixture
def make_nodes() -> Iterator[Callable[..., list[Store]]]:
    made: list[Store] = []

    def make(count: int = 1, password: str | None = PASSWORD) -> list[Store]:
        addrs = [f"127.0.0.1:{p}" for p in free_ports(count)]
        nodes = [Store(a, [b for b in addrs if b != a], password) for a in addrs]
        made.extend(nodes)
        for n in nodes:
            n.waitBinded()
        return nodes

    yield make
    for n in made:
        n.destroy_synchronous()


def transport(node: Store) -> GuardedTransport:
    return node._SyncObj__transport


def port(node: Store) -> tuple[str, int]:
    host, p = node.selfNode.address.rsplit(":", 1)
    return host, int(p)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the node closed `sock` (EOF or reset), or None if it stayed open that long."""
    t0 = time.monotonic()
    sock.settimeout(0.05)
    while time.monotonic() - t0 < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def put_together(leader: Store, items: list[bytes]) -> None:
    """Propose `items` within one tick so pysyncobj sends them in ONE append_entries frame.

    (pysyncobj splits a lone entry of 64 KiB or more into 64 KiB pieces, but a batch is the entries
    from nextIndex up to and including the one that crosses 64 KiB: a small entry then a big one
    travel whole, in one frame.)"""
    done = threading.Event()

    def once() -> None:
        if not done.is_set():
            done.set()
            for item in items:
                leader.put(item, sync=False)

    leader.addOnTickCallback(once)
    assert done.wait(5)
    leader.removeOnTickCallback(once)


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_binding_installs_the_guard() -> None:
    assert peerguard.ENABLED
    assert pysyncobj.tcp_server.TcpConnection is GuardedTcpConnection
    assert pysyncobj.transport.TcpConnection is GuardedTcpConnection
    assert pysyncobj.transport.TcpServer is GuardedTcpServer


@pytest.mark.parametrize("length", [0x7FFFFFFF, peerguard.PREAUTH_MAX_FRAME + 1, -1, -0x80000000])
def test_oversize_or_negative_length_is_dropped_before_the_body(make_nodes, length: int, caplog) -> None:
    (node,) = make_nodes(1)
    caplog.set_level(logging.WARNING, logger="raftlog.peerguard")
    with socket.create_connection(port(node), timeout=2) as sock:
        sock.sendall(struct.pack("i", length))
        try:
            for _ in range(64):
                sock.sendall(bytes(64 << 10))  # zeros; a reset ends it
        except OSError:
            pass
        assert closed_within(sock, 2.0) is not None
    assert transport(node).warner.counts == {"preauth-frame": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "127.0.0.1:" in lines[0] and str(length) in lines[0]


def test_without_a_password_only_the_frame_limit_applies(make_nodes) -> None:
    (node,) = make_nodes(1, password=None)
    with socket.create_connection(port(node), timeout=2) as silent, \
            socket.create_connection(port(node), timeout=2) as big:
        big.sendall(struct.pack("i", peerguard.MAX_FRAME + 1))
        assert closed_within(big, 2.0) is not None
        # a legal (if large) frame length is buffered, and a silent connection is left alone
        with socket.create_connection(port(node), timeout=2) as legal:
            legal.sendall(struct.pack("i", 1 << 20) + bytes(1000))
            assert closed_within(legal, 0.5) is None
        assert closed_within(silent, 0.5) is None
    assert transport(node).warner.counts == {"frame-size": 1}


def test_preauth_budget(make_nodes, monkeypatch) -> None:
    # With the defaults the budget is a backstop: a connection is read one frame at a time before it
    # authenticates and the first frame that does not decrypt drops it. Shrink it to see it act.
    monkeypatch.setattr(peerguard, "PREAUTH_BUDGET", 100)
    (node,) = make_nodes(1)
    with socket.create_connection(port(node), timeout=2) as sock:
        sock.sendall(struct.pack("i", 200) + bytes(80))  # 84 bytes: within the budget
        assert closed_within(sock, 0.3) is None
        sock.sendall(bytes(40))  # 124
        assert closed_within(sock, 2.0) is not None
    assert transport(node).warner.counts == {"preauth-budget": 1}


def test_undecryptable_first_frame_is_dropped(make_nodes) -> None:
    (node,) = make_nodes(1)
    with socket.create_connection(port(node), timeout=2) as sock:
        sock.sendall(struct.pack("i", 300) + bytes(300))
        assert closed_within(sock, 2.0) is not None
    assert transport(node).warner.counts == {"preauth-bad-frame": 1}


def test_preauth_deadline_closes_silent_and_trickling_connections(make_nodes, monkeypatch) -> None:
    monkeypatch.setattr(peerguard, "PREAUTH_DEADLINE_S", 0.5)
    monkeypatch.setattr(peerguard, "SWEEP_EVERY_S", 0.05)
    (node,) = make_nodes(1)
    silent = socket.create_connection(port(node), timeout=2)
    trickle = socket.create_connection(port(node), timeout=2)
    try:
        t0 = time.monotonic()
        wait_until(lambda: transport(node).preauth_connections == 2, 2.0, "both accepted")
        header = struct.pack("i", 100)
        for i in range(4):  # the header a byte at a time, then the body slowly: never a complete frame
            trickle.sendall(header[i:i + 1])
            time.sleep(0.05)
        for _ in range(20):
            try:
                trickle.sendall(b"\0")
            except OSError:
                break
            time.sleep(0.05)
        assert closed_within(silent, 2.0) is not None
        assert closed_within(trickle, 2.0) is not None
        assert time.monotonic() - t0 < 0.5 + 1.0
    finally:
        silent.close()
        trickle.close()
    assert transport(node).warner.counts == {"preauth-deadline": 2}
    assert transport(node).preauth_connections == 0
    assert not transport(node)._unknownConnections


def test_connection_cap_evicts_the_oldest_stranger(make_nodes, monkeypatch) -> None:
    monkeypatch.setattr(peerguard, "MAX_PREAUTH_CONNECTIONS", 3)
    (node,) = make_nodes(1)
    socks = []
    try:
        for _ in range(5):
            socks.append(socket.create_connection(port(node), timeout=2))
            time.sleep(0.05)  # accepted in this order
        wait_until(lambda: transport(node).warner.counts.get("preauth-evicted") == 2, 2.0, "two evicted")
        assert transport(node).preauth_connections == 3
        assert [closed_within(s, 0.3) is not None for s in socks] == [True, True, False, False, False]
        # freeing a slot (the client leaves) admits the next one without evicting anyone
        socks[2].close()
        wait_until(lambda: transport(node).preauth_connections == 2, 2.0, "a slot freed")
        extra = socket.create_connection(port(node), timeout=2)
        socks.append(extra)
        wait_until(lambda: transport(node).preauth_connections == 3, 2.0, "the next one admitted")
        assert closed_within(extra, 0.3) is None
        assert transport(node).warner.counts == {"preauth-evicted": 2}
    finally:
        for s in socks:
            s.close()


def first_frame() -> bytes:
    """What a member sends first on a connection it dials: its random key, encrypted with the password."""
    data = zlib.compress(pysyncobj_pickle.dumps(os.urandom(32)), 3)
    encrypted = getEncryptor(PASSWORD).encrypt_at_time(data, int(time.monotonic()))
    return struct.pack("i", len(encrypted)) + encrypted


def keyed(sock: socket.socket) -> None:
    """Send the first frame and wait for the node's key in reply: the connection has keyed."""
    sock.sendall(first_frame())
    sock.settimeout(2)
    assert len(sock.recv(4)) == 4


def test_a_keyed_connection_is_not_evicted_by_strangers(make_nodes, monkeypatch) -> None:
    monkeypatch.setattr(peerguard, "MAX_PREAUTH_CONNECTIONS", 3)
    (node,) = make_nodes(1)
    member = socket.create_connection(port(node), timeout=2)
    strangers = []
    try:
        keyed(member)
        for _ in range(10):
            strangers.append(socket.create_connection(port(node), timeout=2))
        wait_until(lambda: transport(node).warner.counts.get("preauth-evicted") == 8, 2.0, "8 evicted")
        assert closed_within(member, 0.3) is None
        assert sum(closed_within(s, 0.3) is None for s in strangers) == 2
        assert transport(node).preauth_connections == 3
    finally:
        member.close()
        for s in strangers:
            s.close()


def test_replayed_keys_hold_slots_only_for_the_grace(make_nodes, monkeypatch) -> None:
    # a valid first frame proves nothing (it may be replayed): once it keyed a connection over
    # KEYED_GRACE_S ago without the handshake completing, a newcomer may take its slot
    monkeypatch.setattr(peerguard, "MAX_PREAUTH_CONNECTIONS", 2)
    monkeypatch.setattr(peerguard, "KEYED_GRACE_S", 0.5)
    (node,) = make_nodes(1)
    replays = [socket.create_connection(port(node), timeout=2) for _ in range(2)]
    late = []
    try:
        for s in replays:
            keyed(s)
        late.append(socket.create_connection(port(node), timeout=2))  # every slot keyed just now: refused
        assert closed_within(late[0], 1.0) is not None
        assert transport(node).warner.counts == {"preauth-connections": 1}
        time.sleep(0.6)
        late.append(socket.create_connection(port(node), timeout=2))  # past the grace: evicts the oldest
        assert closed_within(replays[0], 1.0) is not None
        assert closed_within(late[1], 0.3) is None and closed_within(replays[1], 0.01) is None
        assert transport(node).warner.counts == {"preauth-connections": 1, "preauth-evicted": 1}
    finally:
        for s in replays + late:
            s.close()


# Slow (make test-slow): three in-process nodes share one GIL, and after the whole unit suite it timed
# out once in 14 runs while waiting for every node to apply the 10 MiB entry; it passes alone.
@pytest.mark.slow
def test_authenticated_peers_replicate_a_10_mib_entry_past_the_deadline(make_nodes, monkeypatch) -> None:
    monkeypatch.setattr(peerguard, "PREAUTH_DEADLINE_S", 0.5)
    monkeypatch.setattr(peerguard, "SWEEP_EVERY_S", 0.05)
    nodes = make_nodes(3)
    wait_until(lambda: any(n._isLeader() for n in nodes) and all(n.isReady() for n in nodes), 30, "a leader")
    leader = next(n for n in nodes if n._isLeader())
    time.sleep(1.0)  # well past the pre-authentication deadline
    # incompressible: pickled (protocol 2 inflates bytes >= 0x80) and encrypted, a ~19.6 MiB frame
    big = os.urandom(10 << 20)
    t0 = time.monotonic()
    put_together(leader, [b"small", big])
    wait_until(lambda: all(n.sizes == [5, 10 << 20] for n in nodes), 60, "every node applied it")
    took = time.monotonic() - t0
    assert all(n.last == big[:64] for n in nodes)
    for n in nodes:
        assert transport(n).warner.counts == {}, transport(n).warner.counts
        assert transport(n).preauth_connections == 0
    assert took < 30, took


def test_the_frame_limit_applies_to_authenticated_peers(make_nodes, monkeypatch) -> None:
    monkeypatch.setattr(peerguard, "MAX_FRAME", 1 << 20)
    nodes = make_nodes(2)
    wait_until(lambda: any(n._isLeader() for n in nodes) and all(n.isReady() for n in nodes), 30, "a leader")
    leader = next(n for n in nodes if n._isLeader())
    follower = next(n for n in nodes if n is not leader)
    put_together(leader, [b"x", os.urandom(2 << 20)])  # one frame of ~4 MiB
    wait_until(lambda: transport(follower).warner.counts.get("frame-size", 0) >= 1, 10, "the frame refused")
    assert (2 << 20) not in follower.sizes


def test_every_raft_connection_has_a_tcp_user_timeout(make_nodes) -> None:
    """Dialled and accepted links abort when sent data stays unacknowledged (no backed-off silence after a heal)."""
    nodes = make_nodes(2)
    wait_until(lambda: all(n.isReady() for n in nodes), 30, "both nodes connected")
    for n in nodes:
        links = list(transport(n)._connections.values())
        assert links
        for conn in links:
            sock = conn._TcpConnection__socket
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == peerguard.RAFT_TCP_USER_TIMEOUT_MS


def test_frames_go_out_at_the_transports_compress_level(make_nodes, monkeypatch) -> None:
    """raft.wire_compress_level reaches the wire: 2 MiB of one byte repeated is ~2 KiB at pysyncobj's level
    3, and a 2 MiB frame at level 0 (zlib's stored blocks), seen by the follower's frame limit."""
    monkeypatch.setattr(peerguard, "MAX_FRAME", 1 << 20)
    nodes = make_nodes(2)
    wait_until(lambda: any(n._isLeader() for n in nodes) and all(n.isReady() for n in nodes), 30, "a leader")
    leader = next(n for n in nodes if n._isLeader())
    follower = next(n for n in nodes if n is not leader)
    assert transport(leader).compress_level == peerguard.PYSYNCOBJ_COMPRESS_LEVEL
    put_together(leader, [b"x", b"a" * (2 << 20)])
    wait_until(lambda: (2 << 20) in follower.sizes, 10, "the compressed frame applied")
    transport(leader).compress_level = 0
    put_together(leader, [b"y", b"b" * (2 << 20)])
    wait_until(lambda: transport(follower).warner.counts.get("frame-size", 0) >= 1, 10, "the stored frame refused")
    assert follower.sizes.count(2 << 20) == 1


@pytest.mark.parametrize("size", [0, 1, 85, 0xFFFF, 0x10000, 0x1FFFE, 0x1FFFF, 300_000])
def test_a_level_0_stream_is_built_without_deflate_and_any_zlib_reads_it(size: int, monkeypatch) -> None:
    """zlib.compress sets up a ~256 KiB deflate state for every frame, even at level 0 (and where malloc hands
    those pages back at every free, ~60 us of page faults a message). The stream is stored blocks built here."""
    data = os.urandom(size)

    def no_deflate(*_args: object) -> bytes:
        raise AssertionError("zlib.compress called at level 0")

    monkeypatch.setattr(peerguard.zlib, "compress", no_deflate)
    stream = peerguard.zlib_stream(data, 0)
    monkeypatch.undo()
    assert zlib.decompress(stream) == data
    assert zlib.decompressobj().decompress(stream) == data
    assert peerguard.zlib_stream(data, 3) == zlib.compress(data, 3)


def test_a_frame_carries_pickle_protocol_4_at_the_connection_s_level() -> None:
    """What one send() puts on the wire: the length, then a zlib stream of the message pickled with protocol 4
    (protocol 2, pysyncobj's, stored bytes as latin-1 text rebuilt by a call on load); pysyncobj's reader
    takes it."""
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        conn = GuardedTcpConnection(poller=pysyncobj.poller.createPoller("auto"), socket=ours, timeout=10.0)
        message = {"type": "append_entries", "entries": [(b"\x00\xff" * 700, 12, 3)], "term": 3}
        conn.send(message)
        theirs.settimeout(5)
        head = theirs.recv(4, socket.MSG_WAITALL)
        (length,) = struct.unpack("i", head)
        body = theirs.recv(length, socket.MSG_WAITALL)
        raw = zlib.decompress(body)
        assert raw[:2] == b"\x80\x04"
        assert pysyncobj_pickle.loads(raw) == message
        assert len(body) < 1600  # the entry's 1400 bytes as they are, not 2100 as latin-1 text
    finally:
        ours.close()
        theirs.close()


def test_a_coalescing_transport_writes_a_pass_s_frames_together_at_its_flush() -> None:
    """The binding's transport holds a connection's frames until the tick's flush: the commit index's append and
    the next entry's (or a follower's answers to both) leave in one send() and wake the peer once. A big frame
    goes at once, with whatever waited before it."""
    from types import SimpleNamespace

    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        theirs.setblocking(False)
        conn = GuardedTcpConnection(poller=pysyncobj.poller.createPoller("auto"), socket=ours, timeout=10.0)
        owner = SimpleNamespace(coalesce=True, _unsent={}, compress_level=0)
        conn._pg_owner = owner  # type: ignore[assignment]
        conn.send({"type": "append_entries", "n": 1})
        conn.send({"type": "append_entries", "n": 2})
        with pytest.raises(BlockingIOError):
            theirs.recv(1 << 20)
        GuardedTransport.flush(owner)  # type: ignore[arg-type]
        assert owner._unsent == {}
        data = theirs.recv(1 << 20)
        frames = []
        while data:
            (length,) = struct.unpack_from("i", data)
            frames.append(pysyncobj_pickle.loads(zlib.decompress(data[4:4 + length])))
            data = data[4 + length:]
        assert [f["n"] for f in frames] == [1, 2]
        conn.send({"type": "append_entries", "n": 3})
        conn.send({"type": "append_entries", "n": 4, "data": b"x" * peerguard.COALESCE_MAX_BYTES})
        got = b""
        deadline = time.monotonic() + 5
        while len(got) < peerguard.COALESCE_MAX_BYTES and time.monotonic() < deadline:
            try:
                got += theirs.recv(1 << 20)
            except BlockingIOError:
                conn.flush()
        assert len(got) > peerguard.COALESCE_MAX_BYTES  # both went without a flush of the transport's
    finally:
        ours.close()
        theirs.close()
