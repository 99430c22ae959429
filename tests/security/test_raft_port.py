"""The Raft port under attack, on a real 3-process cluster with a Raft password (raftlog/peerguard.py).

Attack 1 (issue 11, attack 3): clients without the password announce a 0x7fffffff-byte frame and
stream zeros, reconnecting whenever dropped, at every node and then at the leader alone. Attack 2:
a few hundred connections to one Raft port that never send a byte. Meanwhile a writer does one
write every 200 ms through the leader. Every write must be acknowledged within 2 s, the term (and
leader) must not change, each node's RSS must stay within RSS_GROWTH_BOUND of its level before the
flood, and (attack 2) every silent connection must be closed within the pre-authentication deadline.
Attack 3: 100 strangers per node keep every pre-authentication slot held (reconnecting whenever closed,
and leaving and coming back by themselves) while a follower is SIGKILLed and restarted: it must rejoin
within REJOIN_BOUND_S, with the writes' p99 under 2 s and no election.

Short by default (~15 s for the file); SECURITY_LONG=1 floods longer with more connections. Running
the cluster with RAFTLOG_PEERGUARD=off in the environment shows the unguarded behaviour (the test
then fails): see the numbers it prints with -s.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import selectors
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pysyncobj.pickle as pysyncobj_pickle
import pytest

from nameserver.pb import api_pb2
from raftlog.peerguard import MAX_PREAUTH_CONNECTIONS, PREAUTH_DEADLINE_S
from tests.cluster import Cluster, NodeProc, register_request, retry
from tests.security.attacks import threads

pytestmark = pytest.mark.cluster

LONG = os.environ.get("SECURITY_LONG") == "1"
FLOOD_S = 30.0 if LONG else 5.0
ATTACKERS_PER_NODE = 8 if LONG else 2
SILENT_CONNECTIONS = 1000 if LONG else 200
WRITE_EVERY_S = 0.2
WRITE_BOUND_S = 2.0
# The guard buffers at most 4 bytes of each attacker's frame (measured growth: under 1 MiB); the
# bound covers the writes themselves, gRPC and allocator noise. Unguarded, a node grew by 40-98 MiB
# in 10 s (limited only by how slowly its quadratic copying could take the zeros in).
RSS_GROWTH_BOUND = 64 << 20
HEADER = struct.pack("i", 0x7FFFFFFF)
ZEROS = bytes(64 << 10)


def rss(node: NodeProc) -> int:
    with open(f"/proc/{node.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_fds(node: NodeProc) -> int:
    return len(os.listdir(f"/proc/{node.proc.pid}/fd"))


def hostport(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


@dataclass
class Writer:
    """One write every WRITE_EVERY_S through `node`; records each write's latency (inf: failed)."""

    node: NodeProc
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    ran_s: float = 0.0  # how long it wrote: the flood's length, or less for an attack that ends by itself

    def run(self) -> None:
        i = 0
        start = time.monotonic()
        while not self.stop.is_set():
            self.ran_s = time.monotonic() - start
            i += 1
            t0 = time.monotonic()
            try:
                self.node.ns.PutKv(api_pb2.PutKvRequest(namespace="flood", key=f"k{i % 50}", value=f"v{i}"),
                                   timeout=10)
                self.latencies.append(time.monotonic() - t0)
            except grpc.RpcError as exc:
                self.latencies.append(float("inf"))
                self.errors.append(f"{exc.code()}: {exc.details()}")
            self.stop.wait(max(0.0, WRITE_EVERY_S - (time.monotonic() - t0)))


