"""raftlog end to end inside one process: three pysyncobj nodes on loopback over a KVState.

Covers group commit, offsets, barrier, the async snapshot handshake with pysyncobj, and a follower
catching up from a snapshot after the leader compacted its log.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time

import pytest

from raftlog.kvstate import KVState, KVStateMachine
from raftlog.log import LogConfig, ReplicatedLog
from raftlog.pb import entry_pb2
from raftlog.roles import Role
from snapshot import SnapshotStore
from tests.cluster import free_ports


def put(key: str, value: str) -> entry_pb2.Batch:
    return entry_pb2.Batch(records=[entry_pb2.Record(type=1, key=key, value=value.encode())])


class Node:
    def __init__(self, addr: str, partners: list[str], root, **kw) -> None:
        self.addr, self.partners, self.root, self.kw = addr, partners, root, kw
        self.start()

    def start(self) -> None:
        self.kv = KVState()
        self.lock = threading.RLock()
        cfg = LogConfig(self_addr=self.addr, partners=self.partners, data_dir=str(self.root / "raft"), **self.kw)
        self.log = ReplicatedLog(cfg, KVStateMachine(self.kv), SnapshotStore(str(self.root / "snaps")), self.lock)

    def close(self) -> None:
        self.log.close()


def wait_for(cond, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = cond()
        if r:
            return r
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def trio(tmp_path):
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    nodes = [Node(a, [b for b in addrs if b != a], tmp_path / f"n{i}", snapshot_every_entries=40)
             for i, a in enumerate(addrs)]
    yield nodes
    for n in nodes:
        with contextlib.suppress(Exception):
            n.close()


def leader_of(nodes):
    return wait_for(lambda: next((n for n in nodes if n.log.is_leader() and n.log.ready), None))


def test_writes_replicate_with_equal_digests_and_offsets(trio) -> None:
    leader = leader_of(trio)
    results = []

    def writer(i: int) -> None:
        results.append(leader.log.propose(put(f"k/{i}", f"v{i}"), timeout=10))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.result.applied for r in results)
    # group commit: 30 concurrent proposals need fewer entries than proposals
    assert leader.log.stats().entries_proposed < 30
    top = max(r.offset for r in results)
    for n in trio:
        assert n.log.wait_applied(top, 10)
    wait_for(lambda: len({n.kv.digest for n in trio}) == 1 and all(n.kv.offset == trio[0].kv.offset for n in trio))
    assert all(n.kv.get("k/7") == b"v7" for n in trio)
    for n in trio:
        assert n.log.apply_offset <= n.log.commit_offset <= n.log.end_offset


def test_precondition_failure_is_a_deterministic_noop(trio) -> None:
    leader = leader_of(trio)
    first = leader.log.propose(put("x", "1"), timeout=10)
    guarded = put("x", "2")
    guarded.preconditions.add(key="x", version=first.offset - 1)
    res = leader.log.propose(guarded, timeout=10)
    assert not res.result.applied and res.result.failed_key == "x"
    assert res.result.failed_key_version == first.offset
    assert leader.kv.get("x") == b"1"


def test_barrier_returns_an_offset_applied_locally(trio) -> None:
    leader = leader_of(trio)
    off = leader.log.barrier(timeout=10)
    assert leader.log.apply_offset >= off > 0


def test_follower_catches_up_from_snapshot_after_compaction(trio) -> None:
    leader = leader_of(trio)
    lagging = next(n for n in trio if n is not leader)
    lagging.close()
    for i in range(200):  # five times the compaction threshold
        assert leader.log.propose(put(f"k/{i % 50}", f"v{i}"), timeout=10).result.applied
    wait_for(lambda: leader.log.snapshot_offset > 0)
    # the leader's log no longer holds the entries the lagging node misses
    lagging.start()
    wait_for(lambda: lagging.log.ready and lagging.kv.offset == leader.kv.offset, timeout=30)
    assert lagging.kv.digest == leader.kv.digest
    assert lagging.kv.get("k/49") == b"v199"
    assert lagging.log.snapshot_offset > 0  # it loaded a snapshot rather than replaying everything
    assert len({n.kv.digest for n in trio}) == 1


def test_restart_restores_snapshot_then_replays_tail(tmp_path) -> None:
    ports = free_ports(1)
    addr = f"127.0.0.1:{ports[0]}"
    node = Node(addr, [], tmp_path / "solo", snapshot_every_entries=40)
    try:
        wait_for(lambda: node.log.is_leader() and node.log.ready)
        for i in range(100):
            node.log.propose(put(f"k/{i}", f"v{i}"), timeout=10)
        wait_for(lambda: node.log.snapshot_offset > 0)
        for i in range(100, 110):
            node.log.propose(put(f"k/{i}", f"v{i}"), timeout=10)
        digest, offset = node.kv.digest, node.kv.offset
        node.close()
        node.start()
        wait_for(lambda: node.log.ready and node.kv.offset >= offset)
        assert node.kv.digest == digest
        assert node.kv.get("k/109") == b"v109" and len(node.kv) == 110
    finally:
        node.close()


def test_the_leader_stream_shows_every_node_who_leads_in_order(trio) -> None:
    """watch_leader: a first view, then each change of leader, term, role or readiness, in term order;
    watch_leadership hears only this node's own role changes, on the same stream."""
    views: dict[str, list] = {n.addr: [] for n in trio}
    roles: dict[str, list[bool]] = {n.addr: [] for n in trio}
    for n in trio:
        n.log.watch_leader(views[n.addr].append)
        n.log.watch_leadership(roles[n.addr].append)
    first = leader_of(trio)
    wait_for(lambda: all(v and v[-1].leader == first.addr and v[-1].ready for v in views.values()))
    assert roles[first.addr] == [True]
    assert all(roles[n.addr] == [] for n in trio if n is not first)
    first.close()
    rest = [n for n in trio if n is not first]
    second = leader_of(rest)
    wait_for(lambda: all(views[n.addr][-1].leader == second.addr for n in rest))
    for n in rest:
        seen = views[n.addr]
        terms = [v.term for v in seen]
        assert terms == sorted(terms), terms                     # in order
        assert any(v.leader == first.addr for v in seen)          # the old leader, then the new one
        assert seen[-1].self_leads == (n is second) and seen[-1].ready
        assert all(a != b for a, b in itertools.pairwise(seen))  # only changes
    assert roles[second.addr] == [True]
    late: list = []
    second.log.watch_leader(late.append)  # a listener that comes later hears the current view first
    wait_for(lambda: late)
    assert late[0].leader == second.addr and late[0].self_leads


