"""Membership changes at runtime: a cluster grows 3 -> 4 -> 5 and shrinks back to 3 while taking writes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from nameserver.cli import nsctl
from nameserver.localports import free_ports
from nameserver.pb import api_pb2
from tests.cluster import Cluster, NodeProc, retry, running

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 3-node cluster for the two tests that keep its membership (refused changes; a leadership
    transfer, after which it still has three members and a leader): either may run first."""
    with running(Cluster(str(tmp_path_factory.mktemp("three")), 3)) as c:
        yield c


class Writer:
    """Keeps writing through random live nodes; records every acknowledged key."""

    def __init__(self, nodes: list[NodeProc]) -> None:
        self.nodes = nodes
        self.acked: dict[str, int] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            node = self.nodes[i % len(self.nodes)]
            try:
                r = node.ns.PutKv(api_pb2.PutKvRequest(namespace="grow", key=f"k{i}", value=str(i)), timeout=3)
                self.acked[f"k{i}"] = r.offset
            except grpc.RpcError:
                self.errors += 1
            i += 1

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def members(node: NodeProc) -> list[str]:
    try:
        return sorted(m.node_id for m in node.admin.Members(api_pb2.MembersRequest(), timeout=5).members)
    except grpc.RpcError:
        return []  # still starting


@pytest.mark.slow  # 45 s; make test adds and replaces members under kills (tests/faults/test_membership_faults.py)
def test_grow_to_five_and_shrink_to_three_while_writing(make_cluster) -> None:
    c: Cluster = make_cluster(5, start=False)
    first3 = c.nodes[:3]
    for n in first3:
        c._write_config(n, first3)
    c._write_config(c.nodes[3], c.nodes[:4])
    c._write_config(c.nodes[4], c.nodes)
    for n in first3:
        c.start(n)
    c.wait_ready(first3)
    ids = lambda nodes: sorted(n.raft_addr for n in nodes)  # noqa: E731
    with Writer(first3) as writer:
        for new, size in ((c.nodes[3], 4), (c.nodes[4], 5)):
            c.start(new)
            if size == 4:  # any node accepts the change: a follower forwards it to the leader
                retry(lambda n=new: first3[1].admin.AddMember(
                    api_pb2.MemberChangeRequest(node_id=n.raft_addr, grpc_addr=n.grpc_addr), timeout=20), timeout=30)
            else:  # the operator's way (docs/operations.md)
                endpoints = ",".join(n.grpc_addr for n in first3)
                assert nsctl.main(["--endpoints", endpoints, "--timeout", "20", "member", "add", new.raft_addr,
                                   "--grpc-addr", new.grpc_addr]) == 0
            c.wait_for(f"{size} members everywhere", lambda s=size: all(
                len(members(n)) == s for n in c.nodes[:s]), timeout=30)
            c.wait_converged(c.nodes[:size], timeout=60)
        assert members(c.nodes[4]) == ids(c.nodes)
        # the new members serve reads and accept writes (forwarded to the leader)
        put = retry(lambda: c.nodes[4].ns.PutKv(api_pb2.PutKvRequest(namespace="grow", key="via-n5", value="x"),
                                                  timeout=5))
        got = c.nodes[3].ns.GetKv(api_pb2.GetKvRequest(namespace="grow", key="via-n5", min_offset=put.offset),
                                  timeout=5)
        assert got.value == "x"
        # shrink back: remove two members that are not the leader, one at a time
        for _ in range(2):
            leader = c.leader()
            victim = next(n for n in reversed(c.nodes) if n.alive and n is not leader)
            assert nsctl.main(["--endpoints", leader.grpc_addr, "--timeout", "20", "member", "remove",
                               victim.raft_addr]) == 0
            c.kill(victim)
            rest = [n for n in c.nodes if n.alive]
            c.wait_for("membership shrunk", lambda r=rest: all(members(n) == ids(r) for n in r), timeout=30)
        rest = [n for n in c.nodes if n.alive]
        assert len(rest) == 3
    sts = c.wait_converged(rest, timeout=60)
    assert len({s.digest for s in sts}) == 1
    table = rest[0].ns.ListKv(api_pb2.ListKvRequest(namespace="grow", min_offset=max(writer.acked.values())),
                              timeout=10).table
    assert set(writer.acked) <= set(table), "an acknowledged write was lost"
    assert len(writer.acked) > 20
    # the shrunk cluster still has a majority and takes writes
    retry(lambda: rest[0].ns.PutKv(api_pb2.PutKvRequest(namespace="grow", key="after", value="y"), timeout=5))