def flooder(addr: str, stop: threading.Event, stats: dict[str, int]) -> None:
    """Announce a 0x7fffffff-byte frame and stream zeros; reconnect whenever the node drops us."""
    while not stop.is_set():
        try:
            with socket.create_connection(hostport(addr), timeout=1.0) as sock:
                stats["connections"] += 1
                sock.sendall(HEADER)
                stats["bytes"] += 4
                while not stop.is_set():
                    sock.sendall(ZEROS)
                    stats["bytes"] += len(ZEROS)
        except OSError:
            stats["dropped"] += 1
            time.sleep(0.01)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("raftport")
    password = os.path.join(str(root), "raft.password")
    with open(password, "w") as f:
        f.write(secrets.token_urlsafe(24))
    os.chmod(password, 0o600)
    c = Cluster(str(root), 3, security={"raft": {"password_file": password}})
    c.start()
    try:
        leader = c.wait_ready(timeout=60)
        reply = retry(lambda: leader.ns.RegisterBroker(register_request(
            "RaftPortCluster", "rp-0", "10.80.0.1:10911", ["RaftPortTopic"]), timeout=10))
        assert reply.offset > 0
        c.wait_converged()
        yield c
    finally:
        c.stop(wait=False)  # the nodes shut down while the next test starts


def run_with_writer(cluster: Cluster, attack: callable, seconds: float) -> tuple[Writer, dict[str, int], NodeProc]:
    """Run `attack(stop)` for `seconds`, or until it returns by itself, with a writer through the leader;
    returns the writer's record, the peak RSS growth of each node, and the leader. Asserts nothing."""
    leader = cluster.wait_ready(timeout=30)
    before = {n.name: rss(n) for n in cluster.nodes}
    writer = Writer(leader)
    wt = threading.Thread(target=writer.run, daemon=True)
    wt.start()
    stop = threading.Event()
    attack_thread = threading.Thread(target=attack, args=(stop,), daemon=True)
    attack_thread.start()
    peak = dict(before)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and attack_thread.is_alive():
        for n in cluster.nodes:
            with contextlib.suppress(OSError, AssertionError):  # attack 3 kills one: no /proc, or no VmRSS
                peak[n.name] = max(peak[n.name], rss(n))
        time.sleep(0.25)
    stop.set()
    attack_thread.join(timeout=30)
    time.sleep(0.5)  # a write or two after the flood
    writer.stop.set()
    wt.join(timeout=15)
    growth = {name: peak[name] - before[name] for name in before}
    return writer, growth, leader


def report(what: str, writer: Writer, growth: dict[str, int], extra: str = "") -> None:
    lat = sorted(writer.latencies)
    ok = [x for x in lat if x != float("inf")]
    print(f"\n[{what}] writes={len(lat)} failed={len(lat) - len(ok)} "
          f"p50={ok[len(ok) // 2] * 1000 if ok else float('nan'):.0f}ms max={lat[-1] * 1000 if lat else 0:.0f}ms "
          f"rss growth MiB={ {k: round(v / 2**20, 1) for k, v in growth.items()} } {extra}")


def assert_healthy(cluster: Cluster, writer: Writer, growth: dict[str, int], terms: dict[str, int],
                   leader: NodeProc) -> None:
    # half the writes it had time for (the silent-connection attack ends in ~5 s, not FLOOD_S)
    assert len(writer.latencies) >= writer.ran_s / WRITE_EVERY_S / 2, \
        f"the writer hardly ran: {len(writer.latencies)} writes in {writer.ran_s:.1f} s"
    slow = [x for x in writer.latencies if x > WRITE_BOUND_S]
    assert not slow, f"{len(slow)} of {len(writer.latencies)} writes took over {WRITE_BOUND_S}s " \
                     f"(max {max(slow)}s; errors {writer.errors[:3]})"
    after = cluster.statuses()
    assert all(s is not None for s in after), cluster.logs()
    assert {n.name: s.term for n, s in zip(cluster.nodes, after, strict=True)} == terms, "the term changed"
    assert {s.leader_id for s in after} == {leader.raft_addr}, "the leader changed"
    for name, grew in growth.items():
        assert grew < RSS_GROWTH_BOUND, f"{name}'s RSS grew by {grew / 2**20:.0f} MiB"


def terms_now(cluster: Cluster) -> dict[str, int]:
    sts = cluster.statuses()
    assert all(s is not None for s in sts)
    return {n.name: s.term for n, s in zip(cluster.nodes, sts, strict=True)}


