"""A worker's gRPC pass-through to its core (nameserver/api/corelink.py), on real gRPC servers in this
process: a "core" on a Unix socket behind WorkerCallers, a "worker" forwarding to it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nameserver import headers
from nameserver.api import auth, corelink, writechannel
from nameserver.config import NodeConfig
from nameserver.pb import api_pb2, api_pb2_grpc

NS = corelink.NAMESERVER.full_name
PUT, WATCH, STREAM = f"/{NS}/PutKv", f"/{NS}/Watch", f"/{NS}/RegisterBrokerStream"


class Core:
    """Raw handlers recording what reached them; the core's apply offset is 42."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def record(self, request: bytes, context: grpc.ServicerContext) -> None:
        self.seen.append({"request": request, "peer": context.peer(), "auth": dict(context.auth_context()),
                          "metadata": dict(context.invocation_metadata())})

    def put(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.record(request, context)
        if request == b"fail":
            context.set_trailing_metadata(((headers.CURRENT_VERSION, "7"),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "version is 7")
        context.set_trailing_metadata(((headers.APPLY_OFFSET, "5"),))
        return request[::-1]

    def register_stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return b"|".join(requests)

    def watch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self.record(request, context)
        yield from (b"a", b"\x00\xff", b"c")
        context.set_trailing_metadata(((headers.LOG_TO_OFFSET, "9"),))


@pytest.fixture
def link(tmp_path: Any) -> Iterator[tuple[Core, grpc.Channel, list[tuple[int, float]]]]:
    core = Core()
    core_server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[corelink.WorkerCallers(lambda: 42)])
    core_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(NS, {
        "PutKv": grpc.unary_unary_rpc_method_handler(core.put),
        "Watch": grpc.unary_stream_rpc_method_handler(core.watch),
        "RegisterBrokerStream": grpc.stream_unary_rpc_method_handler(core.register_stream)}),))
    target = f"unix:{tmp_path}/core.sock"
    core_server.add_insecure_port(target)
    core_server.start()
    settled: list[tuple[int, float]] = []

    def settle(offset: int, timeout: float, alive: Any) -> bool:
        settled.append((offset, timeout))
        return True

    # the writes (PutKv here) come on the write channel, through the same interceptor
    calls = writechannel.WriteCalls(api_pb2_grpc.NameServerServicer(), [corelink.WorkerCallers(lambda: 42)])
    calls.handlers = {PUT: grpc.unary_unary_rpc_method_handler(core.put)}
    writes_server = writechannel.WriteChannelServer(f"{tmp_path}/channel/writes.sock", calls, 4, 1 << 20)
    writes_server.start()
    writes = writechannel.WriteChannel(writes_server.path, 1 << 20)
    worker = grpc.server(futures.ThreadPoolExecutor(4))
    to_core = grpc.insecure_channel(target)
    worker.add_generic_rpc_handlers((corelink.CoreForwarder(to_core, {}, settle, writes),))
    port = worker.add_insecure_port("127.0.0.1:0")
    worker.start()
    client = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield core, client, settled
    finally:
        client.close()
        worker.stop(None)
        writes.close()
        writes_server.stop()
        to_core.close()
        core_server.stop(None)


def test_a_call_reaches_the_core_as_sent_and_its_answer_comes_back(link: Any) -> None:
    core, client, settled = link
    put = client.unary_unary(PUT)
    spoof = json.dumps({"self": True})
    reply, call = put.with_call(b"\x0a\x03abc\xff", timeout=5, metadata=(
        (headers.CLIENT_ID, "c1"), (headers.CLIENT_SEQ, "3"), (headers.WORKER_CALLER, spoof)))
    assert reply == b"\xffcba\x03\x0a"  # the bytes, untouched both ways
    seen = core.seen[-1]
    assert seen["request"] == b"\x0a\x03abc\xff"
    assert seen["metadata"][headers.CLIENT_ID] == "c1" and seen["metadata"][headers.CLIENT_SEQ] == "3"
    # the core sees the worker's client, not the worker, and not what the client claimed to be
    assert "127.0.0.1" in seen["peer"] and not seen["peer"].startswith("unix")
    assert auth.NODE_ITSELF not in seen["auth"]
    assert seen["metadata"][headers.WORKER_CALLER] != spoof
    # the answer waited for the worker's replica to reach the core's offset, which the client never sees
    assert settled and settled[-1][0] == 42 and 0 < settled[-1][1] <= corelink.SETTLE_S
    trailing = dict(call.trailing_metadata())
    assert trailing[headers.APPLY_OFFSET] == "5" and headers.CORE_OFFSET not in trailing


