"""Validation: every refusal names its field; size bounds raise TooLargeError."""

from collections.abc import Callable

import pytest

from nameserver import validation as v
from nameserver.pb import api_pb2, state_pb2


def good_registration(topics: int = 3) -> api_pb2.RegisterBrokerRequest:
    req = api_pb2.RegisterBrokerRequest(cluster_name="DefaultCluster", broker_name="broker-a",
                                        broker_addr="10.0.0.1:10911", broker_id=0,
                                        ha_server_addr="10.0.0.1:10912", filter_servers=["10.0.0.1:30000"])
    for i in range(topics):
        req.topics.add(topic_name=f"T{i}", read_queue_nums=4, write_queue_nums=4, perm=6)
    return req


def field_of(check: Callable[[], None]) -> str:
    with pytest.raises(v.ValidationError) as err:
        check()
    assert err.value.message and err.value.field in str(err.value)
    return err.value.field


@pytest.mark.parametrize("topic", ["TopicTest", "%RETRY%group-1", "%DLQ%g", "rmq_sys_TRACE|x", "a" * 127, "TBW102",
                                   # what real brokers register: a host-named broker's own topic, a
                                   # retry topic of a 255-character group, a 5.x POP retry topic
                                   "host-1.example.com", "%RETRY%" + "g" * 255, "%RETRY%group+TopicA",
                                   # what the stock NameServer stores too: a broker registers a topic named
                                   # after itself, whatever its name
                                   "has space", "ü", "a:b", "team@host c ü", "~7E", "ü" * 150])
def test_valid_topics(topic: str) -> None:
    v.check_topic("topic", topic)


@pytest.mark.parametrize("topic", ["", "a" * 301, "ü" * 151, "a/b", "tab\t", "nul\x00", "del\x7f", "\ud800"])
def test_invalid_topics(topic: str) -> None:
    assert field_of(lambda: v.check_topic("topic", topic)) == "topic"


