"""Translation of requests into records: RocketMQ semantics as diffs against the state."""

import pytest

from nameserver.pb import api_pb2, state_pb2
from nameserver.state import (
    ORDER_TOPIC_CONFIG,
    MetadataState,
    Translation,
    add_write_perm,
    delete_kv,
    delete_topic,
    expire_broker,
    put_kv,
    register_broker,
    register_topic,
    settings,
    unregister_broker,
    update_settings,
    wipe_write_perm,
)
from nameserver.validation import ValidationError
from raftlog.pb import entry_pb2

TIMEOUT = 120_000
M, S = "10.0.0.1:10911", "10.0.0.2:10911"


def apply(state: MetadataState, tr: Translation) -> entry_pb2.BatchResult:
    return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0]


def reg(name: str = "broker-a", addr: str = M, bid: int = 0, counter: int = 1, cluster: str = "c1",
        topics: dict[str, int] | None = None, ha: str = "", acting: bool | None = None, state_version: int = 0,
        filters: tuple[str, ...] = ()) -> api_pb2.RegisterBrokerRequest:
    """A registration; topics maps topic name -> perm (4 queues each)."""
    req = api_pb2.RegisterBrokerRequest(cluster_name=cluster, broker_name=name, broker_addr=addr,
                                        broker_id=bid, ha_server_addr=ha, enable_acting_master=acting,
                                        filter_servers=list(filters))
    req.data_version.counter = counter
    req.data_version.timestamp = 1_700_000_000_000
    req.data_version.state_version = state_version
    for topic, perm in (topics or {"TopicA": 6, "TopicB": 6}).items():
        req.topics.add(topic_name=topic, read_queue_nums=4, write_queue_nums=4, perm=perm)
    return req


def register(state: MetadataState, req: api_pb2.RegisterBrokerRequest) -> Translation:
    tr = register_broker(state, req, TIMEOUT)
    assert apply(state, tr).applied
    return tr


def record_keys(tr: Translation) -> list[tuple[str, str]]:
    return [(entry_pb2.Op.Name(r.op), r.key) for r in tr.batch.records]


def addrs_of(state: MetadataState, name: str) -> list[tuple[int, str]]:
    bd = state.broker_data(name)
    return [(a.broker_id, a.addr) for a in bd.addrs] if bd else []


def test_first_master_registration_writes_everything() -> None:
    state = MetadataState()
    tr = register_broker(state, reg(ha="10.0.0.1:10912", filters=("f2:1", "f1:1", "f1:1")), TIMEOUT)
    assert record_keys(tr) == [
        ("OP_PUT", "broker/broker-a"), ("OP_PUT", f"live/{M}"), ("OP_PUT", f"filter/{M}"),
        ("OP_PUT", "topic/TopicA/broker-a"), ("OP_PUT", "topic/TopicB/broker-a")]
    # read-modify-write keys are guarded at the versions read (0: must still be absent)
    assert {(p.key, p.version) for p in tr.batch.preconditions} == {(f"live/{M}", 0), ("broker/broker-a", 0)}
    assert tr.batch.request_id == ""
    assert tr.master_addr == "" and tr.ha_server_addr == ""
    assert apply(state, tr).applied
    live = state.broker_live(M)
    assert (live.broker_name, live.cluster, live.heartbeat_timeout_ms, live.data_version.counter) == (
        "broker-a", "c1", TIMEOUT, 1)
    assert state.filter_servers(M) == ["f1:1", "f2:1"]  # sorted, deduplicated: canonical bytes
    route = state.route("TopicA")
    assert [(q.broker_name, q.perm, q.read_queue_nums) for q in route.queue_datas] == [("broker-a", 6, 4)]


def test_explicit_heartbeat_timeout_is_kept() -> None:
    state = MetadataState()
    req = reg()
    req.heartbeat_timeout_ms = 30_000
    register(state, req)
    assert state.broker_live(M).heartbeat_timeout_ms == 30_000


def test_unchanged_data_version_gives_zero_records() -> None:
    state = MetadataState()
    register(state, reg())
    again = register_broker(state, reg(), TIMEOUT)
    assert again.records == 0 and again.empty
    assert len(again.batch.preconditions) == 0  # nothing to propose
    # even with a different topic table: the DataVersion says nothing changed, so topics are not read
    assert register_broker(state, reg(topics={"TopicA": 2, "TopicB": 6}), TIMEOUT).records == 0


