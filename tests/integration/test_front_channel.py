"""The Go gRPC front end's pipe ([node] grpc_front = "go"): the real front end (front/, built as a node
builds it) in front of a worker's FrontServer (nameserver/api/frontchannel.py) in this process, with the
node's call guard as its one interceptor and small test handlers that report what they were handed.

What a handler sees of its call through the pipe: the deadline as time left, the caller's address as grpcio
writes it and never a caller header the client sent, the client's metadata; what the client sees of the
handler: its reply, its status, details and trailing metadata, a server stream's messages, a client stream
taken whole; and the call guard's bounds on a client that sends nothing or reads nothing, as under grpcio.
A cancel by the client reaches the handler (is_active turns False). With mutual TLS the handler sees the
client certificate's names, as grpcio's auth context has them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from nameserver import framing, headers, tlsconf
from nameserver.api.callguard import CallGuard
from nameserver.api.frontchannel import FrontServer, socket_path
from nameserver.config import NodeConfig
from nameserver.ops import gobuild, gofront
from nameserver.ops.metrics import RequestMetrics
from tests.certs import TestCA
from tests.security import http2

PROGRESS_MS = 1000


class Handlers(grpc.GenericRpcHandler):
    """/t.T/<Name>: raw bytes in and out."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.drained_at = 0.0
        unary, server_stream = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
        self.methods: dict[str, grpc.RpcMethodHandler] = {
            "/t.T/Echo": unary(self.echo), "/t.T/Abort": unary(self.abort), "/t.T/Wait": unary(self.wait),
            "/t.T/Count": server_stream(self.count), "/t.T/Flood": server_stream(self.flood),
            "/t.T/Sum": grpc.stream_unary_rpc_method_handler(self.sum),
            "/t.T/Drain": grpc.stream_unary_rpc_method_handler(self.drain),
            "/t.T/Unwritten": unary(self.unwritten), "/t.T/Big": unary(lambda request, context: b"x" * (10 << 20)),
            "/t.T/BigStream": server_stream(lambda request, context: iter([b"a", b"x" * (10 << 20)]))}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.methods.get(handler_call_details.method)

    @staticmethod
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        names = {k: [bytes(v).decode() for v in vs] for k, vs in (context.auth_context() or {}).items()}
        return json.dumps({"left": context.time_remaining(), "peer": context.peer(), "request": request.decode(),
                           "auth": names,
                           "metadata": [[k, v] for k, v in context.invocation_metadata() if isinstance(v, str)]}
                          ).encode()

    @staticmethod
    def unwritten(request: bytes, context: grpc.ServicerContext) -> bytes:
        """What a generated servicer's base method does for a method not implemented."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details("Method not implemented!")
        raise NotImplementedError("Method not implemented!")

    @staticmethod
    def abort(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata(((headers.APPLY_OFFSET, "42"),))
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "topic: must not be empty")

    def wait(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        deadline = time.monotonic() + 10
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not context.is_active():
            self.cancelled.set()
        return b""

    @staticmethod
    def count(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for i in range(int(request)):
            yield str(i).encode()

    @staticmethod
    def flood(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        while context.is_active():
            yield b"x" * (1 << 20)

    def drain(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """Reads the client's stream to its end; notes the call's own end (a cancel) with the time."""
        for _ in requests:
            pass
        if not context.is_active():
            self.drained_at = time.monotonic()
            self.cancelled.set()
        return b""

    @staticmethod
    def sum(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return str(sum(len(r) for r in requests)).encode()


class Pipe:
    def __init__(self, addr: str, handlers: Handlers) -> None:
        self.addr = addr
        self.handlers = handlers
        self.channel = grpc.insecure_channel(addr)

    def method(self, name: str, kind: str = "unary_unary", channel: grpc.Channel | None = None) -> Callable[..., Any]:
        return getattr(channel or self.channel, kind)(f"/t.T/{name}")


@contextlib.contextmanager
def front_end(data_dir: str, outer: Sequence[grpc.ServerInterceptor] = (), **settings: Any
              ) -> Iterator[tuple[str, Handlers]]:
    """A FrontServer here and the Go front end before it, with the node's `settings`: its address, the handlers.
    `outer`: interceptors around the call guard."""
    cfg = replace(NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:0", data_dir=data_dir, members=[]),
                  worker_processes=1, workers=16, grpc_progress_timeout_ms=PROGRESS_MS, **settings)
    handlers = Handlers()
    server = FrontServer(cfg, socket_path(data_dir, 0), [*outer, CallGuard(PROGRESS_MS, 8, 4)])
    server.add_generic_rpc_handlers((handlers,))
    server.start()
    proc = subprocess.Popen(gofront.command(cfg, gobuild.build(), 64), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield line.split()[-1], handlers
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        server.stop()


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipe]:
    with front_end(str(tmp_path_factory.mktemp("front"))) as (addr, handlers):
        p = Pipe(addr, handlers)
        yield p
        p.channel.close()


def test_mutual_tls_names_the_callers_certificate(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TLS from the node's files, client certificates required: the handler's auth context has the
    certificate's names as grpcio's has them; a client without one never reaches it."""
    root = str(tmp_path_factory.mktemp("front-tls"))
    ca = TestCA(os.path.join(root, "pki"))
    node, client = ca.node("node"), ca.issue("broker-7", dns=("b7.example",))
    with front_end(root, tls_cert_file=node.cert, tls_key_file=node.key, tls_ca_file=ca.ca_file,
                   tls_client_auth="require") as (addr, _):
        mutual = tlsconf.open_channel(addr, ca_file=ca.ca_file, cert_file=client.cert, key_file=client.key)
        try:
            said = json.loads(mutual.unary_unary("/t.T/Echo")(b"", timeout=10))
        finally:
            mutual.close()
        assert said["auth"]["x509_common_name"] == ["broker-7"]
        assert "b7.example" in said["auth"]["x509_subject_alternative_name"]
        assert said["auth"]["transport_security_type"] == ["ssl"]
        anonymous = tlsconf.open_channel(addr, ca_file=ca.ca_file)
        try:
            with pytest.raises(grpc.RpcError) as err:
                anonymous.unary_unary("/t.T/Echo")(b"", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake fails
        finally:
            anonymous.close()


def test_the_handler_sees_the_deadline_the_caller_and_the_metadata(pipe: Pipe) -> None:
    forged = json.dumps({"self": True})
    reply = json.loads(pipe.method("Echo")(b"hello", timeout=5, metadata=(
        ("x-client-id", "c1"), (headers.WORKER_CALLER, forged))))
    assert reply["request"] == "hello"
    # the client's deadline, as time left: grpc-timeout is sent rounded up to its unit, so the server's
    # deadline may be a few ms past the client's own (5.009 s seen in CI)
    assert 4.0 < reply["left"] <= 5.05, reply["left"]
    assert reply["peer"].startswith("ipv4:127.0.0.1:"), reply["peer"]
    keys = [k for k, _ in reply["metadata"]]
    assert ["x-client-id", "c1"] in reply["metadata"]
    assert headers.WORKER_CALLER not in keys  # a client cannot name the caller
    assert "content-type" not in keys and "grpc-accept-encoding" not in keys  # as grpcio's handler sees it
    no_deadline = json.loads(pipe.method("Echo")(b""))
    assert no_deadline["left"] is None


def test_the_message_bound_is_the_nodes(pipe: Pipe) -> None:
    """[grpc] max_message_bytes (8 MiB): a 5 MiB request is served (grpc-go's own default is 4 MiB), a
    9 MiB one refused by the front end, naming the bound."""
    sum_of = pipe.method("Sum", "stream_unary")
    assert sum_of(iter([b"x" * (5 << 20)]), timeout=30) == str(5 << 20).encode()
    with pytest.raises(grpc.RpcError) as err:
        sum_of(iter([b"x" * (9 << 20)]), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value


def test_a_request_past_the_message_bound_ends_the_workers_call_at_once(pipe: Pipe) -> None:
    """A client stream whose second message is past [grpc] max_message_bytes: the client gets
    RESOURCE_EXHAUSTED (grpc-go's words: it answers the client itself, and ends the call's context), and
    the worker's handler, still reading, is cancelled then, not at the progress bound."""
    pipe.handlers.cancelled.clear()
    with pytest.raises(grpc.RpcError) as err:
        pipe.method("Drain", "stream_unary")(iter([b"small", b"x" * (9 << 20)]), timeout=30)
    ended = time.monotonic()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
    assert f"larger than max ({9 << 20} vs. {8 << 20})" in (err.value.details() or "")
    assert pipe.handlers.cancelled.wait(5)
    assert pipe.handlers.drained_at - ended < PROGRESS_MS / 1000 / 2  # the cancel, not the call guard's bound


def test_a_reply_past_the_message_bound_fails_its_call_only(pipe: Pipe) -> None:
    """A 10 MiB reply (past [grpc] max_message_bytes, and past the front end's frame bound, 9 MiB and a
    little): that call ends RESOURCE_EXHAUSTED as grpcio's server ends it; the worker's link, and the next
    call, go on."""
    with pytest.raises(grpc.RpcError) as unary:
        pipe.method("Big")(b"", timeout=30)
    assert unary.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, unary.value
    assert unary.value.details() == f"Sent message larger than max ({10 << 20} vs. {8 << 20})"
    with pytest.raises(grpc.RpcError) as streamed:
        list(pipe.method("BigStream", "unary_stream")(b"", timeout=30))
    assert streamed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, streamed.value
    assert json.loads(pipe.method("Echo")(b"after", timeout=5))["request"] == "after"


def test_a_compressed_call_is_taken_as_grpcio_takes_it(pipe: Pipe) -> None:
    reply = json.loads(pipe.method("Echo")(b"zipped", timeout=5, compression=grpc.Compression.Gzip))
    assert reply["request"] == "zipped"


def test_an_abort_reaches_the_client_with_its_details_and_trailing_metadata(pipe: Pipe) -> None:
    with pytest.raises(grpc.RpcError) as err:
        pipe.method("Abort")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "topic: must not be empty"
    assert (headers.APPLY_OFFSET, "42") in tuple(err.value.trailing_metadata() or ())
    with pytest.raises(grpc.RpcError) as unknown:
        pipe.method("Nothing")(b"", timeout=5)
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as unwritten:  # set_code and set_details, as grpcio's context takes them
        pipe.method("Unwritten")(b"", timeout=5)
    assert (unwritten.value.code(), unwritten.value.details()) == (grpc.StatusCode.UNIMPLEMENTED,
                                                                   "Method not implemented!")


def test_streams_both_ways(pipe: Pipe) -> None:
    assert list(pipe.method("Count", "unary_stream")(b"50", timeout=10)) == [str(i).encode() for i in range(50)]
    assert pipe.method("Sum", "stream_unary")(iter([b"ab", b"cde", b""]), timeout=10) == b"5"
    many = [b"x" * (i % 7) for i in range(200)]  # far past the window: taken as the handler reads
    assert pipe.method("Sum", "stream_unary")(iter(many), timeout=10) == str(sum(map(len, many))).encode()


def test_a_cancel_reaches_the_handler(pipe: Pipe) -> None:
    pipe.handlers.cancelled.clear()
    call = pipe.method("Wait").future(b"", timeout=30)
    time.sleep(0.3)
    call.cancel()
    assert pipe.handlers.cancelled.wait(3), "the handler's context never turned inactive"


def test_a_client_that_sends_nothing_is_cancelled_at_the_progress_bound(pipe: Pipe) -> None:
    stall = threading.Event()

    def never() -> Iterator[bytes]:
        stall.wait(30)
        yield b""

    t0 = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:
            pipe.method("Echo", "stream_unary")(never())  # no deadline
    finally:
        stall.set()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
    assert "grpc_progress_timeout_ms" in (err.value.details() or "")
    assert time.monotonic() - t0 < PROGRESS_MS / 1000 + 2


def test_a_client_that_reads_nothing_is_cancelled_at_the_progress_bound(pipe: Pipe) -> None:
    # no BDP probing: the stream keeps its first 64 KiB window, and the 1 MiB replies fill it at once
    lazy = grpc.insecure_channel(pipe.addr, options=[("grpc.http2.bdp_probe", 0)])
    try:
        flood = pipe.method("Flood", "unary_stream", lazy)(b"")  # started, not read
        time.sleep(PROGRESS_MS / 1000 + 1.5)
        with pytest.raises(grpc.RpcError) as err:
            for _ in flood:
                pass
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
        assert "grpc_progress_timeout_ms" in (err.value.details() or "")
    finally:
        lazy.close()


def test_a_method_handler_built_once_still_counts_and_checks_every_call(tmp_path_factory: pytest.TempPathFactory
                                                                       ) -> None:
    """The worker builds a method's intercepted handler once per method and metadata: what the interceptors
    count or check is still done per call (the metrics' forwarded calls, the deadline, the caller)."""
    metrics = RequestMetrics(CollectorRegistry())
    forwarded = ((headers.FORWARDED, "1"),)
    with (front_end(str(tmp_path_factory.mktemp("front-metrics")), outer=[metrics.interceptor()]) as (addr, _),
          grpc.insecure_channel(addr) as channel,
          grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)]) as other):
        echo: Callable[..., bytes] = channel.unary_unary("/t.T/Echo")
        seen = [json.loads(echo(b"x", timeout=5 + i, metadata=forwarded)) for i in range(3)]
        echo_other: Callable[..., bytes] = other.unary_unary("/t.T/Echo")
        seen.append(json.loads(echo_other(b"x", timeout=20, metadata=forwarded)))
    registry = metrics.registry
    assert registry.get_sample_value("nameserver_forwarded_requests_received_total", {"method": "Echo"}) == 4
    assert registry.get_sample_value("nameserver_grpc_handled_total", {
        "service": "t.T", "method": "Echo", "type": "client_stream", "code": "OK"}) == 4  # the call guard's kind
    assert [round(s["left"]) for s in seen] == [5, 6, 7, 20]
    assert seen[0]["peer"] == seen[2]["peer"] != seen[3]["peer"], seen