# The stock NameServer checks no name: any text a broker can send is taken, within the key size bound.
@pytest.mark.parametrize("name", ["broker-a", "broker_a.1", "Default%Cluster|x", "b" * 127, "b" * v.MAX_NAME_BYTES,
                                  "a/b", "a b", "a:b", "broker@host", "brökér", "ブローカー", "~", "tab\there",
                                  "/" * (v.MAX_NAME_BYTES // 3)])
def test_valid_names(name: str) -> None:
    v.check_name("broker_name", name)


@pytest.mark.parametrize("name", ["", "b" * (v.MAX_NAME_BYTES + 1), "é" * (v.MAX_NAME_BYTES // 2 + 1),
                                  "/" * (v.MAX_NAME_BYTES // 3 + 1), "a\ud800"])
def test_invalid_names(name: str) -> None:
    assert field_of(lambda: v.check_name("broker_name", name)) == "broker_name"


def test_a_name_of_the_longest_size_fits_a_key_with_the_longest_topic() -> None:
    from nameserver.state import keys
    key = keys.topic_key("T" * v.MAX_TOPIC_NAME_LEN, "/" * (v.MAX_NAME_BYTES // 3) + "b" * (v.MAX_NAME_BYTES % 3))
    assert len(key.encode()) == v.MAX_STATE_KEY_BYTES


@pytest.mark.parametrize("addr", ["10.0.0.1:10911", "localhost:9876", "broker-a.svc.cluster.local:1",
                                  "[::1]:10911", "[fe80::1%eth0]:1", "rmq_broker:65535",
                                  # brokerIP1=fe80::1 (or ::1): the broker sends host:port unbracketed
                                  "fe80::1:10911", "::1:10911", "fe80::1%eth0:10911", "2001:db8::10:1"])
def test_valid_addresses(addr: str) -> None:
    v.check_addr("broker_addr", addr)


@pytest.mark.parametrize("addr", ["", "10.0.0.1", "10.0.0.1:", ":10911", "10.0.0.1:0", "10.0.0.1:65536",
                                  "10.0.0.256:1", "[::1]10911", "[zz::1]:1", "[::1:1", "zz::1:10911",
                                  "fe80::1:", "fe80::1:65536", "::1", "fe80::1%" + "e" * 65 + ":1",
                                  "-bad-.host:1", "a..b:1", "host:+80", "h:123456", "a b:1"])
def test_invalid_addresses(addr: str) -> None:
    assert field_of(lambda: v.check_addr("broker_addr", addr)) == "broker_addr"


@pytest.mark.parametrize("addr", ["fe80::1:9201", "::1:9101"])
def test_a_node_address_takes_ipv6_only_in_brackets(addr: str) -> None:
    # a node's own addresses are dialled by gRPC and the Raft transport, which need the brackets
    v.check_addr("broker_addr", addr)
    assert field_of(lambda: v.check_node_addr("node_id", addr)) == "node_id"
    v.check_node_addr("node_id", "[" + addr.rpartition(":")[0] + "]:1")
    v.check_node_addr("node_id", "10.0.0.1:9201")


@pytest.mark.parametrize("check", [
    lambda name: v.validate_controller_set(api_pb2.BrokerSetRequest(cluster_name=name, broker_name=name)),
    lambda name: v.validate_elect_master(api_pb2.ElectMasterRequest(cluster_name=name, broker_name=name, broker_id=-1)),
    lambda name: v.validate_controller_register(api_pb2.ControllerRegisterRequest(
        cluster_name=name, broker_name=name, broker_id=1, broker_address="fe80::1:10911")),
    lambda name: v.validate_broker_perm(api_pb2.BrokerPermRequest(broker_name=name)),
    lambda name: v.validate_get_broker_member_group(api_pb2.GetBrokerMemberGroupRequest(
        cluster_name=name, broker_name=name)),
    lambda name: v.validate_get_topic_list(api_pb2.GetTopicListRequest(kind=api_pb2.TOPIC_LIST_BY_CLUSTER,
                                                                       cluster_name=name)),
])
def test_admin_and_controller_calls_take_the_names_registration_takes(check) -> None:
    check("team@host/a b ü")  # one rule for a name everywhere: a broker that registers can be named again


def test_good_registration_passes() -> None:
    v.validate_register_broker(good_registration())
    req = good_registration()
    req.heartbeat_timeout_ms = 1000
    req.zone_name = "zone-1"
    v.validate_register_broker(req)


def test_registration_takes_any_name_the_stock_nameserver_takes() -> None:
    req = good_registration()
    req.cluster_name, req.broker_name, req.zone_name = "cluster one", "broker@host/ä", "zone:1 ü"
    req.broker_addr = "fe80::1:10911"
    v.validate_register_broker(req)


@pytest.mark.parametrize(("asked", "stored"), [(0, 0), (1000, 1000), (3_600_000, 3_600_000), (999, 1000),
                                               (500, 1000), (-5, 1000), (3_600_001, 3_600_000)])
def test_heartbeat_timeout_is_clamped_never_refused(asked: int, stored: int) -> None:
    req = good_registration()
    req.heartbeat_timeout_ms = asked
    warning = v.clamp_heartbeat_timeout(req)
    assert req.heartbeat_timeout_ms == stored
    assert (warning is None) == (asked == stored)
    if warning is not None:
        assert "heartbeatTimeoutMillis" in warning and str(asked) in warning and str(stored) in warning
    v.validate_register_broker(req)


def _mutated(mutate: Callable[[api_pb2.RegisterBrokerRequest], None]) -> api_pb2.RegisterBrokerRequest:
    req = good_registration()
    mutate(req)
    return req


REGISTRATION_ERRORS = [
    (lambda r: setattr(r, "cluster_name", ""), "cluster_name"),
    (lambda r: setattr(r, "broker_name", "b" * (v.MAX_NAME_BYTES + 1)), "broker_name"),
    (lambda r: setattr(r, "broker_addr", "nope"), "broker_addr"),
    (lambda r: setattr(r, "broker_id", -1), "broker_id"),
    (lambda r: setattr(r, "ha_server_addr", "x:0"), "ha_server_addr"),
    (lambda r: setattr(r, "zone_name", "z" * (v.MAX_NAME_BYTES + 1)), "zone_name"),
    (lambda r: setattr(r.data_version, "counter", -1), "data_version.counter"),
    (lambda r: setattr(r.data_version, "timestamp", -5), "data_version.timestamp"),
    (lambda r: r.filter_servers.append("bad"), "filter_servers[1]"),
    (lambda r: setattr(r.topics[2], "topic_name", "bad/topic"), "topics[2].topic_name"),
    (lambda r: setattr(r.topics[1], "read_queue_nums", -1), "topics[1].read_queue_nums"),
    (lambda r: setattr(r.topics[1], "write_queue_nums", 65536), "topics[1].write_queue_nums"),
    (lambda r: setattr(r.topics[0], "perm", 8), "topics[0].perm"),
    (lambda r: setattr(r.topics[0], "topic_sys_flag", -1), "topics[0].topic_sys_flag"),
    (lambda r: setattr(r.topics[2], "topic_name", "T0"), "topics[2].topic_name"),
]


@pytest.mark.parametrize(("mutate", "field"), REGISTRATION_ERRORS)
def test_registration_errors_name_their_field(mutate, field: str) -> None:
    req = _mutated(mutate)
    assert field_of(lambda: v.validate_register_broker(req)) == field


def test_values_that_passed_before_are_still_checked_where_anything_else_differs() -> None:
    """Names, addresses and topics that passed are remembered (a broker registers the same ones again and
    again): a request that reuses them with anything else wrong is refused as ever, naming the field."""
    v.validate_register_broker(good_registration())  # its names, addresses and topics T0..T2 passed
    for mutate, field in REGISTRATION_ERRORS:
        req = _mutated(mutate)
        assert field_of(lambda: v.validate_register_broker(req)) == field  # noqa: B023 (called at once)
    mapped = good_registration()
    mapped.topics[1].mapping.epoch = -1  # a topic that passed, with a mapping: the mapping is checked
    assert field_of(lambda: v.validate_register_broker(mapped)) == "topics[1].mapping.epoch"
    for addr in ("10.0.0.1:0", "10.0.0.1", "10.0.0.256:10911"):  # near what passed: refused, with the field
        assert field_of(lambda: v.check_addr("ha_server_addr", addr)) == "ha_server_addr"  # noqa: B023
    assert field_of(lambda: v.check_name("zone_name", "", "zone name")) == "zone_name"
    assert field_of(lambda: v.check_topic("topic", "T0/x")) == "topic"


def test_values_kept_as_passed_are_bounded() -> None:
    kept = v._Passed(2)
    for value in ("a", "b", "c"):
        kept.add(value)
    assert kept.values == {"c"}  # past the bound it starts again
    for value in (f"T{i}" for i in range(3 * v._TOPICS_PASSED.limit)):
        v.check_topic("topic", value)
    assert len(v._TOPICS_PASSED.values) <= v._TOPICS_PASSED.limit


def test_duplicate_topic_message_points_at_the_first() -> None:
    req = _mutated(lambda r: setattr(r.topics[2], "topic_name", "T0"))
    with pytest.raises(v.ValidationError) as err:
        v.validate_register_broker(req)
    assert "topics[0]" in err.value.message and not isinstance(err.value, v.TooLargeError)


def test_too_many_topics_is_too_large() -> None:
    req = good_registration(topics=11)
    with pytest.raises(v.TooLargeError) as err:
        v.validate_register_broker(req, max_topics=10)
    assert err.value.field == "topics"
    v.validate_register_broker(req, max_topics=11)
    assert v.MAX_TOPICS_PER_REGISTRATION >= 70_000


def test_too_many_topics_in_a_streamed_iterable() -> None:
    def stream():
        for i in range(5):
            yield api_pb2.TopicConfig(topic_name=f"T{i}", perm=6)
    with pytest.raises(v.TooLargeError):
        v.check_topic_configs(stream(), max_topics=4)
    v.check_topic_configs(stream(), max_topics=5)


def test_too_many_filter_servers() -> None:
    req = good_registration()
    req.filter_servers.extend(["10.0.0.1:1"] * v.MAX_FILTER_SERVERS)
    with pytest.raises(v.TooLargeError) as err:
        v.validate_register_broker(req)
    assert err.value.field == "filter_servers"


def test_kv_rules() -> None:
    v.validate_put_kv(api_pb2.PutKvRequest(namespace="ORDER_TOPIC_CONFIG", key="a/b", value=""))
    assert field_of(lambda: v.validate_put_kv(api_pb2.PutKvRequest(namespace="", key="k"))) == "namespace"
    assert field_of(lambda: v.validate_put_kv(api_pb2.PutKvRequest(namespace="a/b", key="k"))) == "namespace"
    assert field_of(lambda: v.validate_put_kv(api_pb2.PutKvRequest(namespace="n" * 256, key="k"))) == "namespace"
    assert field_of(lambda: v.validate_put_kv(api_pb2.PutKvRequest(namespace="ns", key=""))) == "key"
    assert field_of(lambda: v.validate_get_kv(api_pb2.GetKvRequest(namespace="ns"))) == "key"
    assert field_of(lambda: v.validate_delete_kv(api_pb2.DeleteKvRequest(namespace="ns"))) == "key"
    assert field_of(lambda: v.validate_list_kv(api_pb2.ListKvRequest(namespace=""))) == "namespace"
    assert field_of(lambda: v.validate_list_kv(api_pb2.ListKvRequest(namespace="ns", min_offset=-1))) == "min_offset"
    with pytest.raises(v.TooLargeError) as err:
        v.validate_put_kv(api_pb2.PutKvRequest(namespace="ns", key="k", value="x" * (v.MAX_KV_VALUE_BYTES + 1)))
    assert err.value.field == "value"
    v.validate_put_kv(api_pb2.PutKvRequest(namespace="ns", key="k", value="x" * v.MAX_KV_VALUE_BYTES))
    with pytest.raises(v.TooLargeError) as err:
        v.validate_put_kv(api_pb2.PutKvRequest(namespace="ns", key="k" * (v.MAX_KV_KEY_BYTES + 1)))
    assert err.value.field == "key"


def test_other_requests() -> None:
    v.validate_unregister_broker(api_pb2.UnregisterBrokerRequest(
        cluster_name="c", broker_name="b", broker_addr="h:1", broker_id=1))
    assert field_of(lambda: v.validate_unregister_broker(api_pb2.UnregisterBrokerRequest(
        cluster_name="c", broker_name="b", broker_addr="h"))) == "broker_addr"
    assert field_of(lambda: v.validate_unregister_broker(api_pb2.UnregisterBrokerRequest(
        cluster_name="c", broker_name="b", broker_addr="h:1", broker_id=-2))) == "broker_id"

    hb = api_pb2.HeartbeatRequest()
    hb.heartbeats.add(broker_addr="h:1")
    hb.heartbeats.add(cluster_name="c", broker_name="b", broker_addr="h:0")
    assert field_of(lambda: v.validate_heartbeat(hb)) == "heartbeats[1].broker_addr"
    sync = api_pb2.HeartbeatRequest(handover=api_pb2.BrokerSilences(broker_addrs=["h:1", "h"], silent_ms=[1, 2]))
    assert field_of(lambda: v.validate_heartbeat(sync)) == "handover.broker_addrs[1]"  # a peer's liveness table
    sync.handover.silent_ms.pop()
    sync.handover.broker_addrs[1] = "h:2"
    assert field_of(lambda: v.validate_heartbeat(sync)) == "handover.silent_ms"

    v.validate_get_route(api_pb2.GetRouteRequest(topic="T", zone_name="z"))
    assert field_of(lambda: v.validate_get_route(api_pb2.GetRouteRequest(topic=""))) == "topic"
    assert field_of(lambda: v.validate_get_route(api_pb2.GetRouteRequest(topic="T", min_offset=-1))) == "min_offset"
    assert field_of(lambda: v.validate_get_cluster_info(api_pb2.GetClusterInfoRequest(min_offset=-1))) == "min_offset"

    v.validate_get_topic_list(api_pb2.GetTopicListRequest(kind=api_pb2.TOPIC_LIST_SYSTEM))
    assert field_of(lambda: v.validate_get_topic_list(
        api_pb2.GetTopicListRequest(kind=api_pb2.TOPIC_LIST_BY_CLUSTER))) == "cluster_name"
    assert field_of(lambda: v.validate_get_topic_list(api_pb2.GetTopicListRequest(kind=42))) == "kind"

    assert field_of(lambda: v.validate_get_broker_member_group(
        api_pb2.GetBrokerMemberGroupRequest(cluster_name="c"))) == "broker_name"
    assert field_of(lambda: v.validate_broker_perm(api_pb2.BrokerPermRequest())) == "broker_name"
    assert field_of(lambda: v.validate_delete_topic(api_pb2.DeleteTopicRequest(topic="a/b"))) == "topic"
    v.validate_delete_topic(api_pb2.DeleteTopicRequest(topic="T", cluster_name="c/1 ü"))  # any name, as stock
    assert field_of(lambda: v.validate_delete_topic(
        api_pb2.DeleteTopicRequest(topic="T", cluster_name="c" * (v.MAX_NAME_BYTES + 1)))) == "cluster_name"


def test_register_topic_request() -> None:
    def req(*qds: state_pb2.QueueData) -> api_pb2.RegisterTopicRequest:
        return api_pb2.RegisterTopicRequest(topic="T", queue_datas=list(qds))

    ok = state_pb2.QueueData(broker_name="a", read_queue_nums=4, write_queue_nums=4, perm=6)
    v.validate_register_topic(req(ok))
    v.validate_register_topic(req())  # empty: a no-op, as in RocketMQ
    bad_perm = state_pb2.QueueData(broker_name="b", perm=9)
    assert field_of(lambda: v.validate_register_topic(req(ok, bad_perm))) == "queue_datas[1].perm"
    assert field_of(lambda: v.validate_register_topic(req(ok, ok))) == "queue_datas[1].broker_name"
    no_name = state_pb2.QueueData(perm=6)
    assert field_of(lambda: v.validate_register_topic(req(no_name))) == "queue_datas[0].broker_name"


def test_error_hierarchy() -> None:
    err = v.TooLargeError("topics", "too many")
    assert isinstance(err, v.ValidationError)
    assert (err.field, err.message, str(err)) == ("topics", "too many", "topics: too many")


def test_value_first_shorthands() -> None:
    v.validate_topic_name("T")
    v.validate_name("broker-a", "broker_name")
    assert field_of(lambda: v.validate_topic_name("a/b", "topic")) == "topic"
    assert field_of(lambda: v.validate_name("", "cluster_name")) == "cluster_name"
    with pytest.raises(v.ValidationError, match="cluster name must not be empty"):
        v.validate_name("", "cluster_name")
    assert field_of(lambda: v.check_kv("a/b")) == "namespace"
    assert field_of(lambda: v.check_kv("ns", "")) == "key"
