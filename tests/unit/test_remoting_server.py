"""The remoting TCP server: malformed frames close only their own connection (with a log line),
oneway and pipelined requests, concurrency across connections, start/stop."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from nameserver import config
from nameserver.config import Member, NodeConfig
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.remoting import RemotingServer

MAX_FRAME = 4096
ROUTE = api_pb2.TopicRoute(
    broker_datas=[state_pb2.BrokerData(cluster="C", broker_name="b", addrs=[state_pb2.BrokerAddr(addr="h:1")])],
    queue_datas=[state_pb2.QueueData(broker_name="b", read_queue_nums=1, write_queue_nums=1, perm=6)])


class RouteOnly(api_pb2_grpc.NameServerServicer):
    def __init__(self) -> None:
        self.release = threading.Event()

    def GetRoute(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.topic == "Slow":
            if not waiting_allowed():  # the node's contract: never wait under no_wait() (loop thread)
                raise WouldBlock("slow")
            self.release.wait(10)
        return api_pb2.GetRouteReply(route=ROUTE)


@pytest.fixture
def servicer() -> RouteOnly:
    return RouteOnly()


def _cfg(tmp_path: Any) -> NodeConfig:
    addr = "127.0.0.1:2"
    return NodeConfig(raft_addr="127.0.0.1:1", grpc_addr=addr, data_dir=str(tmp_path),
                      members=[Member("127.0.0.1:1", addr)], remoting_addr="127.0.0.1:0")


@pytest.fixture
def server(servicer: RouteOnly, tmp_path: Any) -> Iterator[RemotingServer]:
    remoting = RemotingServer(_cfg(tmp_path), servicer, max_frame_bytes=MAX_FRAME)
    remoting.start()
    yield remoting
    servicer.release.set()
    remoting.stop()


def connect(server: RemotingServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def route_frame(opaque: int, topic: str = "T", flag: int = 0) -> bytes:
    head = json.dumps({"code": 105, "extFields": {"topic": topic}, "flag": flag, "language": "JAVA",
                       "opaque": opaque, "version": 479}).encode()
    return struct.pack(">ii", 4 + len(head), len(head)) + head


def read_response(sock: socket.socket) -> dict:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    total, word = struct.unpack(">ii", exactly(8))
    return json.loads(exactly(total - 4)[:word])


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


GOOD_HEAD = b'{"code":105,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":1,"version":479}'


@pytest.mark.parametrize("data, logged", [
    (struct.pack(">i", -5), "frame length -5 is below the minimum"),
    (struct.pack(">i", 2) + b"ab", "frame length 2 is below the minimum"),
    (struct.pack(">i", MAX_FRAME + 1), f"exceeds the {MAX_FRAME}-byte limit"),
    (struct.pack(">i", 0x7FFFFFFF) + b"x" * 100, "exceeds"),
    (struct.pack(">ii", 12, 8) + b"garbage!", "header is not JSON"),
    (struct.pack(">ii", 12, 8) + b'{"a":1}\n', "'code' is missing"),
    (struct.pack(">ii", 8, 100) + b"{}{}", "header length 100 exceeds"),
    (struct.pack(">ii", 6, 2 | (9 << 24)) + b"{}", "serialization type 9"),
    (struct.pack(">ii", 9, 1 << 24 | 5) + b"\x00\x69\x00\x01\xdf", "binary header truncated"),
    (struct.pack(">ii", 4 + len(GOOD_HEAD) + 10, len(GOOD_HEAD)) + GOOD_HEAD + b"short", "truncated frame"),
    (struct.pack(">i", 100)[:3], "truncated frame"),
])
def test_a_malformed_frame_closes_only_its_connection(server: RemotingServer, caplog: pytest.LogCaptureFixture,
                                                      data: bytes, logged: str) -> None:
    caplog.set_level(logging.WARNING, logger="nameserver.remoting")
    good = connect(server)
    good.sendall(route_frame(1))
    assert read_response(good)["code"] == 0
    bad = connect(server)
    bad.sendall(route_frame(2))  # a good request first: the connection is served until the bad frame
    assert read_response(bad)["code"] == 0
    bad.sendall(data)
    if logged == "truncated frame":
        bad.shutdown(socket.SHUT_WR)  # the stream ends mid-frame
    assert closed_by_server(bad)
    deadline = time.monotonic() + 5
    while not any(logged in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records if r.name == "nameserver.remoting"]
    assert any(logged in line and "closing connection from 127.0.0.1:" in line for line in lines), lines
    good.sendall(route_frame(3))  # the other connection never noticed
    assert read_response(good)["opaque"] == 3
    fresh = connect(server)
    fresh.sendall(route_frame(4))
    assert read_response(fresh)["opaque"] == 4
    for s in (good, bad, fresh):
        s.close()


def test_a_frame_at_the_limit_is_accepted(server: RemotingServer) -> None:
    head = GOOD_HEAD
    body = b"x" * (MAX_FRAME - 4 - len(head))
    sock = connect(server)
    sock.sendall(struct.pack(">ii", 4 + len(head) + len(body), len(head)) + head + body)
    assert read_response(sock)["code"] == 0
    sock.close()


def test_pipelined_requests_are_all_answered_and_oneway_ones_not(server: RemotingServer) -> None:
    sock = connect(server)
    sock.sendall(b"".join(route_frame(i, flag=2 if i % 3 == 0 else 0) for i in range(1, 31)))
    got = {read_response(sock)["opaque"] for _ in range(20)}
    assert got == {i for i in range(1, 31) if i % 3 != 0}
    sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        sock.recv(1)  # nothing more: the 10 oneway requests got no response
    sock.close()


def test_response_frames_from_a_peer_are_ignored(server: RemotingServer) -> None:
    sock = connect(server)
    sock.sendall(route_frame(7, flag=1) + route_frame(8))
    assert read_response(sock)["opaque"] == 8
    sock.close()


def test_a_slow_request_does_not_hold_up_other_connections(server: RemotingServer, servicer: RouteOnly) -> None:
    # The first reply of a code the server never answered reserves the connection's whole reply share
    # (replybudget.py): one route read first, so that its size is known.
    primer = connect(server)
    primer.sendall(route_frame(9))
    assert read_response(primer)["opaque"] == 9
    primer.close()
    slow = connect(server)
    slow.sendall(route_frame(1, topic="Slow"))
    fast = connect(server)
    start = time.monotonic()
    fast.sendall(route_frame(2))
    assert read_response(fast)["opaque"] == 2
    assert time.monotonic() - start < 5
    # ...nor later requests on its own connection (responses are matched by opaque, not order).
    slow.sendall(route_frame(3))
    assert read_response(slow)["opaque"] == 3
    servicer.release.set()
    assert read_response(slow)["opaque"] == 1
    slow.close()
    fast.close()


def test_many_garbage_connections_at_once_leave_the_server_serving(server: RemotingServer) -> None:
    socks = [connect(server) for _ in range(20)]
    for i, s in enumerate(socks):
        s.sendall(struct.pack(">i", 10) + bytes([i]) * 10)
    assert all(closed_by_server(s) for s in socks)
    sock = connect(server)
    sock.sendall(route_frame(1))
    assert read_response(sock)["code"] == 0
    for s in socks + [sock]:
        s.close()


def test_stop_closes_connections_and_releases_the_port(servicer: RouteOnly, tmp_path: Any) -> None:
    remoting = RemotingServer(_cfg(tmp_path), servicer)
    remoting.start()
    port = remoting.port
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(route_frame(1))
    assert read_response(sock)["code"] == 0
    remoting.stop()
    assert closed_by_server(sock)
    sock.close()
    again = RemotingServer(_cfg(tmp_path), servicer, listen_addr=f"127.0.0.1:{port}")
    again.start()
    again.stop()


def test_start_on_a_busy_port_raises(server: RemotingServer, servicer: RouteOnly, tmp_path: Any) -> None:
    other = RemotingServer(_cfg(tmp_path), servicer, listen_addr=f"127.0.0.1:{server.port}")
    with pytest.raises(OSError, match="cannot listen"):
        other.start()
    other.stop()  # harmless after a failed start


@pytest.mark.parametrize("size", [3, 5])
def test_local_deploy_configs_listen_on_9876_and_up(size: int) -> None:
    root = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", f"local-{size}")
    addrs = [config.load(os.path.join(root, f"n{i}.toml")).remoting_addr for i in range(1, size + 1)]
    assert addrs == [f"127.0.0.1:{9875 + i}" for i in range(1, size + 1)]


def test_request_bodies_waiting_to_be_handled_count_against_the_reply_budget(servicer: RouteOnly,
                                                                             tmp_path: Any) -> None:
    """Bodies of requests not yet handled are held too: two connections that fill the node's budget with
    them make a third one's large request SYSTEM_BUSY at once, instead of a third pile of bodies."""
    mib = 1 << 20
    cfg = dataclasses.replace(_cfg(tmp_path), remoting_max_unsent_bytes_per_connection=4 * mib,
                              remoting_max_unsent_bytes=6 * mib + (64 << 10))
    remoting = RemotingServer(cfg, servicer)
    remoting.start()
    try:
        primer = connect(remoting)
        primer.sendall(route_frame(1))  # route reads' size is known from now on
        assert read_response(primer)["opaque"] == 1

        def slow_with_body(opaque: int) -> bytes:  # a route read that waits for the servicer, 1 MiB body
            head = json.dumps({"code": 105, "extFields": {"topic": "Slow"}, "flag": 0, "language": "JAVA",
                               "opaque": opaque, "version": 479}).encode()
            return struct.pack(">ii", 4 + len(head) + mib, len(head)) + head + b"b" * mib

        holders = [connect(remoting) for _ in range(2)]
        for sock in holders:
            sock.sendall(b"".join(slow_with_body(i) for i in range(10, 13)))  # 3 MiB: within its share
        deadline = time.monotonic() + 5
        while remoting.budget.held < 6 * mib and time.monotonic() < deadline:
            time.sleep(0.01)
        assert remoting.budget.held >= 6 * mib
        late = connect(remoting)
        late.sendall(slow_with_body(99))
        reply = read_response(late)
        assert reply["opaque"] == 99 and reply["code"] == 2 and "remoting_max_unsent_bytes" in reply["remark"], reply
        servicer.release.set()
        for sock in holders:
            assert {read_response(sock)["opaque"] for _ in range(3)} == {10, 11, 12}
        for sock in (primer, late, *holders):
            sock.close()
    finally:
        servicer.release.set()
        remoting.stop()


