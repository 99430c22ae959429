"""MetadataState: indexes derived from replayed records, reads, restore and determinism."""

import pytest
from google.protobuf.message import Message

from nameserver.pb import api_pb2, state_pb2
from nameserver.state import ORDER_TOPIC_CONFIG, MetadataState, keys
from nameserver.validation import ValidationError
from raftlog.pb import entry_pb2


def put(key: str, msg: Message) -> entry_pb2.Record:
    return entry_pb2.Record(type=keys.record_type_of(key), op=entry_pb2.OP_PUT, key=key,
                            value=msg.SerializeToString(deterministic=True))


def delete(key: str) -> entry_pb2.Record:
    return entry_pb2.Record(type=keys.record_type_of(key), op=entry_pb2.OP_DELETE, key=key)


def batch(*records: entry_pb2.Record) -> entry_pb2.Batch:
    return entry_pb2.Batch(records=list(records))


def apply(state: MetadataState, *batches: entry_pb2.Batch) -> list[entry_pb2.BatchResult]:
    return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=list(batches)))


def broker(cluster: str, name: str, addrs: dict[int, str], zone: str = "", acting: bool = False
           ) -> entry_pb2.Record:
    bd = state_pb2.BrokerData(cluster=cluster, broker_name=name, zone=zone, enable_acting_master=acting)
    for bid in sorted(addrs):
        bd.addrs.add(broker_id=bid, addr=addrs[bid])
    return put(keys.broker_key(name), bd)


def queue(topic: str, name: str, perm: int = 6, flag: int = 0, nums: int = 4) -> entry_pb2.Record:
    qd = state_pb2.QueueData(broker_name=name, read_queue_nums=nums, write_queue_nums=nums, perm=perm,
                             topic_sys_flag=flag)
    return put(keys.topic_key(topic, name), qd)


def live(addr: str, cluster: str, name: str, bid: int, ha: str = "") -> entry_pb2.Record:
    return put(keys.live_key(addr), state_pb2.BrokerLive(cluster=cluster, broker_name=name, broker_id=bid,
                                                          broker_addr=addr, ha_server_addr=ha,
                                                          heartbeat_timeout_ms=120_000))


def kv(ns: str, key: str, value: str) -> entry_pb2.Record:
    return put(keys.kv_key(ns, key), state_pb2.KvValue(value=value))


def sample_records() -> list[entry_pb2.Record]:
    """Two clusters, three broker groups, topics with unit flags, filter servers, KV config."""
    return [
        broker("c1", "broker-a", {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}, zone="z1"),
        live("10.0.0.1:10911", "c1", "broker-a", 0, ha="10.0.0.1:10912"),
        live("10.0.0.2:10911", "c1", "broker-a", 1),
        broker("c1", "broker-b", {0: "10.0.0.3:10911"}, zone="z2"),
        live("10.0.0.3:10911", "c1", "broker-b", 0),
        broker("c2", "broker-c", {0: "10.0.1.1:10911"}),
        live("10.0.1.1:10911", "c2", "broker-c", 0),
        queue("TopicA", "broker-b"),
        queue("TopicA", "broker-a"),
        queue("TopicB", "broker-c", nums=8),
        queue("UnitT", "broker-a", flag=1),
        queue("UnitT", "broker-c", flag=0),
        queue("SubT", "broker-b", flag=2),
        queue("SubUnitT", "broker-c", flag=3),
        put(keys.filter_key("10.0.0.1:10911"), state_pb2.FilterServers(addrs=["10.0.0.1:30000"])),
        kv(ORDER_TOPIC_CONFIG, "TopicA", "broker-a:4;broker-b:4"),
        kv("ns", "k/with/slash", "v"),
    ]


def sample_state() -> MetadataState:
    state = MetadataState()
    records = sample_records()
    apply(state, batch(*records[:7]))
    apply(state, batch(*records[7:12]), batch(*records[12:]))
    return state


