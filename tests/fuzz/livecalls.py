"""Calling any gRPC method of the API generically (typed or raw bytes), and which statuses it may answer.

The method table comes from the service descriptors, so a method added to api.proto is fuzzed (or
fails the coverage check) without anyone remembering to add it here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from nameserver import headers, validation
from nameserver.pb import api_pb2

C = grpc.StatusCode
# A field path as validation writes it: name, name[3], a.b[2].c; gRPC metadata names have dashes.
FIELD_DETAIL = re.compile(r"^([a-z][a-z0-9_-]*)(\[\d+\])?(\.[a-z][a-z0-9_]*(\[\d+\])?)*: \S")
# RESOURCE_EXHAUSTED that names no field: gRPC's own message size limit, or the Watch limits.
GRPC_SIZE_LIMIT = re.compile(r"(Received|Sent) message larger than max")
WATCH_LIMITS = re.compile(r"^(this node already serves \d+ watchers|watcher fell more than)")
REFUSALS = {C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED, C.NOT_FOUND, C.FAILED_PRECONDITION, C.OUT_OF_RANGE}
MAX_STREAM_MESSAGES = 200  # read this many at most, then cancel (a Watch never ends by itself)
WATCH_MESSAGES = 3         # past its initial state a watch only sends changes and progress
ENDLESS = ("Watch", "Follow")  # streams that never end by themselves: read WATCH_MESSAGES, then cancel


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    request: type[Message]
    reply: type[Message]
    client_streaming: bool
    server_streaming: bool
    key: str = ""  # the name, or "Service.Name" where a NameServer method has the same name

    @property
    def path(self) -> str:
        return f"/{api_pb2.DESCRIPTOR.package}.{self.service}/{self.name}"


def all_methods() -> dict[str, Method]:
    """Every RPC of api.proto by key: its name, or "Controller.RegisterBroker" where the Controller
    service reuses a NameServer method's name."""
    services = api_pb2.DESCRIPTOR.services_by_name
    nameserver = {m.name for m in services["NameServer"].methods}
    out = {}
    for svc in services.values():
        for m in svc.methods:
            key = m.name if svc.name == "NameServer" or m.name not in nameserver else f"{svc.name}.{m.name}"
            # by descriptor, not by name in api_pb2: some types live in an imported file (shards.proto)
            out[key] = Method(svc.name, m.name, GetMessageClass(m.input_type), GetMessageClass(m.output_type),
                              m.client_streaming, m.server_streaming, key)
    return out


@dataclass
class Result:
    code: grpc.StatusCode
    details: str = ""
    replies: list[Message] = field(default_factory=list)


def _raw(data: bytes) -> bytes:
    return data


def call(channel: grpc.Channel, m: Method, request: Message | bytes | list, timeout: float,
         metadata: tuple[tuple[str, str], ...] = ()) -> Result:
    """One call; `request` may be raw bytes (sent as the serialized message) or, for a client stream, a
    list of messages or of raw byte strings."""
    first = request[0] if isinstance(request, list) and request else request
    ser = _raw if isinstance(first, bytes) else m.request.SerializeToString
    de = m.reply.FromString
    replies: list[Message] = []
    try:
        if m.client_streaming:
            fn = channel.stream_unary(m.path, request_serializer=ser, response_deserializer=de)
            replies.append(fn(iter(request), timeout=timeout, metadata=metadata))
        elif m.server_streaming:
            stream = channel.unary_stream(m.path, request_serializer=ser, response_deserializer=de)(
                request, timeout=timeout, metadata=metadata)
            for reply in stream:
                replies.append(reply)
                # a Follow's first message (the state or the entries after from_offset) shows it was taken;
                # the next ones come only with writes or a progress tick (seconds, on an idle cluster)
                limit = 1 if m.name == "Follow" else WATCH_MESSAGES if m.name in ENDLESS else MAX_STREAM_MESSAGES
                if len(replies) >= limit or getattr(reply, "initial_state_done", False):
                    stream.cancel()
                    break
        else:
            fn = channel.unary_unary(m.path, request_serializer=ser, response_deserializer=de)
            replies.append(fn(request, timeout=timeout, metadata=metadata))
    except grpc.RpcError as exc:
        if exc.code() == C.CANCELLED and replies:  # our own cancel after reading enough
            return Result(C.OK, "", replies)
        return Result(exc.code(), exc.details() or "", replies)
    return Result(C.OK, "", replies)