def _raw_call(addr: str, path: str, header: tuple[str, str | bytes],
              connect: Callable[[], socket.socket] | None = None) -> bytes:
    """One gRPC call over HTTP/2 written by hand (tests/security/http2.py), with a header grpcio's client
    would refuse to send (a text value that is not UTF-8), over `connect()`'s socket (or a plain one): what
    came back until the stream ended (or 5 s)."""
    host, port = addr.rsplit(":", 1)
    block = http2.header_block([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", addr),
                                ("content-type", "application/grpc"), ("te", "trailers"), header])
    with connect() if connect is not None else socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0)
                     + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, block)
                     + http2.frame(http2.DATA, http2.END_STREAM, 1, b"\x00\x00\x00\x00\x00"))
        got = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                got += chunk
                if TRAILERS in got:
                    break
        return got


TRAILERS = b"\x01\x05\x00\x00\x00\x01"  # a HEADERS frame's type, END_STREAM|END_HEADERS and stream 1


def test_a_header_value_that_is_not_utf8_fails_its_call_only(tmp_path_factory: pytest.TempPathFactory,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """grpc-go passes a text header's bytes >= 0x80 through: the call is refused (the front end names the
    header), and the worker's link, and with it every other call, goes on."""
    with front_end(str(tmp_path_factory.mktemp("front-utf8"))) as (addr, _), grpc.insecure_channel(addr) as channel:
        echo: Callable[..., bytes] = channel.unary_unary("/t.T/Echo")
        for _ in range(3):
            answer = _raw_call(addr, "/t.T/Echo", ("x-a", b"\xff"))
            assert TRAILERS in answer, answer  # ended with trailers, not a reset
            assert json.loads(echo(b"still", timeout=5))["request"] == "still"
    assert "link ended" not in caplog.text  # the front end reconnects, but each link lost failed its calls


def test_a_worker_refuses_a_call_record_it_cannot_read_and_keeps_its_link(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The worker's own check (whatever the front end let through): that call gets INVALID_ARGUMENT naming
    the header, the next call on the same link is served."""
    data_dir = str(tmp_path_factory.mktemp("front-record"))
    cfg = NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:0", data_dir=data_dir, members=[])
    server = FrontServer(cfg, socket_path(data_dir, 0), [])
    handlers = Handlers()
    server.add_generic_rpc_handlers((handlers,))
    server.start()
    caller = json.dumps({"peer": "ipv4:127.0.0.1:1", "auth": {}}).encode()
    try:
        with socket.socket(socket.AF_UNIX) as link:
            link.settimeout(5)
            link.connect(socket_path(data_dir, 0))
            bad, good = (1).to_bytes(8, "big"), (2).to_bytes(8, "big")
            link.sendall(framing.pack([[b"c", bad, b"-1", b"/t.T/Echo", caller, b"x-a", b"\xff"],
                                       [b"m", bad, b"x"], [b"h", bad]]))
            link.sendall(framing.pack([[b"c", good, b"-1", b"/t.T/Count", caller], [b"m", good, b"1"],
                                       [b"h", good]]))
            answers: dict[bytes, list[bytes]] = {}
            while len(answers) < 2 or answers[good][0] != b"s":
                body = framing.read_frame(link, 1 << 20)
                assert body is not None, answers
                for record in framing.unpack(body):
                    answers[record[1]] = record
        assert answers[bad][:4] == [b"s", bad, b"3", b"metadata: x-a's value is not UTF-8"]
        assert answers[good][:3] == [b"s", good, b"0"]
    finally:
        server.stop()


def test_a_later_connection_from_the_same_address_is_named_by_its_own_certificate(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two TLS connections from one client address and port, one after the other (a port reused behind a
    NAT or a balancer), each with its own client certificate: each call is named by its connection's."""
    root = str(tmp_path_factory.mktemp("front-reuse"))
    ca = TestCA(os.path.join(root, "pki"))
    node = ca.node("node")
    with front_end(root, tls_cert_file=node.cert, tls_key_file=node.key, tls_ca_file=ca.ca_file,
                   tls_client_auth="require") as (addr, _):
        host, port = addr.rsplit(":", 1)
        with socket.socket() as probe:  # a free local port, then each connection from it
            probe.bind(("127.0.0.1", 0))
            local = probe.getsockname()[1]
        for name in ("broker-1", "admin-1"):
            client = ca.issue(name)
            tls = ssl.create_default_context(cafile=ca.ca_file)
            tls.load_cert_chain(client.cert, client.key)
            tls.set_alpn_protocols(["h2"])

            def connect(tls: ssl.SSLContext = tls) -> socket.socket:
                raw = socket.socket()
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT
                raw.bind(("127.0.0.1", local))
                raw.settimeout(5)
                raw.connect((host, int(port)))
                return tls.wrap_socket(raw, server_hostname="localhost")

            answer = _raw_call(addr, "/t.T/Echo", ("x-b", "1"), connect)
            said, _ = json.JSONDecoder().raw_decode(answer[answer.index(b'{"left"'):].decode(errors="replace"))
            assert said["peer"] == f"ipv4:127.0.0.1:{local}"
            assert said["auth"]["x509_common_name"] == [name], said
