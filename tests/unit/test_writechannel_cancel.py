"""A write's end on the write channel (nameserver/api/writechannel.py) and the check a write passes before
it is forwarded or proposed (nameserver/api/rpc.py, in_time): a worker whose call ends tells its core,
whose context for the call is then cancelled as gRPC's is; a call over, or past its forwarder's deadline,
raises the status's exception. The channel runs on a real Unix socket in this process."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from nameserver import framing, headers
from nameserver.api import corelink, writechannel
from nameserver.api.inprocess import LocalContext
from nameserver.api.rpc import CallCancelled, DeadlinePassed, in_time
from nameserver.pb import api_pb2_grpc

PUT = f"/{corelink.NAMESERVER.full_name}/PutKv"
CALLER = ((headers.WORKER_CALLER, json.dumps({"self": True})),)


@pytest.fixture
def core(tmp_path: Any) -> Iterator[tuple[writechannel.WriteChannelServer, list[Callable[..., Any]]]]:
    """A core's end of the channel whose PutKv runs the handler the test appends."""
    handlers: list[Callable[..., Any]] = []
    calls = writechannel.WriteCalls(api_pb2_grpc.NameServerServicer(), [corelink.WorkerCallers(lambda: 1)])
    calls.handlers = {PUT: grpc.unary_unary_rpc_method_handler(lambda request, context: handlers[0](request, context))}
    server = writechannel.WriteChannelServer(f"{tmp_path}/channel/writes.sock", calls, 4, 1 << 20)
    server.start()
    yield server, handlers
    server.stop()


def test_a_call_its_worker_ends_is_cancelled_on_the_core_as_grpc_cancels(core: Any) -> None:
    server, handlers = core
    entered, seen = threading.Event(), {}

    def held(request: bytes, context: grpc.ServicerContext) -> bytes:
        ended = threading.Event()
        seen["registered"] = context.add_callback(ended.set)
        entered.set()
        seen["called back"] = ended.wait(10)
        seen["active"], seen["left"] = context.is_active(), context.time_remaining()
        return request

    handlers.append(held)
    writes = writechannel.WriteChannel(server.path, 1 << 20)
    ends: list[Callable[[], None]] = []
    answers: list[writechannel.Answer] = []
    waiting = threading.Thread(target=lambda: answers.append(
        writes.call(PUT, b"x", CALLER, 30, lambda: True, lambda end: ends.append(end) is None)))
    try:
        waiting.start()
        assert entered.wait(10)
        ends[0]()  # the worker's gRPC call ended (gRPC's add_callback calls back)
        waiting.join(10)
        assert answers and answers[0][0] == grpc.StatusCode.CANCELLED
        deadline = time.monotonic() + 10
        while "active" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen["registered"] and seen["called back"] and seen["active"] is False
        assert seen["left"] > 20  # cancelled, not timed out
        assert server.cancels == 1 and server.calls == 1
    finally:
        writes.close()


def test_a_cancel_waiting_behind_its_call_reaches_the_context_before_the_call_starts(core: Any) -> None:
    """Both frames already in the socket when the core reads (a core that was stopped): it reads every
    frame waiting before it starts their calls, so the call starts cancelled."""
    server, handlers = core
    seen: list[bool] = []
    handlers.append(lambda request, context: seen.append(context.is_active()) or request)
    deadline = str(time.monotonic_ns() + 30 * 10**9).encode()
    call = framing.pack([[b"\x00" * 7 + b"\x01", deadline, PUT.encode(), b"x",
                          *writechannel._metadata_fields(CALLER)]])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(server.path)
        sock.sendall(call + framing.pack([[b"\x00" * 7 + b"\x01"]]))
        sock.settimeout(10)
        answer = framing.unpack(framing.read_frame(sock, 1 << 20) or b"")
    assert seen == [False] and answer[0][0] == b"\x00" * 7 + b"\x01"
    assert (server.calls, server.cancels, server.frames) == (1, 1, 2)


def forwarded(deadline_ms: float | None, timeout: float = 30, forward: bool = True) -> LocalContext:
    md = [(headers.FORWARDED, "1")] if forward else []
    if deadline_ms is not None:
        md.append((headers.FORWARD_DEADLINE, str(int(deadline_ms))))
    return LocalContext(timeout, md)


def test_the_clock_skew_allowance_refuses_early_so_a_clock_behind_never_proposes_late() -> None:
    """[limits] forward_clock_skew_ms narrows what the leader takes, on purpose (nameserver/api/rpc.py,
    in_time): it is how far the leader's clock may be behind the forwarder's, so a forwarded deadline is
    taken only while it is more than that ahead of the leader's clock. Refusing only once it is that far
    past (widening) would propose writes after their callers were told DEADLINE_EXCEEDED (finding 14)."""
    skew = 100
    ours = time.time() * 1000
    forwarders = ours + 80  # its clock is 80 ms ahead of ours: within the allowance
    with pytest.raises(DeadlinePassed, match=r"is only \d+ ms away"):  # passed 20 ms ago by the forwarder's
        in_time(forwarded(forwarders - 20, timeout=30), skew)()
    in_time(forwarded(ours + 10 * skew, timeout=30), skew)()  # more than the allowance left: taken


def test_a_write_is_wanted_until_its_deadline_or_its_forwarders_or_its_cancel() -> None:
    now = time.time() * 1000
    in_time(forwarded(now + 5000), 100)()  # time left, by both clocks
    in_time(forwarded(None), 100)()  # no header: gRPC's timeout alone
    with pytest.raises(DeadlinePassed, match=r"passed \d+ ms ago .*forward_clock_skew_ms = 100"):
        in_time(forwarded(now - 5000), 100)()
    with pytest.raises(DeadlinePassed, match=r"is only \d+ ms away"):  # within the clock skew allowed
        in_time(forwarded(now + 50), 100)()
    in_time(forwarded(now - 5000, forward=False), 100)()  # a client's header: not a peer's word, ignored
    with pytest.raises(DeadlinePassed, match="the call's deadline passed"):
        in_time(forwarded(None, timeout=0), 100)()
    cancelled = forwarded(None)
    wanted = in_time(cancelled, 100)
    wanted()
    cancelled.cancel()
    with pytest.raises(CallCancelled):
        wanted()
