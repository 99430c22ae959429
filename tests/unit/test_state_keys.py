"""Key layout: builders, parsers and record types."""

import pytest

from nameserver.pb import state_pb2
from nameserver.state import keys


def test_builders_and_parsers_round_trip() -> None:
    assert keys.broker_key("broker-a") == "broker/broker-a"
    assert keys.parse_broker_key("broker/broker-a") == "broker-a"
    assert keys.live_key("[::1]:10911") == "live/[::1]:10911"
    assert keys.parse_live_key("live/[::1]:10911") == "[::1]:10911"
    assert keys.filter_key("10.0.0.1:10911") == "filter/10.0.0.1:10911"
    assert keys.parse_filter_key("filter/10.0.0.1:10911") == "10.0.0.1:10911"
    assert keys.topic_key("%RETRY%g1", "broker-a.1") == "topic/%RETRY%g1/broker-a.1"
    assert keys.parse_topic_key("topic/%RETRY%g1/broker-a.1") == ("%RETRY%g1", "broker-a.1")
    assert keys.topic_prefix("T") == "topic/T/"


def test_kv_key_may_contain_slashes() -> None:
    key = keys.kv_key("ORDER_TOPIC_CONFIG", "a/b//c")
    assert key == "kv/ORDER_TOPIC_CONFIG/a/b//c"
    assert keys.parse_kv_key(key) == ("ORDER_TOPIC_CONFIG", "a/b//c")
    assert keys.kv_prefix("ns") == "kv/ns/"


@pytest.mark.parametrize("key", ["topic/T", "topic//b", "topic/T/", "topic/T/b/c", "broker/x", "kv/ns"])
def test_malformed_topic_keys_do_not_parse(key: str) -> None:
    assert keys.parse_topic_key(key) is None


def test_other_parsers_reject_foreign_or_malformed_keys() -> None:
    assert keys.parse_broker_key("broker/") is None
    assert keys.parse_broker_key("broker/a/b") is None
    assert keys.parse_broker_key("live/a") is None
    assert keys.parse_live_key("live/") is None
    assert keys.parse_kv_key("kv/ns/") is None
    assert keys.parse_kv_key("kv//k") is None


@pytest.mark.parametrize("build", [
    lambda: keys.broker_key(""),
    lambda: keys.controller_key(""),
    lambda: keys.topic_key("T/x", "b"),
    lambda: keys.topic_key("T", ""),
    lambda: keys.kv_key("a/b", "k"),
    lambda: keys.kv_key("ns", ""),
    lambda: keys.live_key(""),
])
def test_builders_refuse_ambiguous_components(build) -> None:
    with pytest.raises(ValueError):
        build()


# Every name the former rule allowed: its keys are byte for byte what they were (old snapshots and logs).
OLD_NAMES = ["broker-a", "broker_a.1", "Default%Cluster|x", "%RETRY%", "a" * 127, "0", "-", ".", "|"]
# Names the stock NameServer takes that the former rule did not.
NEW_NAMES = ["a/b", "a b", "broker@host", "brökér", "ブローカー", "~", "~2F", "~7E", "a~b", "/", "//", "a/", "/a",
             "x:1", "%2F", "tab\tx", "\x00", "~/~"]


@pytest.mark.parametrize("name", OLD_NAMES)
def test_names_of_the_former_rule_keep_their_keys(name: str) -> None:
    assert keys.broker_key(name).encode() == b"broker/" + name.encode()
    assert keys.topic_key("T", name).encode() == b"topic/T/" + name.encode()
    assert keys.controller_key(name).encode() == b"ctrl/" + name.encode()
    assert keys.parse_broker_key("broker/" + name) == name
    assert keys.parse_topic_key("topic/T/" + name) == ("T", name)
    assert keys.parse_controller_key("ctrl/" + name) == name


@pytest.mark.parametrize("name", OLD_NAMES + NEW_NAMES)
def test_any_broker_name_round_trips_through_its_keys(name: str) -> None:
    assert keys.parse_broker_key(keys.broker_key(name)) == name
    assert keys.parse_controller_key(keys.controller_key(name)) == name
    assert keys.parse_topic_key(keys.topic_key("%RETRY%g", name)) == ("%RETRY%g", name)
    key = keys.topic_key("T", name)
    # in its topic's prefix scan and no other's; one '/' after the prefix, so the record kind is still topic/
    assert key.startswith(keys.topic_prefix("T")) and key.count("/") == 2
    assert keys.record_type_of(keys.broker_key(name)) == state_pb2.BROKER