def reads(state: MetadataState) -> dict[str, object]:
    """A broad fingerprint of every read, to compare two states (the digest: None for one that keeps none)."""
    out: dict[str, object] = {
        "cluster": state.cluster_info().SerializeToString(deterministic=True),
        "kv": {ns: state.kv_list(ns) for ns in state.kv_namespaces()},
        "lives": [(a, lv.SerializeToString(), v) for a, lv, v in state.live_addrs()],
        "digest": state.digest_hex if state.accounting else None,
    }
    for kind in api_pb2.TopicListKind.values():
        out[f"list{kind}"] = state.topic_list(kind, "c1")
    for topic in state.topic_list(api_pb2.TOPIC_LIST_ALL):
        route = state.route(topic, order_message_enable=True)
        out[f"route/{topic}"] = route.SerializeToString(deterministic=True) if route else None
    for name in state.broker_names():
        out[f"topics/{name}"] = state.broker_topics(name)
    return out


def test_any_broker_name_reads_back_as_written_also_after_a_restore() -> None:
    # '/' and '~' are escaped in the keys (keys.py); the indexes and every read hold the name itself
    names = ["team/a~b", "broker@host ü", "~7E", "a"]
    state = MetadataState()
    apply(state, batch(*[broker("c 1", n, {0: f"10.0.0.{i}:10911"}) for i, n in enumerate(names)],
                       *[queue("T", n) for n in names], queue("Own", "team/a~b")))
    restored = MetadataState()
    restored.restore(state.offset, state.kv.items())
    for s in (state, restored):
        assert s.broker_names() == sorted(names) and s.broker_names("c 1") == sorted(names)
        assert [bd.broker_name for bd in s.route("T").broker_datas] == sorted(names)
        assert [qd.broker_name for qd in s.route("T").queue_datas] == sorted(names)
        assert s.broker_topics("team/a~b") == ["Own", "T"] and s.topic_brokers("Own") == ["team/a~b"]
        assert s.topic_list(api_pb2.TOPIC_LIST_BY_CLUSTER, "c 1") == ["Own", "T"]
        assert sorted(s.cluster_info().broker_addr_table) == sorted(names)
    assert reads(restored) == reads(state)
    apply(restored, batch(delete(keys.topic_key("Own", "team/a~b"))))  # a delete finds the escaped key
    assert restored.broker_topics("team/a~b") == ["T"] and not restored.has_topic("Own")


def test_route_sorted_with_filter_servers_and_order_conf() -> None:
    state = sample_state()
    route = state.route("TopicA", order_message_enable=True)
    assert route is not None
    assert [bd.broker_name for bd in route.broker_datas] == ["broker-a", "broker-b"]
    assert [qd.broker_name for qd in route.queue_datas] == ["broker-a", "broker-b"]
    assert [(ba.broker_id, ba.addr) for ba in route.broker_datas[0].addrs] == [
        (0, "10.0.0.1:10911"), (1, "10.0.0.2:10911")]
    assert dict(route.filter_server_table) == {
        "10.0.0.1:10911": state_pb2.FilterServers(addrs=["10.0.0.1:30000"])}
    assert route.order_topic_conf == "broker-a:4;broker-b:4"
    assert state.route("TopicA").order_topic_conf == ""  # only with orderMessageEnable
    assert state.route("TopicB").queue_datas[0].read_queue_nums == 8
    assert state.route("NoSuchTopic") is None


def test_route_without_broker_data_is_topic_not_exist() -> None:
    state = MetadataState()
    apply(state, batch(queue("Orphan", "ghost")))
    assert state.has_topic("Orphan")
    assert state.route("Orphan") is None


def test_zone_mode_keeps_own_zone_and_masterless_groups() -> None:
    state = sample_state()
    route = state.route("TopicA", zone_name="Z2")
    assert [bd.broker_name for bd in route.broker_datas] == ["broker-b"]
    assert [qd.broker_name for qd in route.queue_datas] == ["broker-b"]
    assert dict(route.filter_server_table) == {}  # broker-a's filter server went with it
    # no zone name: no filtering
    assert len(state.route("TopicA").broker_datas) == 2
    # a group with no master is kept whatever its zone (consumers fall back to its slave)
    apply(state, batch(broker("c1", "broker-a", {1: "10.0.0.2:10911"}, zone="z1")))
    route = state.route("TopicA", zone_name="z2")
    assert [bd.broker_name for bd in route.broker_datas] == ["broker-a", "broker-b"]