def test_changed_data_version_writes_only_what_changed() -> None:
    state = MetadataState()
    register(state, reg())
    tr = register_broker(state, reg(counter=2, topics={"TopicA": 6, "TopicB": 4, "TopicC": 6}), TIMEOUT)
    assert record_keys(tr) == [
        ("OP_PUT", f"live/{M}"), ("OP_PUT", "topic/TopicB/broker-a"), ("OP_PUT", "topic/TopicC/broker-a")]
    assert apply(state, tr).applied
    assert state.queue_data("TopicB", "broker-a").perm == 4
    assert state.broker_topics("broker-a") == ["TopicA", "TopicB", "TopicC"]


def test_unchanged_data_version_re_adds_a_missing_topic() -> None:
    # RocketMQ isTopicConfigChanged: a topic this group has no queue data for is written again
    state = MetadataState()
    register(state, reg())
    assert apply(state, delete_topic(state, "TopicA")).applied
    tr = register_broker(state, reg(), TIMEOUT)
    assert record_keys(tr) == [("OP_PUT", "topic/TopicA/broker-a")]


def test_delete_missing_topics_option() -> None:
    state = MetadataState()
    register(state, reg(topics={"TopicA": 6, "TopicB": 6}))
    kept = register_broker(state, reg(counter=2, topics={"TopicA": 6}), TIMEOUT)
    assert record_keys(kept) == [("OP_PUT", f"live/{M}")]  # upstream default: keep
    apply(state, update_settings(state, {settings.DELETE_TOPIC_WITH_BROKER_REGISTRATION: "true"}))
    static = reg(counter=2, topics={"TopicA": 6})
    static.topics[0].mapping.total_queues = 4  # a broker with static topics keeps its topics (as upstream)
    assert ("OP_DELETE", "topic/TopicB/broker-a") not in record_keys(register_broker(state, static, TIMEOUT))
    tr = register_broker(state, reg(counter=2, topics={"TopicA": 6}), TIMEOUT)
    assert ("OP_DELETE", "topic/TopicB/broker-a") in record_keys(tr)
    assert apply(state, tr).applied
    assert not state.has_topic("TopicB")


def test_settings_are_records_with_defaults_and_change_registration_replies() -> None:
    state = MetadataState()
    apply(state, put_kv(state, ORDER_TOPIC_CONFIG, "TopicA", "broker-a:4"))
    assert register(state, reg()).order_topic_config == {"TopicA": "broker-a:4"}  # RocketMQ's default: true
    tr = update_settings(state, {settings.RETURN_ORDER_TOPIC_CONFIG_TO_BROKER: "false"})
    assert record_keys(tr) == [("OP_PUT", "setting/returnOrderTopicConfigToBroker")]
    apply(state, tr)
    assert update_settings(state, {settings.RETURN_ORDER_TOPIC_CONFIG_TO_BROKER: "false"}).empty
    assert register_broker(state, reg(counter=2), TIMEOUT).order_topic_config is None  # no body at all
    assert state.stored_settings() == {"returnOrderTopicConfigToBroker": "false"}
    eff = settings.effective(state.stored_settings(), {settings.ORDER_MESSAGE_ENABLE: True})
    assert eff[settings.ORDER_MESSAGE_ENABLE] and not eff[settings.RETURN_ORDER_TOPIC_CONFIG_TO_BROKER]
    assert eff[settings.ENABLE_TOPIC_LIST] and not eff[settings.SUPPORT_ACTING_MASTER]
    copy = MetadataState()
    copy.restore(state.offset, state.kv.items())
    assert copy.stored_settings() == state.stored_settings()
    with pytest.raises(ValidationError, match="node-local") as err:
        settings.canonical_values({"listenPort": "9876"})
    assert err.value.field == "settings" and "'listenPort'" in err.value.message
    with pytest.raises(ValidationError, match="true or false"):
        settings.canonical_values({settings.ENABLE_TOPIC_LIST: "yes"})
    assert settings.canonical_values({settings.ENABLE_TOPIC_LIST: " FALSE "}) == {"enableTopicList": "false"}