# Flooding only the leader is the "all" case's leader part; make test runs "all", make test-slow both.
@pytest.mark.parametrize("target", ["all", pytest.param("leader", marks=pytest.mark.slow)])
def test_oversized_frame_flood_keeps_writes_and_leadership(cluster: Cluster, target: str) -> None:
    leader = cluster.wait_ready(timeout=30)
    terms = terms_now(cluster)
    victims = cluster.nodes if target == "all" else [leader]
    stats = {"connections": 0, "bytes": 0, "dropped": 0}

    def attack(stop: threading.Event) -> None:
        threads = [threading.Thread(target=flooder, args=(n.raft_addr, stop, stats), daemon=True)
                   for n in victims for _ in range(ATTACKERS_PER_NODE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    writer, growth, writer_leader = run_with_writer(cluster, attack, FLOOD_S)
    report(f"flood {target}", writer, growth, f"attack={stats}")
    assert writer_leader is leader
    assert stats["connections"] > len(victims) * ATTACKERS_PER_NODE, "the nodes never dropped an attacker"
    assert_healthy(cluster, writer, growth, terms, leader)


def test_silent_connections_are_closed_within_the_preauth_deadline(cluster: Cluster) -> None:
    leader = cluster.wait_ready(timeout=30)
    terms = terms_now(cluster)
    fds_before = open_fds(leader)
    closed_after: dict[int, float] = {}
    opened = {"n": 0, "refused": 0}
    peak_fds = [fds_before]

    def attack(stop: threading.Event) -> None:
        sel = selectors.DefaultSelector()
        socks: dict[int, tuple[socket.socket, float, int]] = {}  # fd -> socket, opened at, its number

        def collect(timeout: float) -> None:
            for key, _ in sel.select(timeout=timeout):
                s, t0, n = socks.pop(key.fd)
                try:
                    data = s.recv(1)
                except OSError:
                    data = b""
                assert data == b"", "a silent client was sent data"
                closed_after[n] = time.monotonic() - t0  # (its fd number is reused)
                sel.unregister(s)
                s.close()

        for _ in range(SILENT_CONNECTIONS):
            try:
                s = socket.create_connection(hostport(leader.raft_addr), timeout=3.0)
            except OSError:
                opened["refused"] += 1
                continue
            opened["n"] += 1
            s.setblocking(False)
            socks[s.fileno()] = (s, time.monotonic(), opened["n"])
            sel.register(s, selectors.EVENT_READ)
            collect(0)  # closes seen as they come, not once all are open (1000 take over a second here)
            if opened["n"] % 25 == 0:
                peak_fds[0] = max(peak_fds[0], open_fds(leader))
        while socks and not stop.is_set():
            collect(0.1)
            peak_fds[0] = max(peak_fds[0], open_fds(leader))
        for s, _, _ in socks.values():
            s.close()

    seconds = PREAUTH_DEADLINE_S + (4.0 if not LONG else 10.0)  # at most: the attack ends once all are closed
    writer, growth, _ = run_with_writer(cluster, attack, seconds)
    at_once = sum(1 for v in closed_after.values() if v < 1.0)
    report("silent", writer, growth, f"opened={opened} closed={len(closed_after)} closed within 1 s={at_once} "
           f"max close after={max(closed_after.values(), default=0):.2f}s fds before={fds_before} "
           f"peak={peak_fds[0]} after={open_fds(leader)}")
    assert opened["n"] + opened["refused"] == SILENT_CONNECTIONS
    assert len(closed_after) == opened["n"], f"{opened['n'] - len(closed_after)} silent connections still open"
    # closed within the deadline (plus the sweep's period and scheduling slack), and never more than the cap
    # held at once: each newcomer past MAX_PREAUTH_CONNECTIONS evicts the oldest stranger, the rest wait in
    # the kernel's accept queue (not the node's descriptors). How many are closed within 1 s is not bounded:
    # the node accepts one connection per tick, so a flood of 1000 waits to be accepted (and to evict one
    # another) longer than 200 do; taking more per tick shortens a member's time to key likewise (a
    # restarted member rejoined in 5-17 s instead of 4-7 s in test_strangers..., side by side).
    assert max(closed_after.values()) < PREAUTH_DEADLINE_S + 1.5
    assert peak_fds[0] <= fds_before + MAX_PREAUTH_CONNECTIONS + 8, f"{peak_fds[0] - fds_before} descriptors held"
    assert open_fds(leader) <= fds_before + 5
    assert_healthy(cluster, writer, growth, terms, leader)


# ---- attack 3: strangers hold every pre-authentication slot while a member restarts -----------------

STRANGERS_PER_NODE = 100  # over MAX_PREAUTH_CONNECTIONS: every slot is held, and more wait to reconnect
# A killed follower is back (ready, following the same leader, applied up to the leader's commit at its
# restart) in about 1 s here without strangers (a new process loads its snapshot and journal), 1.7-2.9 s
# with them. When a full node refused the newcomer instead of evicting an unkeyed stranger, it took 9 s,
# 17 s, or not within 18 s: it got in only when it won the race for a freed slot.
REJOIN_BOUND_S = 6.0
THREAD_BOUND = 40  # strangers cost no thread (the tick thread's poller holds them): a node runs ~25


def stranger_pool(addr: str, count: int, stop: threading.Event, stats: dict[str, int]) -> None:
    """Keep `count` connections open to `addr` that never send a byte. Each is opened again as soon as the
    node closes it, and each also leaves by itself after a random time below the pre-authentication deadline
    and comes straight back: slots free up all the time, not only at the node's deadline sweeps, and a
    freed slot goes to whoever connects first. While the node is down, every 50 ms."""
    sel = selectors.DefaultSelector()
    leaves_at: dict[socket.socket, float] = {}
    rng = random.Random(addr)

    def close(s: socket.socket) -> None:
        sel.unregister(s)
        leaves_at.pop(s, None)
        s.close()

    try:
        while not stop.is_set():
            while len(leaves_at) < count and not stop.is_set():
                try:
                    s = socket.create_connection(hostport(addr), timeout=1.0)
                except OSError:
                    stats["refused"] += 1
                    stop.wait(0.05)
                    break
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
                leaves_at[s] = time.monotonic() + rng.uniform(0.5, PREAUTH_DEADLINE_S)
                stats["connections"] += 1
            for key, _ in sel.select(timeout=0.02):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(1)
                except OSError:
                    data = b""
                if data:
                    stats["sent_data"] += 1  # a stranger must never be told anything
                stats["closed"] += 1
                close(s)
            now = time.monotonic()
            for s in [s for s, t in leaves_at.items() if t <= now]:
                close(s)
    finally:
        for s in list(leaves_at):
            close(s)
        sel.close()


def rejoined(cluster: Cluster, node: NodeProc, leader: NodeProc, offset: int) -> bool:
    st = node.status()
    return (st is not None and st.ready and st.leader_id == leader.raft_addr and st.apply_offset >= offset
            and st.has_quorum)


def test_strangers_holding_preauth_slots_do_not_lock_out_a_restarted_member(cluster: Cluster) -> None:
    leader = cluster.wait_ready(timeout=30)
    cluster.wait_converged()
    terms = terms_now(cluster)
    # pysyncobj links a pair from the greater address: prefer a member the leader dials, so that the member
    # is reached only through its own port, flooded from the moment it listens
    followers = sorted((n for n in cluster.nodes if n is not leader), key=lambda n: n.raft_addr)
    member = followers[0]
    peak_threads = {n.name: 0 for n in cluster.nodes}
    stats = {"connections": 0, "refused": 0, "closed": 0, "sent_data": 0}
    took: list[float] = []

    def attack(stop: threading.Event) -> None:
        pools = [threading.Thread(target=stranger_pool, args=(n.raft_addr, STRANGERS_PER_NODE, stop, stats),
                                  daemon=True) for n in cluster.nodes]
        for t in pools:
            t.start()
        stop.wait(2.0)  # every slot held on every node
        cluster.kill(member)
        stop.wait(0.5)
        commit = leader.status(timeout=5)
        assert commit is not None
        t0 = time.monotonic()
        cluster.start(member)
        while not stop.is_set() and not rejoined(cluster, member, leader, commit.commit_offset):
            for n in cluster.nodes:
                if n.alive:
                    peak_threads[n.name] = max(peak_threads[n.name], threads(n))
            time.sleep(0.1)
        if not stop.is_set():
            took.append(time.monotonic() - t0)
        stop.wait(1.0)  # writes with the member back, strangers still at it
        stop.set()
        for t in pools:
            t.join()

    writer, growth, writer_leader = run_with_writer(cluster, attack, 2.5 + REJOIN_BOUND_S * 3)
    report("strangers + restart", writer, growth,
           f"rejoined after={took} dialled by the leader={leader.raft_addr > member.raft_addr} "
           f"attack={stats} threads={peak_threads}")
    assert writer_leader is leader
    assert took, f"the member did not rejoin within {REJOIN_BOUND_S * 3:.0f} s\n{cluster.logs()}"
    assert took[0] < REJOIN_BOUND_S, f"the member rejoined after {took[0]:.1f} s (bound {REJOIN_BOUND_S} s)"
    assert stats["connections"] > len(cluster.nodes) * STRANGERS_PER_NODE, "no stranger was ever closed"
    assert stats["sent_data"] == 0, "a stranger was sent data"
    with open(leader.log_path, errors="replace") as f:  # the node says why it closed them (rate-limited)
        assert "evicted for a newer connection" in f.read()
    for name, n in peak_threads.items():
        assert n < THREAD_BOUND, f"{name} ran {n} threads"
    p99 = sorted(writer.latencies)[int(len(writer.latencies) * 0.99)]
    assert p99 < WRITE_BOUND_S, f"p99 write {p99:.2f} s ({writer.errors[:3]})"
    after = cluster.statuses()
    assert all(s is not None for s in after), cluster.logs()
    # no election: the follower's restart is not one, and nobody else's term moved
    assert {n.name: s.term for n, s in zip(cluster.nodes, after, strict=True)} == terms, "the term changed"
    assert {s.leader_id for s in after} == {leader.raft_addr}, "the leader changed"
    for name, grew in growth.items():
        if name != member.name:  # a new process: its growth from the killed one's level means nothing
            assert grew < RSS_GROWTH_BOUND, f"{name}'s RSS grew by {grew / 2**20:.0f} MiB"


def raft_frame(message: object) -> bytes:
    """One message as pysyncobj frames it on a cluster without a Raft password: a length, zlib, a pickle."""
    data = zlib.compress(pysyncobj_pickle.dumps(message), 3)
    return struct.pack("i", len(data)) + data


def test_a_link_opened_with_a_raft_request_instead_of_an_address_is_closed(tmp_path: Any) -> None:
    """docs/faults.md, finding 12: a first message on an incoming Raft connection that is a Raft request
    (a dict), not the dialer's address, made pysyncobj raise TypeError on the tick thread for every
    message of that connection. It is closed instead, with one log line."""
    c = Cluster(str(tmp_path), 1)
    c.start()
    try:
        node = c.wait_ready(timeout=60)
        closed_after: list[float] = []
        for _ in range(3):
            with socket.create_connection(hostport(node.raft_addr), timeout=5.0) as sock:
                sock.sendall(raft_frame({"type": "append_entries", "term": 1}) * 3)
                t0 = time.monotonic()
                sock.settimeout(5.0)
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(1) == b"", "the node answered a link that never said who it is"
                closed_after.append(time.monotonic() - t0)
        assert max(closed_after) < 2.0, f"the links stayed open for {closed_after} s"
        reply = node.ns.PutKv(api_pb2.PutKvRequest(namespace="raftport", key="k", value="v"), timeout=10)
        assert reply.offset > 0
        with open(node.log_path, errors="replace") as f:
            logged = f.read()
        assert "TypeError" not in logged and "failed _onTick" not in logged, logged[-3000:]
        assert logged.count("not the dialer's address") == 1, "one log line for the three links (rate-limited)"
    finally:
        c.stop(wait=False)  # the nodes shut down while the next test starts
