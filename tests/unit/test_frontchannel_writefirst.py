"""A worker's unary writes from the Go front end (nameserver/api/frontchannel.py, WriteFirst; corelink.write_first):
the write goes to the core as the call arrives whole, with no pool thread waiting for it, and the call runs, with
the worker's interceptors, once the core answered and the worker's replica has the answer's offset
(read-your-writes): on the replica's thread as it publishes that offset, or on the write channel's reader thread
when it has it already. A call whose caller the front end did not name is never sent; a call its client leaves
is cancelled on the core. A real core end of the write channel (a stub handler), a real worker end, a real
front-channel server, all on Unix sockets in this process; the replica is a stand-in with its offset."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from nameserver import framing
from nameserver.api import corelink, writechannel
from nameserver.api.deadlines import DeadlineWatch
from nameserver.api.frontchannel import CALL, CANCEL, HALF_CLOSE, MESSAGE, STATUS, UNARY, FrontServer, socket_path
from nameserver.config import NodeConfig
from nameserver.pb import api_pb2_grpc
from nameserver.worker import _write_first

PUT = f"/{corelink.NAMESERVER.full_name}/PutKv"
CALLER = json.dumps({"peer": "ipv4:127.0.0.1:1", "auth": {}}).encode()
CORE_OFFSET = 5


class Replica:
    """What the worker's write path reads of its replica: the offset, its wait, its publish listeners."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.publish_listeners: list[Callable[[int], None]] = []
        self._cv = threading.Condition()

    def wait_applied(self, offset: int, timeout: float, alive: Callable[[], bool] | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self.offset >= offset, timeout)

    def publish(self, offset: int) -> None:
        """As the replica's thread publishes an offset: readers see it, then the listeners run."""
        def run() -> None:
            with self._cv:
                self.offset = offset
                self._cv.notify_all()
            for listener in self.publish_listeners:
                listener(offset)
        t = threading.Thread(target=run, name="replica-test")
        t.start()
        t.join(10)