def test_acting_master_view_promotes_lowest_slave_of_readonly_group() -> None:
    state = MetadataState()
    apply(state, batch(broker("c", "g", {2: "h2:1", 1: "h1:1"}, acting=True), queue("T", "g", perm=4)))
    plain = state.route("T")
    assert [ba.broker_id for ba in plain.broker_datas[0].addrs] == [1, 2]
    acting = state.route("T", support_acting_master=True)
    assert [(ba.broker_id, ba.addr) for ba in acting.broker_datas[0].addrs] == [(0, "h1:1"), (2, "h2:1")]
    # a writeable group is left alone
    apply(state, batch(queue("T", "g", perm=6)))
    assert [ba.broker_id for ba in state.route("T", support_acting_master=True).broker_datas[0].addrs] == [1, 2]


def test_cluster_info_and_member_group() -> None:
    state = sample_state()
    info = state.cluster_info()
    assert sorted(info.broker_addr_table) == ["broker-a", "broker-b", "broker-c"]
    assert {c: list(v.names) for c, v in info.cluster_addr_table.items()} == {
        "c1": ["broker-a", "broker-b"], "c2": ["broker-c"]}
    assert info.broker_addr_table["broker-a"].zone == "z1"
    group = state.broker_member_group("c1", "broker-a")
    assert group.cluster_name == "c1" and group.broker_name == "broker-a"
    assert [(a.broker_id, a.addr) for a in group.addrs] == [(0, "10.0.0.1:10911"), (1, "10.0.0.2:10911")]
    assert list(state.broker_member_group("c1", "nope").addrs) == []


def test_topic_lists() -> None:
    state = sample_state()
    all_topics = ["SubT", "SubUnitT", "TopicA", "TopicB", "UnitT"]
    assert state.topic_list(api_pb2.TOPIC_LIST_ALL) == all_topics
    assert state.topic_list(api_pb2.TOPIC_LIST_BY_CLUSTER, "c1") == ["SubT", "TopicA", "UnitT"]
    assert state.topic_list(api_pb2.TOPIC_LIST_BY_CLUSTER, "c2") == ["SubUnitT", "TopicB", "UnitT"]
    assert state.topic_list(api_pb2.TOPIC_LIST_BY_CLUSTER, "none") == []
    assert state.topic_list(api_pb2.TOPIC_LIST_SYSTEM) == ["broker-a", "broker-b", "broker-c", "c1", "c2"]
    assert state.topic_list(api_pb2.TOPIC_LIST_UNIT) == ["SubUnitT", "UnitT"]
    assert state.topic_list(api_pb2.TOPIC_LIST_HAS_UNIT_SUB) == ["SubT", "SubUnitT"]
    assert state.topic_list(api_pb2.TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT) == ["SubT"]
    assert state.first_broker_addr() == "10.0.0.1:10911"
    # flags follow updates: UnitT loses its unit queue data
    apply(state, batch(delete(keys.topic_key("UnitT", "broker-a"))))
    assert state.topic_list(api_pb2.TOPIC_LIST_UNIT) == ["SubUnitT"]
    assert state.topic_list(api_pb2.TOPIC_LIST_ALL) == all_topics  # still on broker-c
    apply(state, batch(queue("SubT", "broker-b", flag=0)))
    assert state.topic_list(api_pb2.TOPIC_LIST_HAS_UNIT_SUB) == ["SubUnitT"]
    with pytest.raises(ValidationError) as err:
        state.topic_list(42)
    assert err.value.field == "kind"


def test_deletes_drop_index_entries() -> None:
    state = sample_state()
    apply(state, batch(delete(keys.topic_key("TopicB", "broker-c")), delete(keys.broker_key("broker-c")),
                       delete(keys.live_key("10.0.1.1:10911"))))
    assert not state.has_topic("TopicB")
    assert state.broker_topics("broker-c") == ["SubUnitT", "UnitT"]
    assert state.cluster_names() == ["c1"]
    assert state.broker_data("broker-c") is None
    assert state.broker_live("10.0.1.1:10911") is None
    assert state.live_version("10.0.1.1:10911") == 0
    apply(state, batch(delete(keys.filter_key("10.0.0.1:10911")), delete(keys.kv_key("ns", "k/with/slash"))))
    assert state.filter_servers("10.0.0.1:10911") == []
    assert state.kv_list("ns") == {} and "ns" not in state.kv_namespaces()


def test_kv_reads() -> None:
    state = sample_state()
    assert state.kv_get("ns", "k/with/slash") == "v"
    assert state.kv_get("ns", "missing") is None
    assert state.kv_list(ORDER_TOPIC_CONFIG) == {"TopicA": "broker-a:4;broker-b:4"}
    listed = state.kv_list("ns")
    listed["x"] = "mutated"
    assert state.kv_list("ns") == {"k/with/slash": "v"}  # reads are copies


