"""A node's readiness as its workers answer it (nameserver/api/corehealth.py, CoreStatus): Admin.Status and
grpc.health.v1 Health/Check and Watch over real gRPC, with stand-in group cores on 127.0.0.1. A sharded node is
ready only when every group core is: a write to a set of group k needs group k's core. A core that stopped
answering the worker (frozen: its socket open, nothing answered; the worker's replica of it says how long it has
heard nothing, stood in for here by `quiet`) is not asked: not ready and NOT_SERVING at once."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nameserver.api.auth import CONTROLLER_SERVICE
from nameserver.api.corehealth import CoreStatus
from nameserver.config import Member, NodeConfig
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


def _worker(groups: int) -> Iterator[tuple[list[int], grpc.Server, list[float]]]:
    """A worker's gRPC server answering CoreStatus for `groups` group cores at ports[:groups] (nothing listens
    there yet), at ports[groups]; quiet[k]: how long group k's core has not answered it (0: it answers)."""
    ports = free_ports(groups + 1)
    cfg = NodeConfig(raft_addr="127.0.0.1:9201", grpc_addr="127.0.0.1:9101", data_dir="/nonexistent",
                     members=[Member("127.0.0.1:9201", "127.0.0.1:9101")], groups=groups)
    cores = [grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.initial_reconnect_backoff_ms", 100),
                                                                  ("grpc.max_reconnect_backoff_ms", 200)])
             for port in ports[:groups]]
    quiet = [0.0] * groups
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handlers = CoreStatus(cfg, cores, [lambda group=group: quiet[group] for group in range(groups)]).handlers()

    class Local(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return handlers.get(details.method)

    server.add_generic_rpc_handlers((Local(),))
    server.add_insecure_port(f"127.0.0.1:{ports[groups]}")
    server.start()
    yield ports, server, quiet
    server.stop(None)
    for channel in cores:
        channel.close()


@pytest.fixture
def node() -> Iterator[tuple[list[int], grpc.Server, list[float]]]:
    """A sharded node's worker: two group cores."""
    yield from _worker(2)


@pytest.fixture
def one_group() -> Iterator[tuple[list[int], grpc.Server, list[float]]]:
    """A one-group node's worker: its core."""
    yield from _worker(1)


def _ask(port: int) -> tuple[api_pb2.NodeStatus, int]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        status = api_pb2_grpc.AdminStub(channel).Status(api_pb2.StatusRequest(), timeout=5)
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return status, check.status


def test_a_node_is_ready_only_when_every_group_core_is(node) -> None:
    ports, _, _ = node
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
    ports, _, _ = node
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
    ports, _, _ = node
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
    ports, _, _ = node
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


class _Frozen:
    """A core frozen (SIGSTOP) as a worker sees it: its socket accepts connections (the kernel's backlog) and
    nothing answers on them, so a call waits for its deadline rather than failing."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))  # listening, never accepting

    def close(self) -> None:
        self.sock.close()


def test_a_group_core_that_stopped_answering_is_not_asked_the_node_not_ready_naming_it(node) -> None:
    """Group 1's core frozen: while the worker has heard from it lately its health is asked (and waits for
    the caller's deadline); once its silence passes the bound, Check answers NOT_SERVING at once, Status
    lists group 1 not ready naming how long, and a Watch begins NOT_SERVING."""
    ports, _, quiet = node
    group0 = _Core(ports[0], "127.0.0.1:9201", ready=True)
    group1 = _Frozen(ports[1])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[2]}") as channel:
            health_stub, admin = health_pb2_grpc.HealthStub(channel), api_pb2_grpc.AdminStub(channel)
            with pytest.raises(grpc.RpcError) as err:  # not known silent yet: asked, and the answer waits
                health_stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            quiet[1] = 7.25
            began = time.monotonic()
            assert health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == NOT_SERVING
            status = admin.Status(api_pb2.StatusRequest(), timeout=5)
            assert time.monotonic() - began < 3  # neither waited for the frozen core (a call to it waits 5 s)
            assert not status.ready and [g.ready for g in status.groups] == [True, False]
            assert status.groups[1].node_id == "127.0.0.1:9301"
            assert status.groups[1].not_ready_reason.startswith("group 1's core has not answered this worker for "
                                                                "7.2 s"), status.groups[1].not_ready_reason
            # the Controller service is group 0's core's alone: group 1's silence is not its health
            group0.health.set(CONTROLLER_SERVICE, SERVING)
            ask = health_pb2.HealthCheckRequest(service=CONTROLLER_SERVICE)
            assert health_stub.Check(ask, timeout=5).status == SERVING
            watch = health_stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == NOT_SERVING
            watch.cancel()
    finally:
        group1.close()
        group0.server.stop(None)


def test_watch_turns_not_serving_while_a_core_is_silent_and_back_after(node) -> None:
    """Each core's health SERVING and its Watch stream open, as a frozen core's stays: the node's Watch
    follows the cores' silences too."""
    ports, _, quiet = node
    group0 = _Core(ports[0], "127.0.0.1:9201", ready=True)
    group1 = _Core(ports[1], "127.0.0.1:9301", ready=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[2]}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == SERVING
            quiet[1] = 6.0  # group 0's the same: the one-group test below
            assert next(watch).status == NOT_SERVING
            quiet[1] = 0.0
            assert next(watch).status == SERVING
            watch.cancel()
    finally:
        group1.server.stop(None)
        group0.server.stop(None)


def test_a_one_group_node_s_core_that_stopped_answering(one_group) -> None:
    """A one-group node's worker answers its core's Status and health as they are (no `groups`), and for a
    core silent past the bound the node's own: not ready naming its core, NOT_SERVING, without asking it."""
    ports, _, quiet = one_group
    core = _Core(ports[0], "127.0.0.1:9201", ready=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[1]}") as channel:
            health_stub, admin = health_pb2_grpc.HealthStub(channel), api_pb2_grpc.AdminStub(channel)
            assert admin.Status(api_pb2.StatusRequest(), timeout=5) == api_pb2.NodeStatus(node_id="127.0.0.1:9201",
                                                                                         ready=True)
            assert health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
            watch = health_stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == SERVING
            quiet[0] = 12.0
            assert next(watch).status == NOT_SERVING
            assert health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == NOT_SERVING
            status = admin.Status(api_pb2.StatusRequest(), timeout=5)  # what it answers, not ready whatever it says
            assert (status.node_id, status.ready, list(status.groups)) == ("127.0.0.1:9201", False, [])
            assert status.not_ready_reason.startswith("this node's core has not answered this worker for 12.0 s")
            quiet[0] = 0.0
            assert next(watch).status == SERVING
            assert admin.Status(api_pb2.StatusRequest(), timeout=5).ready
            watch.cancel()
    finally:
        core.server.stop(None)


def test_group_0_s_core_frozen_the_node_says_so_itself(node) -> None:
    """Group 0's core's status is the node's: frozen and silent past the bound, it is asked only briefly and
    the node's own is answered, not ready naming it (a one-group node's worker answers the same)."""
    ports, _, quiet = node
    group0 = _Frozen(ports[0])
    group1 = _Core(ports[1], "127.0.0.1:9301", ready=True)
    quiet[0] = 9.0
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[2]}") as channel:
            status = api_pb2_grpc.AdminStub(channel).Status(api_pb2.StatusRequest(), timeout=5)
            assert (status.node_id, status.grpc_addr, status.ready) == ("127.0.0.1:9201", "127.0.0.1:9101", False)
            assert status.not_ready_reason.startswith("group 0's core has not answered this worker for 9.0 s")
            assert [(g.node_id, g.ready) for g in status.groups] == [("127.0.0.1:9201", False),
                                                                     ("127.0.0.1:9301", True)]
            health_stub = health_pb2_grpc.HealthStub(channel)
            assert health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == NOT_SERVING
            watch = health_stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == NOT_SERVING
            watch.cancel()
    finally:
        group1.server.stop(None)
        group0.close()
