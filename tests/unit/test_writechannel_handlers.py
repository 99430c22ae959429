"""The core's write channel (nameserver/api/writechannel.py, WriteCalls) wraps a method's handler in the
interceptors once per distinct method and metadata, as the Go front end's worker does: a worker's calls for
one client repeat both. What an interceptor checks per call still runs on every call, and a call with other
metadata (another caller) gets a handler of its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc

from nameserver import headers
from nameserver.api import corelink, writechannel
from nameserver.api.grpcwrap import wrap_handler
from nameserver.pb import api_pb2_grpc

PUT = f"/{corelink.NAMESERVER.full_name}/PutKv"


def caller(peer: str) -> tuple[tuple[str, str], ...]:
    return ((headers.WORKER_CALLER, json.dumps({"peer": peer, "auth": {}})),)


class Counting(grpc.ServerInterceptor):
    """Counts the handlers it builds and the calls they run; refuses a caller named "ipv4:refused"."""

    def __init__(self) -> None:
        self.built = 0
        self.checked: list[str] = []

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        self.built += 1
        said = json.loads(dict(details.invocation_metadata).get(headers.WORKER_CALLER, '{"peer": ""}'))["peer"]

        def wrap(behavior: Callable, kind: str) -> Callable:
            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                self.checked.append(said)
                if said == "ipv4:refused":
                    context.abort(grpc.StatusCode.PERMISSION_DENIED, "refused")
                return behavior(request, context)
            return unary
        return wrap_handler(handler, wrap)


def calls_with(counting: Counting) -> writechannel.WriteCalls:
    calls = writechannel.WriteCalls(api_pb2_grpc.NameServerServicer(), [corelink.WorkerCallers(lambda: 7), counting])
    calls.handlers = {PUT: grpc.unary_unary_rpc_method_handler(lambda request, context: request + b"!")}
    return calls


def call(calls: writechannel.WriteCalls, metadata: tuple[tuple[str, str], ...]) -> writechannel.Answer:
    return calls.call(PUT, b"x", writechannel.ChannelContext(None, metadata))


def test_a_handler_is_built_once_per_method_and_metadata_and_checks_every_call() -> None:
    counting = Counting()
    calls = calls_with(counting)
    for _ in range(3):
        code, _details, body, trailing = call(calls, caller("ipv4:127.0.0.1:5000"))
        assert (code, body) == (grpc.StatusCode.OK, b"x!")
        assert (headers.CORE_OFFSET, "7") in trailing  # WorkerCallers' per-call stamp, on every call
    assert counting.built == 1
    assert counting.checked == ["ipv4:127.0.0.1:5000"] * 3
    code, details, _body, _trailing = call(calls, caller("ipv4:refused"))
    assert (code, details) == (grpc.StatusCode.PERMISSION_DENIED, "refused")
    assert counting.built == 2  # another caller: its own handler, its own verdict
    code, _details, body, _trailing = call(calls, caller("ipv4:127.0.0.1:5000"))
    assert (code, body) == (grpc.StatusCode.OK, b"x!")
    assert counting.built == 2 and counting.checked[-1] == "ipv4:127.0.0.1:5000"


def test_a_call_without_its_caller_is_refused_every_time() -> None:
    counting = Counting()
    calls = calls_with(counting)
    for _ in range(2):
        code, details, _body, _trailing = calls.call(PUT, b"x", writechannel.ChannelContext(None, ()))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "must name its caller" in details
    assert counting.checked == []


def test_the_kept_handlers_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(writechannel, "MAX_HANDLERS_KEPT", 4)
    counting = Counting()
    calls = calls_with(counting)
    for i in range(10):
        assert call(calls, caller(f"ipv4:127.0.0.1:{i}"))[0] == grpc.StatusCode.OK
        assert len(calls._intercepted) <= 4
    assert counting.built == 10