def test_live_addrs_carry_versions() -> None:
    state = sample_state()
    lives = state.live_addrs()
    assert [a for a, _, _ in lives] == ["10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911", "10.0.1.1:10911"]
    assert all(v == 1 for _, _, v in lives)  # written by the entry at offset 1
    apply(state, batch(live("10.0.0.3:10911", "c1", "broker-b", 0, ha="x:1")))
    assert state.live_version("10.0.0.3:10911") == 3
    assert state.broker_live("10.0.0.3:10911").ha_server_addr == "x:1"


def test_reads_return_copies() -> None:
    state = sample_state()
    state.broker_data("broker-a").zone = "mutated"
    state.route("TopicA").broker_datas[0].zone = "mutated"
    assert state.broker_data("broker-a").zone == "z1"
    assert state.route("TopicA").broker_datas[0].zone == "z1"


def test_batch_grouping_does_not_change_the_digest() -> None:
    records = sample_records()
    one_by_one = MetadataState()
    for rec in records:
        apply(one_by_one, batch(rec))
    all_at_once = MetadataState()
    apply(all_at_once, batch(*records))
    assert one_by_one.offset == len(records) and all_at_once.offset == 1
    assert one_by_one.digest_hex == all_at_once.digest_hex == sample_state().digest_hex
    a, b = reads(one_by_one), reads(all_at_once)
    a.pop("lives")
    b.pop("lives")  # key versions (offsets) legitimately differ
    assert a == b


def test_restore_rebuilds_indexes_identically() -> None:
    state = sample_state()
    apply(state, batch(delete(keys.topic_key("SubT", "broker-b")), kv("ns", "k2", "v2")))
    restored = MetadataState()
    apply(restored, batch(queue("Stale", "gone")))  # indexes from before the restore must vanish
    restored.restore(state.offset, state.kv.items())
    assert restored.offset == state.offset
    assert reads(restored) == reads(state)
    assert restored.route("Stale") is None and not restored.has_topic("Stale")
    # and it keeps applying consistently afterwards
    more = batch(queue("New", "broker-a"), delete(keys.broker_key("broker-b")))
    apply(state, more)
    apply(restored, more)
    assert reads(restored) == reads(state)


def test_undecodable_value_is_ignored_by_indexes_not_fatal() -> None:
    state = MetadataState()
    bad = entry_pb2.Record(type=keys.TOPIC_TYPE, key=keys.topic_key("T", "b"), value=b"\xff\xff\xff")
    results = apply(state, batch(bad, broker("c", "b", {0: "h:1"})))
    assert results[0].applied
    assert not state.has_topic("T")
    assert state.broker_names() == ["b"]
    assert len(state.kv) == 2  # the bad value is still in the replicated map (and its digest)


def test_route_generation_moves_with_every_record_a_route_reads_and_only_those() -> None:
    """nameserver/core/routecache.py reuses a route while the generation stays: every input must move it."""
    from nameserver.state import settings

    state = sample_state()
    moves = {
        "queue data": queue("T1", "broker-a", perm=4),
        "broker data": broker("c1", "broker-a", {0: "10.0.0.9:10911"}),
        "filter servers": put(keys.filter_key("10.0.0.9:10911"), state_pb2.FilterServers(addrs=["f:1"])),
        "a setting": put(keys.setting_key(settings.ORDER_MESSAGE_ENABLE), state_pb2.SettingValue(value="true")),
        "the order-topic config": kv(ORDER_TOPIC_CONFIG, "T1", "broker-a:4"),
    }
    for what, record in moves.items():
        before, route_before = state.route_generation, state.route("T1", order_message_enable=True)
        apply(state, batch(record))
        assert state.route_generation > before, what
        if what != "a setting":  # (a setting changes the route through the caller's flags)
            assert state.route("T1", order_message_enable=True) != route_before, what
    before = state.route_generation
    apply(state, batch(live("10.0.0.7:10911", "c1", "broker-a", 2)))  # liveness feeds no route
    assert state.route_generation == before
    # a route reads one KV namespace (the order-topic config): another's keys move no route (nor the Go
    # front end's kept replies, nameserver/api/frontchannel.py)
    route_before = state.route("T1", order_message_enable=True)
    apply(state, batch(kv("someNamespace", "T1", "broker-a:8")))
    assert state.route_generation == before
    assert state.route("T1", order_message_enable=True) == route_before
    restored = MetadataState()
    restored.restore(state.offset, [(k, v, ver, t) for k, v, ver, t in state.kv.items()])
    assert restored.route_generation > 0