def test_a_write_another_node_forwarded_does_not_wait_for_this_worker_s_replica(link: Any) -> None:
    """A follower's core forwards its clients' writes to the leader's public port (its workers): the
    client reads on the follower, whose worker waits for its own replica; the leader worker's wait only
    delayed every forwarded write."""
    _, client, settled = link
    put = client.unary_unary(PUT)
    reply, call = put.with_call(b"\x0a\x01x", timeout=5, metadata=((headers.FORWARDED, "1"),))
    assert reply == b"x\x01\x0a" and settled == []
    assert headers.CORE_OFFSET not in dict(call.trailing_metadata())
    put(b"\x0a\x01x", timeout=5)  # a client's own: waited for
    assert [offset for offset, _ in settled] == [42]


def test_a_refusal_comes_back_with_its_status_details_and_trailers(link: Any) -> None:
    _, client, _ = link
    with pytest.raises(grpc.RpcError) as err:
        client.unary_unary(PUT)(b"fail", timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and err.value.details() == "version is 7"
    trailing = dict(err.value.trailing_metadata())
    assert trailing[headers.CURRENT_VERSION] == "7" and headers.CORE_OFFSET not in trailing


def test_a_stream_passes_through(link: Any) -> None:
    _, client, _ = link
    call = client.unary_stream(WATCH)(b"w", timeout=5)
    assert list(call) == [b"a", b"\x00\xff", b"c"]
    assert dict(call.trailing_metadata())[headers.LOG_TO_OFFSET] == "9"


def test_a_client_stream_passes_through(link: Any) -> None:
    _, client, _ = link
    assert client.stream_unary(STREAM)(iter([b"1", b"22", b"333"]), timeout=5) == b"1|22|333"


def test_a_method_of_no_forwarded_service_is_not_served(link: Any) -> None:
    _, client, _ = link
    with pytest.raises(grpc.RpcError) as err:
        client.unary_unary(writechannel.READ_INDEX)(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_core_refuses_a_call_that_names_no_caller(tmp_path: Any) -> None:
    calls = threading.Event()
    core = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[corelink.WorkerCallers(lambda: 0)])
    core.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(NS, {
        "PutKv": grpc.unary_unary_rpc_method_handler(lambda req, ctx: calls.set() or b"")}),))
    target = f"unix:{tmp_path}/core.sock"
    core.add_insecure_port(target)
    core.start()
    channel = grpc.insecure_channel(target)
    try:
        for metadata in ((), ((headers.WORKER_CALLER, "not json"),)):
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(PUT)(b"x", timeout=5, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert not calls.is_set()
    finally:
        channel.close()
        core.stop(None)


def test_linearizable_reads_waiting_at_once_share_the_cores_read_index_asks(tmp_path: Any) -> None:
    """A worker's LINEARIZABLE reads waiting at once share one READ_INDEX ask on the write channel, as the
    node itself (each ask here answers its own number, after a while); a read that comes after an
    answer gets a later ask's."""
    answered: list[int] = []
    callers: list[str] = []
    lock = threading.Lock()

    def read_index(request: api_pb2.ReadIndexRequest, context: grpc.ServicerContext) -> api_pb2.ReadIndexReply:
        time.sleep(0.05)
        with lock:
            callers.append(context.peer())
            answered.append(len(answered) + 1)
            return api_pb2.ReadIndexReply(read_index=answered[-1])

    calls = writechannel.WriteCalls(api_pb2_grpc.NameServerServicer(), [corelink.WorkerCallers(lambda: 42)])
    calls.handlers[writechannel.READ_INDEX] = grpc.unary_unary_rpc_method_handler(
        read_index, request_deserializer=api_pb2.ReadIndexRequest.FromString,
        response_serializer=api_pb2.ReadIndexReply.SerializeToString)
    server = writechannel.WriteChannelServer(f"{tmp_path}/channel/writes.sock", calls, 8, 1 << 20)
    server.start()
    writes = writechannel.WriteChannel(server.path, 1 << 20)
    read_indexes = corelink.core_read_index(writes, NodeConfig("127.0.0.1:1", "127.0.0.1:2", str(tmp_path), []),
                                              str(tmp_path))
    index = read_indexes.read_index
    try:
        first = index(5)
        with futures.ThreadPoolExecutor(32) as pool:
            got = list(pool.map(lambda _: index(5), range(32)))
        assert all(i > first for i in got)
        assert len(answered) < 1 + 32 / 2, answered  # one ask per read: 33
        assert index(5) > max(got)
        assert set(callers) == {"worker"}  # the node itself (CALLER "self"), not a client
    finally:
        read_indexes.stop()
        writes.close()
        server.stop()


def test_health_asked_of_a_worker_is_the_cores(tmp_path: Any) -> None:
    """A worker has no health service of its own: Check and Watch reach the core's, so a worker's port says
    NOT_SERVING while its core does (a balancer never sends clients to a node whose core is not ready)."""
    core_health = health.HealthServicer()
    core_health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    core_server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[corelink.WorkerCallers(lambda: 1)])
    health_pb2_grpc.add_HealthServicer_to_server(core_health, core_server)
    target = f"unix:{tmp_path}/core.sock"
    core_server.add_insecure_port(target)
    core_server.start()
    worker = grpc.server(futures.ThreadPoolExecutor(4))
    to_core = grpc.insecure_channel(target)
    no_writes = writechannel.WriteChannel(f"{tmp_path}/none", 1 << 20)
    worker.add_generic_rpc_handlers((corelink.CoreForwarder(to_core, {}, lambda offset, timeout, alive: True,
                                                             no_writes),))
    port = worker.add_insecure_port("127.0.0.1:0")
    worker.start()
    client = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub, ask = health_pb2_grpc.HealthStub(client), health_pb2.HealthCheckRequest(service="")
        assert stub.Check(ask, timeout=5).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch = stub.Watch(ask, timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        core_health.set("", health_pb2.HealthCheckResponse.SERVING)  # the core is ready
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        assert stub.Check(ask, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    finally:
        client.close()
        worker.stop(None)
        to_core.close()
        core_server.stop(None)


def test_a_local_stream_is_served_here_only_when_its_request_lets_it(tmp_path: Any) -> None:
    """Watch on a worker: answered by the replica's handler when `here(request)` (the replica's history
    holds where it resumes), else passed to the core, the request as decoded and its answer's bytes as sent."""
    core = Core()
    core_server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[corelink.WorkerCallers(lambda: 1)])
    core_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(NS, {
        "Watch": grpc.unary_stream_rpc_method_handler(core.watch)}),))
    target = f"unix:{tmp_path}/core.sock"
    core_server.add_insecure_port(target)
    core_server.start()

    def replica_watch(request: api_pb2.WatchRequest, context: grpc.ServicerContext
                      ) -> Iterator[api_pb2.WatchResponse]:
        yield api_pb2.WatchResponse(offset=request.start_offset)

    local = {WATCH: grpc.unary_stream_rpc_method_handler(
        replica_watch, request_deserializer=api_pb2.WatchRequest.FromString,
        response_serializer=api_pb2.WatchResponse.SerializeToString)}
    worker = grpc.server(futures.ThreadPoolExecutor(2))
    to_core = grpc.insecure_channel(target)
    worker.add_generic_rpc_handlers((corelink.CoreForwarder(
        to_core, local, lambda offset, timeout, alive: True,
        here={WATCH: lambda request: request.start_offset != 1}),))
    port = worker.add_insecure_port("127.0.0.1:0")
    worker.start()
    client = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        watch = client.unary_stream(WATCH, request_serializer=api_pb2.WatchRequest.SerializeToString)
        assert list(watch(api_pb2.WatchRequest(start_offset=7), timeout=5)) == [
            api_pb2.WatchResponse(offset=7).SerializeToString()]
        assert not core.seen
        old = api_pb2.WatchRequest(key_prefixes=["kv/"], start_offset=1)
        assert list(watch(old, timeout=5)) == [b"a", b"\x00\xff", b"c"]
        assert [s["request"] for s in core.seen] == [old.SerializeToString()]
    finally:
        client.close()
        worker.stop(None)
        to_core.close()
        core_server.stop(None)