def test_master_and_slave() -> None:
    state = MetadataState()
    register(state, reg(ha="10.0.0.1:10912", topics={"TopicA": 6}))
    tr = register_broker(state, reg(addr=S, bid=1, topics={"TopicA": 6, "SlaveOnly": 6}), TIMEOUT)
    assert tr.master_addr == M and tr.ha_server_addr == "10.0.0.1:10912"
    # a slave never writes topic routes
    assert record_keys(tr) == [("OP_PUT", "broker/broker-a"), ("OP_PUT", f"live/{S}")]
    assert apply(state, tr).applied
    assert addrs_of(state, "broker-a") == [(0, M), (1, S)]
    assert not state.has_topic("SlaveOnly")
    assert [(a.broker_id, a.addr) for a in state.broker_member_group("c1", "broker-a").addrs] == [(0, M), (1, S)]


def test_slave_before_master_gets_no_master_addr() -> None:
    state = MetadataState()
    tr = register(state, reg(addr=S, bid=1))
    assert tr.master_addr == "" and tr.ha_server_addr == ""
    assert state.topic_count() == 0  # not a master, not an acting master


@pytest.mark.parametrize("acting", [False, True])
def test_prime_slave_registers_topics_when_the_master_is_absent(acting: bool) -> None:
    # RocketMQ 5: a broker that sends enableActingMaster (even false) is new enough; with the master
    # absent its lowest-id slave registers the group's topics (read-only only when acting).
    state = MetadataState()
    register(state, reg(addr=S, bid=1, acting=acting, topics={"TopicA": 6}))
    assert state.queue_data("TopicA", "broker-a").perm == (4 if acting else 6)
    # a higher-id slave is not the prime slave
    register(state, reg(addr="10.0.0.9:10911", bid=2, acting=acting, topics={"Other": 6}))
    assert not state.has_topic("Other")


def test_reply_carries_order_topic_config() -> None:
    state = MetadataState()
    assert register_broker(state, reg(), TIMEOUT).order_topic_config is None  # never written: no table
    assert apply(state, put_kv(state, ORDER_TOPIC_CONFIG, "TopicA", "broker-a:4")).applied
    tr = register_broker(state, reg(), TIMEOUT)
    assert tr.order_topic_config == {"TopicA": "broker-a:4"}
    # emptied: an empty table, as RocketMQ (4.9 brokers then clear their topics' order flag)
    assert apply(state, delete_kv(state, ORDER_TOPIC_CONFIG, "TopicA")).applied
    assert register_broker(state, reg(), TIMEOUT).order_topic_config == {}


def test_address_changing_id_replaces_its_old_entry() -> None:
    state = MetadataState()
    register(state, reg(addr=S, bid=1))
    register(state, reg(addr=M, bid=2))
    # S is promoted to master: its id-1 entry goes, there is one entry per address
    tr = register(state, reg(addr=S, bid=0, counter=2))
    assert addrs_of(state, "broker-a") == [(0, S), (2, M)]
    assert ("OP_PUT", "topic/TopicA/broker-a") in record_keys(tr)  # first time at id 0: topics written


def test_address_moving_to_another_group_leaves_the_old_one() -> None:
    state = MetadataState()
    register(state, reg(name="old", addr=M))
    register(state, reg(name="new", addr=M, counter=2))
    assert state.broker_data("old") is None
    assert state.broker_topics("old") == []
    assert addrs_of(state, "new") == [(0, M)]
    assert state.topic_brokers("TopicA") == ["new"]


def test_newer_state_version_holder_refuses_a_conflicting_registration() -> None:
    state = MetadataState()
    register(state, reg(addr=M, state_version=5))
    tr = register_broker(state, reg(addr=S, bid=0, state_version=3), TIMEOUT)
    assert tr.conflict and tr.records == 0
    assert register_broker(state, reg(addr=S, bid=0, state_version=6), TIMEOUT).conflict is False


def test_concurrent_change_makes_the_batch_a_no_op() -> None:
    state = MetadataState()
    master = register_broker(state, reg(), TIMEOUT)
    slave = register_broker(state, reg(addr=S, bid=1), TIMEOUT)  # both translated on the same state
    assert apply(state, master).applied
    result = apply(state, slave)
    assert not result.applied and result.failed_key == "broker/broker-a"
    assert addrs_of(state, "broker-a") == [(0, M)]  # the slave did not overwrite the master's entry
    assert apply(state, register_broker(state, reg(addr=S, bid=1), TIMEOUT)).applied  # retry
    assert addrs_of(state, "broker-a") == [(0, M), (1, S)]


