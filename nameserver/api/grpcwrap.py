"""Re-wrapping a gRPC method handler, for server interceptors (metrics, auth).

grpc.ServerInterceptor hands over a handler of one of four kinds; an interceptor that wants to run
code around the call must rebuild a handler of the same kind around its wrapped behaviour.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import grpc

# When a call arrived, for a call whose handler runs only later (a LINEARIZABLE read behind the Go front end
# runs once its read index comes: nameserver/api/frontchannel.py, IndexFirst): the metrics interceptor times
# the call from then, as its client waited, not from its handler's start.
CALL_RECEIVED: contextvars.ContextVar[float | None] = contextvars.ContextVar("rip18_call_received", default=None)

# (handler attribute, kind label, factory); kinds whose response is a stream are in STREAMING_RESPONSE.
_KINDS = (
    ("unary_unary", "unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", "server_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", "client_stream", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", "bidi_stream", grpc.stream_stream_rpc_method_handler),
)
STREAMING_RESPONSE = frozenset({"server_stream", "bidi_stream"})


def wrap_handler(handler: grpc.RpcMethodHandler, wrap: Callable[[Callable, str], Callable],
                 request_deserializer: Callable[[bytes], object] | None = None) -> grpc.RpcMethodHandler:
    """A handler of the same kind whose behaviour is `wrap(behaviour, kind)` (and whose requests are
    parsed by `request_deserializer`, when given)."""
    for attr, kind, factory in _KINDS:
        behavior = getattr(handler, attr)
        if behavior:
            return factory(wrap(behavior, kind),
                           request_deserializer=request_deserializer or handler.request_deserializer,
                           response_serializer=handler.response_serializer)
    return handler
