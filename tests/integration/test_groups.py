"""Sharding's processes (docs/scaling.md, "Sharding", Step 2) on a real 3-node cluster with [sharding]
groups = 2 and one worker per node: each node's core (group 0) starts and watches a group-1 core, a process
of its own with group 1's Raft (ports raft_port_step apart) and data under data_dir/g1; group 1 elects its
own leader. A group core killed with SIGKILL is started again by its node's core and rejoins its group,
and the cluster keeps answering meanwhile.

A group core has no public port: the tests reach it on its private socket, as the node's workers do
(corelink.own_channel with config.group_config).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import grpc
import pytest

from bench.procnet import children
from nameserver import config
from nameserver.api import corelink
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import Cluster, NodeProc, register_request, retry, running

GROUPS = 2
pytestmark = pytest.mark.slow  # a 3-node cluster of 9 processes, started once for the module (~40 s here)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("groups")), size=3, worker_processes=1, groups=GROUPS, remoting=True)
    with running(c, timeout=c.ready_timeout) as started:
        yield started


def group_core_channel(node: NodeProc, group: int) -> grpc.Channel:
    """A channel to `node`'s core of `group` on its private socket, as the node's workers have."""
    return corelink.own_channel(config.group_config(config.load(node.config_path), group))


def group_status(node: NodeProc, group: int) -> api_pb2.NodeStatus | None:
    with group_core_channel(node, group) as channel:
        try:
            return api_pb2_grpc.AdminStub(channel).Status(api_pb2.StatusRequest(), timeout=2)
        except grpc.RpcError:
            return None


def group_core_pids(node: NodeProc) -> list[int]:
    assert node.proc is not None
    found = []
    for pid in children(node.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"nameserver.groupcore" in f.read():
                    found.append(pid)
        except OSError:  # exited meanwhile
            pass
    return found


def group_leader(cluster: Cluster, group: int) -> NodeProc | None:
    for node in cluster.nodes:
        st = group_status(node, group)
        if st is not None and st.ready and st.role == api_pb2.ROLE_LEADER:
            return node
    return None


def test_each_node_runs_a_group_core_and_the_group_elects_its_own_leader(sharded: Cluster) -> None:
    sharded.wait_for("group 1 ready on every node with a leader", lambda: group_leader(sharded, 1) and all(
        (st := group_status(n, 1)) is not None and st.ready for n in sharded.nodes), timeout=60)
    for node in sharded.nodes:
        assert len(group_core_pids(node)) == GROUPS - 1
        st = group_status(node, 1)
        assert st is not None
        # group 1's Raft address is the node's shifted by the step; its data under data_dir/g1
        assert st.node_id == config.group_raft_addr(node.raft_addr, 1, sharded.raft_port_step)
        assert os.path.isdir(os.path.join(sharded.root, f"{node.name}-data", "g1", "raft"))
    members = {st.node_id for st in (group_status(n, 1) for n in sharded.nodes) if st is not None}
    assert len(members) == 3 and not members & {n.raft_addr for n in sharded.nodes}


def test_a_killed_group_core_is_started_again_and_the_cluster_keeps_answering(sharded: Cluster) -> None:
    node = sharded.nodes[0]
    sharded.wait_for("n1's group core", lambda: group_core_pids(node))
    [victim] = group_core_pids(node)
    os.kill(victim, signal.SIGKILL)
    # the cluster answers writes and reads while n1's group 1 core is down and after
    retry(lambda: node.ns.RegisterBroker(register_request("c", "kill-test", "10.9.0.1:10911", ["TopicK"]), timeout=5),
          timeout=30)
    retry(lambda: node.ns.GetRoute(api_pb2.GetRouteRequest(topic="TopicK"), timeout=5), timeout=30)
    restarted = sharded.wait_for("n1's group core started again",
                                 lambda: [p for p in group_core_pids(node) if p != victim], timeout=30)
    assert victim not in restarted
    sharded.wait_for("n1's group 1 core ready again",
                     lambda: (st := group_status(node, 1)) is not None and st.ready, timeout=60)
    assert node.alive
