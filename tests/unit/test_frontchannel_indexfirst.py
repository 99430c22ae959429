"""A worker's LINEARIZABLE reads from the Go front end (nameserver/api/frontchannel.py, IndexFirst): the read
index is asked as the call arrives whole, and the call runs on the thread the index comes on, with that index
(no pool thread waits for it); a call that would still wait there is the pool's with its index kept; with no
index that way, the pool's call asks as ever. Spoken to directly over a real Unix socket in this process."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from nameserver import framing
from nameserver.api.frontchannel import CALL, HALF_CLOSE, MESSAGE, UNARY, FrontServer, IndexFirst, socket_path
from nameserver.config import NodeConfig
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.core.readindex import GIVEN_INDEX
from nameserver.pb import api_pb2
from nameserver.replica.node import ReplicaNode
from nameserver.worker import _index_first_reads

READ, BUSY = "/t.T/Read", "/t.T/Busy"
CALLER = json.dumps({"peer": "ipv4:127.0.0.1:1", "auth": {}}).encode()


def read(request: bytes, context: grpc.ServicerContext) -> bytes:
    return f"{threading.current_thread().name} {GIVEN_INDEX.get()}".encode()


def busy(request: bytes, context: grpc.ServicerContext) -> bytes:
    if not waiting_allowed():
        raise WouldBlock("the replica has not applied the index yet")
    return read(request, context)


class Reads(grpc.GenericRpcHandler):
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        behavior = {READ: read, BUSY: busy}.get(handler_call_details.method)
        return None if behavior is None else grpc.unary_unary_rpc_method_handler(behavior)


@pytest.fixture
def front(tmp_path: Any) -> Iterator[tuple[socket.socket, list[tuple[str, bytes, Callable[[int | None], None]]]]]:
    asked: list[tuple[str, bytes, Callable[[int | None], None]]] = []

    def start(method: str, request: bytes, context: Any, done: Callable[[int | None], None]) -> bool:
        if request == b"serializable":
            return False
        asked.append((method, request, done))
        return True

    with serving(tmp_path, [], IndexFirst(frozenset({READ, BUSY}), start), Reads()) as sock:
        yield sock, asked


@contextlib.contextmanager
def serving(tmp_path: Any, interceptors: list[Any], first: IndexFirst, handlers: grpc.GenericRpcHandler
            ) -> Iterator[socket.socket]:
    """A worker's front-channel server with `first` and `handlers`, and a front end's link to it."""
    data_dir = str(tmp_path)
    cfg = replace(NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:0", data_dir=data_dir, members=[]),
                  worker_processes=1, workers=4)
    server = FrontServer(cfg, socket_path(data_dir, 0), interceptors, index_first=first)
    server.add_generic_rpc_handlers((handlers,))
    server.start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path(data_dir, 0))
    sock.settimeout(10)
    try:
        yield sock
    finally:
        sock.close()
        server.stop()


def _call(sock: socket.socket, number: int, method: str, request: bytes) -> bytes:
    key = number.to_bytes(8, "big")
    sock.sendall(framing.pack([[CALL, key, b"-1", method.encode(), CALLER], [MESSAGE, key, request],
                               [HALF_CLOSE, key]]))
    return key


def _answer(sock: socket.socket) -> tuple[bytes, bytes, str]:
    body = framing.read_frame(sock, 1 << 20)
    assert body is not None
    (record,) = framing.unpack(body)
    return record[0], record[1], record[2].decode()


def _index_comes(done: Callable[[int | None], None], index: int | None) -> None:
    """As the write channel's reader thread calls back with the core's answer."""
    t = threading.Thread(target=done, args=(index,), name="write-channel-reader")
    t.start()
    t.join(10)


def _wait_asked(asked: list[Any], n: int) -> None:
    for _ in range(500):
        if len(asked) >= n:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{len(asked)} asks, not {n}")


def test_a_linearizable_read_asks_as_it_arrives_and_runs_with_its_index_where_the_index_comes(front: Any) -> None:
    sock, asked = front
    key = _call(sock, 1, READ, b"linearizable")
    _wait_asked(asked, 1)
    assert asked[0][:2] == (READ, b"linearizable")
    sock.settimeout(0.2)
    with pytest.raises(TimeoutError):  # nothing answered before its index comes
        framing.read_frame(sock, 1 << 20)
    sock.settimeout(10)
    _index_comes(asked[0][2], 17)
    assert _answer(sock) == (UNARY, key, "write-channel-reader 17")


def test_a_read_that_would_wait_with_its_index_is_the_pools_with_the_index_kept(front: Any) -> None:
    sock, asked = front
    key = _call(sock, 1, BUSY, b"linearizable")
    _wait_asked(asked, 1)
    _index_comes(asked[0][2], 23)
    kind, got, reply = _answer(sock)
    assert (kind, got) == (UNARY, key) and reply.startswith("grpc") and reply.endswith(" 23"), reply


def test_without_an_index_that_way_or_without_an_ask_the_pool_runs_the_call_as_ever(front: Any) -> None:
    sock, asked = front
    key = _call(sock, 1, READ, b"linearizable")
    _wait_asked(asked, 1)
    _index_comes(asked[0][2], None)
    kind, got, reply = _answer(sock)
    assert (kind, got) == (UNARY, key) and reply.startswith("grpc") and reply.endswith(" None"), reply
    key = _call(sock, 2, READ, b"serializable")  # start said it is not such a call
    kind, got, reply = _answer(sock)
    assert (kind, got) == (UNARY, key) and reply.startswith("grpc") and reply.endswith(" None"), reply
    assert len(asked) == 1


def test_only_a_well_formed_linearizable_read_asks_before_it_runs(tmp_path: Any) -> None:
    """The worker's IndexFirst: GetBinding and ListBindings LINEARIZABLE with min_offset >= 0 ask first; a
    SERIALIZABLE one, a negative min_offset (refused before any read index) or bytes that do not decode are
    the pool's call, as ever."""
    timeouts: list[float] = []
    first = _index_first_reads(lambda timeout, done: timeouts.append(timeout),
                               NodeConfig("127.0.0.1:1", "127.0.0.1:2", str(tmp_path), []))
    ns = "/rip18.nameserver.v1.NameServer"
    context = type("Context", (), {"time_remaining": lambda self: 2.5})()

    def asks(method: str, request: bytes) -> bool:
        return first.start(f"{ns}/{method}", request, context, lambda index: None)

    lin = api_pb2.LINEARIZABLE
    assert asks("GetBinding", api_pb2.GetBindingRequest(topic="t", consistency=lin).SerializeToString())
    assert asks("ListBindings", api_pb2.ListBindingsRequest(topic="t", consistency=lin).SerializeToString())
    assert timeouts == [2.5, 2.5]
    assert not asks("GetBinding", api_pb2.GetBindingRequest(topic="t", consistency=api_pb2.SERIALIZABLE)
                    .SerializeToString())
    assert not asks("GetBinding", api_pb2.GetBindingRequest(topic="t", consistency=lin,
                                                            min_offset=-1).SerializeToString())
    assert not asks("GetBinding", b"\xff\xff")
    assert len(timeouts) == 2