class Where(grpc.ServerInterceptor):
    """Records the thread each call's handler ran on (the worker's interceptors run there too)."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        behavior = handler.unary_unary

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            self.threads.append(threading.current_thread().name)
            return behavior(request, context)
        return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


@contextlib.contextmanager
def node(tmp_path: Any, replica: Replica, put: Callable[[bytes, Any], bytes]
         ) -> Iterator[tuple[socket.socket, writechannel.WriteChannelServer, Where]]:
    data_dir = str(tmp_path)
    calls = writechannel.WriteCalls(api_pb2_grpc.NameServerServicer(), [corelink.WorkerCallers(lambda: CORE_OFFSET)])
    calls.handlers = {PUT: grpc.unary_unary_rpc_method_handler(put)}
    core = writechannel.WriteChannelServer(writechannel.socket_path(data_dir), calls, 4, 1 << 20)
    core.start()
    writes = writechannel.WriteChannel(core.path, 1 << 20)
    cfg = replace(NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:0", data_dir=data_dir, members=[]),
                  worker_processes=1, workers=4)
    where = Where()
    front = FrontServer(cfg, socket_path(data_dir, 0), [where], write_first=_write_first(writes, replica))  # type: ignore[arg-type]
    onward = grpc.insecure_channel(f"unix:{data_dir}/nothing.sock")
    front.add_generic_rpc_handlers((corelink.CoreForwarder(onward, {}, replica.wait_applied, writes),))
    front.start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path(data_dir, 0))
    sock.settimeout(10)
    try:
        yield sock, core, where
    finally:
        sock.close()
        front.stop()
        writes.close()
        onward.close()
        core.stop()


def _call(sock: socket.socket, number: int, request: bytes, caller: bytes = CALLER) -> bytes:
    key = number.to_bytes(8, "big")
    sock.sendall(framing.pack([[CALL, key, b"-1", PUT.encode(), caller], [MESSAGE, key, request], [HALF_CLOSE, key]]))
    return key


def _answer(sock: socket.socket) -> list[bytes]:
    body = framing.read_frame(sock, 1 << 20)
    assert body is not None
    (record,) = framing.unpack(body)
    return record


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_write_is_sent_as_it_arrives_and_answered_on_the_replicas_thread_once_it_has_the_offset(
        tmp_path: Any) -> None:
    replica = Replica(CORE_OFFSET - 2)
    with node(tmp_path, replica, lambda request, context: b"written " + request) as (sock, core, where):
        key = _call(sock, 1, b"kv")
        _until(lambda: core.calls == 1)  # at the core before anything waits on the worker
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):  # read-your-writes: not before the replica has the write
            framing.read_frame(sock, 1 << 20)
        sock.settimeout(10)
        assert where.threads == []  # no thread of the worker ran the call meanwhile
        replica.publish(CORE_OFFSET)
        assert _answer(sock)[:3] == [UNARY, key, b"written kv"]
        assert where.threads == ["replica-test"]


def test_with_the_offset_applied_already_the_call_runs_where_the_core_answer_comes(tmp_path: Any) -> None:
    replica = Replica(CORE_OFFSET)
    with node(tmp_path, replica, lambda request, context: b"written " + request) as (sock, _core, where):
        key = _call(sock, 1, b"kv")
        assert _answer(sock)[:3] == [UNARY, key, b"written kv"]
        assert where.threads == ["write-channel-reader"]


def test_a_refusal_is_answered_at_once_whatever_the_replicas_offset(tmp_path: Any) -> None:
    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "value: too long")

    with node(tmp_path, Replica(0), refuse) as (sock, _core, _where):
        key = _call(sock, 1, b"kv")
        record = _answer(sock)
        assert record[:4] == [STATUS, key, str(grpc.StatusCode.INVALID_ARGUMENT.value[0]).encode(), b"value: too long"]
        assert corelink.headers.CORE_OFFSET.encode() not in record  # the worker's header never leaves it


def test_a_call_whose_caller_the_front_end_did_not_name_is_never_sent(tmp_path: Any) -> None:
    with node(tmp_path, Replica(CORE_OFFSET), lambda request, context: request) as (sock, core, _where):
        key = _call(sock, 1, b"kv", caller=b"")
        record = _answer(sock)
        assert record[:3] == [STATUS, key, str(grpc.StatusCode.UNAUTHENTICATED.value[0]).encode()]
        assert core.calls == 0


def test_a_write_its_client_leaves_is_cancelled_on_the_core(tmp_path: Any) -> None:
    entered, seen = threading.Event(), threading.Event()

    def held(request: bytes, context: grpc.ServicerContext) -> bytes:
        ended = threading.Event()
        context.add_callback(ended.set)
        entered.set()
        if ended.wait(10):
            seen.set()
        return request

    with node(tmp_path, Replica(CORE_OFFSET), held) as (sock, core, _where):
        key = _call(sock, 1, b"kv")
        assert entered.wait(10)
        sock.sendall(framing.pack([[CANCEL, key]]))
        record = _answer(sock)
        assert record[:3] == [STATUS, key, str(grpc.StatusCode.CANCELLED.value[0]).encode()]
        assert seen.wait(10) and core.cancels == 1


def test_replica_offsets_run_each_callback_once_at_its_offset_or_its_bound() -> None:
    replica = Replica(3)
    offsets = corelink.ReplicaOffsets(lambda: replica.offset, replica.publish_listeners, DeadlineWatch("t"))
    ran: list[tuple[str, str]] = []

    def note(name: str) -> Callable[[], None]:
        return lambda: ran.append((name, threading.current_thread().name))

    offsets.when(3, 5.0, note("there"))
    offsets.when(5, 5.0, note("at 5"))
    offsets.when(4, 5.0, note("at 4"))
    offsets.when(9, 0.2, note("bound"))
    assert ran == [("there", "MainThread")]
    replica.publish(5)
    assert ran[1:] == [("at 4", "replica-test"), ("at 5", "replica-test")]
    _until(lambda: len(ran) == 4)
    assert ran[3] == ("bound", "t")
    replica.publish(9)
    time.sleep(0.1)
    assert len(ran) == 4