def test_a_connection_waiting_for_its_reply_is_not_idle(servicer: RouteOnly, tmp_path: Any) -> None:
    """The idle bound closed a connection whose request was still being handled (a big registration waits
    its turn for up to a minute): its reply never came. Idle means nothing asked and nothing owed."""
    from dataclasses import replace

    cfg = replace(_cfg(tmp_path), remoting_idle_timeout_ms=300)
    remoting = RemotingServer(cfg, servicer, max_frame_bytes=MAX_FRAME)
    remoting.start()
    try:
        primer = connect(remoting)  # a route read first: its reply size is known (see the test above)
        primer.sendall(route_frame(9))
        assert read_response(primer)["opaque"] == 9
        slow = connect(remoting)
        slow.sendall(route_frame(1, topic="Slow"))
        time.sleep(1.0)  # over three idle bounds with the request in progress
        servicer.release.set()
        assert read_response(slow)["opaque"] == 1
        slow.settimeout(5)
        assert closed_by_server(slow)  # then idle: closed after the bound
        primer.close()
        slow.close()
    finally:
        servicer.release.set()
        remoting.stop()


def test_thousands_of_fresh_connections_first_route_reads_are_answered_not_busy(
        server: RemotingServer, servicer: RouteOnly) -> None:
    """2,000 connections send their first route read before the node answered any (slow reads: held in
    the servicer until released). Each used to reserve the whole 32 MiB share for a code never answered:
    eight filled the 256 MiB total and the rest were answered SYSTEM_BUSY (the fleet simulator, 9,000
    connections, though route replies are ~1 KB). Now the first reserves the share, the others wait for
    its answer (at most 1 s, then reserve as for a small reply: never refused)."""
    first = connect(server)
    first.sendall(route_frame(1, topic="Slow"))
    time.sleep(0.2)
    socks = []
    try:
        for i in range(2000):
            s = connect(server)
            s.sendall(route_frame(i + 2, topic="Slow"))
            socks.append(s)
        time.sleep(1.5)  # past the 1 s a request waits for its code's first answer
        servicer.release.set()
        assert read_response(first)["code"] == 0
        answers = [read_response(s)["code"] for s in socks]
        assert answers.count(0) == len(socks), f"{len(socks) - answers.count(0)} answered SYSTEM_BUSY"
        assert server.budget.busy_total == 0
    finally:
        for s in [first, *socks]:
            s.close()