def test_every_record_kind_has_at_most_one_handler_and_moves_routes_as_the_registry_says() -> None:
    """The record registry (nameserver/logformat/records.py) drives the state: a record of a kind marked
    `routes` moves the route generation, any other does not; each handler is a registered kind's."""
    from nameserver.logformat import records
    from nameserver.state.metadata import _HANDLERS

    assert set(_HANDLERS) <= {kind.rtype for kind in records.KINDS}
    state = MetadataState()
    for kind in records.KINDS:
        before = state.route_generation
        # a KV record feeds routes in the order-topic config's namespace only (the test above)
        key = f"{kind.prefix}{ORDER_TOPIC_CONFIG}/x" if kind is records.KV else f"{kind.prefix}x"
        apply(state, batch(put(key, kind.value())))
        assert state.route_generation == before + kind.routes, kind


def test_rewritten_queue_datas_leave_the_indexes_a_rebuild_makes() -> None:
    """A changed registration rewrites its queue datas in place when their unit flags stay (the apply
    thread's short path), and a rewrite moves no quota count but KV bytes: reads and quota totals after
    each rewrite equal those of a state rebuilt from the same pairs."""
    state = sample_state()
    for records in ([queue("TopicA", "broker-a", perm=4, nums=8)],  # same flag: in place
                    [queue("UnitT", "broker-a", flag=1, nums=2)],  # a unit queue data, same flag
                    [queue("UnitT", "broker-a", flag=2)],  # another flag: the unit lists move
                    [queue("TopicB", "broker-c", flag=1), queue("SubUnitT", "broker-c", flag=0)],
                    [kv("ns", "k/with/slash", "a longer value"), live("10.0.0.3:10911", "c1", "broker-b", 0, "h:1")],
                    [entry_pb2.Record(type=keys.TOPIC_TYPE, key=keys.topic_key("TopicA", "broker-b"),
                                      value=b"\xff\xff\xff")]):  # no longer parses: out of the indexes
        apply(state, batch(*records))
        rebuilt = MetadataState()
        rebuilt.restore(state.offset, state.kv.items())
        assert reads(state) == reads(rebuilt)
        assert state.usage.totals == rebuilt.usage.totals
    assert state.queue_data("TopicA", "broker-a").write_queue_nums == 8
    assert state.topic_brokers("TopicA") == ["broker-a"]
    assert state.topic_list(api_pb2.TOPIC_LIST_UNIT) == ["TopicB"]


def test_a_topic_moving_between_one_and_several_brokers_reads_the_same_as_rebuilt() -> None:
    """A one-broker topic is held as a pair, a topic on several as a dict (nameserver/state/topicqueues.py):
    every read agrees with a state rebuilt from the same records, through each change of shape."""
    state = sample_state()
    steps = [batch(queue("Moving", "broker-b")),
             batch(queue("Moving", "broker-a", nums=2)),                       # one -> two
             batch(queue("Moving", "broker-c", flag=1)),                       # two -> three
             batch(delete(keys.topic_key("Moving", "broker-a"))),              # three -> two
             batch(delete(keys.topic_key("Moving", "broker-b"))),              # two -> one
             batch(queue("Moving", "broker-c", nums=6)),                       # one, rewritten
             batch(delete(keys.topic_key("Moving", "broker-c")))]              # gone
    for step in steps:
        apply(state, step)
        rebuilt = MetadataState()
        rebuilt.restore(state.offset, state.kv.items())
        assert reads(state) == reads(rebuilt)
        brokers = state.topic_brokers("Moving")
        assert [qd.broker_name for qd in state.queue_datas("Moving")] == brokers == sorted(brokers)
        assert all(state.queue_data("Moving", b) is not None for b in brokers)
        assert state.queue_data("Moving", "broker-nowhere") is None
        # the shape that keeps a million one-broker topics small
        assert isinstance(state._topic_queues.get("Moving"), tuple) == (len(brokers) == 1)
    assert not state.has_topic("Moving")


