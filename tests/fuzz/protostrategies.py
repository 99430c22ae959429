"""Hypothesis strategies derived from protobuf descriptors: any request message of the API.

Every field gets arbitrary values of its type (unicode, empty and huge strings; negative, boundary and
huge integers; unknown enum numbers; random repeated lengths), mixed with a few plausible values per
field name so that examples also get past validation and exercise the write path and the state.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from nameserver.pb import api_pb2

F = FieldDescriptor

TOPICS = ["TopicA", "TopicB", "%RETRY%group-1", "T|x", "rmq_sys_SYNC_BROKER_MEMBER_a"]
NAMES = ["broker-a", "broker-b", "c1", "c2", "z1", "node.1"]
ADDRS = ["10.0.0.1:10911", "10.0.0.2:10911", "[::1]:10911", "host-1.example:65535", "[fe80::1%eth0]:10911"]

# Plausible values by field name: these reach the state, the arbitrary ones test validation.
HINTS: dict[str, list[Any]] = {
    "topic": TOPICS, "topic_name": TOPICS, "topics": TOPICS,
    "broker_name": NAMES, "cluster_name": NAMES, "zone_name": NAMES, "owner": ["consumer-1", "c2"],
    "broker_addr": ADDRS, "ha_server_addr": ADDRS, "filter_servers": ADDRS, "node_id": ADDRS,
    "grpc_addr": ADDRS,
    # Keys around the snapshot store's 511-byte limit on a whole state key ("kv/ns/" + key).
    "namespace": ["ns", "ORDER_TOPIC_CONFIG"], "key": ["k", "TopicA", "k/with/slash", "x" * 505, "é" * 300],
    "value": ["v", ""], "consistency": [0, 1],
    "key_prefixes": ["", "topic/", "kv/ns/", "bind/TopicA/"],
    "broker_id": [0, 1, 2], "queue_id": [0, 1, 65534], "read_queue_nums": [0, 4, 65535],
    "write_queue_nums": [0, 4, 65535], "perm": [0, 2, 4, 6, 7], "topic_sys_flag": [0, 1, 2, 3],
    "heartbeat_timeout_ms": [0, 1000, 3_600_000], "expected_version": [0, 1, 2, 3],
    # Reads wait (bounded) for min_offset: keep most examples at 0 so the run stays fast.
    "min_offset": [0, 0, 0, 1], "start_offset": [0, 1, 2], "progress_interval_ms": [0, 50, 60_000],
    "counter": [0, 1, 2], "timestamp": [0, 1_700_000_000_000], "state_version": [0, 1],
    "from_offset": [0, 1], "to_offset": [0, 1, 2], "max_batch": [0, 1, 5000],
}

_INT_RANGES = {
    F.TYPE_INT32: (-(1 << 31), (1 << 31) - 1), F.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    F.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1), F.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    F.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1), F.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    F.TYPE_UINT32: (0, (1 << 32) - 1), F.TYPE_FIXED32: (0, (1 << 32) - 1),
    F.TYPE_UINT64: (0, (1 << 64) - 1), F.TYPE_FIXED64: (0, (1 << 64) - 1),
}
HUGE_SIZES = [128, 256, 512, 600, 4_097, 70_000, (1 << 20) + 1]  # around and past every length bound

# Strings that have broken parsers before: separators, control and non-BMP characters, lookalikes.
NASTY = ["", " ", "/", "a/b", ":", "::", "[", "[::1]", "\x00", "\n", "%", "|", "é", "\u0663", "\U0001f600",
         "１２３", "a" * 128, "-1", "9" * 30, "nan", "true", "null", "{}", "..", "host:99999",
         "[fe80::1%" + "a" * 600 + "]:10911", "[::1%é]:1", "a." * 130 + "a:1"]


@functools.cache
def text_values(max_size: int = 40, huge_sizes: tuple[int, ...] = tuple(HUGE_SIZES)) -> st.SearchStrategy[str]:
    """Arbitrary strings: unicode, nasty, huge (a repeated character, cheap to generate)."""
    huge = st.builds(lambda ch, n: ch * n, st.characters(exclude_categories=["Cs"]), st.sampled_from(huge_sizes))
    return st.one_of(st.sampled_from(NASTY), st.text(max_size=max_size), huge)


def int_values(ftype: int) -> st.SearchStrategy[int]:
    lo, hi = _INT_RANGES[ftype]
    edges = sorted({lo, hi, 0, 1, -1 if lo < 0 else 0, 2, 65535, 65536, lo // 2, hi // 2})
    return st.one_of(st.sampled_from([e for e in edges if lo <= e <= hi]), st.integers(lo, hi))


def _scalar(field: FieldDescriptor, plausible: bool) -> st.SearchStrategy[Any]:
    t = field.type
    # Hints are per field name, for string fields (a map<int32, int32>'s "key" is no KV key).
    hints = HINTS.get(field.name) if t == F.TYPE_STRING else None
    if plausible and hints:
        return st.sampled_from(hints)
    if plausible and t in _INT_RANGES:
        return st.integers(0, 3)
    if t == F.TYPE_STRING:
        base: st.SearchStrategy[Any] = text_values()
    elif t == F.TYPE_BYTES:
        base = st.binary(max_size=64)
    elif t == F.TYPE_BOOL:
        base = st.booleans()
    elif t == F.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        base = st.one_of(st.sampled_from(known), st.integers(-(1 << 31), (1 << 31) - 1))  # open enums
    elif t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        base = st.floats(width=32 if t == F.TYPE_FLOAT else 64)
    elif t in _INT_RANGES:
        base = int_values(t)
    else:
        raise TypeError(f"no strategy for field {field.full_name} of type {t}")
    return st.one_of(st.sampled_from(hints), base) if hints else base


def _single(field: FieldDescriptor, depth: int, plausible: bool) -> st.SearchStrategy[Any]:
    if field.type == F.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1, plausible=plausible)
    return _scalar(field, plausible)


def _field(field: FieldDescriptor, depth: int, max_items: int, plausible: bool) -> st.SearchStrategy[Any]:
    if field.type == F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        kf, vf = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return st.dictionaries(_single(kf, depth, plausible), _single(vf, depth, plausible), max_size=max_items)
    if field.is_repeated and plausible:  # validation refuses duplicate topics and brokers
        return st.lists(_single(field, depth, plausible), max_size=max_items, unique_by=_identity)
    if field.is_repeated:
        return st.lists(_single(field, depth, plausible), max_size=max_items)
    return _single(field, depth, plausible)


def _identity(value: Any) -> Any:
    if isinstance(value, Message):
        return getattr(value, "topic_name", None) or getattr(value, "broker_name", None) or value.SerializeToString()
    return value


def message_class(descriptor: Descriptor) -> type[Message]:
    return GetMessageClass(descriptor)


@functools.cache  # building strategies is slow; they are immutable
def messages(descriptor: Descriptor, depth: int = 0, max_items: int = 4, plausible: bool = False
             ) -> st.SearchStrategy[Message]:
    """Any message of this type; fields present or not, oneofs with at most one member set.

    plausible: only the per-field-name hints (most such requests pass validation and change state)."""
    cls = message_class(descriptor)
    if depth > 4:  # no request type recurses, but a bound keeps a future one finite
        return st.just(cls())
    plain = {f.name: _field(f, depth, max_items, plausible) for f in descriptor.fields
             if f.containing_oneof is None}
    oneofs = [st.one_of(st.just({}), *[_field(f, depth, max_items, plausible).map(lambda v, n=f.name: {n: v})
                                       for f in o.fields])
              for o in descriptor.oneofs]

    def build(values: dict[str, Any], *chosen: dict[str, Any]) -> Message:
        kwargs = dict(values)
        for c in chosen:
            kwargs.update(c)
        return cls(**kwargs)

    fields = st.fixed_dictionaries(plain) if plausible else st.fixed_dictionaries({}, optional=plain)
    return st.builds(build, fields, *oneofs)


@functools.cache
def one_wild(descriptor: Descriptor, max_items: int = 4) -> st.SearchStrategy[Message]:
    """A plausible message with one field replaced by an arbitrary value: reaches each check alone."""
    cls = message_class(descriptor)
    plain = [f for f in descriptor.fields if f.containing_oneof is None]
    if not plain:
        return messages(descriptor)
    good = st.fixed_dictionaries({f.name: _field(f, 0, max_items, True) for f in plain})

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        values = draw(good)
        f = draw(st.sampled_from(plain))
        values[f.name] = draw(_field(f, 0, max_items, False))
        return cls(**values)

    return build()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@functools.cache
def wire_bytes(max_fields: int = 6) -> st.SearchStrategy[bytes]:
    """Protobuf-shaped random bytes: tags with any field number and wire type, random payloads."""
    field_no = st.one_of(st.integers(1, 12), st.integers(1, (1 << 29) - 1))

    def enc(num: int, wt: int, n: int, payload: bytes) -> bytes:
        tag = _varint(num << 3 | wt)
        if wt == 0:
            return tag + _varint(n)
        if wt == 1:
            return tag + payload.ljust(8, b"\0")[:8]
        if wt == 5:
            return tag + payload.ljust(4, b"\0")[:4]
        return tag + _varint(len(payload)) + payload  # 2: length-delimited

    one = st.builds(enc, field_no, st.sampled_from([0, 1, 2, 5]), st.integers(0, (1 << 64) - 1),
                    st.binary(max_size=24))
    return st.lists(one, max_size=max_fields).map(b"".join)


@functools.cache
def parsed(descriptor: Descriptor) -> st.SearchStrategy[Message]:
    """Random protobuf-shaped bytes that happen to parse as this type (unknown fields kept)."""
    cls = message_class(descriptor)

    def parse(data: bytes) -> Message | None:
        try:
            return cls.FromString(data)
        except DecodeError:
            return None

    return wire_bytes().map(parse).filter(lambda m: m is not None)


@functools.cache
def requests(descriptor: Descriptor) -> st.SearchStrategy[Message]:
    """Plausible messages, plausible but for one field, arbitrary ones, random bytes parsed as the type."""
    return st.one_of(messages(descriptor, plausible=True), one_wild(descriptor), messages(descriptor),
                     parsed(descriptor))


@functools.cache
def chunk_streams() -> st.SearchStrategy[list[Message]]:
    """RegisterBrokerStream input: a plausible header then topic chunks, or any chunks in any order."""
    chunk = message_class(api_pb2.RegisterBrokerChunk.DESCRIPTOR)
    plausible = st.builds(
        lambda head, parts: [chunk(header=head)] + [chunk(topics=p) for p in parts],
        messages(api_pb2.RegisterBrokerRequest.DESCRIPTOR, plausible=True),
        st.lists(messages(api_pb2.TopicConfigs.DESCRIPTOR, plausible=True), max_size=3))
    return st.one_of(plausible, st.lists(requests(api_pb2.RegisterBrokerChunk.DESCRIPTOR), max_size=4))


@functools.cache
def garbage() -> st.SearchStrategy[bytes]:
    """Bytes to send as a serialized request: protobuf-shaped or not at all."""
    return st.one_of(wire_bytes(), st.binary(max_size=256), st.sampled_from(
        [b"\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x02\xc3\x28", b"\x08" + b"\xff" * 10 + b"\x01"]))

