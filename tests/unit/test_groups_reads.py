"""A sharded worker's merged reads (nameserver/groups/reads.py) over in-process read replicas: the service a
worker runs (MergedService) called as the remoting handlers call it (InProcessStub), each group's replica
fed by hand as its follower thread would (an entry applied under its lock, then its offset published).

- GetBrokerMemberGroup waits for the directory's floor: just after a set moved into group 1, a replica of
  group 1 that has not applied the copy yet is not read (it would answer an empty group).
- The merged route cache is looked up before any group's lock: a kept route is answered while a group's
  apply holds its lock (an inline remoting read never waits), and a kept route is never answered once any
  group's route generation moved (the answer equals the merge of the states as they are).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from nameserver.api import auth
from nameserver.api.inprocess import InProcessStub, LocalRpcError
from nameserver.config import Member, NodeConfig
from nameserver.core.nowait import no_wait
from nameserver.groups.reads import MergedReads, MergedService
from nameserver.pb import api_pb2
from nameserver.replica import ReadReplica, ReplicaNode
from nameserver.state import MetadataState, Translation, register_broker
from nameserver.state.shards import moves
from nameserver.state.shards.merge import merge_route
from raftlog.pb import entry_pb2
from tests.cluster import register_request

GROUPS = 2
TIMEOUT_MS = 120_000
CFG = NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir="/nonexistent",
                 members=[Member("127.0.0.1:1", "127.0.0.1:2")])


def fed_replica(group: int) -> ReadReplica:
    """A replica that counts as following its core (loaded, heard from), fed by `apply` and `advance`."""
    replica = ReadReplica(f"g{group}", grpc.insecure_channel, name=f"g{group}", max_silence_s=3600, accounting=False)
    replica._bootstrapped = True
    replica._heard = time.monotonic()
    return replica


def apply(replica: ReadReplica, tr: Translation) -> None:
    """One entry, applied as the follower thread applies it."""
    state = replica.state
    with replica.lock:
        [result] = state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))
    assert result.applied
    replica._publish(state.offset)


def advance(replica: ReadReplica, offset: int) -> None:
    """Offsets without entries of ours (the core's no-ops), as the follower thread takes them."""
    with replica.lock:
        replica.state.kv.offset = offset
    replica._publish(offset)


def register(replica: ReadReplica, name: str, addr: str, topics: list[str], group0: MetadataState | None = None,
             broker_id: int = 0) -> None:
    request = register_request("c", name, addr, topics, broker_id=broker_id)
    apply(replica, register_broker(replica.state, request, TIMEOUT_MS, group0))


@pytest.fixture
def groups() -> Iterator[list[ReadReplica]]:
    replicas = [fed_replica(group) for group in range(GROUPS)]
    yield replicas
    for replica in replicas:
        replica.stop()


def service(replicas: list[ReadReplica]) -> tuple[InProcessStub, MergedReads]:
    reads = MergedReads(replicas)
    return InProcessStub(MergedService(ReplicaNode(replicas[0], CFG), reads), auth.NAMESERVER_SERVICE), reads


def member_group(stub: InProcessStub, name: str, timeout: float) -> list[str]:
    reply = stub.GetBrokerMemberGroup(api_pb2.GetBrokerMemberGroupRequest(cluster_name="c", broker_name=name),
                                      timeout=timeout)
    return sorted(a.addr for a in reply.addrs)


def test_a_member_group_read_waits_for_a_moved_set_s_copy_in_its_new_group(groups: list[ReadReplica]) -> None:
    """Group 0's directory says b1 moved to group 1 at offset 5; group 1's replica is at 0. The read waits for
    it (and fails UNAVAILABLE at its deadline) instead of answering b1's group empty."""
    g0, g1 = groups
    register(g0, "b1", "10.0.0.1:10911", ["T"])
    apply(g0, moves.begin_move(g0.state, "b1", 1, GROUPS))
    apply(g0, moves.finish_move(g0.state, "b1", 1, since=5))
    stub, _ = service(groups)
    with pytest.raises(LocalRpcError) as refused:
        member_group(stub, "b1", timeout=0.3)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "below min_offset 5" in refused.value.details()

    answered: list[list[str]] = []
    waiting = threading.Thread(target=lambda: answered.append(member_group(stub, "b1", timeout=30)))
    waiting.start()
    apply(g1, moves.copy_set(g0.state, g1.state, 1, "b1"))  # the copy, then group 1's log up to the floor
    advance(g1, 5)
    waiting.join(timeout=30)
    assert answered == [["10.0.0.1:10911"]]


def _route(stub: InProcessStub, topic: str, min_offset: int = 0, timeout: float = 5) -> api_pb2.TopicRoute:
    return stub.GetRoute(api_pb2.GetRouteRequest(topic=topic, min_offset=min_offset), timeout=timeout).route


def _two_groups_on_topic(groups: list[ReadReplica]) -> None:
    """b0 in group 0 and b1 in group 1 (pinned there), both serving topic T."""
    g0, g1 = groups
    register(g0, "b0", "10.0.0.1:10911", ["T"])
    apply(g0, moves.pin_set(g0.state, "b1", 1, GROUPS))
    register(g1, "b1", "10.0.1.1:10911", ["T"], group0=g0.state)


def test_a_kept_route_is_answered_without_any_group_s_lock(groups: list[ReadReplica]) -> None:
    """A remoting read runs inline (no_wait) and must not wait on a lock: with group 1's lock held (its apply
    under way), the kept route is answered; a read needing an offset group 0 has not applied still waits."""
    _two_groups_on_topic(groups)
    stub, reads = service(groups)
    first = _route(stub, "T")
    assert [bd.broker_name for bd in first.broker_datas] == ["b0", "b1"]
    hits = reads.routes.hits
    with groups[1].lock, no_wait():
        assert _route(stub, "T") == first
    assert reads.routes.hits == hits + 1
    with pytest.raises(LocalRpcError) as behind:
        _route(stub, "T", min_offset=groups[0].offset + 1, timeout=0.2)
    assert behind.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_kept_route_is_never_answered_once_a_group_s_routes_changed(groups: list[ReadReplica]) -> None:
    """Each change in either group (a broker joining in group 1, group 0's directory, a snapshot swapped in)
    makes the next read compute the route again, equal to the merge of the states as they are now."""
    _two_groups_on_topic(groups)
    g0, g1 = groups
    stub, reads = service(groups)

    def merged() -> api_pb2.TopicRoute:
        route = merge_route([g0.state, g1.state], "T").route
        assert route is not None
        return route

    assert _route(stub, "T") == merged()
    register(g1, "b1", "10.0.1.2:10911", ["T"], g0.state, broker_id=1)  # b1's slave, in group 1 only
    misses = reads.routes.misses
    assert _route(stub, "T") == merged() and len(merged().broker_datas[1].addrs) == 2
    assert reads.routes.misses == misses + 1
    apply(g0, moves.pin_set(g0.state, "b2", 1, GROUPS))  # group 0's directory: no topic changed, still a miss
    assert _route(stub, "T") == merged() and reads.routes.misses == misses + 2
    fresh = g1._fresh_state()  # a snapshot of the same records installed in group 1's replica
    fresh.restore(g1.state.offset, [(k, v, ver, t) for k, (v, ver, t) in g1.state.kv._values.items()])
    g1._swap_in(fresh, fresh.offset, fresh.digest_hex, "test")
    assert _route(stub, "T") == merged() and reads.routes.misses == misses + 3
    assert _route(stub, "T") == merged() and reads.routes.misses == misses + 3  # and kept again


def test_a_route_read_waits_for_each_group_s_entry_of_its_offset_vector(groups: list[ReadReplica]) -> None:
    """GetRoute's min_offsets: group k must have applied min_offsets[k] (a write of a group-1 set answers its
    offset in group 1, which says nothing of group 0's), kept route or not; the reply carries each group's
    apply offset it was read at, as GetClusterInfo's; more entries than groups are refused by field."""
    _two_groups_on_topic(groups)
    g0, g1 = groups
    stub, _ = service(groups)
    advance(g0, 50)  # group 0 far ahead of group 1: its offsets say nothing of group 1's
    reply = stub.GetRoute(api_pb2.GetRouteRequest(topic="T"), timeout=5)  # kept from now on
    assert (reply.apply_offset, list(reply.offsets)) == (50, [50, g1.offset])
    wanted = g1.offset + 1  # a write to b1 acknowledged in group 1 at this offset, not applied here yet
    behind = api_pb2.GetRouteRequest(topic="T", min_offset=wanted, min_offsets=[0, wanted])
    with pytest.raises(LocalRpcError) as waited:
        stub.GetRoute(behind, timeout=0.3)
    assert waited.value.code() == grpc.StatusCode.UNAVAILABLE  # group 0 is past `wanted`: group 1 is not
    with pytest.raises(LocalRpcError) as waited:
        stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(min_offsets=[0, wanted]), timeout=0.3)
    assert waited.value.code() == grpc.StatusCode.UNAVAILABLE

    answered: list[api_pb2.GetRouteReply] = []
    waiting = threading.Thread(target=lambda: answered.append(stub.GetRoute(behind, timeout=30)))
    waiting.start()
    register(g1, "b1", "10.0.1.2:10911", ["T"], g0.state, broker_id=1)  # the write, applied in group 1
    waiting.join(timeout=30)
    [read] = answered
    assert list(read.offsets) == [50, wanted] and len(read.route.broker_datas[1].addrs) == 2
    info = stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(min_offsets=[0, wanted]), timeout=5)
    assert (info.apply_offset, list(info.offsets)) == (50, [50, wanted])

    with pytest.raises(LocalRpcError) as refused:
        stub.GetRoute(api_pb2.GetRouteRequest(topic="T", min_offsets=[0, 0, 1]), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "min_offsets: 3 entries: this cluster has 2 groups (one entry a group)"
    with pytest.raises(LocalRpcError) as refused:
        stub.GetRoute(api_pb2.GetRouteRequest(topic="T", min_offsets=[0, -1]), timeout=5)
    assert refused.value.details() == "min_offsets[1]: must be >= 0, got -1"
