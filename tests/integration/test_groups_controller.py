"""Controller mode on a sharded cluster, the long version (docs/scaling.md, "Controller mode with groups"):
a 3-node cluster with [sharding] groups = 2, one worker per node, and every node's controller port (group 0's
core's). Two broker sets of stand-in brokers, one whose routes the directory places in group 1 and one in
group 0, each with its controller record in group 0: the group-1 set's master goes silent and group 0's
leader's election scan elects its in-sync slave and tells the brokers; both sets are moved to the other
group, keeping their controller records; the node leading group 0 (the controller leader) is SIGKILLed and
the next leader's scan elects a new master of the set now in group 1. The short version is in
test_groups_short.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nameserver.pb import shards_pb2, shards_pb2_grpc
from nameserver.state import keys
from nameserver.state.shards.directory import default_group
from tests.cluster import Cluster, retry, running
from tests.integration.groupcontroller import (
    ControllerSet,
    controller_records,
    held_in,
    leader_port,
    member_group,
)

pytestmark = pytest.mark.slow  # a 3-node, 2-group cluster (9 processes) and a node killed: about a minute here

GROUPS = 2
CLUSTER = "CtlGroups"
TIMEOUT_MS = 1500  # the stand-in brokers' heartbeat timeout


def _named(prefix: str, group: int) -> str:
    return next(f"{prefix}-{i}" for i in range(64) if default_group(f"{prefix}-{i}", GROUPS) == group)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(str(tmp_path_factory.mktemp("groups-controller")), size=3, worker_processes=1, groups=GROUPS,
                      remoting=True, controller=True, controller_scan_interval_ms=300)
    with running(cluster, timeout=cluster.ready_timeout):
        yield cluster


def _routes_in(cluster: Cluster, cs: ControllerSet, group: int) -> bool:
    return all(held_in(n, group, cs.name) and not held_in(n, 1 - group, cs.name) for n in cluster.nodes if n.alive)


def _master(cs: ControllerSet, cluster: Cluster, master: str, epoch: str) -> bool:
    """Every live node's controller port answers the set's master and epoch."""
    for node in cluster.nodes:
        if not node.alive:
            continue
        code, header, _ = cs.replica_info(node.controller_addr)
        if (code, header.get("masterBrokerId"), header.get("masterEpoch")) != (0, master, epoch):
            return False
    return True


def _move(cluster: Cluster, cs: ControllerSet, group: int) -> None:
    node = next(n for n in cluster.nodes if n.alive)
    reply = retry(lambda: shards_pb2_grpc.ShardsStub(node._channel()).MoveShard(
        shards_pb2.ShardPlacement(broker_name=cs.name, group=group), timeout=30), timeout=60)
    assert reply.set.group == group
    cluster.wait_for(f"{cs.name}'s routes in group {group} alone", lambda: _routes_in(cluster, cs, group), timeout=30)


def test_elections_moves_and_a_killed_controller_leader(sharded: Cluster) -> None:
    controllers = [n.controller_addr for n in sharded.nodes]
    in_1, in_0 = (ControllerSet(_named("ctl-groups", g), CLUSTER, timeout_ms=TIMEOUT_MS) for g in (1, 0))
    sets = {1: in_1, 0: in_0}
    try:
        leader = sharded.wait_for("a controller leader", lambda: leader_port(sharded))
        follower = next(a for a in controllers if a != leader)
        for group, cs in sets.items():
            cs.claim([follower, leader])
            cs.start_beating(controllers)
            code, header, remark = cs.elect(leader, 1)
            assert code == 0 and header["masterBrokerId"] == "1", remark
            assert cs.report_in_sync(leader, 1, 1, [1, 2], 1) == 2
            cs.register_routes(sharded.nodes[group], [f"Ctl-{cs.name}"])
            sharded.wait_for(f"{cs.name}'s routes in group {group}", lambda cs=cs, g=group: _routes_in(sharded, cs, g),
                             timeout=30)
        records = sorted(keys.controller_key(cs.name) for cs in sets.values())
        assert all(controller_records(n, 0) == records and controller_records(n, 1) == [] for n in sharded.nodes)

        # the group-1 set's master goes silent: group 0's leader's scan elects its in-sync slave, tells it
        in_1.silent.add(1)
        sharded.wait_for("the group-1 set's slave elected by the scan", lambda: _master(in_1, sharded, "2", "2"),
                         timeout=TIMEOUT_MS / 1000 + 15)
        sharded.wait_for("the new master notified", lambda: ("2", "2") in in_1.notified(2), timeout=10)
        assert _master(in_0, sharded, "1", "1")  # the other set untouched

        # each set moved to the other group: its controller record stays in group 0, as it was
        before = {cs.name: cs.replica_info(leader) for cs in sets.values()}
        _move(sharded, in_1, 0)
        _move(sharded, in_0, 1)
        assert {cs.name: cs.replica_info(leader) for cs in sets.values()} == before
        assert all(controller_records(n, 0) == records and controller_records(n, 1) == [] for n in sharded.nodes)
        assert member_group(sharded.nodes[0], CLUSTER, in_0.name) == {0: in_0.addr(1), 2: in_0.addr(2)}

        # the controller leader's node is killed (group 0's leader, and its group 1 core with it)
        dead = next(n for n in sharded.nodes if n.controller_addr == leader)
        sharded.kill(dead)
        survivors = [n for n in sharded.nodes if n is not dead]
        new_leader = sharded.wait_for("a new controller leader",
                                      lambda: (found := leader_port(sharded)) != leader and found, timeout=30)
        assert new_leader in [n.controller_addr for n in survivors]
        assert _master(in_1, sharded, "2", "2") and _master(in_0, sharded, "1", "1")
        # the set now in group 1 loses its master: the new leader's scan (its own heartbeat table) elects
        in_0.silent.add(1)
        sharded.wait_for("the group-1 set's slave elected by the new leader's scan",
                         lambda: _master(in_0, sharded, "2", "2"), timeout=TIMEOUT_MS / 1000 + 20)
        sharded.wait_for("the new master notified", lambda: ("2", "2") in in_0.notified(2), timeout=10)
        assert all(controller_records(n, 0) == records and controller_records(n, 1) == [] for n in survivors)
        for node in survivors:
            assert member_group(node, CLUSTER, in_0.name) == {0: in_0.addr(1), 2: in_0.addr(2)}
            assert member_group(node, CLUSTER, in_1.name) == {0: in_1.addr(1), 2: in_1.addr(2)}
    finally:
        for cs in sets.values():
            cs.stop()