def test_a_write_waiting_when_the_channel_breaks_fails_unavailable_and_the_next_reconnects(tmp_path: Any) -> None:
    """The worker's end of the write channel: a call whose link to the core goes fails at once with
    UNAVAILABLE (never waits out its deadline, never reports success), and the next call connects again."""
    entered, release = threading.Event(), threading.Event()

    def slow(request: bytes, context: grpc.ServicerContext) -> bytes:
        entered.set()
        release.wait(10)
        return request

    def serve() -> writechannel.WriteChannelServer:
        calls = writechannel.WriteCalls(api_pb2_grpc.NameServerServicer(), [corelink.WorkerCallers(lambda: 1)])
        calls.handlers = {PUT: grpc.unary_unary_rpc_method_handler(slow)}
        server = writechannel.WriteChannelServer(f"{tmp_path}/channel/writes.sock", calls, 4, 1 << 20)
        server.start()
        return server

    caller = ((headers.WORKER_CALLER, json.dumps({"self": True})),)
    core = serve()
    writes = writechannel.WriteChannel(core.path, 1 << 20)
    answers: list[Any] = []
    waiting = threading.Thread(target=lambda: answers.append(writes.call(PUT, b"x", caller, 30, lambda: True)))
    waiting.start()
    assert entered.wait(10)
    core.stop()  # the core's end closes with the call in flight
    waiting.join(5)
    assert not waiting.is_alive() and answers[0][0] == grpc.StatusCode.UNAVAILABLE, answers
    release.set()
    again = serve()
    try:
        code, _, reply, trailing = writes.call(PUT, b"y", caller, 5, lambda: True)
        assert (code, reply) == (grpc.StatusCode.OK, b"y") and dict(trailing)[headers.CORE_OFFSET] == "1"
    finally:
        writes.close()
        again.stop()


