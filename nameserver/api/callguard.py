"""What one gRPC call may hold of a server worker: bounded in time without progress from its client,
and (for streams) bounded in number per caller and per node.

grpcio's sync server gives every call a worker thread from the node's pool (limits: [grpc] workers),
and that worker blocks on the client: waiting for the request message (a client that sent HEADERS and
nothing else), for the next chunk of a client stream, or for a server stream's message to be taken
off the wire (a client that never reads). Three bounds, enforced by one interceptor:

- progress: every wait on the client -- a request message, a client stream's next message, the send
  of a server stream's message -- ends within limits.grpc_progress_timeout_ms; past it the call is
  cancelled with DEADLINE_EXCEEDED naming the limit. To watch the request message, unary-request
  methods are served as request-streaming ones that read exactly one message (grpcio otherwise waits
  for it before any of our code runs).
- streams per node: streaming calls (client or server streams, Watch excepted: limits its own with
  [grpc] max_watchers) running at once; more fail RESOURCE_EXHAUSTED at once.
- streams per caller: the same, per caller (its bearer token, else its certificate's name, else its
  address). Forwarded calls from peer nodes count only against the node's bound.

A call the auth interceptor will refuse whatever its request says (no token, a bad token, a role
without the right: `refusal`, decided from the metadata alone) is refused without waiting for its
request: the inner interceptors run with a stand-in request that fails closed, so the refusal is
answered (and counted by the metrics) as always. The guard is the outermost interceptor: the others see every
method as what it is.

All bounds wait on one watch thread (nameserver/api/deadlines.py, EqualBounds: every bound is one length,
so arming one per call is an append). Every call crosses this guard: its per-call path is kept to a few
attribute writes (docs/benchmarks.md, "the call guard's cost").
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from nameserver import headers
from nameserver.api.deadlines import EqualBounds
from nameserver.pb import api_pb2

# Streams with bounds of their own: Watch (max_watchers; its feed is cut off when it lags) and a read
# replica's Follow (limits.max_followers: a node's worker processes all follow with one peer credential).
_OWN_BOUND = frozenset({"/" + api_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name + "/Watch",
                        "/" + api_pb2.DESCRIPTOR.services_by_name["Log"].full_name + "/Follow"})


def caller_key(metadata: dict[str, str], context: grpc.ServicerContext) -> str:
    """Who a call is, for per-caller bounds: its bearer token (hashed; never kept), else its client
    certificate's name, else its address without the port (one host's connections are one caller)."""
    token = metadata.get(headers.AUTHORIZATION)
    if token:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    names = (context.auth_context() or {}).get("x509_common_name")
    if names:
        return "cert:" + bytes(next(iter(names))).decode(errors="replace")
    return context.peer().rsplit(":", 1)[0]  # "ipv4:10.0.0.1:53412", "ipv6:[::1]:53412"


def cancel_call(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """Cancel from another thread, with a status the client sees. grpcio's public cancel() sends
    CANCELLED without a reason; its call object (grpc/_server.py: _Context._rpc_event.call, a
    cygrpc.Call) cancels with a status too, as a front channel's context does (cancel_with)."""
    cancel_with = getattr(context, "cancel_with", None)
    if cancel_with is not None:  # a call from the Go front end (nameserver/api/frontchannel.py)
        cancel_with(code, details)
        return
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)  # type: ignore[union-attr]
    except Exception:  # another grpcio: the plain cancel still frees the worker
        context.cancel()


class StreamSlots:
    """How many streaming calls run, per caller and on the node."""

    def __init__(self, per_node: int, per_caller: int) -> None:
        self.per_node, self.per_caller = per_node, per_caller
        self._lock = threading.Lock()
        self._running = 0
        self._by_caller: Counter[str] = Counter()

    def take(self, caller: str | None) -> str | None:
        """None when taken; else which limit refused it (the caller's own, or the node's)."""
        with self._lock:
            if caller is not None and self._by_caller[caller] >= self.per_caller:
                return (f"this caller already runs {self.per_caller} streaming calls on this node "
                        "(limits.grpc_max_streams_per_caller)")
            if self._running >= self.per_node:
                return (f"this node already runs {self.per_node} streaming calls "
                        "(limits.grpc_max_streams); try another node")
            self._running += 1
            if caller is not None:
                self._by_caller[caller] += 1
            return None

    def give_back(self, caller: str | None) -> None:
        with self._lock:
            self._running -= 1
            if caller is not None:
                self._by_caller[caller] -= 1
                if self._by_caller[caller] <= 0:
                    del self._by_caller[caller]

    def running(self) -> int:
        with self._lock:
            return self._running


# (method, metadata) -> the status a call will be refused with whatever it sends, or None
Refusal = Callable[[str, dict[str, str]], tuple[grpc.StatusCode, str] | None]