def test_the_typed_raft_view_reads_pysyncobj_s_own_state(trio) -> None:
    """RaftNode's accessors (raftlog/raftview.py: what pre-vote, the read index and Members read) against
    real pysyncobj nodes: a renamed private field of a newer pysyncobj fails here."""
    leader = leader_of(trio)
    top = leader.log.propose(put("k", "v"), timeout=10).offset
    followers = [n for n in trio if n is not leader]
    raft = leader.log.raft
    assert raft.role() == Role.LEADER and raft.current_term() == raft.raftCurrentTerm >= 1
    assert raft.commit_index() == raft.raftCommitIndex >= top
    assert raft.self_peer().id == leader.addr and {p.id for p in raft.other_peers()} == set(leader.partners)
    assert raft.last_log() == (leader.log.end_offset, raft.current_term())
    assert raft.noop_index() is not None and raft.noop_index() <= top and not raft.transfer_in_progress()
    wait_for(lambda: all(link.connected and link.match_index >= top for link in leader.log.peer_links().values()))
    assert set(leader.log.peer_links()) == set(leader.partners)
    # when each follower last answered (pysyncobj's last response time: the leader-balancing duty reads it)
    assert all(0 <= link.heard_s < math.inf for link in leader.log.peer_links().values())
    for f in followers:
        wait_for(lambda f=f: f.log.raft.leader_peer() is not None)
        assert f.log.raft.role() == Role.FOLLOWER and f.log.raft.leader_peer().id == leader.addr
        assert f.log.raft.current_term() == raft.current_term()


