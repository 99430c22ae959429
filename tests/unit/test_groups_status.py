"""A sharded node's readiness as its workers answer it (nameserver/groups/shards.py, GroupStatus): Admin.Status
and grpc.health.v1 Health/Check over real gRPC, with stand-in group cores on 127.0.0.1. The node is ready only
when every group core is: a write to a set of group k needs group k's core."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nameserver.api.auth import CONTROLLER_SERVICE
from nameserver.config import Member, NodeConfig
from nameserver.groups.shards import GroupStatus
from nameserver.localports import free_ports
from nameserver.pb import api_pb2, api_pb2_grpc

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class _Core(api_pb2_grpc.AdminServicer):
    """A group core's private socket, as far as the node's status goes: its Status and its health."""

    def __init__(self, port: int, node_id: str, ready: bool) -> None:
        self.node_id, self.ready = node_id, ready
        self.health = health.HealthServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_AdminServicer_to_server(self, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.set_ready(ready)
        self.server.start()

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self.health.set("", SERVING if ready else NOT_SERVING)

    def Status(self, request, context):  # noqa: N802 (gRPC's name)
        return api_pb2.NodeStatus(node_id=self.node_id, ready=self.ready)


@pytest.fixture
def node() -> Iterator[tuple[list[int], grpc.Server]]:
    """A worker's gRPC server answering GroupStatus for two group cores at `ports` (nothing listens there
    yet)."""
    ports = free_ports(3)
    cfg = NodeConfig(raft_addr="127.0.0.1:9201", grpc_addr="127.0.0.1:9101", data_dir="/nonexistent",
                     members=[Member("127.0.0.1:9201", "127.0.0.1:9101")], groups=2)
    cores = [grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.initial_reconnect_backoff_ms", 100),
                                                                  ("grpc.max_reconnect_backoff_ms", 200)])
             for port in ports[:2]]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handlers = GroupStatus(cfg, cores).handlers()

    class Local(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return handlers.get(details.method)

    server.add_generic_rpc_handlers((Local(),))
    server.add_insecure_port(f"127.0.0.1:{ports[2]}")
    server.start()
    yield ports, server
    server.stop(None)
    for channel in cores:
        channel.close()


def _ask(port: int) -> tuple[api_pb2.NodeStatus, int]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        status = api_pb2_grpc.AdminStub(channel).Status(api_pb2.StatusRequest(), timeout=5)
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return status, check.status


def test_a_node_is_ready_only_when_every_group_core_is(node) -> None:
    ports, _ = node
    group0 = _Core(ports[0], "127.0.0.1:9201", ready=True)
    try:
        status, serving = _ask(ports[2])  # group 1's core does not accept calls (not started yet, restarting)
        assert [g.ready for g in status.groups] == [True, False] and not status.ready and serving == NOT_SERVING
        assert "group 1's core did not answer: UNAVAILABLE" in status.groups[1].not_ready_reason
        assert status.groups[1].node_id == "127.0.0.1:9301"  # its Raft address: the node's, shifted a step
        group1 = _Core(ports[1], "127.0.0.1:9301", ready=False)  # answering, still loading
        try:
            def answered() -> tuple[api_pb2.NodeStatus, int]:
                for _ in range(100):  # the worker's channel reconnects within its backoff
                    status, serving = _ask(ports[2])
                    if not status.groups[1].not_ready_reason:
                        return status, serving
                raise AssertionError("group 1's core never answered")

            status, serving = answered()
            assert [g.ready for g in status.groups] == [True, False] and not status.ready and serving == NOT_SERVING
            group1.set_ready(True)
            status, serving = _ask(ports[2])
            assert [g.ready for g in status.groups] == [True, True] and status.ready and serving == SERVING
            group0.set_ready(False)  # group 0's own readiness counts as ever
            status, serving = _ask(ports[2])
            assert not status.ready and serving == NOT_SERVING
        finally:
            group1.server.stop(None)
    finally:
        group0.server.stop(None)


def test_group_0_s_core_not_answering_is_the_node_s_answer(node) -> None:
    """As a one-group node's worker passing the call on: the core's own error, for Status, Check and Watch
    alike."""
    ports, _ = node
    group1 = _Core(ports[1], "127.0.0.1:9301", ready=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[2]}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                api_pb2_grpc.AdminStub(channel).Status(api_pb2.StatusRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.RpcError) as err:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.RpcError) as err:
                next(health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=5))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        group1.server.stop(None)


def test_watch_streams_the_node_s_health_as_any_group_core_s_changes(node) -> None:
    """Health/Watch agrees with Check: SERVING only while every group core's health is, and a change in any
    group core's (its readiness, its core gone and back) is streamed; group 0's alone before."""
    ports, _ = node
    group0 = _Core(ports[0], "127.0.0.1:9201", ready=True)
    group1 = _Core(ports[1], "127.0.0.1:9301", ready=False)  # answering, still loading
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[2]}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == NOT_SERVING  # group 0's core alone is SERVING
            group1.set_ready(True)
            assert next(watch).status == SERVING
            group0.set_ready(False)  # group 0's own readiness counts as ever
            assert next(watch).status == NOT_SERVING
            group0.set_ready(True)
            assert next(watch).status == SERVING
            group1.server.stop(None)  # group 1's core gone (restarting): its stream ends
            assert next(watch).status == NOT_SERVING
            group1 = _Core(ports[1], "127.0.0.1:9301", ready=True)  # back: its Watch answers again
            assert next(watch).status == SERVING
            watch.cancel()
    finally:
        group1.server.stop(None)
        group0.server.stop(None)


def test_the_controller_service_s_health_is_group_0_s_core_s(node) -> None:
    """Only group 0's core serves the Controller service (every ctrl/ record is group 0's): a group k core lists
    no Controller (its health answers NOT_FOUND), and the node's Check and Watch of it are group 0's core's."""
    ports, _ = node
    group0 = _Core(ports[0], "127.0.0.1:9201", ready=True)
    group0.health.set(CONTROLLER_SERVICE, SERVING)
    group1 = _Core(ports[1], "127.0.0.1:9301", ready=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[2]}") as channel:
            stub, ask = health_pb2_grpc.HealthStub(channel), health_pb2.HealthCheckRequest(service=CONTROLLER_SERVICE)
            assert stub.Check(ask, timeout=5).status == SERVING
            watch = stub.Watch(ask, timeout=30)
            assert next(watch).status == SERVING
            group0.health.set(CONTROLLER_SERVICE, NOT_SERVING)
            assert next(watch).status == NOT_SERVING
            assert stub.Check(ask, timeout=5).status == NOT_SERVING
            watch.cancel()
            # a service no core serves: as a one-group node answers it
            with pytest.raises(grpc.RpcError) as err:
                stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            unknown = stub.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
            assert next(unknown).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            unknown.cancel()
    finally:
        group1.server.stop(None)
        group0.server.stop(None)