def test_a_replica_nodes_linearizable_index_is_the_one_given_and_never_waits_on_an_event_loop() -> None:
    node = ReplicaNode.__new__(ReplicaNode)
    node.read_index = lambda timeout: 5
    assert node.linearizable_index(1) == 5
    token = GIVEN_INDEX.set(9)
    try:
        assert node.linearizable_index(1) == 9
    finally:
        GIVEN_INDEX.reset(token)
    from nameserver.core.nowait import no_wait
    with no_wait(), pytest.raises(WouldBlock):
        node.linearizable_index(1)


def test_a_read_run_when_its_index_comes_is_timed_from_its_arrival(tmp_path: Any) -> None:
    """nameserver_grpc_handling_seconds times a call as its client waited: a read that ran only once its
    index came is timed from its arrival (CALL_RECEIVED), not from its handler's start."""
    import time

    from prometheus_client import CollectorRegistry

    from nameserver.api.grpcwrap import CALL_RECEIVED
    from nameserver.ops.metrics import RequestMetrics

    seen: list[float | None] = []

    def timed(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(CALL_RECEIVED.get())
        return b"ok"

    class Timed(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return grpc.unary_unary_rpc_method_handler(timed) if details.method == READ else None

    asked: list[Callable[[int | None], None]] = []
    metrics = RequestMetrics(CollectorRegistry())
    first = IndexFirst(frozenset({READ}), lambda m, r, c, done: asked.append(done) or True)
    with serving(tmp_path, [metrics.interceptor()], first, Timed()) as sock:
        t0 = time.perf_counter()
        _call(sock, 1, READ, b"linearizable")
        _wait_asked(asked, 1)
        time.sleep(0.3)  # the index is late
        _index_comes(asked[0], 17)
        assert _answer(sock)[0] == UNARY
        assert seen and seen[0] is not None and t0 <= seen[0] < t0 + 0.3
        assert CALL_RECEIVED.get() is None
        total = metrics.registry.get_sample_value("nameserver_grpc_handling_seconds_sum",
                                                  {"service": "t.T", "method": "Read", "type": "unary"})
        assert total is not None and total >= 0.3
