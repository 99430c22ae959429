"""RegisterBrokerBody: plain JSON, or RocketMQ's compressed form, plus the header's body CRC.

Compressed (`compressed=true`): a zlib stream of
    int32 length + DataVersion JSON
    int32 topic count, then per topic: int32 length + "name readQ writeQ perm filterType [attributesJSON]"
    int32 length + filter server list JSON
    (5.x) int32 count + that many (int32 length + TopicQueueMappingInfo JSON)
The compressed form carries no topicSysFlag: like RocketMQ, such topics register with flag 0.
Plain 5.x bodies carry the static-topic queue mappings as topicConfigSerializeWrapper.topicQueueMappingInfoMap
(topic -> TopicQueueMappingInfo). Either way a mapping rides on its topic's TopicConfig (attach_mappings).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from nameserver.pb import api_pb2, state_pb2
from nameserver.remoting import bodies
from nameserver.remoting.bodies import BodyError
from nameserver.validation import MAX_TOPICS_PER_REGISTRATION

# A 70k-topic body inflates to a few MiB; 200,000 topics with long names and attributes stay well
# under this. It bounds a zip bomb before anything is parsed.
MAX_INFLATED = 64 << 20
_INT32 = struct.Struct(">i")
ZLIB_HEADER = b"\x78"  # CMF byte of a zlib stream with a 32 KiB window (what java.util.zip.Deflater writes)


@dataclass
class RegisterBody:
    data_version: state_pb2.DataVersion = field(default_factory=state_pb2.DataVersion)
    topics: list[api_pb2.TopicConfig] = field(default_factory=list)
    filter_servers: list[str] = field(default_factory=list)
    # RIP-21 static topics: topic -> (bname, mapping), as the broker sent them
    mappings: dict[str, tuple[str, state_pb2.QueueMapping]] = field(default_factory=dict)

    def attach_mappings(self, broker_name: str) -> list[str]:
        """Put each queue mapping on its topic's config; what could not be attached, as messages. RocketMQ
        files a mapping under its bname, which a broker sets to its own name."""
        by_name = {tc.topic_name: tc for tc in self.topics}
        ignored = []
        for topic, (bname, mapping) in self.mappings.items():
            tc = by_name.get(topic)
            if tc is None:
                ignored.append(f"queue mapping of {topic!r}: the broker registered no such topic")
            elif bname and bname != broker_name:
                ignored.append(f"queue mapping of {topic!r}: bname {bname!r} is not the broker's name")
            else:
                tc.mapping.CopyFrom(mapping)
        return ignored


def crc32(body: bytes) -> int:
    """RocketMQ UtilAll.crc32: CRC-32 masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def decode(body: bytes, compressed: bool) -> RegisterBody:
    if not body:
        return RegisterBody()  # RocketMQ: no body means DataVersion 0/0 and no topics
    # RocketMQ 5.5.0 brokers with compressedRegister=true send a zlib body but compressed=false in the
    # header, and the stock 5.5.0 NameServer refuses them. A JSON body never starts with zlib's 0x78.
    return _decode_compressed(body) if compressed or body[:1] == ZLIB_HEADER else _decode_json(body)


