"""Record types and the human JSON rendering of record values.

A record's value is the canonical bytes of a state.proto message chosen by its type. The exported
log keeps those bytes (what the digest hashes) and a JSON rendering next to them, for people and for
Spark's JSON functions (`get_json_object(value_json, '$.cluster')`). 64-bit integers stay JSON numbers.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from nameserver.pb import state_pb2

# The nameserver's record types (state.proto RecordType) and the message each value holds.
VALUE_MESSAGES: dict[int, type[Message]] = {
    state_pb2.BROKER: state_pb2.BrokerData,
    state_pb2.BROKER_LIVE: state_pb2.BrokerLive,
    state_pb2.TOPIC_QUEUE: state_pb2.QueueData,
    state_pb2.FILTER_SERVER: state_pb2.FilterServers,
    state_pb2.KV_CONFIG: state_pb2.KvValue,
    state_pb2.KV_NAMESPACE: state_pb2.KvNamespace,
    state_pb2.SETTING: state_pb2.SettingValue,
    state_pb2.QUEUE_BINDING: state_pb2.QueueBindingValue,
    state_pb2.CLIENT_SESSION: state_pb2.ClientSession,
    state_pb2.MEMBER: state_pb2.MemberInfo,
    state_pb2.CONTROLLER_BROKER_SET: state_pb2.ControllerBrokerSet,
}

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