def test_equal_values_share_one_object_applied_or_restored() -> None:
    """A broker's topics mostly carry byte-identical queue datas: one bytes object for all of them."""
    state = sample_state()
    apply(state, batch(*(queue(f"Same{i}", "broker-a") for i in range(3))))
    held = {id(state.kv.get(keys.topic_key(f"Same{i}", "broker-a"))) for i in range(3)}
    assert len(held) == 1
    restored = MetadataState()
    restored.restore(state.offset, ((k, bytes(bytearray(v)), ver, t) for k, v, ver, t in state.kv.items()))
    assert len({id(restored.kv.get(keys.topic_key(f"Same{i}", "broker-a"))) for i in range(3)}) == 1
    assert restored.digest_hex == state.digest_hex


def test_a_restore_from_a_snapshot_files_entries_equals_the_state_written(tmp_path) -> None:
    """The entries read into the map at once (snapshot/format.py Entries.into_map, what a restart loads) give
    the state that was written: every read and index, the digest recomputed from the pairs, the items."""
    from raftlog.kvstate import KVStateMachine
    from snapshot import SnapshotStore

    state = sample_state()
    apply(state, batch(*(queue(f"Same{i}", "broker-a") for i in range(3))))  # equal stored entries
    apply(state, batch(queue("Same0", "broker-a", nums=4), queue("Later", "broker-a")))  # same bytes, newer
    store = SnapshotStore(tmp_path, keep=1)
    fsm = KVStateMachine(state.kv)
    info = store.write(state.offset, 1, state.digest_hex, fsm.snapshot_items(fsm.freeze()))
    for stamped in (info.digest, None):  # None: the digest hashed from the pairs loaded
        restored = MetadataState()
        _, entries = store.load(info.path, bytes_verified=True)
        restored.restore(info.offset, entries, stamped)
        assert reads(restored) == reads(state)
        assert restored.kv.freeze() == state.kv.freeze() and restored.usage.totals == state.usage.totals
    held = restored.kv.freeze()
    same = [held[keys.topic_key(f"Same{i}", "broker-a")] for i in (1, 2)]
    assert same[0] is same[1]  # equal stored entries: one item
    assert held[keys.topic_key("Same0", "broker-a")][0] is same[0][0]  # equal values: one bytes object


def test_a_rewrite_of_an_escaped_broker_name_or_of_a_pending_topic_reads_as_rebuilt() -> None:
    """The rewrite short path (MetadataState._on_change: a one-broker topic's queue data, same sys flag) takes
    only a plain broker part of a built topic: a broker name escaped in its key ('/', '~'), a topic a restore
    left pending, another broker of the same topic, each read as a state rebuilt from the same pairs."""
    state = sample_state()
    steps = [[queue("Esc", "b/x"), queue("Tilde", "b~y"), queue("Two", "broker-a")],
             [queue("Esc", "b/x", nums=2), queue("Tilde", "b~y", nums=3)],   # rewrites, escaped names
             [queue("Two", "broker-ab", nums=5)],                              # another broker: one -> two
             [queue("Two", "broker-a", nums=6)]]                               # a rewrite of a two-broker topic
    for records in steps:
        apply(state, batch(*records))
        rebuilt = MetadataState()
        rebuilt.restore(state.offset, state.kv.items())
        assert reads(state) == reads(rebuilt)
    assert state.queue_data("Esc", "b/x").write_queue_nums == 2
    assert state.queue_data("Tilde", "b~y").write_queue_nums == 3
    pending = MetadataState()
    pending.restore(state.offset, state.kv.items(), defer_routes=True)  # every topic left pending
    apply(pending, batch(queue("TopicA", "broker-a", nums=9), queue("Tilde", "b~y", nums=1)))
    apply(state, batch(queue("TopicA", "broker-a", nums=9), queue("Tilde", "b~y", nums=1)))
    assert reads(pending) == reads(state)
    while pending.build_routes():
        pass
    assert reads(pending) == reads(state)


