"""nameserver/api/callguard.py on an in-process gRPC server: what a call may hold of a worker.

The progress timeout here is 300 ms; the tests check what happens past it, never how fast anything is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from nameserver import headers
from nameserver.api.auth import AuthInterceptor, Authorizer, hash_token
from nameserver.api.callguard import CallGuard, StreamSlots
from nameserver.config import NodeConfig

SERVICE = "t.Guarded"


class Served:
    """The handlers behind the guard, and what they saw."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.whole_streams = 0

    def echo(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.ran.append("echo")
        return request

    def gather(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        data = b"".join(requests)
        self.whole_streams += 1  # reached only when the client ended its stream itself
        return data

    def many(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in range(1000):
            yield b"x" * 100_000


@pytest.fixture
def served() -> Iterator[tuple[grpc.Channel, Served]]:
    s = Served()
    handlers = grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(s.echo),
        "Gather": grpc.stream_unary_rpc_method_handler(s.gather),
        "Many": grpc.unary_stream_rpc_method_handler(s.many)})

    # as deployed (nameserver/server.py): the guard outermost, the auth interceptor inside it
    cfg = NodeConfig("127.0.0.1:1", "127.0.0.1:2", "unused", [], auth_tokens={hash_token("t"): "admin"})
    authz = AuthInterceptor(Authorizer(cfg))
    guard = CallGuard(300, max_streams=3, max_streams_per_caller=2, refusal=authz.authorizer.refusal)
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handlers], interceptors=[guard, authz])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.http2.bdp_probe", 0)])
    try:
        yield channel, s
    finally:
        channel.close()
        server.stop(0)


TOKEN = ((headers.AUTHORIZATION, "Bearer t"),)


def _stalling(first: bytes | None, release: threading.Event) -> Iterator[bytes]:
    if first is not None:
        yield first
    release.wait(30)


def test_a_request_that_never_comes_is_cancelled_naming_the_limit(served: tuple[grpc.Channel, Served]) -> None:
    channel, s = served
    release = threading.Event()
    echo: Any = channel.stream_unary(f"/{SERVICE}/Echo")
    with pytest.raises(grpc.RpcError) as err:
        echo(_stalling(None, release), metadata=TOKEN, timeout=20)
    release.set()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "limits.grpc_progress_timeout_ms" in err.value.details()
    assert s.ran == []
    assert channel.unary_unary(f"/{SERVICE}/Echo")(b"hi", metadata=TOKEN, timeout=5) == b"hi"


def test_a_refused_call_is_answered_without_its_request(served: tuple[grpc.Channel, Served]) -> None:
    channel, s = served
    release = threading.Event()
    echo: Any = channel.stream_unary(f"/{SERVICE}/Echo")
    with pytest.raises(grpc.RpcError) as err:
        echo(_stalling(None, release), timeout=20)  # no credential, and no request either
    release.set()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no credentials" in err.value.details()
    assert s.ran == []


def test_a_client_stream_cut_short_never_passes_for_a_whole_one(served: tuple[grpc.Channel, Served]) -> None:
    channel, s = served
    release = threading.Event()
    with pytest.raises(grpc.RpcError) as err:
        channel.stream_unary(f"/{SERVICE}/Gather")(_stalling(b"head", release), metadata=TOKEN, timeout=20)
    release.set()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert s.whole_streams == 0
    assert channel.stream_unary(f"/{SERVICE}/Gather")(iter([b"a", b"b"]), metadata=TOKEN, timeout=5) == b"ab"


def test_unread_server_streams_are_cancelled_and_bounded_per_caller(served: tuple[grpc.Channel, Served]) -> None:
    channel, _ = served
    many = channel.unary_stream(f"/{SERVICE}/Many")
    calls = [many(b"", metadata=TOKEN, timeout=20) for _ in range(3)]
    threading.Event().wait(1.0)  # past the progress timeout, unread
    ends = []
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            for _ in call:
                pass
        ends.append((err.value.code(), err.value.details()))
    assert sorted(code.name for code, _ in ends) == ["DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"]
    assert any("limits.grpc_max_streams_per_caller" in why for _, why in ends)
    # their slots were given back
    assert sum(1 for _ in many(b"", metadata=TOKEN, timeout=20)) == 1000


def test_stream_slots_bound_each_caller_and_the_node() -> None:
    slots = StreamSlots(per_node=3, per_caller=2)
    assert slots.take("a") is None and slots.take("a") is None
    assert "grpc_max_streams_per_caller" in (slots.take("a") or "")
    assert slots.take(None) is None  # forwarded by a peer: the node's bound only
    assert "limits.grpc_max_streams)" in (slots.take("b") or "")
    slots.give_back("a")
    assert slots.take("b") is None
    assert slots.running() == 3


def test_follow_streams_are_bounded_by_max_followers_not_the_callers_slots() -> None:
    """A node's worker processes all follow their core with one peer credential: Log.Follow has its own
    bound (limits.max_followers, in the Log service), so the guard's per-caller slots do not refuse it."""
    from nameserver.pb import api_pb2

    release = threading.Event()

    def follow(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield b"snapshot"
        release.wait(30)

    log_service = api_pb2.DESCRIPTOR.services_by_name["Log"].full_name
    handlers = grpc.method_handlers_generic_handler(log_service, {
        "Follow": grpc.unary_stream_rpc_method_handler(follow)})
    guard = CallGuard(10_000, max_streams=1, max_streams_per_caller=1)
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handlers], interceptors=[guard])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub: Any = channel.unary_stream(f"/{log_service}/Follow")
            calls = [stub(b"", timeout=10) for _ in range(3)]  # one caller, three followers
            assert [next(c) for c in calls] == [b"snapshot"] * 3
            release.set()
    finally:
        release.set()
        server.stop(0)


def test_a_finished_call_gives_its_stream_back_at_once() -> None:
    """grpcio keeps a call's HTTP/2 stream while its objects live: a guard that kept each call's context
    until its bound's watch thread came by (up to 250 ms) held a busy connection's streams, and calls on
    it were refused (RST_STREAM REFUSED_STREAM) past grpc.max_concurrent_streams."""
    handlers = grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)})
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handlers],
                         interceptors=[CallGuard(10_000, max_streams=3, max_streams_per_caller=2)],
                         options=[("grpc.max_concurrent_streams", 4)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary(f"/{SERVICE}/Echo")
            for i in range(300):  # one at a time: never more than one stream in use
                assert echo(b"x%d" % i, timeout=5) == b"x%d" % i
    finally:
        server.stop(None)