def test_membership_change_errors_are_clear(three: Cluster) -> None:
    c = three
    leader = c.wait_ready()
    with pytest.raises(grpc.RpcError) as err:
        leader.admin.AddMember(api_pb2.MemberChangeRequest(node_id=leader.raft_addr, grpc_addr=leader.grpc_addr),
                               timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "already a member" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        leader.admin.RemoveMember(api_pb2.MemberChangeRequest(node_id="127.0.0.1:1"), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not a member" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        leader.admin.AddMember(api_pb2.MemberChangeRequest(node_id="no-port", grpc_addr="127.0.0.1:1"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "node_id" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        leader.admin.RemoveMember(api_pb2.MemberChangeRequest(node_id=leader.raft_addr), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "transfer leadership" in err.value.details()
    assert len(members(leader)) == 3


def test_transfer_leadership(three: Cluster) -> None:
    c = three
    leader = c.wait_ready()
    target = c.followers()[0]
    c.wait_converged()
    reply = retry(lambda: target.admin.TransferLeadership(api_pb2.TransferLeadershipRequest(
        node_id=target.raft_addr), timeout=10))
    assert reply.leader_id in (target.raft_addr, "")
    c.wait_for("the target to lead", lambda: c.leader() is target, timeout=15)
    assert leader.status().role != api_pb2.ROLE_LEADER


@pytest.mark.parametrize("new_address", ["greater", "lesser"])
def test_a_member_that_missed_a_change_follows_a_leader_it_does_not_know(make_cluster, new_address: str) -> None:
    """A follower is down while n4 joins and the other follower leaves; the leader dies; only the stale
    follower and n4 are left. The stale one does not know n4, yet n4 needs its vote, and it must learn the
    membership from n4 (Raft, thesis section 4.1).

    pysyncobj connects each pair from the greater address and closed a connection naming a non-member,
    so the stale follower refused n4's dial ("greater") or never dialled n4 ("lesser"): no leader, ever
    (raftlog/peerlinks.py: guest links and reverse dials)."""
    c: Cluster = make_cluster(4, start=False)
    first3, n4 = c.nodes[:3], c.nodes[3]
    for n in first3:
        c._write_config(n, first3)
    for n in first3:
        c.start(n)
    leader = c.wait_ready(first3)
    stale, other = [n for n in first3 if n is not leader]
    # pysyncobj compares addresses as strings: give n4 a raft address on the asked-for side of the stale one's
    # (draw until one is: the stale one's port may sit near an end of the pool, string-wise)
    n4.raft_addr = next(a for _ in range(50) for a in (f"127.0.0.1:{p}" for p in free_ports(40))
                        if (a > stale.raft_addr) == (new_address == "greater"))
    c._write_config(n4, c.nodes)
    before = retry(lambda: leader.ns.PutKv(api_pb2.PutKvRequest(namespace="m", key="before", value="1"), timeout=5))
    c.wait_converged(first3)
    c.kill(stale)
    c.start(n4)
    retry(lambda: leader.admin.AddMember(api_pb2.MemberChangeRequest(node_id=n4.raft_addr, grpc_addr=n4.grpc_addr),
                                         timeout=20), timeout=30)
    retry(lambda: leader.admin.RemoveMember(api_pb2.MemberChangeRequest(node_id=other.raft_addr), timeout=20),
          timeout=30)
    c.kill(other)
    final = sorted([leader.raft_addr, stale.raft_addr, n4.raft_addr])
    c.wait_for("n4 to know the final membership", lambda: members(n4) == final, timeout=30)
    c.wait_converged([leader, n4])
    c.kill(leader)
    c.start(stale)
    c.wait_for("the stale member to learn the membership from n4", lambda: members(stale) == final, timeout=60)
    c.wait_ready([stale, n4], timeout=30)
    put = retry(lambda: stale.ns.PutKv(api_pb2.PutKvRequest(namespace="m", key="after", value="2"), timeout=5))
    assert put.offset > before.offset
    for n in (stale, n4):
        got = n.ns.GetKv(api_pb2.GetKvRequest(namespace="m", key="before", min_offset=put.offset), timeout=5)
        assert got.value == "1", n.name
    sts = c.wait_converged([stale, n4])
    assert len({s.digest for s in sts}) == 1