WRITES = {"RegisterBroker", "RegisterBrokerStream", "UnregisterBroker", "PutKv", "DeleteKv", "WipeWritePerm",
          "AddWritePerm", "RegisterTopic", "DeleteTopic", "BindQueue", "ReleaseQueue", "UpdateSettings",
          "ApplyBrokerId", "Controller.RegisterBroker", "ElectMaster", "AlterSyncStateSet", "CleanBrokerData"}
# Besides OK, INVALID_ARGUMENT and RESOURCE_EXHAUSTED (bad input, size bounds), what each method may
# answer whatever the input (docs/api.md). Waits for an offset are handled by waits_for_offset.
EXTRA: dict[str, set[grpc.StatusCode]] = {
    "GetRoute": {C.NOT_FOUND}, "GetKv": {C.NOT_FOUND},
    "GetTopicList": {C.FAILED_PRECONDITION},  # a list turned off by a replicated setting (enableTopicList)
    "BindQueue": {C.FAILED_PRECONDITION}, "ReleaseQueue": {C.FAILED_PRECONDITION},
    # A watch is endless: idle (a long progress interval), it hits our deadline; a compacted start offset.
    "Watch": {C.OUT_OF_RANGE, C.DEADLINE_EXCEEDED},
    "ReadLog": {C.OUT_OF_RANGE},
    "DigestAt": {C.OUT_OF_RANGE},  # older than the node's digest ring
    "AddMember": {C.FAILED_PRECONDITION}, "RemoveMember": {C.FAILED_PRECONDITION},
    # Raft may refuse while a previous transfer is still in progress: retryable.
    "TransferLeadership": {C.FAILED_PRECONDITION, C.UNAVAILABLE},
} | {w: {C.FAILED_PRECONDITION} for w in WRITES - {"BindQueue", "ReleaseQueue"}}  # superseded x-client-seq


def waits_for_offset(m: Method, request: Message | None, applied: int) -> bool:
    """The request asks this node to wait for an offset not yet applied: it ends UNAVAILABLE (with the
    node's offset) or at our deadline, by design (read-your-writes)."""
    if request is None:
        return False
    if m.name == "ReadLog":
        return request.to_offset > applied
    if m.name == "DigestAt":
        return request.offset > applied
    return validation.highest_min_offset(request) > applied


def allowed(m: Method, request: Message | None, applied: int, on_leader: bool) -> set[grpc.StatusCode]:
    codes = {C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED} | EXTRA.get(m.key, set())
    if waits_for_offset(m, request, applied):
        codes |= {C.UNAVAILABLE, C.DEADLINE_EXCEEDED}
    if m.name == "Watch" and request is not None and request.start_offset == 0:
        codes.discard(C.DEADLINE_EXCEEDED)  # the current state and its end marker come at once
    if m.name == "ReadIndex" and not on_leader:
        codes.add(C.UNAVAILABLE)  # internal: followers ask the leader, never each other
    return codes


def field_names(m: Method) -> set[str]:
    """Top-level names an INVALID_ARGUMENT detail may start with for this method."""
    names = {f.name for f in m.request.DESCRIPTOR.fields} | {headers.CLIENT_ID, headers.CLIENT_SEQ, "request"}
    if m.client_streaming:  # the stream is reassembled into a RegisterBrokerRequest
        names |= {f.name for f in api_pb2.RegisterBrokerRequest.DESCRIPTOR.fields} | {"chunks"}
    return names


def check_status(m: Method, request: Message | None, code: grpc.StatusCode, details: str, applied: int,
                 on_leader: bool) -> None:
    """The status is one the method documents; INVALID_ARGUMENT names a field of the request."""
    ok = allowed(m, request, applied, on_leader)
    assert code in ok, f"{m.key} answered {code.name}: {details!r} (allowed: {sorted(c.name for c in ok)})"
    if code == C.INVALID_ARGUMENT or (code == C.RESOURCE_EXHAUSTED and not GRPC_SIZE_LIMIT.search(details)):
        assert FIELD_DETAIL.match(details) or WATCH_LIMITS.match(details), \
            f"{m.key}: {code.name} names no field: {details[:300]!r}"
        root = re.split(r"[\[.:]", details, maxsplit=1)[0]
        assert root in field_names(m) or WATCH_LIMITS.match(details), \
            f"{m.key}: {root!r} is not a field of {m.request.__name__}"
