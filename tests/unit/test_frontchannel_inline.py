"""A worker's end of the Go front end's socket (nameserver/api/frontchannel.py), spoken to directly over a real
Unix socket in this process: an eventual read whose request comes in the frame after its call record (as a
lone caller's mostly does) is still answered on the link's own thread when that frame is already waiting,
not handed to the pool (a thread wake and a GIL hand-over a call)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from nameserver import framing
from nameserver.api.frontchannel import CALL, HALF_CLOSE, MESSAGE, UNARY, FrontServer, Inline, socket_path
from nameserver.config import NodeConfig

READ = "/t.T/Read"
CALLER = json.dumps({"peer": "ipv4:127.0.0.1:1", "auth": {}}).encode()


class Reads(grpc.GenericRpcHandler):
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != READ:
            return None
        return grpc.unary_unary_rpc_method_handler(lambda request, context: threading.current_thread().name.encode())


@pytest.fixture
def link(tmp_path: Any) -> Iterator[socket.socket]:
    data_dir = str(tmp_path)
    cfg = replace(NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:0", data_dir=data_dir, members=[]),
                  worker_processes=1, workers=4)
    server = FrontServer(cfg, socket_path(data_dir, 0), [], Inline(frozenset({READ}), lambda method, request: True))
    server.add_generic_rpc_handlers((Reads(),))
    server.start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path(data_dir, 0))
    try:
        yield sock
    finally:
        sock.close()
        server.stop()


def _answer(sock: socket.socket) -> list[bytes]:
    body = framing.read_frame(sock, 1 << 20)
    assert body is not None
    (record,) = framing.unpack(body)
    return record


def test_a_request_in_the_next_frame_already_waiting_is_answered_on_the_link_thread(link: socket.socket) -> None:
    key = (1).to_bytes(8, "big")
    call = framing.pack([[CALL, key, b"-1", READ.encode(), CALLER]])
    request = framing.pack([[MESSAGE, key, b"x"], [HALF_CLOSE, key]])
    link.sendall(call + request)  # two frames, both waiting when the worker reads the first
    kind, got, thread = _answer(link)[:3]
    assert (kind, got) == (UNARY, key)
    assert thread.decode().startswith("front-channel"), thread


def test_a_request_in_the_same_frame_is_answered_on_the_link_thread_and_a_late_one_by_the_pool(
        link: socket.socket) -> None:
    one, two = (1).to_bytes(8, "big"), (2).to_bytes(8, "big")
    link.sendall(framing.pack([[CALL, one, b"-1", READ.encode(), CALLER], [MESSAGE, one, b"x"], [HALF_CLOSE, one]]))
    assert _answer(link)[2].decode().startswith("front-channel")
    link.sendall(framing.pack([[CALL, two, b"-1", READ.encode(), CALLER]]))  # nothing else waits: the pool's
    threading.Event().wait(0.2)
    link.sendall(framing.pack([[MESSAGE, two, b"x"], [HALF_CLOSE, two]]))
    assert _answer(link)[2].decode().startswith("grpc")
