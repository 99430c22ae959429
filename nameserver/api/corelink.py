"""gRPC between a node's worker processes and its core (docs/architecture.md, "Processes").

With [node] worker_processes > 0 the workers serve the node's public gRPC address (SO_REUSEPORT) and the
core serves gRPC only on a private Unix socket, <data_dir>/channel/grpc.sock (the socket 0600, its
directory 0700: only the node's own user reaches it). A worker answers the eventual reads in
REPLICA_METHODS from its read replica with the core's own service code; the unary writes go to the core
batched on the write channel (nameserver/api/writechannel.py), every other call over the private socket
(CoreForwarder): either way the request and reply bytes untouched (no decode, no encode), the caller's
metadata and time left, the status, details and trailing metadata back.

What the private socket cannot carry itself, the worker says in one header, CALLER (set by the worker,
never taken from a client): the client's address and its TLS auth context (certificate names), or
"self" on the worker's own calls (Log.Follow, read indexes). On the core, WorkerCallers (outermost,
before every guard) hands the guards and the service a context that answers peer() and auth_context()
with the client's: the core decides a forwarded call as if the client had called it directly
(tokens, certificate roles, per-caller stream bounds, session owners). A call without the header is
refused. The core stamps its apply offset on each unary answer (CORE_OFFSET, removed by the worker),
which the worker's replica reaches before the answer leaves (bounded): a client reads its own writes.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from nameserver import headers, tlsconf
from nameserver.api import auth
from nameserver.api.coreindex import CoreReadIndex, lease_path
from nameserver.api.deadlines import DeadlineWatch
from nameserver.api.grpcwrap import STREAMING_RESPONSE, wrap_handler
from nameserver.api.later import Later
from nameserver.api.rpc import call_timeout, rpc
from nameserver.api.writechannel import GIVEN_WRITE, WRITE_METHODS, Answer, WriteChannel, method_path
from nameserver.config import NodeConfig
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.pb import api_pb2
from raftlog.leaseboard import LeaseView

log = logging.getLogger("nameserver.api.corelink")
SOCKET_NAME = os.path.join("channel", "grpc.sock")
SETTLE_S = 2.0  # how long an answer waits for the worker's replica to reach the core's offset
# Eventual reads a replica answers (the gRPC twins of the remoting codes REQUESTS marks replica=True,
# nameserver/remoting/handlers.py, and the other reads of the state). GetBinding and ListBindings read
# LINEARIZABLE through a read index from the core (ReadIndexes) and a wait on the replica.
REPLICA_METHODS = ("GetRoute", "GetClusterInfo", "GetTopicList", "GetBrokerMemberGroup", "GetKv", "ListKv",
                   "GetSettings", "GetBinding", "ListBindings")
NAMESERVER = api_pb2.DESCRIPTOR.services_by_name["NameServer"]
# Streams a replica serves too, when the request lets it (CoreForwarder's `here`): a watch resuming from
# before the replica's recent history goes to the core, whose history is the node's.
REPLICA_STREAMS = ("Watch",)
WATCH = f"/{NAMESERVER.full_name}/Watch"
# The services a worker passes on; any other method is UNIMPLEMENTED there (the core's private ones too).
FORWARDED_SERVICES = (NAMESERVER, *(api_pb2.DESCRIPTOR.services_by_name[s] for s in ("Admin", "Controller", "Log")),
                      health_pb2.DESCRIPTOR.services_by_name["Health"],
                      reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"])
REFLECTION_INFO = f"/{reflection.SERVICE_NAME}/ServerReflectionInfo"
_DROPPED = frozenset({"user-agent", headers.WORKER_CALLER})  # set by the channel, or by us
# What of a TLS caller's auth context the core uses (auth.py, callguard.py): its certificate's names. Not
# the whole context: the PEM certificate alone would pass gRPC's 8 KiB metadata bound once hex-encoded.
_AUTH_KEYS = ("x509_common_name", "x509_subject_alternative_name", "transport_security_type")
_NO_DEADLINE_S = 1e6  # what time_remaining() reports for a call without a deadline is far beyond this


def socket_path(cfg: NodeConfig) -> str:
    return os.path.join(cfg.data_dir, SOCKET_NAME)


def target(cfg: NodeConfig) -> str:
    return "unix:" + os.path.abspath(socket_path(cfg))


def prepare_socket(cfg: NodeConfig) -> str:
    """The private socket's address, its directory made 0700 and a stale socket removed."""
    path = socket_path(cfg)
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    if os.path.exists(path):
        os.unlink(path)
    return target(cfg)


