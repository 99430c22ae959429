"""A sharded test cluster's group cores, reached as the node's workers reach them: on each core's private
socket (corelink.own_channel with config.group_config), and found among the node's core's children."""

from __future__ import annotations

import grpc

from bench.procnet import children
from nameserver import config
from nameserver.api import corelink
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import Cluster, NodeProc


def group_core_channel(node: NodeProc, group: int) -> grpc.Channel:
    """A channel to `node`'s core of `group` on its private socket, as the node's workers have."""
    return corelink.own_channel(config.group_config(config.load(node.config_path), group))


def group_status(node: NodeProc, group: int) -> api_pb2.NodeStatus | None:
    with group_core_channel(node, group) as channel:
        try:
            return api_pb2_grpc.AdminStub(channel).Status(api_pb2.StatusRequest(), timeout=2)
        except grpc.RpcError:
            return None


def children_running(node: NodeProc, module: bytes) -> list[int]:
    """The pids of `node`'s core's children running `module` (python -m)."""
    assert node.proc is not None
    found = []
    for pid in children(node.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if module in f.read():
                    found.append(pid)
        except OSError:  # exited meanwhile
            pass
    return found


def group_core_pids(node: NodeProc) -> list[int]:
    return children_running(node, b"nameserver.groupcore")


def group_leader(cluster: Cluster, group: int) -> NodeProc | None:
    for node in cluster.nodes:
        st = group_status(node, group) if node.alive else None
        if st is not None and st.ready and st.role == api_pb2.ROLE_LEADER:
            return node
    return None