def test_a_workers_read_index_has_no_thread_and_refuses_reads_once_stopped(tmp_path: Any) -> None:
    """The worker's read index (corelink.core_read_index) asks from the reading threads and the channel's
    reader: no thread of its own is left in a call while the process exits, and a read after the worker's
    stop is refused at once."""
    from nameserver import worker

    writes = writechannel.WriteChannel(f"{tmp_path}/none", 1 << 20)
    read_indexes = corelink.core_read_index(writes, NodeConfig("127.0.0.1:1", "127.0.0.1:2", str(tmp_path), []),
                                              str(tmp_path))
    assert not [t for t in threading.enumerate() if "read-index" in t.name]
    worker._stop(None, None, SimpleNamespace(stop=lambda: None), read_indexes)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError, match="stopping"):
        read_indexes.read_index(1)


def test_the_caller_header_says_each_callers_address_and_certificate_names_and_nothing_else() -> None:
    """forwarded_metadata's CALLER (made once per distinct caller): the core reads back each caller's own address
    and certificate names, whichever callers came before, and no other key of its auth context."""

    class Caller:
        def __init__(self, peer: str, said: dict[str, list[bytes]]) -> None:
            self._peer, self._said = peer, said

        def peer(self) -> str:
            return self._peer

        def auth_context(self) -> dict[str, list[bytes]]:
            return self._said

        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return (("user-agent", "grpc-go"), (headers.CLIENT_ID, "c1"))

    callers = [Caller("ipv4:10.0.0.1:5", {}), Caller("ipv4:10.0.0.1:6", {}),
               Caller("ipv4:10.0.0.1:5", {"x509_common_name": [b"broker-a"], "x509_pem_cert": [b"PEM"],
                                          "transport_security_type": [b"ssl"]}),
               Caller("ipv4:10.0.0.1:5", {"x509_common_name": [b"broker-b"]})]
    for _ in range(2):  # the second time from what was made the first
        for caller in callers:
            md = corelink.forwarded_metadata(caller)  # type: ignore[arg-type]
            assert md[0] == (headers.CLIENT_ID, "c1") and md[-1][0] == headers.WORKER_CALLER
            peer, said = corelink.decode_caller(md[-1][1])  # type: ignore[arg-type, misc]
            assert peer == caller.peer()
            assert said == {k: v for k, v in caller.auth_context().items() if k in corelink._AUTH_KEYS}


def test_a_read_index_under_a_lease_is_read_from_the_page_of_the_core_it_asks(tmp_path: Any) -> None:
    """core_read_index reads the lease page of the core its write channel reaches (core_dir), not the node's
    group 0's: a group core's reads (the move duty's, nameserver/groups/moveduty.py) under group 0's lease once
    took group 0's commit index for group k's."""
    import time as clock

    from nameserver.api.coreindex import lease_path
    from raftlog.leaseboard import ORDERED_STORES, LeaseBoard

    assert ORDERED_STORES, "the lease page is read on x86-64 only"
    group0, group1 = str(tmp_path), str(tmp_path / "g1")
    boards = [LeaseBoard(lease_path(group0)), LeaseBoard(lease_path(group1))]
    for board, commit in zip(boards, (5, 9), strict=True):
        board.commit(commit)
        board.publish(clock.monotonic() + 60)
    writes = writechannel.WriteChannel(f"{tmp_path}/nowhere.sock", 1 << 20)  # never asked: both are leased
    cfg = NodeConfig("127.0.0.1:1", "127.0.0.1:2", group0, [])
    of_group1 = corelink.core_read_index(writes, cfg, group1)
    of_group0 = corelink.core_read_index(writes, cfg, group0)
    try:
        assert (of_group1.read_index(1), of_group0.read_index(1)) == (9, 5)
    finally:
        of_group1.stop()
        of_group0.stop()
        writes.close()
        for board in boards:
            board.close()