def own_metadata(cfg: NodeConfig) -> tuple[tuple[str, str], ...]:
    """What a worker's own calls to its core carry: marked as the node itself, and with the peer token
    when there is one (a token-only [auth] refuses a call without one before it runs)."""
    token = ((headers.AUTHORIZATION, f"Bearer {cfg.peer_token}"),) if cfg.auth_enabled and cfg.peer_token else ()
    return ((headers.WORKER_CALLER, json.dumps({"self": True})), *token)


def own_channel(cfg: NodeConfig, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A worker's channel for its own gRPC calls to the core (its replica's Log.Follow): own_metadata."""
    return tlsconf.open_channel(target(cfg), extra_metadata=list(own_metadata(cfg)), options=options or ())


# ---- the core's side -------------------------------------------------------------------------------

class CallerContext:
    """A servicer context that answers with the worker's client as the caller."""

    def __init__(self, context: grpc.ServicerContext, peer: str, auth_context: Mapping[str, list[bytes]],
                 apply_offset: Callable[[], int]) -> None:
        self._context = context
        self._peer = peer
        self._auth = auth_context
        self._apply_offset = apply_offset
        self._trailing: tuple[tuple[str, Any], ...] = ()
        # what a write asks of its context, several times a call, found here rather than by __getattr__ (a
        # failed lookup first: about a tenth of the core's CPU on a worker's write, session 26)
        self.invocation_metadata = context.invocation_metadata
        self.is_active = context.is_active
        self.time_remaining = context.time_remaining

    @property
    def answers_later(self) -> bool:
        return getattr(self._context, "answers_later", False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Mapping[str, list[bytes]]:
        return self._auth

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._trailing = tuple(metadata)
        self.stamp()

    def stamp(self) -> None:
        """The trailing metadata with the core's apply offset as of now."""
        self._context.set_trailing_metadata(self._trailing + ((headers.CORE_OFFSET, str(self._apply_offset())),))


def decode_caller(value: str | None) -> tuple[str, dict[str, list[bytes]]] | None:
    """(peer, auth context) from CALLER (or from the Go front end's call record, which says who its client is in
    the same form: nameserver/api/frontchannel.py); None when absent or malformed."""
    if value is None:
        return None
    try:
        said = json.loads(value)
        if said.get("self") is True:
            return "worker", {auth.NODE_ITSELF: [b"1"]}
        return str(said["peer"]), {str(k): [bytes.fromhex(v) for v in vs] for k, vs in said["auth"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _encode_caller(context: grpc.ServicerContext) -> str:
    said = context.auth_context() or {}
    return _caller_header(context.peer(), tuple((k, tuple(bytes(v) for v in said[k])) for k in _AUTH_KEYS if k in said))


@functools.lru_cache(maxsize=1024)
def _caller_header(peer: str, auth: tuple[tuple[str, tuple[bytes, ...]], ...]) -> str:
    """CALLER's value for a caller, made once per distinct one (a connection's calls all name the same one)."""
    return json.dumps({"peer": peer, "auth": {k: [v.hex() for v in vs] for k, vs in auth}})


class WorkerCallers(grpc.ServerInterceptor):
    """Outermost on the core's private listener: who the worker's caller was (see the module's text)."""

    def __init__(self, apply_offset: Callable[[], int]) -> None:
        self.apply_offset = apply_offset

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        value = next((v for k, v in details.invocation_metadata or () if k == headers.WORKER_CALLER), None)
        caller = decode_caller(value if isinstance(value, str) else None)
        if caller is None:
            def refuse(request: Any, context: grpc.ServicerContext) -> Any:
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              "a call on the core's private socket must name its caller")
            return wrap_handler(handler, lambda behavior, kind: refuse)
        peer, auth_context = caller

        def wrap(behavior: Callable, kind: str) -> Callable:
            if kind in STREAMING_RESPONSE:
                return lambda request, context: behavior(request, CallerContext(context, peer, auth_context,
                                                                                self.apply_offset))

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                ctx = CallerContext(context, peer, auth_context, self.apply_offset)
                reply = None
                try:
                    reply = behavior(request, ctx)
                    return reply
                finally:
                    if isinstance(reply, Later):  # a write answered from the apply: the offset then
                        reply.then(lambda _: ctx.stamp())
                    else:
                        ctx.stamp()
            return unary

        return wrap_handler(handler, wrap)


class ReadIndexes:
    """READ_INDEX on the core's write channel: the node's linearizable read index (from the leader when
    the core follows), for a worker's LINEARIZABLE reads."""

    def __init__(self, index: Callable[[float], int], cfg: NodeConfig) -> None:
        self.index = index
        self.default, self.cap = cfg.write_timeout_ms / 1000, cfg.max_wait_ms / 1000

    @rpc
    def ReadIndex(self, request: api_pb2.ReadIndexRequest, context: grpc.ServicerContext) -> api_pb2.ReadIndexReply:
        return api_pb2.ReadIndexReply(read_index=self.index(call_timeout(context, self.default, self.cap)))

    def method_handler(self) -> grpc.RpcMethodHandler:
        """READ_INDEX's handler, for the core's write channel (WriteCalls.handlers), where its workers ask."""
        return grpc.unary_unary_rpc_method_handler(
            self.ReadIndex, request_deserializer=api_pb2.ReadIndexRequest.FromString,
            response_serializer=api_pb2.ReadIndexReply.SerializeToString)


# ---- the worker's side -----------------------------------------------------------------------------

def core_read_index(writes: WriteChannel, cfg: NodeConfig, core_dir: str) -> CoreReadIndex:
    """The core's read index (READ_INDEX, asked on the write channel as the worker itself): its read_index,
    for ReplicaNode.linearizable_index, raises TimeoutError when it has none; stop it with the worker.

    Reads waiting at once share one ask (nameserver/api/coreindex.py: an ask serves only the reads that
    arrived before it was sent, so each still gets an index that covers every write acknowledged before
    it). Without that, and over a gRPC call of its own, a LINEARIZABLE read cost the core and the worker a
    gRPC call each (docs/benchmarks.md, "gRPC per call with worker processes"). On the leader's node, under
    its lease, no ask: the index is the core's commit index on its lease page (raftlog/leaseboard.py).
    `core_dir`: the data directory of the core `writes` reaches, whose page that is (a group core's own, under
    data_dir/g<K>: another core's commit index is no read index of this one's)."""
    return CoreReadIndex(writes, own_metadata(cfg), cfg.max_wait_ms / 1000,
                         leased=LeaseView(lease_path(core_dir)).index)


def local_handlers(servicer: Any) -> dict[str, grpc.RpcMethodHandler]:
    """REPLICA_METHODS and REPLICA_STREAMS of a NameServerService, by full method name."""
    handlers = {}
    for name in (*REPLICA_METHODS, *REPLICA_STREAMS):
        m = NAMESERVER.methods_by_name[name]
        new = grpc.unary_stream_rpc_method_handler if m.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[f"/{NAMESERVER.full_name}/{name}"] = new(
            getattr(servicer, name), request_deserializer=getattr(api_pb2, m.input_type.name).FromString,
            response_serializer=getattr(api_pb2, m.output_type.name).SerializeToString)
    return handlers


Settle = Callable[[int, float, Callable[[], bool]], bool]  # (offset, timeout, alive): the replica's wait_applied


class CoreForwarder(grpc.GenericRpcHandler):
    """A worker's gRPC methods: `local` ones answered here, the unary writes passed to the core on the
    write channel (`writes`, batched: nameserver/api/writechannel.py; without one, as every other call), the
    rest of FORWARDED_SERVICES over `channel` (the core's private socket; a read replica's followed voter);
    the request and reply bytes untouched either way. A local server stream named in `here` is answered here
    only when `here[name](request)` says so, else passed on. Server reflection is answered here, listing the
    services of these methods (`services`): exactly what this listener answers, which the core's own list is
    not (a worker's Shards, the core's private ones)."""

    def __init__(self, channel: grpc.Channel, local: dict[str, grpc.RpcMethodHandler], settle: Settle,
                 writes: WriteChannel | None = None, here: Mapping[str, Callable[[Any], bool]] | None = None) -> None:
        self.channel = channel
        self.settle = settle
        self.writes = writes
        self.handlers = dict(local)
        here = here or {}
        for name in WRITE_METHODS if writes is not None else ():
            self.handlers[method_path(name)] = grpc.unary_unary_rpc_method_handler(self._writing(method_path(name)))
        for service in FORWARDED_SERVICES:
            for m in service.methods:
                name = f"/{service.full_name}/{m.name}"
                forwarding = self._forwarding(name, m.client_streaming, m.server_streaming)
                if name in here and name in local:
                    self.handlers[name] = _either(local[name], forwarding, here[name])
                self.handlers.setdefault(name, forwarding)
        # reflection answered here, listing what this listener answers (the followed core's lists its own)
        self.services = tuple(sorted({name.split("/")[1] for name in self.handlers}))
        self.handlers[REFLECTION_INFO] = reflection_handler(self.services)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handlers.get(handler_call_details.method)

    def _forwarding(self, method: str, client_streaming: bool, server_streaming: bool) -> grpc.RpcMethodHandler:
        if server_streaming:
            call: Any = (self.channel.stream_stream if client_streaming else self.channel.unary_stream)(method)

            def streamed(request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
                responses = call(request, timeout=_time_left(context), metadata=forwarded_metadata(context))
                _cancel_with(context, responses)
                try:
                    yield from responses
                except grpc.RpcError:
                    _fail(context, responses)
                context.set_trailing_metadata(_strip(responses.trailing_metadata()))

            if client_streaming:
                return grpc.stream_stream_rpc_method_handler(streamed)
            return grpc.unary_stream_rpc_method_handler(streamed)
        unary: Any = (self.channel.stream_unary if client_streaming else self.channel.unary_unary)(method)

        def answered(request: Any, context: grpc.ServicerContext) -> bytes:
            future = unary.future(request, timeout=_time_left(context), metadata=forwarded_metadata(context))
            _cancel_with(context, future)
            try:
                reply = future.result()
            except grpc.FutureCancelledError:
                context.abort(grpc.StatusCode.CANCELLED, "the caller went away")
            except grpc.RpcError:
                _fail(context, future)
            self._settled(context, future.trailing_metadata() or ())
            return reply

        if client_streaming:
            return grpc.stream_unary_rpc_method_handler(answered)
        return grpc.unary_unary_rpc_method_handler(answered)

    def _writing(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        writes = self.writes
        assert writes is not None, "a write method is routed to the write channel only when there is one"

        def written(request: bytes, context: grpc.ServicerContext) -> bytes:
            given = GIVEN_WRITE.get()  # sent as it came, answered before this call ran (frontchannel.WriteFirst)
            code, details, reply, trailing = given if given is not None else writes.call(
                method, request, forwarded_metadata(context), _time_left(context), context.is_active,
                context.add_callback)
            if code != grpc.StatusCode.OK:
                context.set_trailing_metadata(_strip(trailing))
                context.abort(code, details)
            self._settled(context, trailing)
            return reply
        return written

    def _settled(self, context: grpc.ServicerContext, trailing: Any) -> None:
        """The answer's trailing metadata set, once this worker's replica has the core's state as it
        answered (bounded): read-your-writes. Not for a call another node's core forwarded (a follower's
        write to its leader): its client reads on that node, whose own worker waits for its replica; this
        replica's wait only delayed the answer."""
        offset = _core_offset(trailing)
        if offset and not _forwarded(context):
            if waiting_allowed():
                left = context.time_remaining()
                self.settle(offset, min(SETTLE_S, left if left is not None else SETTLE_S), context.is_active)
            elif not self.settle(offset, 0.0, context.is_active):  # (where it has: nothing more to wait for)
                raise WouldBlock("the replica has not applied the write yet")  # the pool's call waits
        context.set_trailing_metadata(_strip(trailing))


def _core_offset(trailing: Any) -> int:
    """The core's apply offset an answer carries (CORE_OFFSET); 0: none."""
    offset = next((v for k, v in trailing if k == headers.CORE_OFFSET), "")
    return int(offset) if isinstance(offset, str) and offset.isdigit() else 0


class ReplicaOffsets:
    """Callbacks run once a worker's replica has applied an offset, with no thread waiting for it: `when`
    runs one at once when the replica has, else on the replica's thread as it publishes that offset (its
    publish listener: readers see the offset by then), or past its bound on the deadline thread, whichever
    comes first, once."""

    def __init__(self, offset: Callable[[], int], publish_listeners: list[Callable[[int], None]],
                 bounds: DeadlineWatch) -> None:
        self.offset = offset
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int]] = []  # (offset, key); a key no longer in _waiting was run
        self._waiting: dict[int, tuple[Callable[[], None], Any]] = {}  # key: (callback, its bound)
        self._keys = itertools.count()
        self._bounds = bounds
        publish_listeners.append(self._published)

    def when(self, offset: int, bound_s: float, callback: Callable[[], None]) -> None:
        if bound_s <= 0 or self.offset() >= offset:
            callback()
            return
        key = next(self._keys)
        with self._lock:
            self._waiting[key] = (callback, None)
            heapq.heappush(self._heap, (offset, key))
        bound = self._bounds.after(bound_s, lambda: self._run(self._take([key])))
        with self._lock:
            if key in self._waiting:
                self._waiting[key] = (callback, bound)
            else:  # run already
                bound.cancel()
        self._published(self.offset())  # the offset may have come between the first look and the push

    def _published(self, offset: int) -> None:
        if not self._heap:
            return
        with self._lock:
            keys = []
            while self._heap and self._heap[0][0] <= offset:
                keys.append(heapq.heappop(self._heap)[1])
        self._run(self._take(keys))

    def _take(self, keys: list[int]) -> list[tuple[Callable[[], None], Any]]:
        with self._lock:
            return [found for key in keys if (found := self._waiting.pop(key, None)) is not None]

    @staticmethod
    def _run(due: list[tuple[Callable[[], None], Any]]) -> None:
        for callback, bound in due:
            if bound is not None:
                bound.cancel()
            try:
                callback()
            except Exception:  # a call's failure must not stop the replica's thread or the others
                log.exception("a write's answer after its replica's offset failed")


def write_first(writes: WriteChannel, settled: ReplicaOffsets, deadlines: DeadlineWatch
                ) -> Callable[[str, bytes, Any, Callable[[Answer], None]], bool]:
    """frontchannel.WriteFirst's start for a worker's unary writes: the write sent on `writes` as the
    handler (CoreForwarder._writing) would send it, with the caller's metadata, time left and cancel; `done`
    called with the core's answer once `settled` says the replica has the answer's CORE_OFFSET (bounded by
    SETTLE_S and the call's time, as _settled's wait), or at once for an answer without one (a refusal) or
    a call another node's core forwarded. Without an answer by the call's deadline and a second's grace (a
    core that stopped answering), the call is answered UNAVAILABLE-in-time as WriteChannel.call's is."""
    methods = frozenset(method_path(name) for name in WRITE_METHODS)

    def start(method: str, request: bytes, context: Any, done: Callable[[Answer], None]) -> bool:
        if method not in methods:
            return False
        left = _time_left(context)
        answer, cancel = writes.start(method, request, forwarded_metadata(context), left)
        if not context.add_callback(cancel):
            cancel()  # the caller's call had ended already
        bound = None if left is None else deadlines.after(left + 1.0, lambda: cancel(
            (grpc.StatusCode.DEADLINE_EXCEEDED, "the node's core did not answer in time")))

        def answered(future: Any) -> None:
            if bound is not None:
                bound.cancel()
            got = future.result()
            offset = _core_offset(got[3]) if got[0] == grpc.StatusCode.OK else 0
            if not offset or _forwarded(context):
                done(got)
                return
            spare = context.time_remaining()
            settled.when(offset, min(SETTLE_S, spare if spare is not None else SETTLE_S), lambda: done(got))

        answer.add_done_callback(answered)
        return True

    return start


def reflection_handler(services: Sequence[str]) -> grpc.RpcMethodHandler:
    """ServerReflectionInfo listing `services` (full names), their descriptors from this process's pool."""
    servicer = reflection.ReflectionServicer(services)
    return grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo, request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)


def _either(local: grpc.RpcMethodHandler, forwarding: grpc.RpcMethodHandler, here: Callable[[Any], bool]
            ) -> grpc.RpcMethodHandler:
    """A server stream answered by `local` when `here(request)`, else passed on by `forwarding` (the
    request encoded again: the core decodes what the worker did; its answer's bytes pass untouched)."""
    serve, forward, encode = local.unary_stream, forwarding.unary_stream, local.response_serializer
    assert serve is not None and forward is not None and encode is not None, "a server stream of one request"

    def either(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if here(request):
            return serve(request, context)
        return forward(request.SerializeToString(), context)

    return grpc.unary_stream_rpc_method_handler(
        either, request_deserializer=local.request_deserializer,
        response_serializer=lambda reply: reply if isinstance(reply, bytes) else encode(reply))


def _forwarded(context: grpc.ServicerContext) -> bool:
    """Whether another node's core sent this call (its LeaderForwarder marks every call it forwards)."""
    return any(k == headers.FORWARDED for k, _ in context.invocation_metadata())


def _time_left(context: grpc.ServicerContext) -> float | None:
    left = context.time_remaining()
    return left if left is not None and left < _NO_DEADLINE_S else None


def forwarded_metadata(context: grpc.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    """The caller's metadata, as the core is to see it (also a sharded node's Health/Watch to each group
    core: nameserver/groups/shards.py)."""
    md = tuple((k, v) for k, v in context.invocation_metadata() if k not in _DROPPED and not k.startswith("grpc-"))
    return md + ((headers.WORKER_CALLER, _encode_caller(context)),)


def _cancel_with(context: grpc.ServicerContext, call: Any) -> None:
    """The forwarded call ends when its caller goes away."""
    def cancel() -> None:
        call.cancel()
    context.add_callback(cancel)


def _strip(metadata: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((k, v) for k, v in metadata or () if k != headers.CORE_OFFSET)


def _fail(context: grpc.ServicerContext, call: Any) -> None:
    """End this call as the core ended the forwarded one."""
    context.set_trailing_metadata(_strip(call.trailing_metadata()))
    context.abort(call.code(), call.details() or "")


__all__ = ["CoreForwarder", "ReadIndexes", "ReplicaOffsets", "WorkerCallers", "core_read_index", "decode_caller",
           "forwarded_metadata", "local_handlers", "own_channel", "prepare_socket", "reflection_handler", "socket_path",
           "target", "write_first"]
