"""Input validation: bad input is refused with the offending field named, before anything is logged.

ValidationError maps to INVALID_ARGUMENT, TooLargeError (a size bound) to RESOURCE_EXHAUSTED.
Field paths follow the protobuf field names, with indexes for repeated fields
(e.g. `topics[3].topic_name`). Names are taken as the stock NameServer takes them (it checks none),
within what a state key can hold; the bounds below are ours, chosen generously enough for real
deployments.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from typing import Any

from nameserver.errors import TooLargeError, ValidationError
from nameserver.logformat import keynames
from nameserver.pb import api_pb2, state_pb2
from nameserver.state import keys

# ---- limits ----------------------------------------------------------------------------------------

# RocketMQ's TopicValidator allows 127 characters for a topic an operator creates, but brokers register
# more: retry and DLQ topics are "%RETRY%"/"%DLQ%" + a group name of up to 255 characters. The bound
# keeps "topic/<topic>/<broker name>" within a snapshot's 511-byte key.
MAX_TOPIC_NAME_LEN = 300  # bytes of UTF-8 (characters, for the names RocketMQ's TopicValidator allows)
MAX_STATE_KEY_BYTES = 511          # LMDB's key size: every state key must fit in a snapshot
MAX_NAME_LEN = 127                  # a static topic's mapping scope, in UTF-8 bytes (ours)
# Broker, cluster and zone names: RocketMQ checks none, so any text is taken (keys.py escapes a broker name
# where it goes into a key). Bounded by what a key can hold: "topic/<topic>/<broker name>" with the longest
# topic must fit a snapshot's key, so a name may take 204 bytes of UTF-8 once escaped ('/', '~' count 3).
# Every name of the former rule (127 of letters, digits, '%', '|', '_', '.', '-') is within it.
MAX_NAME_BYTES = MAX_STATE_KEY_BYTES - len(keys.TOPIC_PREFIX) - MAX_TOPIC_NAME_LEN - len("/")
MAX_HOST_LEN = 253                  # DNS name limit
MAX_QUEUE_NUMS = 65535              # read/write queue numbers per topic per broker (ours)
MAX_LOGICAL_QUEUES = 65535          # a static topic's logical queues (RIP-21 queue mapping)
MAX_PERM = 7                        # read 4 | write 2 | inherit 1
# A registration's heartbeat timeout is clamped into this range (0 = the server's default): RocketMQ takes
# any value, so a broker is never refused for it; below a second it would expire between two heartbeats.
MIN_HEARTBEAT_TIMEOUT_MS = 1_000
MAX_HEARTBEAT_TIMEOUT_MS = 3_600_000
MAX_TOPICS_PER_REGISTRATION = 200_000  # a 70k-topic broker fits with room to spare
MAX_FILTER_SERVERS = 1_024
MAX_HEARTBEATS_PER_REQUEST = 10_000
MAX_QUEUE_DATAS_PER_TOPIC = 10_000  # one per broker name
MAX_KV_NAMESPACE_LEN = 255          # bytes in UTF-8
# "kv/<namespace>/<key>" must fit MAX_STATE_KEY_BYTES: the key gets what the namespace leaves.
MAX_KV_KEY_BYTES = MAX_STATE_KEY_BYTES - len(keys.KV_PREFIX) - len("/") - 1
MAX_KV_VALUE_BYTES = 1 << 20        # 1 MiB

# A topic name is any text the stock NameServer would store (it checks none; a broker registers a topic
# named after itself, whatever its name), except what a state key cannot hold: a '/' (it ends the topic's
# part of topic/<topic>/<broker>) and control characters (they would reach logs and tables as they are).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # DNS label ('_' tolerated)
_PORT = re.compile(r"[0-9]{1,5}")
_SCOPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # an IPv6 zone: an interface name or number


class _Passed:
    """Values a check of the value alone (its field named only in the error) passed, kept so that the next
    check of the same value is a set lookup: a broker registers the same names, addresses and topics again
    and again (every 30 s; a bench's broker, at every call). Bounded: past `limit` values it starts again.
    Only a value that passed is kept, so a refusal is decided, and worded, by the check itself every time."""

    __slots__ = ("limit", "values")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.values: set[str] = set()

    def add(self, value: str) -> None:
        if len(self.values) >= self.limit:
            self.values = set()  # a bound, not an eviction order (a reader may still hold the old set: fine)
        self.values.add(value)


_TOPICS_PASSED = _Passed(16_384)  # check_topic's; a topic name is at most MAX_TOPIC_NAME_LEN bytes
_NAMES_PASSED = _Passed(4_096)    # check_name's
_ADDRS_PASSED = _Passed(4_096)    # check_addr's


MAX_QUOTED = 64        # a bad value is quoted in a message up to this many characters


def _quoted(value: str) -> str:
    """A value for an error message, shortened: echoing a huge input whole would make the status
    trailer exceed gRPC's metadata limit, and the client would get RESOURCE_EXHAUSTED instead."""
    if len(value) <= MAX_QUOTED:
        return repr(value)
    return f"{value[:MAX_QUOTED]!r}... ({len(value)} characters)"


# ---- field checks ----------------------------------------------------------------------------------

def check_topic(field: str, topic: str) -> None:
    if topic in _TOPICS_PASSED.values:
        return
    if not topic:
        raise ValidationError(field, "topic name must not be empty")
    if "/" in topic:
        raise ValidationError(field, f"topic name {_quoted(topic)} may not contain '/'")
    if _CONTROL.search(topic):
        raise ValidationError(field, f"topic name {_quoted(topic)} may not contain control characters")
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape: no UTF-8 can hold it
        raise ValidationError(field, f"topic name {_quoted(topic)} is not valid Unicode") from None
    if size > MAX_TOPIC_NAME_LEN:
        raise ValidationError(field, f"topic name longer than {MAX_TOPIC_NAME_LEN} bytes in UTF-8")
    _TOPICS_PASSED.add(topic)


def check_name(field: str, name: str, what: str = "name") -> None:
    """Broker, cluster and zone names (and the names the controller and admin calls take): any non-empty
    text, as the stock NameServer takes it, within MAX_NAME_BYTES once escaped for a key."""
    if name in _NAMES_PASSED.values:
        return
    if not name:
        raise ValidationError(field, f"{what} must not be empty")
    try:
        size = len(keynames.escape(name).encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape: no UTF-8 can hold it
        raise ValidationError(field, f"{what} {_quoted(name)} is not valid Unicode") from None
    if size > MAX_NAME_BYTES:
        raise ValidationError(field, f"{what} longer than {MAX_NAME_BYTES} bytes in UTF-8 "
                                     "('/' and '~' count 3)")
    _NAMES_PASSED.add(name)


def check_addr(field: str, addr: str) -> None:
    """host:port, the port 1..65535 after the last ':'. The host is a hostname, an IPv4 literal or an
    IPv6 literal, bracketed or not: a broker with brokerIP1=fe80::1 registers "fe80::1:10911", and the
    stock NameServer stores it as it is."""
    if addr in _ADDRS_PASSED.values:
        return
    if not addr:
        raise ValidationError(field, "address must not be empty")
    if addr.startswith("["):
        end = addr.find("]")
        host, rest = (addr[1:end], addr[end + 1:]) if end > 0 else ("", "")
        if not rest.startswith(":"):
            raise ValidationError(field, f"address {_quoted(addr)} is not [ipv6]:port")
        _check_ipv6(field, addr, host)
        port = rest[1:]
    else:
        host, sep, port = addr.rpartition(":")
        if not sep or not host:
            raise ValidationError(field, f"address {_quoted(addr)} is not host:port")
        if ":" in host:
            _check_ipv6(field, addr, host)
        elif re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValidationError(field, f"address {_quoted(addr)}: {_quoted(host)} is not an IPv4 "
                                             "address") from None
        elif len(host) > MAX_HOST_LEN or not all(_LABEL.fullmatch(label) for label in host.split(".")):
            raise ValidationError(field, f"address {_quoted(addr)}: {_quoted(host)} is not a valid hostname")
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise ValidationError(field, f"address {_quoted(addr)}: port must be 1..65535")
    _ADDRS_PASSED.add(addr)


def check_node_addr(field: str, addr: str) -> None:
    """A node's own address (Raft id, gRPC address), which gRPC and the Raft transport dial: as check_addr,
    but an IPv6 host only in brackets ("[::1]:9201"). Unbracketed, gRPC reads "::1:9201" as some other
    target; RocketMQ has no such rule to follow here, brokers never send these."""
    check_addr(field, addr)
    if not addr.startswith("[") and ":" in addr.rpartition(":")[0]:
        raise ValidationError(field, f"address {_quoted(addr)}: write IPv6 literals in brackets ([::1]:port)")


def _check_ipv6(field: str, addr: str, host: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise ValidationError(field, f"address {_quoted(addr)}: {_quoted(host)} is not an IPv6 literal") from None
    # Python accepts any scope ID ("%" + anything, any length); an interface name is enough, and an
    # unbounded one would make state keys (live/<addr>) too long for a snapshot.
    scope = host.partition("%")[2]
    if scope and not _SCOPE.fullmatch(scope):
        raise ValidationError(field, f"address {_quoted(addr)}: the scope ID must be 1..64 of letters, "
                                     "digits, '_', '.', '-'")


def clamp_heartbeat_timeout(req: api_pb2.RegisterBrokerRequest) -> str | None:
    """Bring the registration's heartbeat timeout into MIN..MAX_HEARTBEAT_TIMEOUT_MS (0, the default, stays);
    the warning to pass on when it was changed, else None. Never a refusal: RocketMQ takes any value."""
    asked = req.heartbeat_timeout_ms
    if asked == 0 or MIN_HEARTBEAT_TIMEOUT_MS <= asked <= MAX_HEARTBEAT_TIMEOUT_MS:
        return None
    req.heartbeat_timeout_ms = min(max(asked, MIN_HEARTBEAT_TIMEOUT_MS), MAX_HEARTBEAT_TIMEOUT_MS)
    return (f"heartbeatTimeoutMillis {asked} is outside {MIN_HEARTBEAT_TIMEOUT_MS}..{MAX_HEARTBEAT_TIMEOUT_MS}: "
            f"registered with {req.heartbeat_timeout_ms}")


def _check_range(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValidationError(field, f"must be in {low}..{high}, got {value}")


def check_queue_numbers(prefix: str, read: int, write: int, perm: int, sys_flag: int) -> None:
    _check_range(f"{prefix}read_queue_nums", read, 0, MAX_QUEUE_NUMS)
    _check_range(f"{prefix}write_queue_nums", write, 0, MAX_QUEUE_NUMS)
    _check_range(f"{prefix}perm", perm, 0, MAX_PERM)
    if sys_flag < 0:
        raise ValidationError(f"{prefix}topic_sys_flag", f"must be >= 0, got {sys_flag}")


def check_topic_config(prefix: str, tc: api_pb2.TopicConfig) -> None:
    """One TopicConfig; prefix is its path with a trailing dot, e.g. 'topics[3].'."""
    check_topic(f"{prefix}topic_name", tc.topic_name)
    check_queue_numbers(prefix, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
    if tc.HasField("mapping"):
        check_queue_mapping(f"{prefix}mapping.", tc.mapping)


def check_queue_mapping(prefix: str, m: state_pb2.QueueMapping) -> None:
    """A static topic's queue mapping (RIP-21): non-negative numbers, a bounded id map and scope."""
    if not 0 <= m.total_queues <= MAX_LOGICAL_QUEUES:
        raise ValidationError(f"{prefix}total_queues", f"must be 0..{MAX_LOGICAL_QUEUES}, got {m.total_queues}")
    if m.epoch < 0:
        raise ValidationError(f"{prefix}epoch", f"must be >= 0, got {m.epoch}")
    if len(m.scope.encode("utf-8")) > MAX_NAME_LEN:
        raise ValidationError(f"{prefix}scope", f"longer than {MAX_NAME_LEN} bytes")
    if len(m.curr_id_map) > MAX_LOGICAL_QUEUES:
        raise ValidationError(f"{prefix}curr_id_map", f"more than {MAX_LOGICAL_QUEUES} entries")
    for logical, physical in m.curr_id_map.items():
        if logical < 0 or physical < 0:
            raise ValidationError(f"{prefix}curr_id_map",
                                  f"queue ids must be >= 0, got {logical} -> {physical}")


def check_topic_configs(topics: Iterable[api_pb2.TopicConfig], field: str = "topics",
                        max_topics: int = MAX_TOPICS_PER_REGISTRATION) -> None:
    """A registration's topic table: each valid, no duplicate names, at most max_topics."""
    seen: dict[str, int] = {}
    passed = _TOPICS_PASSED.values
    for i, tc in enumerate(topics):
        if i >= max_topics:
            raise TooLargeError(field, f"more than {max_topics} topics in one registration")
        name = tc.topic_name
        # what check_topic_config would pass, seen without building each field's path (most topics): else it
        # checks, and names the field of what it refuses
        if not (name in passed and 0 <= tc.read_queue_nums <= MAX_QUEUE_NUMS
                and 0 <= tc.write_queue_nums <= MAX_QUEUE_NUMS and 0 <= tc.perm <= MAX_PERM
                and tc.topic_sys_flag >= 0 and not tc.HasField("mapping")):
            check_topic_config(f"{field}[{i}].", tc)
        first = seen.setdefault(name, i)
        if first != i:
            raise ValidationError(f"{field}[{i}].topic_name",
                                  f"duplicate topic {tc.topic_name!r} (first at {field}[{first}])")


def check_broker_id(field: str, broker_id: int) -> None:
    if broker_id < 0:
        raise ValidationError(field, f"broker id must be >= 0, got {broker_id}")


def check_min_offset(field: str, offset: int) -> None:
    if offset < 0:
        raise ValidationError(field, f"must be >= 0, got {offset}")


def check_min_offsets(field: str, offsets: Sequence[int], groups: int) -> None:
    """A read's offset vector (sharding): one entry a group at most, none negative."""
    if len(offsets) > groups:
        raise ValidationError(field, f"{len(offsets)} entries: this cluster has {groups} group"
                                     f"{'s' if groups > 1 else ''} (one entry a group)")
    for k, offset in enumerate(offsets):
        check_min_offset(f"{field}[{k}]", offset)


def highest_min_offset(request: Any) -> int:
    """The highest offset a read's request asks for: its min_offset and every entry of its min_offsets (a
    read waits for the largest); 0 for a request with neither."""
    return max([getattr(request, "min_offset", 0), *getattr(request, "min_offsets", ())])


def check_kv(namespace: str, key: str | None = None, value: str | None = None) -> None:
    """KV namespace (non-empty, no '/'), key (non-empty) and value (may be empty), with size bounds."""
    if not namespace:
        raise ValidationError("namespace", "must not be empty")
    ns_bytes = len(namespace.encode())
    if ns_bytes > MAX_KV_NAMESPACE_LEN:
        raise ValidationError("namespace", f"longer than {MAX_KV_NAMESPACE_LEN} bytes in UTF-8")
    if "/" in namespace:
        raise ValidationError("namespace", "must not contain '/'")
    if key is not None:
        if not key:
            raise ValidationError("key", "must not be empty")
        # A longer state key would be accepted here, then fail every snapshot from then on.
        room = MAX_STATE_KEY_BYTES - len(keys.KV_PREFIX) - len("/") - ns_bytes
        if len(key.encode()) > room:
            raise TooLargeError("key", f"longer than {room} bytes in UTF-8 (namespace and key share "
                                       f"{MAX_STATE_KEY_BYTES - 4} bytes)")
    if value is not None and len(value.encode()) > MAX_KV_VALUE_BYTES:
        raise TooLargeError("value", f"longer than {MAX_KV_VALUE_BYTES} bytes")


# ---- requests --------------------------------------------------------------------------------------

def validate_register_broker(req: api_pb2.RegisterBrokerRequest,
                             max_topics: int = MAX_TOPICS_PER_REGISTRATION) -> None:
    check_name("cluster_name", req.cluster_name, "cluster name")
    check_name("broker_name", req.broker_name, "broker name")
    check_addr("broker_addr", req.broker_addr)
    check_broker_id("broker_id", req.broker_id)
    if req.ha_server_addr:
        check_addr("ha_server_addr", req.ha_server_addr)
    # heartbeat_timeout_ms: clamped before this (clamp_heartbeat_timeout), never refused
    if req.zone_name:
        check_name("zone_name", req.zone_name, "zone name")
    if req.data_version.counter < 0:
        raise ValidationError("data_version.counter", "must be >= 0")
    if req.data_version.timestamp < 0:
        raise ValidationError("data_version.timestamp", "must be >= 0")
    if len(req.filter_servers) > MAX_FILTER_SERVERS:
        raise TooLargeError("filter_servers", f"more than {MAX_FILTER_SERVERS} filter servers")
    for i, addr in enumerate(req.filter_servers):
        check_addr(f"filter_servers[{i}]", addr)
    if len(req.topics) > max_topics:
        raise TooLargeError("topics", f"{len(req.topics)} topics, more than {max_topics} in one registration")
    check_topic_configs(req.topics, "topics", max_topics)


def validate_unregister_broker(req: api_pb2.UnregisterBrokerRequest) -> None:
    check_name("cluster_name", req.cluster_name, "cluster name")
    check_name("broker_name", req.broker_name, "broker name")
    check_addr("broker_addr", req.broker_addr)
    check_broker_id("broker_id", req.broker_id)


def validate_heartbeat(req: api_pb2.HeartbeatRequest) -> None:
    if len(req.heartbeats) > MAX_HEARTBEATS_PER_REQUEST:
        raise TooLargeError("heartbeats", f"more than {MAX_HEARTBEATS_PER_REQUEST} heartbeats")
    for i, hb in enumerate(req.heartbeats):
        # Cluster and broker name are informative (the address is the identity): checked if given.
        if hb.cluster_name:
            check_name(f"heartbeats[{i}].cluster_name", hb.cluster_name, "cluster name")
        if hb.broker_name:
            check_name(f"heartbeats[{i}].broker_name", hb.broker_name, "broker name")
        check_addr(f"heartbeats[{i}].broker_addr", hb.broker_addr)
    handover = req.handover  # a peer's liveness table: bounded by the message size
    if len(handover.silent_ms) != len(handover.broker_addrs):
        raise ValidationError("handover.silent_ms", f"{len(handover.silent_ms)} silences for "
                              f"{len(handover.broker_addrs)} addresses")
    for i, addr in enumerate(handover.broker_addrs):
        check_addr(f"handover.broker_addrs[{i}]", addr)


def validate_get_route(req: api_pb2.GetRouteRequest) -> None:
    check_topic("topic", req.topic)
    check_min_offset("min_offset", req.min_offset)
    if req.zone_name:
        check_name("zone_name", req.zone_name, "zone name")


def validate_get_cluster_info(req: api_pb2.GetClusterInfoRequest) -> None:
    check_min_offset("min_offset", req.min_offset)


def validate_get_topic_list(req: api_pb2.GetTopicListRequest) -> None:
    if req.kind not in api_pb2.TopicListKind.values():
        raise ValidationError("kind", f"unknown topic list kind {req.kind}")
    if req.kind == api_pb2.TOPIC_LIST_BY_CLUSTER:
        check_name("cluster_name", req.cluster_name, "cluster name")
    check_min_offset("min_offset", req.min_offset)


def validate_get_broker_member_group(req: api_pb2.GetBrokerMemberGroupRequest) -> None:
    if req.cluster_name:
        check_name("cluster_name", req.cluster_name, "cluster name")
    check_name("broker_name", req.broker_name, "broker name")
    check_min_offset("min_offset", req.min_offset)


def validate_put_kv(req: api_pb2.PutKvRequest) -> None:
    check_kv(req.namespace, req.key, req.value)


def validate_get_kv(req: api_pb2.GetKvRequest) -> None:
    check_kv(req.namespace, req.key)
    check_min_offset("min_offset", req.min_offset)


def validate_delete_kv(req: api_pb2.DeleteKvRequest) -> None:
    check_kv(req.namespace, req.key)


def validate_list_kv(req: api_pb2.ListKvRequest) -> None:
    check_kv(req.namespace)
    check_min_offset("min_offset", req.min_offset)


def validate_broker_perm(req: api_pb2.BrokerPermRequest) -> None:
    check_name("broker_name", req.broker_name, "broker name")


def check_queue_data(prefix: str, qd: state_pb2.QueueData) -> None:
    check_name(f"{prefix}broker_name", qd.broker_name, "broker name")
    check_queue_numbers(prefix, qd.read_queue_nums, qd.write_queue_nums, qd.perm, qd.topic_sys_flag)
    if qd.HasField("mapping"):
        raise ValidationError(f"{prefix}mapping", "a static topic's queue mapping comes with the broker's "
                              "registration, not with RegisterTopic")


def validate_register_topic(req: api_pb2.RegisterTopicRequest) -> None:
    """Every queue data valid, one per broker name (that the brokers exist is checked by translate)."""
    check_topic("topic", req.topic)
    if len(req.queue_datas) > MAX_QUEUE_DATAS_PER_TOPIC:
        raise TooLargeError("queue_datas", f"more than {MAX_QUEUE_DATAS_PER_TOPIC} queue datas")
    seen: dict[str, int] = {}
    for i, qd in enumerate(req.queue_datas):
        check_queue_data(f"queue_datas[{i}].", qd)
        first = seen.setdefault(qd.broker_name, i)
        if first != i:
            raise ValidationError(f"queue_datas[{i}].broker_name",
                                  f"duplicate broker {qd.broker_name!r} (first at queue_datas[{first}])")


def validate_delete_topic(req: api_pb2.DeleteTopicRequest) -> None:
    check_topic("topic", req.topic)
    if req.cluster_name:
        check_name("cluster_name", req.cluster_name, "cluster name")


# ---- value-first shorthands (the gRPC service's calling convention) -------------------------------

def validate_topic_name(topic: str, field: str = "topic") -> None:
    check_topic(field, topic)


def validate_name(name: str, field: str) -> None:
    """A broker/cluster/zone name in `field` (the message says which, from the field name)."""
    check_name(field, name, field.rsplit(".", 1)[-1].replace("_", " "))


# ---- queue bindings -------------------------------------------------------------------------------

def validate_queue_id(queue_id: int, field: str = "queue_id") -> None:
    _check_range(field, queue_id, 0, MAX_QUEUE_NUMS - 1)


def validate_bind_queue(req: api_pb2.BindQueueRequest) -> None:
    check_topic("topic", req.topic)
    validate_queue_id(req.queue_id)
    check_name("owner", req.owner, "owner")
    if req.expected_version < 0:
        raise ValidationError("expected_version", "must be >= 0 (0: the queue must be unbound)")


def validate_release_queue(req: api_pb2.ReleaseQueueRequest) -> None:
    check_topic("topic", req.topic)
    validate_queue_id(req.queue_id)
    if req.expected_version <= 0:
        raise ValidationError("expected_version", "must be the binding's current version (> 0)")


def validate_watch(req: api_pb2.WatchRequest) -> tuple[str, ...]:
    """The key prefixes a watch covers ('' = everything)."""
    if req.start_offset < 0:
        raise ValidationError("start_offset", "must be >= 0 (0: from now, current state first)")
    if not 0 <= req.progress_interval_ms <= 60_000:
        raise ValidationError("progress_interval_ms", "must be within 0..60000")
    if len(req.key_prefixes) + len(req.topics) > 1000:
        raise TooLargeError("key_prefixes", "at most 1000 prefixes and topics together")
    for i, prefix in enumerate(req.key_prefixes):
        if len(prefix) > 1024:
            raise ValidationError(f"key_prefixes[{i}]", "at most 1024 characters")
    prefixes = list(req.key_prefixes)
    for i, topic in enumerate(req.topics):
        check_topic(f"topics[{i}]", topic)
        prefixes += [keys.topic_prefix(topic), keys.bind_prefix(topic)]
    return tuple(prefixes) or ("",)


# ---- controller mode ------------------------------------------------------------------------------

MAX_CONTROLLER_BROKER_ID = 1 << 20   # a set holds a handful of replicas; ids are assigned from 1
MAX_SYNC_STATE_SET = 64
MAX_CHECK_CODE_LEN = 256


def _controller_broker_id(field: str, broker_id: int, allow_none: bool = False) -> None:
    if allow_none and broker_id == -1:
        return
    _check_range(field, broker_id, 1, MAX_CONTROLLER_BROKER_ID)


def _controller_cluster(field: str, name: str) -> None:
    if name:  # optional in RocketMQ's requests (mqadmin sends it; a broker's elect may not)
        validate_name(name, field)


def validate_controller_set(req: api_pb2.BrokerSetRequest) -> None:
    _controller_cluster("cluster_name", req.cluster_name)
    validate_name(req.broker_name, "broker_name")


def validate_apply_broker_id(req: api_pb2.ApplyBrokerIdRequest) -> None:
    _controller_cluster("cluster_name", req.cluster_name)
    validate_name(req.broker_name, "broker_name")
    _controller_broker_id("broker_id", req.broker_id)
    if not req.register_check_code or len(req.register_check_code) > MAX_CHECK_CODE_LEN:
        raise ValidationError("register_check_code", f"must be 1..{MAX_CHECK_CODE_LEN} characters "
                              "(<broker address>;<timestamp>)")
    check_addr("register_check_code", req.register_check_code.split(";")[0])


def validate_controller_register(req: api_pb2.ControllerRegisterRequest) -> None:
    _controller_cluster("cluster_name", req.cluster_name)
    validate_name(req.broker_name, "broker_name")
    _controller_broker_id("broker_id", req.broker_id)
    check_addr("broker_address", req.broker_address)


def validate_elect_master(req: api_pb2.ElectMasterRequest) -> None:
    _controller_cluster("cluster_name", req.cluster_name)
    validate_name(req.broker_name, "broker_name")
    _controller_broker_id("broker_id", req.broker_id, allow_none=True)  # -1: by policy


def validate_alter_sync_state_set(req: api_pb2.AlterSyncStateSetRequest) -> None:
    validate_name(req.broker_name, "broker_name")
    _controller_broker_id("master_id", req.master_id)
    if not req.sync_state_set or len(req.sync_state_set) > MAX_SYNC_STATE_SET:
        raise ValidationError("sync_state_set", f"must hold 1..{MAX_SYNC_STATE_SET} broker ids")
    for i, broker_id in enumerate(req.sync_state_set):
        _controller_broker_id(f"sync_state_set[{i}]", broker_id)
    if req.master_epoch < 0 or req.sync_state_set_epoch < 0:
        raise ValidationError("master_epoch" if req.master_epoch < 0 else "sync_state_set_epoch", "must be >= 0")


def validate_clean_broker_data(req: api_pb2.CleanBrokerDataRequest) -> None:
    _controller_cluster("cluster_name", req.cluster_name)
    validate_name(req.broker_name, "broker_name")
    if len(req.broker_ids) > MAX_SYNC_STATE_SET:
        raise ValidationError("broker_ids", f"at most {MAX_SYNC_STATE_SET} ids")
    for i, broker_id in enumerate(req.broker_ids):
        _controller_broker_id(f"broker_ids[{i}]", broker_id)


def validate_controller_heartbeat(req: api_pb2.ControllerHeartbeatRequest) -> None:
    _controller_cluster("cluster_name", req.cluster_name)
    validate_name(req.broker_name, "broker_name")
    _controller_broker_id("broker_id", req.broker_id)
    check_addr("broker_address", req.broker_address)
    if req.timeout_ms < 0 or req.timeout_ms > 3_600_000:
        raise ValidationError("timeout_ms", f"must be in 0..3600000, got {req.timeout_ms}")
