"""A sharded test cluster's group cores, reached as the node's workers reach them: on each core's private
socket (corelink.own_channel with config.group_config), and found among the node's core's children."""

from __future__ import annotations

import grpc

from bench.brokerconn import BrokerConnections
from bench.procnet import children
from nameserver import config
from nameserver.api import corelink
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import codes
from tests.cluster import Cluster, NodeProc, retry


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


def own_cluster_info(node: NodeProc, group: int) -> api_pb2.GetClusterInfoReply:
    """Group `group`'s own (unmerged) cluster info, from `node`'s core of that group."""
    with group_core_channel(node, group) as channel:
        return retry(lambda: api_pb2_grpc.NameServerStub(channel).GetClusterInfo(
            api_pb2.GetClusterInfoRequest(), timeout=5))


def route_of(node: NodeProc, topic: str) -> api_pb2.TopicRoute | None:
    """`node`'s (merged) gRPC route of `topic`; None: no such topic."""
    try:
        return node.ns.GetRoute(api_pb2.GetRouteRequest(topic=topic), timeout=5).route
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


def remoting_answer(node: NodeProc, code: int, ext: dict[str, str]) -> tuple[int, bytes]:
    """A remoting request's (code, body) from `node`'s remoting port, on a connection of its own."""
    client = BrokerConnections("reader", "none", "127.0.0.1:1")
    try:
        resp = client.call(node.remoting_addr, code, ext, timeout=10)
        assert resp is not None
        return resp.code, resp.body
    finally:
        client.close_channels()


def answers_equal(node: NodeProc, reference: NodeProc, topics: list[str]) -> bool:
    """`node`'s routes of `topics` (gRPC and remoting 105) and its cluster info (gRPC, and remoting 106)
    equal `reference`'s (a one-group node fed the same fleet), the offsets they were read at aside."""
    for topic in topics:
        if route_of(node, topic) != route_of(reference, topic):
            return False
        ext = {"topic": topic}
        if remoting_answer(node, codes.GET_ROUTEINFO_BY_TOPIC, ext) != remoting_answer(
                reference, codes.GET_ROUTEINFO_BY_TOPIC, ext):
            return False
    info = node.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
    want = reference.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
    without_offsets(info, want)
    return info == want and remoting_answer(node, codes.GET_BROKER_CLUSTER_INFO, {}) == remoting_answer(
        reference, codes.GET_BROKER_CLUSTER_INFO, {})


def without_offsets(*replies: api_pb2.GetClusterInfoReply) -> None:
    """Each reply's apply offset and offset vector (a sharded node's) cleared: the part that differs between
    clusters fed the same fleet."""
    for reply in replies:
        reply.apply_offset = 0
        reply.ClearField("offsets")