def test_distinct_names_never_share_a_key() -> None:
    names = OLD_NAMES + NEW_NAMES
    assert len({keys.broker_key(n) for n in names}) == len(names)
    assert len({keys.topic_key("T", n) for n in names}) == len(names)
    # a '/' in the name does not move the topic/broker boundary: ("a", "b/c") is no ("a/b", "c")
    assert keys.topic_key("a", "b/c") == "topic/a/b~2Fc" != "topic/a/b/c"
    assert keys.parse_topic_key("topic/a/b/c") is None
    assert keys.broker_key("a/b") != keys.broker_key("a~2Fb") != keys.broker_key("a~7E2Fb")


@pytest.mark.parametrize("part", ["a~", "a~2", "a~2f", "~7e", "~41", "~~", "a/b"])
def test_a_key_part_escape_never_writes_is_no_name(part: str) -> None:
    assert keys.parse_broker_key("broker/" + part) is None
    assert keys.parse_topic_key("topic/T/" + part) is None
    assert keys.parse_controller_key("ctrl/" + part) is None


def test_record_type_per_prefix() -> None:
    assert keys.record_type_of("broker/a") == state_pb2.BROKER
    assert keys.record_type_of("live/a:1") == state_pb2.BROKER_LIVE
    assert keys.record_type_of("topic/T/a") == state_pb2.TOPIC_QUEUE
    assert keys.record_type_of("filter/a:1") == state_pb2.FILTER_SERVER
    assert keys.record_type_of("kv/ns/k") == state_pb2.KV_CONFIG
    assert keys.record_type_of("bind/T/0") == state_pb2.QUEUE_BINDING
    assert keys.record_type_of("session/c1") == state_pb2.CLIENT_SESSION
    assert keys.record_type_of("other/x") == state_pb2.RECORD_TYPE_UNSPECIFIED


def test_the_record_registry_declares_every_record_type_once() -> None:
    """One row per state.proto RecordType (prefix, value message, routes): keys, the state's dispatch, the log
    export and the pipeline all read it, so a type missing here is missing everywhere, loudly."""
    from nameserver.logformat import records

    declared = {v.number for v in state_pb2.RecordType.DESCRIPTOR.values} - {state_pb2.RECORD_TYPE_UNSPECIFIED}
    assert sorted(kind.rtype for kind in records.KINDS) == sorted(declared)
    prefixes = [kind.prefix for kind in records.KINDS]
    assert len(set(prefixes)) == len(prefixes) and all(p.count("/") == 1 and p.endswith("/") for p in prefixes)
    assert all(kind.value.DESCRIPTOR.file is state_pb2.DESCRIPTOR for kind in records.KINDS)
    for kind in records.KINDS:
        assert keys.record_type_of(kind.prefix + "a/b") == kind.rtype and records.kind_of(kind.prefix) is kind
        assert records.VALUE_MESSAGES[kind.rtype] is kind.value and keys.PREFIX_TYPES[kind.prefix] == kind.rtype
    # shard/: the directory names the group a set's route records are read from (a sharded read)
    routes = {"topic/", "broker/", "filter/", "setting/", "kv/", "shard/"}
    assert {k.prefix for k in records.KINDS if k.routes} == routes


@pytest.mark.parametrize("topic", ["has space", "ü", "team@host c ü", "a:b", "~7E", "%RETRY%g+t"])
def test_any_topic_the_stock_nameserver_stores_round_trips_through_its_keys(topic: str) -> None:
    """Topics are stored as sent (validation refuses only '/', control characters and oversize): the part
    before the broker's is the topic verbatim, and the prefix a watcher of the topic uses matches it."""
    key = keys.topic_key(topic, "b c/d")
    assert keys.parse_topic_key(key) == (topic, "b c/d")
    assert key.startswith(keys.topic_prefix(topic))
    assert keys.parse_bind_key(keys.bind_key(topic, 3)) == (topic, 3)