class CallGuard(grpc.ServerInterceptor):
    def __init__(self, progress_timeout_ms: int, max_streams: int, max_streams_per_caller: int,
                 refusal: Refusal | None = None) -> None:
        self.progress_s = progress_timeout_ms / 1000
        self.slots = StreamSlots(max_streams, max_streams_per_caller)
        self.bounds = EqualBounds(self.progress_s, "call-progress")
        self.refusal = refusal

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return handler
        method = details.method
        counted = (handler.request_streaming or handler.response_streaming) and method not in _OWN_BOUND
        # read only when something here needs it (most calls, in the default mode, do not)
        metadata = {k: v for k, v in details.invocation_metadata or () if isinstance(v, str)} \
            if counted or self.refusal is not None else _NO_METADATA
        behavior = next(b for b in (handler.unary_unary, handler.unary_stream, handler.stream_unary,
                                    handler.stream_stream) if b)
        args = {"request_deserializer": handler.request_deserializer,
                "response_serializer": handler.response_serializer}
        refused = self.refusal(method, metadata) if self.refusal is not None else None
        if refused is not None:
            return self._refuse(behavior, handler.response_streaming, refused, args)
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._streamed(behavior, handler.request_streaming, metadata, counted), **args)
        return grpc.stream_unary_rpc_method_handler(
            self._unary(behavior, handler.request_streaming, metadata, counted), **args)

    @staticmethod
    def _refuse(behavior: Callable, response_streaming: bool, refused: tuple[grpc.StatusCode, str],
                args: dict[str, Any]) -> grpc.RpcMethodHandler:
        """A handler that never reads the request: request-streaming, so grpcio runs it at once. The
        inner interceptors (metrics, then auth, which aborts with the same verdict) get a stand-in that
        fails closed should anything ever touch it."""
        if response_streaming:
            def refuse_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
                yield from behavior(_Unread(), context)
                context.abort(*refused)
            return grpc.stream_stream_rpc_method_handler(refuse_stream, **args)

        def refuse(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            behavior(_Unread(), context)
            context.abort(*refused)
        return grpc.stream_unary_rpc_method_handler(refuse, **args)

    # ---- the waits on the client -------------------------------------------------------------------

    def _wait(self, context: grpc.ServicerContext, what: str, fn: Callable[[], Any]) -> Any:
        """fn() (a wait on the client), cancelled with DEADLINE_EXCEEDED past the progress timeout. After
        a cancel, grpcio may report the client's stream as ended rather than cancelled: a stream cut short
        must never pass for a whole one, so a fired bound aborts whatever fn returned."""
        stall = Stall(context, what, self.progress_s)
        bound = self.bounds.arm(stall.cancel)
        try:
            return fn()
        finally:
            bound.disarm()
            if stall.fired:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, stall.message())

    def _received(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """The client's messages, each of which must arrive within the progress timeout."""
        while True:
            item = self._wait(context, _NO_REQUEST, lambda: next(requests, _END))
            if item is _END:
                return
            yield item

    def _request(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """A unary method's one request message (grpcio answers a call without one UNIMPLEMENTED too)."""
        request = self._wait(context, _NO_REQUEST, lambda: next(requests, _END))
        if request is _END:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "request: the call carried no request message")
        return request

    def _sent(self, responses: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """grpcio asks for the next message once the last one is sent: each send must complete (the
        client reads) within the progress timeout."""
        for response in responses:
            stall = Stall(context, _NOT_READ, self.progress_s)
            bound = self.bounds.arm(stall.cancel)
            try:
                yield response
            finally:
                bound.disarm()
            if stall.fired:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, stall.message())

    # ---- the handlers ------------------------------------------------------------------------------

    def _admit(self, counted: bool, metadata: dict[str, str], context: grpc.ServicerContext
               ) -> tuple[bool, str | None]:
        """Take a stream slot for a counted call, or abort; (taken, the caller it was counted on)."""
        if not counted:
            return False, None
        caller = None if headers.FORWARDED in metadata else caller_key(metadata, context)
        refused = self.slots.take(caller)
        if refused is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        return True, caller

    def _unary(self, behavior: Callable, request_streaming: bool, metadata: dict[str, str],
               counted: bool) -> Callable:
        def serve(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            taken, caller = self._admit(counted, metadata, context)
            try:
                if request_streaming:
                    return behavior(self._received(requests, context), context)
                return behavior(self._request(requests, context), context)
            finally:
                if taken:
                    self.slots.give_back(caller)
        return serve

    def _streamed(self, behavior: Callable, request_streaming: bool, metadata: dict[str, str],
                  counted: bool) -> Callable:
        def serve(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            taken, caller = self._admit(counted, metadata, context)
            try:
                arg = self._received(requests, context) if request_streaming else self._request(requests, context)
                yield from self._sent(behavior(arg, context), context)
            finally:
                if taken:
                    self.slots.give_back(caller)
        return serve


_END = object()
_NO_METADATA: dict[str, str] = {}
_NO_REQUEST = "no request message from the client"
_NOT_READ = "the client read no reply"


class Stall:
    """A wait on the client that ran past its bound: cancels the call (on the watch thread) with
    DEADLINE_EXCEEDED naming the limit. The waiting thread checks `fired` once its wait is over and
    aborts whatever the wait returned (a cancelled client stream may read as ended)."""

    __slots__ = ("context", "what", "progress_s", "limit", "fired")

    def __init__(self, context: grpc.ServicerContext, what: str, progress_s: float,
                 limit: str = "limits.grpc_progress_timeout_ms") -> None:
        self.context, self.what, self.progress_s, self.limit, self.fired = context, what, progress_s, limit, False

    def message(self) -> str:
        return f"{self.what} within {int(self.progress_s * 1000)} ms ({self.limit})"

    def cancel(self) -> None:
        self.fired = True
        cancel_call(self.context, grpc.StatusCode.DEADLINE_EXCEEDED, self.message())


class _Unread:
    """The request of a call refused before it was read: a request (or request stream) that raises
    on any use, so a handler can never act on it."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("the request of a refused call was never read")

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        raise RuntimeError("the request of a refused call was never read")

__all__ = ["CallGuard", "Refusal", "Stall", "StreamSlots", "caller_key", "cancel_call"]
