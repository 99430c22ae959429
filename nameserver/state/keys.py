"""The state's key layout: one key per RocketMQ table row (see DESIGN.md section 3).

    broker/<brokerName>            BrokerData      (brokerAddrTable + clusterAddrTable)
    live/<brokerAddr>              BrokerLive      (registration part of brokerLiveTable)
    topic/<topic>/<brokerName>     QueueData       (topicQueueTable)
    filter/<brokerAddr>            FilterServers   (filterServerTable)
    kv/<namespace>/<key>           KvValue         (KVConfigManager)
    kvns/<namespace>               KvNamespace     (KVConfigManager's namespace table: kept when emptied)
    setting/<name>                 SettingValue    (NamesrvConfig switches, replicated: settings.py)
    bind/<topic>/<queueId>         QueueBindingValue (new: which owner serves a queue; compare-and-set)
    session/<clientId>             ClientSession   (new: exactly-once writes, latest result per client)
    member/<raftAddr>              MemberInfo      (new: gRPC address of a member added at runtime)
    ctrl/<brokerName>              ControllerBrokerSet (controller mode: a broker set's ids, master, epochs)
    shard/<brokerName>             ShardSet        (sharding: group 0's directory; a moving set's fence)

Topic, namespace and setting names never contain '/' (validation refuses it), so the first '/' after a
prefix ends the name; addresses and KV keys are the rest of the key verbatim (a KV key may contain
anything).

A broker name is any non-empty text, as with the stock NameServer (RocketMQ checks none), so it is
escaped where it goes into a key (broker/, topic/, ctrl/, shard/): '/' is written "~2F" and '~' is
written "~7E"; every other character, space and unicode letter included, is itself. The names allowed before
(letters, digits, '%', '|', '_', '.', '-') contain neither, so their keys are byte for byte what they
were, and every key of an older snapshot or log keeps its meaning. A key part with any other '~'
sequence, or with a '/', is no broker name (its parser answers None). The escape is
nameserver/logformat/keynames.py (shared with the client's route cache); a watcher
of one broker's keys subscribes to the escaped name (broker_key() gives it).
Watchers subscribe by key prefix, so the prefixes are part of the public contract. The prefixes and types
are declared once, in the record registry (nameserver/logformat/records.py); this module builds and parses
the keys.
"""

from __future__ import annotations

from collections.abc import Callable

from nameserver.logformat import keynames, records
from nameserver.pb import state_pb2

# Prefixes and types by name, as the record registry declares them (nameserver/logformat/records.py).
BROKER_PREFIX, BROKER_TYPE = records.BROKER.prefix, records.BROKER.rtype
LIVE_PREFIX, LIVE_TYPE = records.LIVE.prefix, records.LIVE.rtype
TOPIC_PREFIX, TOPIC_TYPE = records.TOPIC.prefix, records.TOPIC.rtype
_TOPIC_CUT = len(TOPIC_PREFIX)
FILTER_PREFIX, FILTER_TYPE = records.FILTER.prefix, records.FILTER.rtype
KV_PREFIX, KV_TYPE = records.KV.prefix, records.KV.rtype
KV_NAMESPACE_PREFIX, KV_NAMESPACE_TYPE = records.KV_NAMESPACE.prefix, records.KV_NAMESPACE.rtype
SETTING_PREFIX, SETTING_TYPE = records.SETTING.prefix, records.SETTING.rtype
BIND_PREFIX, BIND_TYPE = records.BIND.prefix, records.BIND.rtype
SESSION_PREFIX, SESSION_TYPE = records.SESSION.prefix, records.SESSION.rtype
MEMBER_PREFIX, MEMBER_TYPE = records.MEMBER.prefix, records.MEMBER.rtype
CONTROLLER_PREFIX, CONTROLLER_TYPE = records.CONTROLLER.prefix, records.CONTROLLER.rtype
SHARD_PREFIX, SHARD_TYPE = records.SHARD.prefix, records.SHARD.rtype

# Record type per prefix (a key's type is implied by its prefix; records carry both).
PREFIX_TYPES: dict[str, int] = {kind.prefix: kind.rtype for kind in records.KINDS}


def _name(what: str, value: str) -> str:
    # A '/' inside a name would make the key ambiguous; validation rejects it earlier, this is a guard.
    if not value or "/" in value:
        raise ValueError(f"{what} must be non-empty and contain no '/': {value!r}")
    return value


def _broker(value: str) -> str:
    """A broker name as its key part (escaped: see the module's docstring)."""
    if not value:
        raise ValueError("broker name must be non-empty")
    return keynames.escape(value)


def _nonempty(what: str, value: str) -> str:
    if not value:
        raise ValueError(f"{what} must be non-empty")
    return value


# ---- builders ------------------------------------------------------------------------------------

def broker_key(broker_name: str) -> str:
    return BROKER_PREFIX + _broker(broker_name)


def live_key(broker_addr: str) -> str:
    return LIVE_PREFIX + _nonempty("broker address", broker_addr)