def test_a_leadership_transfer_sends_from_the_tick_thread_only(trio) -> None:
    """Only the tick thread may write a peer connection's buffer: TransferLeadership called pysyncobj's
    transferLeadership on a gRPC thread, whose send resized the buffer under the tick thread's memoryview
    (BufferError "Existing exports of data", answered UNKNOWN in CI)."""
    leader = leader_of(trio)
    top = leader.log.propose(put("k", "v"), timeout=10).offset
    wait_for(lambda: all(link.match_index >= top for link in leader.log.peer_links().values()))
    raft = leader.log.raft
    senders: list[threading.Thread] = []
    original = raft.transferLeadership

    def recording(*args, **kwargs):
        senders.append(threading.current_thread())
        return original(*args, **kwargs)

    raft.transferLeadership = recording
    leader.log.transfer_leadership(None, timeout=10)
    assert senders == [raft.tick_thread()]
    wait_for(lambda: any(n.log.is_leader() for n in trio if n is not leader))


@contextlib.contextmanager
def closing_all(nodes):
    try:
        yield nodes
    finally:
        for n in nodes:
            with contextlib.suppress(Exception):
                n.close()


def twenty_writes_apply_alike(nodes) -> None:
    """20 writes through the leader: every node applies them to the same digest."""
    leader = leader_of(nodes)
    top = 0
    for i in range(20):
        top = leader.log.propose(put(f"k{i}", "v" * 500), timeout=10).offset
    wait_for(lambda: all(n.log.apply_offset >= top for n in nodes))
    assert len({n.kv.digest_at(top) for n in nodes}) == 1 and all(len(n.kv) == 20 for n in nodes)


def test_members_replicate_at_the_zlib_level_of_each(tmp_path) -> None:
    """raft.wire_compress_level reaches each node's transport, and members at different levels (0 stored,
    pysyncobj's 3) read each other's frames: every node applies the same entries to the same digest."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    nodes = [Node(a, [b for b in addrs if b != a], tmp_path / f"n{i}", wire_compress_level=level)
             for i, (a, level) in enumerate(zip(addrs, (0, 0, 3), strict=True))]
    with closing_all(nodes):
        assert [n.log.raft._SyncObj__transport.compress_level for n in nodes] == [0, 0, 3]
        twenty_writes_apply_alike(nodes)


def test_members_with_a_raft_password_replicate_through_the_coalescing_transport(tmp_path) -> None:
    """Encrypted frames (the Raft password: a session key exchanged first, each frame sealed on its own) held
    for the pass's flush and written together: the handshake completes and every node applies the same."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    nodes = [Node(a, [b for b in addrs if b != a], tmp_path / f"n{i}", password="coalesce-test")
             for i, a in enumerate(addrs)]
    with closing_all(nodes):
        assert all(n.log.raft._SyncObj__transport.coalesce for n in nodes)
        twenty_writes_apply_alike(nodes)


def test_a_lone_leader_s_tick_is_woken_once_per_entry(tmp_path) -> None:
    """One member: the journal's syncer wakes the tick after each sync, and that wake commits the entry. The
    tick no longer wakes itself for every appended entry as well (that pass found nothing to commit: the
    leader counts itself only up to its durable index)."""
    node = Node(f"127.0.0.1:{free_ports(1)[0]}", [], tmp_path / "n0")
    try:
        raft = leader_of([node]).log.raft
        wakes = []
        wake = raft.wake

        def counted() -> None:
            wakes.append(1)
            wake()

        raft.wake = counted
        for i in range(40):
            node.log.propose(put(f"k{i}", "v"), timeout=10)
        assert len(wakes) <= 44, len(wakes)  # one per sync; was two per entry
    finally:
        node.close()


def _leader_after_a_sync(others: list[str], match: dict[str, int], commit: int = 10) -> tuple[object, list[int]]:
    """A stand-in for a leader's RaftNode as its journal's syncer sees it, counting the wakes."""
    from types import SimpleNamespace

    from raftlog.binding import RaftNode

    wakes: list[int] = []
    node = SimpleNamespace(_SyncObj__otherNodes=set(others), _SyncObj__raftMatchIndex=dict(match),
                           _commit_index=commit, _isLeader=lambda: True, wake=lambda: wakes.append(1))
    node._durable_may_commit = lambda: RaftNode._durable_may_commit(node)
    return node, wakes


