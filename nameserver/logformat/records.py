"""Record types (the registry: `RecordKind`, `KINDS`) and the human JSON rendering of record values.

A record's value is the canonical bytes of a state.proto message chosen by its type. The exported
log keeps those bytes (what the digest hashes) and a JSON rendering next to them, for people and for
Spark's JSON functions (`get_json_object(value_json, '$.cluster')`). 64-bit integers stay JSON numbers.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from nameserver.pb import state_pb2


@dataclass(frozen=True)
class RecordKind:
    """One record type of the nameserver's state: the one place it is declared (nameserver/state/keys.py,
    metadata.py, the log export, the client's watches and the pipeline read it from here)."""

    rtype: int                 # state.proto RecordType, carried by every record
    prefix: str                # every key of the type starts with it ("<word>/"; the layout defines meaning)
    value: type[Message]       # the state.proto message its value holds (what the export renders)
    routes: bool = False       # a topic's route reads it: a change moves the route generation, so kept
                               # routes (nameserver/core/routecache.py) are computed again


BROKER = RecordKind(state_pb2.BROKER, "broker/", state_pb2.BrokerData, routes=True)
LIVE = RecordKind(state_pb2.BROKER_LIVE, "live/", state_pb2.BrokerLive)
TOPIC = RecordKind(state_pb2.TOPIC_QUEUE, "topic/", state_pb2.QueueData, routes=True)
FILTER = RecordKind(state_pb2.FILTER_SERVER, "filter/", state_pb2.FilterServers, routes=True)
KV = RecordKind(state_pb2.KV_CONFIG, "kv/", state_pb2.KvValue, routes=True)  # the order-topic config
KV_NAMESPACE = RecordKind(state_pb2.KV_NAMESPACE, "kvns/", state_pb2.KvNamespace)
SETTING = RecordKind(state_pb2.SETTING, "setting/", state_pb2.SettingValue, routes=True)
BIND = RecordKind(state_pb2.QUEUE_BINDING, "bind/", state_pb2.QueueBindingValue)
SESSION = RecordKind(state_pb2.CLIENT_SESSION, "session/", state_pb2.ClientSession)
MEMBER = RecordKind(state_pb2.MEMBER, "member/", state_pb2.MemberInfo)
CONTROLLER = RecordKind(state_pb2.CONTROLLER_BROKER_SET, "ctrl/", state_pb2.ControllerBrokerSet)
# Sharding's directory in group 0 (which group a set's route records are read from, so a change moves routes);
# in another group, the fence of a set moving out of it (nameserver/state/shards/moves.py).
SHARD = RecordKind(state_pb2.SHARD_SET, "shard/", state_pb2.ShardSet, routes=True)

KINDS: tuple[RecordKind, ...] = (BROKER, LIVE, TOPIC, FILTER, KV, KV_NAMESPACE, SETTING, BIND, SESSION, MEMBER,
                                 CONTROLLER, SHARD)
BY_PREFIX: dict[str, RecordKind] = {kind.prefix: kind for kind in KINDS}
# The message each record type's value holds.
VALUE_MESSAGES: dict[int, type[Message]] = {kind.rtype: kind.value for kind in KINDS}


def kind_of(key: str) -> RecordKind | None:
    """The record kind a key's prefix names (None for a key of no known kind)."""
    return BY_PREFIX.get(key[:key.find("/") + 1])


# Request-id prefixes that say why a batch was written. Batches the leader writes on its own (an
# expiry) or for an unregister can carry them; the report uses them to tell expiries from unregisters.
EXPIRE_TAG = "expire/"
UNREGISTER_TAG = "unregister/"

_CACHE_MAX = 1 << 16
_json_cache: dict[tuple[int, bytes], str | None] = {}


def type_name(rtype: int) -> str:
    """BROKER_LIVE, TOPIC_QUEUE, ...; TYPE_<n> for a type this build does not know."""
    try:
        return state_pb2.RecordType.Name(rtype)
    except ValueError:
        return f"TYPE_{rtype}"


def to_jsonable(msg: Message) -> dict[str, Any]:
    """Every field (defaults included), snake_case, enums by name, bytes as base64, ints as numbers."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.is_repeated:
            out[field.name] = [_scalar(field, v) for v in value]
        else:
            out[field.name] = _scalar(field, value)
    return out


def _scalar(field: Any, value: Any) -> Any:  # a FieldDescriptor (python or upb: the stubs tell them apart)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_jsonable(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type.values_by_number.get(value) if field.enum_type is not None else None
        return enum.name if enum is not None else value
    return value


def value_json(rtype: int, value: bytes) -> str | None:
    """The JSON rendering of a record value; None for an empty value (a delete) or an unknown type.

    Values repeat a lot (a broker's queue datas), so renderings are cached by (type, bytes).
    """
    if not value:
        return None
    cache_key = (rtype, value)
    hit = _json_cache.get(cache_key, False)
    if hit is not False:
        return hit  # type: ignore[return-value]
    cls = VALUE_MESSAGES.get(rtype)
    text: str | None = None
    if cls is not None:
        try:
            text = json.dumps(to_jsonable(cls.FromString(value)), separators=(",", ":"), sort_keys=True)
        except DecodeError:
            text = None
    if len(_json_cache) >= _CACHE_MAX:
        _json_cache.clear()
    _json_cache[cache_key] = text
    return text
