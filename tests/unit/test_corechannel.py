"""The local channel between a core and a remoting worker (nameserver/remoting/corechannel.py), both ends
real listeners on real sockets in this process: requests pipelined through it with their opaques mapped
back, the channel's own fields never reaching a client, read-your-writes on a connection, and a lost
core failing the requests that waited on it, then reconnected."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from nameserver.api.auth import NAMESERVER_SERVICE
from nameserver.api.inprocess import InProcessStub
from nameserver.config import Member, NodeConfig
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.remoting import RemotingServer, codes, frame
from nameserver.remoting.command import Command
from nameserver.remoting.corechannel import APPLIED_FIELD, CONN_FIELD, CoreChannel, CoreHandlers
from nameserver.remoting.handlers import Handlers

ROUTE = api_pb2.TopicRoute(
    broker_datas=[state_pb2.BrokerData(cluster="C", broker_name="b", addrs=[state_pb2.BrokerAddr(addr="h:1")])],
    queue_datas=[state_pb2.QueueData(broker_name="b", read_queue_nums=1, write_queue_nums=1, perm=6)])
APPLIED = 42


class Core(api_pb2_grpc.NameServerServicer):
    """The core's service: KV writes (one held until released), no route reads (a worker answers those)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.keys: list[str] = []

    def PutKv(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.key == "held":
            self.release.wait(10)
        self.keys.append(request.key)
        return api_pb2.WriteReply(offset=APPLIED)


class Replica(api_pb2_grpc.NameServerServicer):
    def __init__(self) -> None:
        self.offset = APPLIED - 1
        self.reads = 0

    def GetRoute(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.reads += 1
        return api_pb2.GetRouteReply(route=ROUTE, apply_offset=self.offset)


def _cfg(tmp_path: Any) -> NodeConfig:
    return NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir=str(tmp_path),
                      members=[Member("127.0.0.1:1", "127.0.0.1:2")], remoting_addr="127.0.0.1:0")


def core_server(cfg: NodeConfig, core: Core, path: str) -> RemotingServer:
    handlers = CoreHandlers(Handlers(InProcessStub(core, NAMESERVER_SERVICE), cfg, 5.0), lambda: APPLIED)
    server = RemotingServer(cfg, None, handlers=handlers, unix_path=path)
    server.start()
    return server


@pytest.fixture
def ends(tmp_path: Any) -> Iterator[tuple[Core, Replica, RemotingServer, RemotingServer]]:
    """The core's listener on its Unix socket, and a worker's TCP listener passing to it."""
    cfg, core, replica = _cfg(tmp_path), Core(), Replica()
    path = os.path.join(str(tmp_path), "channel", "remoting.sock")
    core_end = core_server(cfg, core, path)
    worker = RemotingServer(cfg, replica, front=CoreChannel(path, lambda: replica.offset, timeout_s=5.0))
    worker.start()
    yield core, replica, worker, core_end
    core.release.set()
    worker.stop()
    core_end.stop()


def send(sock: socket.socket, opaque: int, code: int, ext: dict[str, str]) -> None:
    sock.sendall(frame.encode(Command(code=code, opaque=opaque, version=479, ext_fields=ext)))


def receive(sock: socket.socket) -> Command:
    head = sock.recv(4, socket.MSG_WAITALL)
    size = int.from_bytes(head, "big")
    return frame.decode(sock.recv(size, socket.MSG_WAITALL))


def test_the_core_socket_is_private(ends: tuple) -> None:
    path = ends[3].unix_path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_writes_are_pipelined_to_the_core_and_answered_under_the_clients_opaques(ends: tuple) -> None:
    core, _, worker, _ = ends
    sock = socket.create_connection(("127.0.0.1", worker.port), timeout=10)
    # one answered first: a connection holds one request of a code never answered yet (replybudget.py)
    send(sock, 6, codes.PUT_KV_CONFIG, {"namespace": "ns", "key": "first", "value": "v"})
    assert receive(sock).code == codes.SUCCESS
    send(sock, 7, codes.PUT_KV_CONFIG, {"namespace": "ns", "key": "held", "value": "v", CONN_FIELD: "forged"})
    send(sock, 8, codes.PUT_KV_CONFIG, {"namespace": "ns", "key": "quick", "value": "v"})
    first = receive(sock)  # the second passed the first, still held in the core
    core.release.set()
    second = receive(sock)
    assert [(first.opaque, first.code), (second.opaque, second.code)] == [(8, 0), (7, 0)]
    assert core.keys == ["first", "quick", "held"]
    for resp in (first, second):
        assert APPLIED_FIELD not in resp.ext_fields and CONN_FIELD not in resp.ext_fields
    sock.close()


def test_a_read_after_a_write_waits_for_the_replica_to_reach_it(ends: tuple) -> None:
    core, replica, worker, _ = ends
    core.release.set()
    fresh = socket.create_connection(("127.0.0.1", worker.port), timeout=10)
    send(fresh, 1, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert receive(fresh).code == codes.SUCCESS  # nothing written on it: answered at the replica's offset
    sock = socket.create_connection(("127.0.0.1", worker.port), timeout=10)
    send(sock, 1, codes.PUT_KV_CONFIG, {"namespace": "ns", "key": "k", "value": "v"})
    assert receive(sock).code == codes.SUCCESS
    reads = replica.reads
    send(sock, 2, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    time.sleep(0.3)
    assert replica.reads == reads, "read at an offset before the connection's own write"
    replica.offset = APPLIED
    assert receive(sock).code == codes.SUCCESS
    assert replica.reads == reads + 1
    sock.close()
    fresh.close()


def test_a_lost_core_fails_the_waiting_requests_and_is_reconnected(ends: tuple, tmp_path: Any) -> None:
    core, _, worker, core_end = ends
    sock = socket.create_connection(("127.0.0.1", worker.port), timeout=10)
    send(sock, 5, codes.PUT_KV_CONFIG, {"namespace": "ns", "key": "held", "value": "v"})
    time.sleep(0.3)  # it waits in the core
    # the core's end closes every connection (its process died): the waiting request is answered at once
    core_end.stop()
    resp = receive(sock)
    assert (resp.opaque, resp.code) == (5, codes.SYSTEM_ERROR) and "core" in (resp.remark or "")
    core.release.set()
    # a core listening again is reconnected to by the next request
    again = core_server(_cfg(tmp_path), core, core_end.unix_path)
    try:
        send(sock, 6, codes.PUT_KV_CONFIG, {"namespace": "ns", "key": "after", "value": "v"})
        resp = receive(sock)
        assert (resp.opaque, resp.code) == (6, codes.SUCCESS)
    finally:
        again.stop()
        sock.close()