def topic_key(topic: str, broker_name: str) -> str:
    return f"{TOPIC_PREFIX}{_name('topic', topic)}/{_broker(broker_name)}"


def topic_keys_of(broker_name: str) -> Callable[[str], str]:
    """topic_key(topic, broker_name) for one broker's topics: its name escaped once."""
    tail = "/" + _broker(broker_name)
    return lambda topic: TOPIC_PREFIX + _name("topic", topic) + tail


def topic_prefix(topic: str) -> str:
    """Prefix of every queue-data key of one topic (for watchers)."""
    return f"{TOPIC_PREFIX}{_name('topic', topic)}/"


def filter_key(broker_addr: str) -> str:
    return FILTER_PREFIX + _nonempty("broker address", broker_addr)


def kv_key(namespace: str, key: str) -> str:
    return f"{KV_PREFIX}{_name('namespace', namespace)}/{_nonempty('key', key)}"


def kv_prefix(namespace: str) -> str:
    """Prefix of every key of one KV namespace (for watchers)."""
    return f"{KV_PREFIX}{_name('namespace', namespace)}/"


def kv_namespace_key(namespace: str) -> str:
    return KV_NAMESPACE_PREFIX + _name("namespace", namespace)


def setting_key(name: str) -> str:
    return SETTING_PREFIX + _name("setting", name)


def bind_key(topic: str, queue_id: int) -> str:
    return f"{BIND_PREFIX}{_name('topic', topic)}/{int(queue_id)}"


def bind_prefix(topic: str) -> str:
    """Prefix of every binding of one topic (for watchers and listing)."""
    return f"{BIND_PREFIX}{_name('topic', topic)}/"


def session_key(client_id: str) -> str:
    return SESSION_PREFIX + _nonempty("client id", client_id)


def member_key(raft_addr: str) -> str:
    return MEMBER_PREFIX + _nonempty("member", raft_addr)


def controller_key(broker_name: str) -> str:
    return CONTROLLER_PREFIX + _broker(broker_name)


def shard_key(broker_name: str) -> str:
    return SHARD_PREFIX + _broker(broker_name)


# ---- parsers (None when the key is not of that kind or malformed) ---------------------------------

def _tail(key: str, prefix: str) -> str | None:
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix):]
    return rest or None


def broker_of_part(part: str) -> str | None:
    """The broker name a key part stands for (None: not one broker_key/topic_key writes)."""
    return keynames.unescape(part) if part else None


def parse_broker_key(key: str) -> str | None:
    rest = _tail(key, BROKER_PREFIX)
    return None if rest is None else broker_of_part(rest)


def parse_controller_key(key: str) -> str | None:
    rest = _tail(key, CONTROLLER_PREFIX)
    return None if rest is None else broker_of_part(rest)


def parse_shard_key(key: str) -> str | None:
    rest = _tail(key, SHARD_PREFIX)
    return None if rest is None else broker_of_part(rest)


def parse_live_key(key: str) -> str | None:
    return _tail(key, LIVE_PREFIX)


def parse_filter_key(key: str) -> str | None:
    return _tail(key, FILTER_PREFIX)


def parse_topic_key(key: str) -> tuple[str, str] | None:
    """(topic, broker name). _tail and broker_of_part inlined: every changed topic record of every replica
    parses its key."""
    if not key.startswith(TOPIC_PREFIX):
        return None
    topic, sep, part = key[_TOPIC_CUT:].partition("/")
    broker = part if "/" not in part and keynames.ESCAPE not in part else keynames.unescape(part)
    if not sep or not topic or not broker:
        return None
    return topic, broker


def parse_kv_namespace_key(key: str) -> str | None:
    rest = _tail(key, KV_NAMESPACE_PREFIX)
    return rest if rest and "/" not in rest else None


def parse_setting_key(key: str) -> str | None:
    rest = _tail(key, SETTING_PREFIX)
    return rest if rest and "/" not in rest else None


def parse_kv_key(key: str) -> tuple[str, str] | None:
    """(namespace, key); the key part may itself contain '/'."""
    rest = _tail(key, KV_PREFIX)
    if rest is None:
        return None
    namespace, sep, kv = rest.partition("/")
    if not sep or not namespace or not kv:
        return None
    return namespace, kv


def record_type_of(key: str) -> int:
    """The record type a key's prefix implies (RECORD_TYPE_UNSPECIFIED = 0 when unknown)."""
    kind = records.kind_of(key)
    return state_pb2.RECORD_TYPE_UNSPECIFIED if kind is None else kind.rtype


def parse_bind_key(key: str) -> tuple[str, int] | None:
    """(topic, queue id)."""
    rest = _tail(key, BIND_PREFIX)
    if rest is None:
        return None
    topic, sep, qid = rest.partition("/")
    if not sep or not topic or not qid.isdigit():
        return None
    return topic, int(qid)


def parse_session_key(key: str) -> str | None:
    return _tail(key, SESSION_PREFIX)