def test_expiry_with_stale_version_is_a_no_op() -> None:
    state = MetadataState()
    register(state, reg())
    seen = state.live_version(M)
    expiry = expire_broker(state, M, seen)
    assert expiry.records > 0
    register(state, reg(counter=2))  # the broker re-registered after the scan
    result = apply(state, expiry)
    assert not result.applied and result.failed_key == f"live/{M}"
    assert state.broker_live(M) is not None and state.route("TopicA") is not None
    # translating with the stale version again gives nothing at all
    assert expire_broker(state, M, seen).empty
    assert expire_broker(state, "10.9.9.9:1", 0).empty


def test_removing_the_last_address_removes_the_broker_from_every_topic() -> None:
    state = MetadataState()
    register(state, reg(name="broker-a", addr=M, topics={"Shared": 6, "OnlyA": 6}))
    register(state, reg(addr=S, bid=1, topics={}))
    register(state, reg(name="broker-b", addr="10.0.0.3:10911", topics={"Shared": 6}))
    # the slave goes: the group and its topics stay
    tr = unregister_broker(state, "c1", "broker-a", S, 1)
    assert record_keys(tr) == [("OP_DELETE", f"live/{S}"), ("OP_PUT", "broker/broker-a")]
    assert apply(state, tr).applied
    assert state.topic_brokers("Shared") == ["broker-a", "broker-b"]
    # the master expires: last address, so broker-a leaves every topic; OnlyA is gone
    tr = expire_broker(state, M, state.live_version(M))
    assert apply(state, tr).applied
    assert state.broker_data("broker-a") is None and state.broker_live(M) is None
    assert not state.has_topic("OnlyA") and state.route("OnlyA") is None
    assert state.topic_brokers("Shared") == ["broker-b"]
    assert state.broker_names() == ["broker-b"]
    assert [bd.broker_name for bd in state.route("Shared").broker_datas] == ["broker-b"]


def test_unregister_unknown_address_is_empty() -> None:
    state = MetadataState()
    register(state, reg())
    assert unregister_broker(state, "c1", "broker-a", "10.9.9.9:1", 3).empty


def test_acting_master_writes_read_only_routes() -> None:
    state = MetadataState()
    tr = register(state, reg(addr=S, bid=1, acting=True, topics={"TopicA": 6}))
    assert ("OP_PUT", "topic/TopicA/broker-a") in record_keys(tr)
    assert state.queue_data("TopicA", "broker-a").perm == 4  # write bit cleared for the acting master
    route = state.route("TopicA", support_acting_master=True)
    assert [(a.broker_id, a.addr) for a in route.broker_datas[0].addrs] == [(0, S)]
    # the real master comes back: first registration at id 0 restores its permissions
    register(state, reg(addr=M, bid=0, acting=True, topics={"TopicA": 6}))
    assert state.queue_data("TopicA", "broker-a").perm == 6


def test_master_loss_in_acting_group_wipes_write_perm() -> None:
    state = MetadataState()
    register(state, reg(addr=M, acting=True))
    register(state, reg(addr=S, bid=1, acting=True))
    assert apply(state, unregister_broker(state, "c1", "broker-a", M, 0)).applied
    assert [state.queue_data(t, "broker-a").perm for t in ("TopicA", "TopicB")] == [4, 4]
    # without acting master the routes keep their permissions
    plain = MetadataState()
    register(plain, reg(addr=M))
    register(plain, reg(addr=S, bid=1))
    assert apply(plain, unregister_broker(plain, "c1", "broker-a", M, 0)).applied
    assert plain.queue_data("TopicA", "broker-a").perm == 6


def test_wipe_and_add_write_perm_counts() -> None:
    state = MetadataState()
    register(state, reg(topics={"T1": 6, "T2": 6, "T3": 4}))
    register(state, reg(name="broker-b", addr="10.0.0.3:10911", topics={"T1": 6}))
    wipe = wipe_write_perm(state, "broker-a")
    assert wipe.count == 3  # every queue data of the broker, as RocketMQ counts
    assert record_keys(wipe) == [("OP_PUT", "topic/T1/broker-a"), ("OP_PUT", "topic/T2/broker-a")]
    assert apply(state, wipe).applied
    assert [state.queue_data(t, "broker-a").perm for t in ("T1", "T2", "T3")] == [4, 4, 4]
    assert state.queue_data("T1", "broker-b").perm == 6  # other brokers untouched
    again = wipe_write_perm(state, "broker-a")
    assert again.count == 3 and again.empty
    add = add_write_perm(state, "broker-a")
    assert add.count == 3 and add.records == 3
    assert apply(state, add).applied
    assert [state.queue_data(t, "broker-a").perm for t in ("T1", "T2", "T3")] == [6, 6, 6]
    assert wipe_write_perm(state, "nobody").count == 0