def test_a_lazy_routes_state_indexes_topic_records_when_read_and_reads_as_an_eager_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's replica (lazy_routes) notes each changed topic/ key and indexes it at the first read of the route
    index after: a write-only stream of registrations rewriting the same keys never indexes them; every read
    answers as an eager state applying the same entries."""
    eager, lazy = MetadataState(), MetadataState(lazy_routes=True)
    for state in (eager, lazy):
        for records in ([*sample_records()], [queue("TopicA", "broker-a", nums=8), queue("Esc", "b/x")],
                        [queue("UnitT", "broker-a", flag=2), delete(keys.topic_key("TopicB", "broker-c"))]):
            apply(state, batch(*records))
    indexed: list[str] = []
    real = MetadataState._on_topic

    def on_topic(self: MetadataState, key: str, new: bytes | None) -> None:
        if self is lazy:
            indexed.append(key)
        real(self, key, new)

    monkeypatch.setattr(MetadataState, "_on_topic", on_topic)
    generation = lazy.route_generation
    for nums in range(1, 20):  # a write-only load: the same broker's queue datas, rewritten
        apply(lazy, batch(queue("TopicA", "broker-a", nums=nums), queue("Esc", "b/x", nums=nums)))
        apply(eager, batch(queue("TopicA", "broker-a", nums=nums), queue("Esc", "b/x", nums=nums)))
    assert indexed == []
    assert lazy.route_generation == generation + 38  # a route kept before any of them is not reused
    assert lazy.queue_data("TopicA", "broker-a").write_queue_nums == 19  # read: indexed now, once each
    assert sorted(indexed) == sorted(set(indexed)) and len(indexed) >= 2
    assert reads(lazy) == reads(eager)
    for read in (lambda s: s.topic_list(api_pb2.TOPIC_LIST_UNIT), lambda s: s.broker_topics("broker-a"),
                 lambda s: s.broker_has_topic("broker-c", "TopicB"), lambda s: s.some_topic() is not None,
                 lambda s: s.topic_count(), lambda s: s.has_topic("Esc")):
        apply(lazy, batch(queue("UnitT", "broker-a", flag=1), delete(keys.topic_key("TopicA", "broker-a"))))
        apply(eager, batch(queue("UnitT", "broker-a", flag=1), delete(keys.topic_key("TopicA", "broker-a"))))
        assert read(lazy) == read(eager)
        apply(lazy, batch(queue("TopicA", "broker-a"), queue("UnitT", "broker-a", flag=2)))
        apply(eager, batch(queue("TopicA", "broker-a"), queue("UnitT", "broker-a", flag=2)))
        assert read(lazy) == read(eager)


def test_a_lazy_routes_state_indexes_its_noted_keys_itself_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys a lazy state notes are bounded (STALE_ROUTE_KEYS): past it, its apply indexes them."""
    from nameserver.state import metadata
    monkeypatch.setattr(metadata, "STALE_ROUTE_KEYS", 3)
    lazy = MetadataState(accounting=False, lazy_routes=True)
    apply(lazy, batch(queue("T1", "b"), queue("T2", "b")))
    assert len(lazy._stale) == 2 and not lazy._topic_queues
    apply(lazy, batch(queue("T3", "b")))
    assert not lazy._stale and sorted(lazy._topic_queues) == ["T1", "T2", "T3"]