def _decode_json(body: bytes) -> RegisterBody:
    doc = bodies.parse_json(body, "RegisterBrokerBody")
    if not isinstance(doc, dict):
        raise BodyError("RegisterBrokerBody is not a JSON object")
    # Brokers before 3.0.11 sent the TopicConfigSerializeWrapper itself.
    wrapper = doc.get("topicConfigSerializeWrapper", doc if "topicConfigTable" in doc else {})
    if not isinstance(wrapper, dict):
        raise BodyError("topicConfigSerializeWrapper is not a JSON object")
    out = RegisterBody()
    if wrapper.get("dataVersion") is not None:
        out.data_version.CopyFrom(bodies.parse_data_version(wrapper["dataVersion"]))
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise BodyError("topicConfigTable is not a JSON object")
    if len(table) > MAX_TOPICS_PER_REGISTRATION:  # the gRPC path's limit, checked before any topic is built
        raise BodyError(f"topicConfigTable: more than {MAX_TOPICS_PER_REGISTRATION} topics in one registration")
    for name, tc in table.items():
        if not isinstance(tc, dict):
            raise BodyError(f"topicConfigTable[{name!r}] is not a JSON object")
        out.topics.append(bodies.topic_config(tc, str(name), f"topicConfigTable[{name!r}]"))
    out.filter_servers = _string_list(doc.get("filterServerList"), "filterServerList")
    infos = wrapper.get("topicQueueMappingInfoMap") or {}
    if not isinstance(infos, dict):
        raise BodyError("topicQueueMappingInfoMap is not a JSON object")
    for name, info in infos.items():
        _, bname, mapping = bodies.parse_queue_mapping(info, f"topicQueueMappingInfoMap[{name!r}]")
        out.mappings[str(name)] = (bname, mapping)
    return out


def _string_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BodyError(f"{what} is not a list of strings")
    return list(value)


class _Inflated:
    def __init__(self, body: bytes) -> None:
        inflater = zlib.decompressobj()
        try:
            self.data = inflater.decompress(body, MAX_INFLATED)
        except zlib.error as exc:
            raise BodyError(f"compressed RegisterBrokerBody does not inflate: {exc}") from None
        if inflater.unconsumed_tail:
            raise BodyError(f"compressed RegisterBrokerBody inflates past {MAX_INFLATED} bytes")
        self.pos = 0

    def int32(self, what: str) -> int:
        value = _INT32.unpack(self.take(4, what))[0]
        if value < 0:
            raise BodyError(f"compressed RegisterBrokerBody: negative {what} ({value})")
        return value

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise BodyError(f"compressed RegisterBrokerBody truncated reading {what}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def chunk(self, what: str) -> bytes:
        """An int32 length, then that many bytes."""
        return self.take(self.int32(f"{what} length"), what)

    @property
    def done(self) -> bool:
        return self.pos >= len(self.data)


def _decode_compressed(body: bytes) -> RegisterBody:
    src = _Inflated(body)
    out = RegisterBody()
    out.data_version.CopyFrom(bodies.parse_data_version(bodies.parse_json(src.chunk("dataVersion"),
                                                                          "dataVersion")))
    count = src.int32("topic count")
    # Checked on the declared count, before inflating a single topic (the gRPC stream's limit).
    if count > MAX_TOPICS_PER_REGISTRATION:
        raise BodyError(f"compressed RegisterBrokerBody declares {count} topics: more than "
                        f"{MAX_TOPICS_PER_REGISTRATION} topics in one registration")
    for i in range(count):
        out.topics.append(_topic_line(src.chunk(f"topic config {i}"), i))
    out.filter_servers = _string_list(bodies.parse_json(src.chunk("filter server list"), "filterServerList"),
                                      "filterServerList")
    if not src.done:  # 5.x appends the static-topic queue mappings
        for i in range(src.int32("topic queue mapping count")):
            what = f"topic queue mapping {i}"
            topic, bname, mapping = bodies.parse_queue_mapping(bodies.parse_json(src.chunk(what), what), what)
            out.mappings[topic] = (bname, mapping)
    return out


def _topic_line(raw: bytes, index: int) -> api_pb2.TopicConfig:
    # TopicConfig.encode(): space-separated; attributes (JSON) last and optional.
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError(f"topic config {index} is not UTF-8") from None
    parts = line.split(" ", 5)
    if len(parts) < 5:
        raise BodyError(f"topic config {index} {line[:80]!r} has fewer than 5 fields")
    try:
        read, write, perm = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        raise BodyError(f"topic config {index} {line[:80]!r}: queue numbers and perm must be integers") from None
    return api_pb2.TopicConfig(topic_name=parts[0], read_queue_nums=read, write_queue_nums=write, perm=perm)