def test_wipe_survives_unchanged_reregistration() -> None:
    state = MetadataState()
    register(state, reg())
    assert apply(state, wipe_write_perm(state, "broker-a")).applied
    assert register_broker(state, reg(), TIMEOUT).empty
    assert state.queue_data("TopicA", "broker-a").perm == 4


def test_delete_topic_all_or_by_cluster() -> None:
    state = MetadataState()
    register(state, reg(name="a1", addr="h1:1", cluster="c1", topics={"T": 6}))
    register(state, reg(name="a2", addr="h2:1", cluster="c1", topics={"T": 6}))
    register(state, reg(name="b1", addr="h3:1", cluster="c2", topics={"T": 6}))
    tr = delete_topic(state, "T", "c1")
    assert record_keys(tr) == [("OP_DELETE", "topic/T/a1"), ("OP_DELETE", "topic/T/a2")]
    assert apply(state, tr).applied
    assert state.topic_brokers("T") == ["b1"]
    assert delete_topic(state, "T", "no-such-cluster").empty
    assert apply(state, delete_topic(state, "T")).applied
    assert not state.has_topic("T") and state.topic_list(api_pb2.TOPIC_LIST_ALL) == []
    assert delete_topic(state, "T").empty


def test_register_topic_requires_known_brokers() -> None:
    state = MetadataState()
    register(state, reg(topics={}))
    qds = [state_pb2.QueueData(broker_name="broker-a", read_queue_nums=8, write_queue_nums=8, perm=6),
           state_pb2.QueueData(broker_name="ghost", read_queue_nums=8, write_queue_nums=8, perm=6)]
    with pytest.raises(ValidationError) as err:
        register_topic(state, "NewT", qds)
    assert err.value.field == "queue_datas[1].broker_name"
    assert "ghost" in err.value.message
    tr = register_topic(state, "NewT", qds[:1])
    assert record_keys(tr) == [("OP_PUT", "topic/NewT/broker-a")]
    assert [p.key for p in tr.batch.preconditions] == ["broker/broker-a"]
    assert apply(state, tr).applied
    assert state.route("NewT").queue_datas[0].read_queue_nums == 8
    assert register_topic(state, "NewT", qds[:1]).empty


def test_kv_put_and_delete_diff() -> None:
    state = MetadataState()
    tr = put_kv(state, "ns", "a/b", "v1")
    assert record_keys(tr) == [("OP_PUT", "kv/ns/a/b"), ("OP_PUT", "kvns/ns")]  # the namespace, once
    assert apply(state, tr).applied
    assert put_kv(state, "ns", "a/b", "v1").empty
    assert record_keys(put_kv(state, "ns", "c", "v")) == [("OP_PUT", "kv/ns/c")]
    assert apply(state, put_kv(state, "ns", "a/b", "")).applied  # an empty value is a value
    assert state.kv_get("ns", "a/b") == ""
    assert delete_kv(state, "ns", "missing").empty
    assert apply(state, delete_kv(state, "ns", "a/b")).applied
    assert state.kv_get("ns", "a/b") is None
    # RocketMQ keeps an emptied namespace: it lists as an empty table, and never-written ones do not exist
    assert state.kv_list("ns") == {} and state.kv_namespace_exists("ns")
    assert not state.kv_namespace_exists("never")
    copy = MetadataState()
    copy.restore(state.offset, state.kv.items())
    assert copy.kv_namespace_exists("ns") and copy.digest_hex == state.digest_hex


def test_seventy_thousand_topics() -> None:
    state = MetadataState()
    n = 70_000
    req = reg(topics={f"Topic-{i:05d}": 6 for i in range(n)})
    tr = register_broker(state, req, TIMEOUT)
    assert tr.records == n + 2  # broker, live, one queue data per topic
    assert apply(state, tr).applied
    assert state.topic_count() == n and len(state.broker_topics("broker-a")) == n
    assert register_broker(state, req, TIMEOUT).empty  # the 30 s heartbeat-style re-registration
    req.data_version.counter = 2
    req.topics[123].perm = 4
    tr = register_broker(state, req, TIMEOUT)
    assert record_keys(tr) == [("OP_PUT", f"live/{M}"), ("OP_PUT", "topic/Topic-00123/broker-a")]
    assert apply(state, tr).applied
    wipe = wipe_write_perm(state, "broker-a")
    assert wipe.count == n and wipe.records == n - 1
    gone = expire_broker(state, M, state.live_version(M))
    assert gone.records == n + 2
    assert apply(state, gone).applied
    assert state.topic_count() == 0 and len(state.kv) == 0