# ---- the fast path (route reads answered as they arrive: no task, no timer per frame) ----------------

def _limited(servicer: RouteOnly, tmp_path: Any, **limits: int) -> RemotingServer:
    remoting = RemotingServer(dataclasses.replace(_cfg(tmp_path), **limits), servicer, max_frame_bytes=MAX_FRAME)
    remoting.start()
    return remoting


def _fast_reads(remoting: RemotingServer, sock: socket.socket, n: int = 3) -> None:
    """A few route reads on `sock`, the later ones on the fast path (the first teaches the reply's size)."""
    before = remoting.fast_total
    for i in range(n):
        sock.sendall(route_frame(i))
        assert read_response(sock)["opaque"] == i
    assert remoting.fast_total >= before + n - 1, (remoting.fast_total, remoting.budget.learned())


def test_a_connection_idle_after_fast_path_reads_is_closed(servicer: RouteOnly, tmp_path: Any) -> None:
    """Fast-path reads start no idle timer: the periodic sweep closes a connection silent past the bound."""
    remoting = _limited(servicer, tmp_path, remoting_idle_timeout_ms=300)
    try:
        sock = connect(remoting)
        _fast_reads(remoting, sock)
        started = time.monotonic()
        assert closed_by_server(sock)  # the socket's own timeout (10 s) fails the test otherwise
        assert 0.25 <= time.monotonic() - started < 3
        sock.close()
    finally:
        remoting.stop()