@pytest.mark.parametrize(("others", "match", "woken"), [
    (["f1", "f2"], {"f1": 10, "f2": 10}, False),  # the leader's fsync came first: nothing to commit yet
    (["f1", "f2"], {"f1": 11, "f2": 10}, True),   # a follower holds the next entry: the leader's copy commits it
    ([], {}, True),                               # one member: the syncer's wake is the one that commits
    (["f1", "f2", "f3", "f4"], {"f1": 11, "f2": 9, "f3": 10}, False),  # 2 of 5 with the leader: no majority
    (["f1", "f2", "f3", "f4"], {"f1": 11, "f2": 12, "f3": 10}, True),
])
def test_the_syncer_wakes_the_leader_s_tick_only_when_its_copy_can_commit(others, match, woken) -> None:
    """With followers, the leader's own fsync usually finishes before any follower answers, and its wake found
    nothing to commit: one pass of the tick thread per entry for nothing."""
    from raftlog.binding import RaftNode

    node, wakes = _leader_after_a_sync(others, match)
    RaftNode._on_durable(node)
    assert wakes == ([1] if woken else [])


def test_the_syncer_wakes_the_tick_when_it_cannot_read_the_followers() -> None:
    from raftlog.binding import RaftNode

    node, wakes = _leader_after_a_sync(["f1"], {})
    node._SyncObj__raftMatchIndex = None  # as a membership change racing the read could leave it
    RaftNode._on_durable(node)
    assert wakes == [1]


def test_followers_hold_back_the_answer_repeating_the_last(trio) -> None:
    """Each entry's answer goes out; the answer to the leader's next append, which passes on the commit index
    and says nothing new, stays home. The leader still commits every entry and hears from every follower."""
    leader = leader_of(trio)
    top = 0
    for i in range(30):
        top = leader.log.propose(put(f"k{i}", "v"), timeout=10).offset
    wait_for(lambda: all(n.log.apply_offset >= top for n in trio))
    followers = [n for n in trio if n is not leader]
    assert all(n.log.raft.repeated_answers.held > 0 for n in followers)
    # a follower applies once it heard of the commit, maybe before the leader read its own answer: wait for it
    wait_for(lambda: all(link.match_index >= top and link.heard_s < 1.0 for link in leader.log.peer_links().values()))


def test_an_entry_s_command_is_pickled_at_protocol_4_and_applies_everywhere(trio) -> None:
    """pysyncobj's @replicated pickles the command at protocol 2 (bytes as latin-1 text, rebuilt by a call on
    every node's apply); append_entry pickles it at protocol 4, which pysyncobj's apply reads as it is."""
    leader = leader_of(trio)
    value = bytes(range(256)) * 4
    top = leader.log.propose(entry_pb2.Batch(records=[entry_pb2.Record(type=1, key="bin", value=value)]),
                             timeout=10).offset
    wait_for(lambda: all(n.log.apply_offset >= top for n in trio))
    for n in trio:
        entries = n.log.raft._SyncObj__raftLog
        command = next(e[0] for e in entries if e[1] == top)
        assert command[1:3] == b"\x80\x04"
        assert len(command) < len(value) + 200  # the 1 KiB value as it is: at protocol 2 it took ~1.5 KiB
        assert n.kv.get("bin") is not None
    assert len({n.kv.digest_at(top) for n in trio}) == 1


def test_a_role_change_inside_raftnodes_constructor_is_passed_on_after_it(tmp_path, monkeypatch) -> None:
    """pysyncobj's tick thread starts inside RaftNode's constructor and can elect this node before
    `self.raft` is set (a long journal replaying): seen as an AttributeError on `raft` that left a node
    never ready. Here the constructor itself reports a won election before it returns."""
    import raftlog.log as logmodule

    class ElectedWhileConstructed(logmodule.RaftNode):  # type: ignore[misc, valid-type]
        def __init__(self, addr, partners, conf, *args, **kw) -> None:
            super().__init__(addr, partners, conf, *args, **kw)
            conf.onStateChanged(Role.FOLLOWER, Role.LEADER)
            conf.onStateChanged(Role.LEADER, Role.FOLLOWER)
            conf.onStateChanged(Role.FOLLOWER, Role.LEADER)

    monkeypatch.setattr(logmodule, "RaftNode", ElectedWhileConstructed)
    node = Node(f"127.0.0.1:{free_ports(1)[0]}", [], tmp_path)
    try:
        assert node.log.leader_changes == 3
        wait_for(lambda: node.log.is_leader() and node.log.ready)
        node.log.propose(put("k", "v"), timeout=5)
        assert node.kv.get("k") is not None  # its committer and apply work
    finally:
        node.close()