def test_static_topic_queue_mapping_is_stored_served_and_kept() -> None:
    """RIP-21: a registration's queue mapping lands on the topic's queue data, reaches the route, survives
    wipe/add write perm and a 217 for the topic, changes only with a new DataVersion, and leaves with
    the broker's queues."""
    state = MetadataState()
    req = reg(topics={"ST": 6, "Plain": 6})
    req.topics[0].mapping.CopyFrom(state_pb2.QueueMapping(scope="__global__", total_queues=8, epoch=5,
                                                           curr_id_map={0: 0, 1: 1}))
    register(state, req)
    (qd,) = state.route("ST").queue_datas
    assert (qd.mapping.total_queues, dict(qd.mapping.curr_id_map)) == (8, {0: 0, 1: 1})
    assert not state.route("Plain").queue_datas[0].HasField("mapping")
    assert register_broker(state, req, TIMEOUT).empty  # unchanged DataVersion: nothing written
    apply(state, wipe_write_perm(state, "broker-a"))
    apply(state, register_topic(state, "ST", [state_pb2.QueueData(broker_name="broker-a", read_queue_nums=2,
                                                                  write_queue_nums=2, perm=6)]))
    (qd,) = state.route("ST").queue_datas
    assert (qd.read_queue_nums, qd.mapping.epoch) == (2, 5)
    newer = reg(counter=2, topics={"ST": 6})
    newer.topics[0].mapping.CopyFrom(state_pb2.QueueMapping(total_queues=8, epoch=6, curr_id_map={0: 0}))
    tr = register(state, newer)
    assert ("OP_PUT", "topic/ST/broker-a") in record_keys(tr)
    assert dict(state.route("ST").queue_datas[0].mapping.curr_id_map) == {0: 0}
    apply(state, unregister_broker(state, "c1", "broker-a", M, 0))
    assert state.route("ST") is None


def test_static_topic_mapping_is_validated_and_not_accepted_from_register_topic() -> None:
    from nameserver.validation import check_topic_configs, validate_register_topic

    tc = api_pb2.TopicConfig(topic_name="ST", read_queue_nums=1, write_queue_nums=1, perm=6)
    tc.mapping.curr_id_map[-1] = 0
    with pytest.raises(ValidationError) as err:
        check_topic_configs([tc])
    assert err.value.field == "topics[0].mapping.curr_id_map"
    qd = state_pb2.QueueData(broker_name="broker-a", read_queue_nums=1, write_queue_nums=1, perm=6)
    qd.mapping.total_queues = 1
    with pytest.raises(ValidationError) as err:
        validate_register_topic(api_pb2.RegisterTopicRequest(topic="ST", queue_datas=[qd]))
    assert err.value.field == "queue_datas[0].mapping"


def test_a_registrations_topic_records_are_the_plain_builders_whatever_was_made_before() -> None:
    """The queue data's bytes and the topic keys are made once per distinct one (a broker registers the same
    again and again): each record is still what keys.topic_key and the canonical QueueData give, for a broker
    name escaped in its keys, the same numbers under another broker, and an acting master's read-only perm."""
    from nameserver.state import keys
    from nameserver.state.translate import _queue_data, canonical

    def expected(name: str, perm: int) -> dict[str, bytes]:
        return {keys.topic_key(t, name): canonical(_queue_data(name, 4, 4, perm, 0)) for t in ("A", "B")}

    for name in ("broker-a", "x/y~z", "broker-b", "broker-a"):
        state = MetadataState()
        tr = register_broker(state, reg(name=name, topics={"A": 6, "B": 6}), TIMEOUT)
        topics = {r.key: r.value for r in tr.batch.records if r.type == keys.TOPIC_TYPE}
        assert topics == expected(name, 6)
    acting = reg(name="g", bid=1, acting=True, topics={"A": 6, "B": 6})
    tr = register_broker(MetadataState(), acting, TIMEOUT)
    assert {r.key: r.value for r in tr.batch.records if r.type == keys.TOPIC_TYPE} == expected("g", 6 & ~2)
    with pytest.raises(ValueError, match="topic"):
        keys.topic_keys_of("broker-a")("a/b")  # as topic_key: a '/' never makes a key