def test_a_frame_trickling_in_past_the_frame_bound_closes_its_connection(servicer: RouteOnly,
                                                                         tmp_path: Any) -> None:
    """A frame begun must arrive whole within remoting_frame_timeout_ms, however steadily its bytes come
    (each byte resets no idle bound here: the sweep reads when the frame began)."""
    remoting = _limited(servicer, tmp_path, remoting_frame_timeout_ms=300, remoting_idle_timeout_ms=60_000)
    try:
        sock = connect(remoting)
        _fast_reads(remoting, sock)
        data = route_frame(7)
        started = time.monotonic()
        with contextlib.suppress(OSError):  # the server's close: a later send fails
            for i in range(len(data) - 1):  # ~5 s at 50 ms a byte, never whole
                sock.sendall(data[i:i + 1])
                time.sleep(0.05)
        assert closed_by_server(sock)
        assert time.monotonic() - started < 3
        sock.close()
    finally:
        remoting.stop()


def test_a_client_that_never_reads_its_fast_path_replies_is_cut(servicer: RouteOnly, tmp_path: Any,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Route reads pipelined by a client that reads none of the replies: the fast path writes a reply only
    while the transport has room for it, then the slow path's drain bound (remoting_reply_timeout_ms) cuts
    the connection; without that the replies would pile up in the node without bound."""
    caplog.set_level(logging.WARNING, logger="nameserver.remoting")
    remoting = _limited(servicer, tmp_path, remoting_reply_timeout_ms=500)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", remoting.port))
        _fast_reads(remoting, sock)
        sock.setblocking(False)
        batch = b"".join(route_frame(i) for i in range(100))
        pending = b""
        cut = False
        deadline = time.monotonic() + 15
        while not cut and time.monotonic() < deadline:
            pending = pending or batch  # whole frames only: a frame cut short would close it for another reason
            try:
                pending = pending[sock.send(pending):]
            except BlockingIOError:
                time.sleep(0.05)
            except OSError:
                cut = True
        if not cut:
            with contextlib.suppress(BlockingIOError):
                sock.recv(1)
        assert cut, "the connection that never reads was not cut"
        assert any("went unread" in r.getMessage() for r in caplog.records)
        assert remoting.fast_total > 100  # the replies it was sent came by the fast path
        sock.close()
    finally:
        remoting.stop()