def test_the_kept_topic_sys_flags_answer_as_decoding_and_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue data's topicSysFlag, kept by its bytes: what decoding gives, None for bytes that do not parse (kept
    too), and no more than SYS_FLAGS_KEPT of them; the unit topic lists and routes follow it either way."""
    from nameserver.state import metadata
    monkeypatch.setattr(metadata, "SYS_FLAGS_KEPT", 4)
    flags = metadata._SysFlags()
    raws = [state_pb2.QueueData(broker_name=f"b{i}", topic_sys_flag=i % 4).SerializeToString() for i in range(10)]
    for _ in range(2):
        for i, raw in enumerate(raws):
            assert flags[raw] == metadata._queue_sys_flag(raw) == i % 4
            assert len(flags) <= 4
    assert flags[b"\xff\xff"] is None and flags[b"\xff\xff"] is None  # not a QueueData
    state = MetadataState()
    apply(state, batch(broker("C", "b", {0: "10.0.0.1:10911"}), queue("U", "b", flag=1), queue("V", "b")))
    for flag in (0, 1, 1, 0):  # rewritten with another flag, and with the same
        apply(state, batch(queue("U", "b", flag=flag, nums=8 - flag)))
        assert state.topic_list(api_pb2.TOPIC_LIST_UNIT) == (["U"] if flag else [])
        assert state.queue_data("U", "b").topic_sys_flag == flag


@pytest.mark.parametrize("kept", [3, 4096])
def test_a_lazy_state_indexing_each_entry_once_it_is_in_reads_as_an_eager_one(
        monkeypatch: pytest.MonkeyPatch, kept: int) -> None:
    """A lazy_routes state indexes an entry's changes after the entry is in (no listener call per record): whatever
    the entries (every kind, a key written twice in one, deletes, topics on one and on several brokers, failed
    batches), it reads as an eager state that indexed them record by record, entry after entry, also when its
    noted keys pass their bound (`kept`) inside an entry."""
    import random

    from nameserver.state import metadata
    monkeypatch.setattr(metadata, "STALE_ROUTE_KEYS", kept)
    rng = random.Random(11)
    eager, lazy, counted = MetadataState(), MetadataState(accounting=False, lazy_routes=True), \
        MetadataState(lazy_routes=True)
    names = ["broker-a", "broker-b", "b/x"]

    def record() -> entry_pb2.Record:
        name, topic, n = rng.choice(names), f"T{rng.randint(0, 5)}", rng.randint(0, 2)
        made = rng.choice([
            lambda: queue(topic, name, flag=rng.randint(0, 3), nums=rng.randint(1, 4)),
            lambda: delete(keys.topic_key(topic, name)),
            lambda: broker("c1" if n else "c2", name, {i: f"10.0.{i}.{n}:10911" for i in range(n + 1)}),
            lambda: delete(keys.broker_key(name)),
            lambda: live(f"10.0.0.{n}:10911", "c1", name, n),
            lambda: delete(keys.live_key(f"10.0.0.{n}:10911")),
            lambda: kv(rng.choice(["ns", ORDER_TOPIC_CONFIG]), topic, f"v{n}"),
            lambda: put(keys.filter_key(f"10.0.0.{n}:10911"), state_pb2.FilterServers(addrs=[f"f{n}"])),
        ])
        return made()

    for _ in range(150):
        batches = []
        for _ in range(rng.randint(1, 3)):
            b = batch(*[record() for _ in range(rng.randint(1, 6))])
            if rng.random() < 0.1:  # a precondition that fails: the batch changes nothing
                b.preconditions.add(key=keys.broker_key("broker-a"), version=10**9)
            batches.append(b)
        for state in (eager, lazy, counted):
            apply(state, *batches)
        if rng.random() < 0.3:
            assert reads(lazy) | {"digest": None} == reads(eager) | {"digest": None}
    assert reads(lazy) | {"digest": None} == reads(eager) | {"digest": None}
    assert reads(counted) == reads(eager) and counted.usage.totals == eager.usage.totals
    assert lazy.route_generation == eager.route_generation == counted.route_generation


@pytest.mark.parametrize("lazy_routes", [False, True])
def test_the_route_generation_moves_before_the_offset_does(lazy_routes: bool) -> None:
    """A route cache hit reads the offset, then the generation, without the lock (nameserver/core/routecache.py):
    when an entry's offset becomes visible, every route change in it has moved the generation already, for a
    worker's lazy state (which indexes an entry's changes after its records) as for an eager one."""
    from raftlog.kvstate import KVState
    state = MetadataState(accounting=not lazy_routes, lazy_routes=lazy_routes)
    seen: list[tuple[int, int]] = []  # (offset, the generation) each time the offset is set

    class Watched(KVState):
        @property  # type: ignore[override]
        def offset(self) -> int:
            return self._watched_offset

        @offset.setter
        def offset(self, value: int) -> None:
            seen.append((value, state.route_generation))
            self._watched_offset = value

    state.kv._watched_offset = state.kv.__dict__.pop("offset")  # type: ignore[attr-defined]
    state.kv.__class__ = Watched
    apply(state, batch(broker("c1", "b", {0: "10.0.0.1:10911"}), queue("T", "b")))
    apply(state, batch(live("10.0.0.1:10911", "c1", "b", 0)))  # no route change
    apply(state, batch(queue("T", "b", nums=8), queue("U", "b")))
    generations = [gen for _, gen in seen]
    assert [offset for offset, _ in seen] == [1, 2, 3]
    assert generations[0] > 0 and generations[1] == generations[0] and generations[2] == state.route_generation
    assert generations[2] > generations[1]
    assert state.queue_data("T", "b").write_queue_nums == 8
