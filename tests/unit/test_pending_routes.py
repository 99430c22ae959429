"""A restore that leaves the route index to be built in chunks (MetadataState.restore defer_routes,
nameserver/state/pendingroutes.py): every read answers as the fully built index does, before, between and
after the chunks, with changes applied in between; and the index it ends with is the one built at once."""

from __future__ import annotations

from nameserver.pb import api_pb2, state_pb2
from nameserver.state import MetadataState, keys
from raftlog.pb import entry_pb2
from tests.unit.test_state_metadata import apply, batch, broker, delete, queue, reads

BROKERS = ["broker-a", "broker-b", "team/a~b", "c"]
FLAGS = (0, 1, 2, 3)  # unit, unit-sub and both: the unit topic lists


def raw(key: str, value: bytes) -> entry_pb2.Record:
    return entry_pb2.Record(type=keys.TOPIC_TYPE, op=entry_pb2.OP_PUT, key=key, value=value)


def source() -> MetadataState:
    """Topics on one to three brokers, unit flags, an escaped broker name, and keys the index skips."""
    state = MetadataState()
    records = [broker("c1", name, {0: f"10.0.0.{i}:10911"}) for i, name in enumerate(BROKERS[:3])]
    records.append(broker("c2", BROKERS[3], {0: "10.0.1.1:10911"}))
    for t in range(40):
        for b in range(1 + t % 3):
            records.append(queue(f"T{t:02d}", BROKERS[(t + b) % 4], flag=FLAGS[(t // 3 + b) % 4], nums=1 + b))
    records += [raw(keys.topic_key("Bad", "broker-a"), b"\xff\xff\xff"),  # does not parse: no route
                raw("topic/NoPart", b""), raw("topic/T01/x/y", b""), raw("topic/T02/bad~zz", b""),
                raw(keys.topic_key("T03", "broker-c"), b"\xff")]  # one broker of a topic unreadable
    apply(state, batch(*records))
    return state


TOPICS = [f"T{t:02d}" for t in range(42)] + ["Bad", "NoPart", "T01/x", "New", ""]


def fingerprint(state: MetadataState) -> dict[str, object]:
    """reads() and every per-topic read, for topics the state has, had, never had, or cannot have."""
    out = reads(state)
    out["count"] = state.topic_count()
    out["c2"] = state.topic_list(api_pb2.TOPIC_LIST_BY_CLUSTER, "c2")
    for topic in TOPICS:
        out[f"has/{topic}"] = state.has_topic(topic)
        out[f"brokers/{topic}"] = state.topic_brokers(topic)
        out[f"qds/{topic}"] = [qd.SerializeToString() for qd in state.queue_datas(topic)]
        for name in BROKERS + ["nowhere"]:
            out[f"on/{name}/{topic}"] = state.broker_has_topic(name, topic)
            qd = state.queue_data(topic, name)
            out[f"qd/{name}/{topic}"] = None if qd is None else qd.SerializeToString()
    for name in BROKERS + ["nowhere"]:
        out[f"topics/{name}"] = state.broker_topics(name)
    return out


CHANGES = [  # each applied between two chunks; most touch topics the chunks have not reached yet
    batch(queue("T39", "broker-b", flag=1)),                                      # a broker added, unit
    batch(delete(keys.topic_key("T38", "broker-a"))),                             # one broker of three gone
    batch(queue("T35", "c", flag=2, nums=9)),                                     # rewritten, another flag
    batch(delete(keys.topic_key("T30", "broker-c")), delete(keys.topic_key("T30", "team/a~b"))),  # gone
    batch(queue("T30", "broker-a")),                                              # and back, elsewhere
    batch(queue("New", "team/a~b", flag=3), queue("T33", "c", flag=1)),          # a new topic; same broker
    batch(queue("T03", "broker-c")),                                              # the unreadable one mended
    batch(queue("T01", "broker-b", flag=1), delete(keys.topic_key("T02", "c"))),  # built ones
    batch(raw(keys.topic_key("T37", "broker-a"), b"\xff\xff\xff")),               # made unreadable
]


def test_every_read_answers_as_the_built_index_while_a_restore_builds_it_in_chunks() -> None:
    state = source()
    deferred, built = MetadataState(), MetadataState()
    deferred.restore(state.offset, state.kv.items(), defer_routes=True)
    built.restore(state.offset, state.kv.items())
    assert fingerprint(deferred) == fingerprint(built) == fingerprint(state)
    assert MetadataState().some_topic() is None and deferred.has_topic(deferred.some_topic() or "")
    assert deferred.usage.totals == built.usage.totals == state.usage.totals
    changes, chunks = list(CHANGES), 0
    while True:
        more = deferred.build_routes(7)  # a few topics a chunk: changes land before, inside and after
        chunks += 1
        assert fingerprint(deferred) == fingerprint(built)
        some = deferred.some_topic()  # a worker's warm-up read: any topic it has, the index built or not
        assert some is not None and deferred.has_topic(some)
        if changes:
            change = changes.pop()
            apply(deferred, change)
            apply(built, change)
            assert fingerprint(deferred) == fingerprint(built)
        if not more:
            break
    assert chunks > 5 and not changes
    for change in CHANGES[:3]:  # and it keeps applying as the other does
        apply(deferred, change)
        apply(built, change)
    assert fingerprint(deferred) == fingerprint(built)
    assert deferred._topic_queues == built._topic_queues
    assert deferred._broker_topics == built._broker_topics
    assert deferred._unit_topics == built._unit_topics
    assert deferred.digest_hex == built.digest_hex and deferred.usage.totals == built.usage.totals


def test_a_restore_while_the_last_one_is_still_building_starts_over() -> None:
    state = source()
    deferred = MetadataState()
    deferred.restore(state.offset, state.kv.items(), defer_routes=True)
    deferred.build_routes(5)
    apply(state, batch(delete(keys.topic_key("T00", "broker-a")), queue("Later", "c")))
    deferred.restore(state.offset, state.kv.items(), defer_routes=True)
    assert fingerprint(deferred) == fingerprint(state)
    while deferred.build_routes(11):
        pass
    assert fingerprint(deferred) == fingerprint(state)
    assert deferred._topic_queues == state._topic_queues and deferred._broker_topics == state._broker_topics


def test_a_restore_keeps_its_topic_keys_sorted_whatever_order_they_come_in() -> None:
    state = source()
    deferred = MetadataState()
    deferred.restore(state.offset, reversed(list(state.kv.items())), defer_routes=True)
    assert fingerprint(deferred) == fingerprint(state)
    assert state_pb2.QueueData.FromString(deferred.kv.get(keys.topic_key("T00", "broker-a")) or b"").read_queue_nums


def test_the_apply_thread_publishes_a_restore_first_then_builds_its_routes_between_entries() -> None:
    """raftlog/applier.py: the core's restore (nameserver/core/node.py StateMachineAdapter) is published with
    its route index pending, and the apply thread builds it after, entries applied in between."""
    import threading
    import time

    from nameserver.core.node import StateMachineAdapter
    from raftlog.applier import Applier
    from raftlog.codec import encode_entry

    state = source()
    for t in range(3000):  # a few chunks' worth (pendingroutes.CHUNK_KEYS)
        apply(state, batch(queue(f"Many{t:05d}", BROKERS[t % 4])))
    adapter = StateMachineAdapter(MetadataState())
    applier = Applier(adapter, threading.RLock())
    pending_at_reset: list[bool] = []
    applier.reset_listeners.append(lambda _offset: pending_at_reset.append(adapter.state._pending is not None))
    applier.restore_handler = lambda path, index: (state.offset, iter(list(state.kv.items())), None)
    change = batch(queue("T39", "broker-b", flag=1), delete(keys.topic_key("Many02999", "c")))
    applier.start()
    try:
        applier.enqueue_restore("snap", state.offset)
        applier.enqueue_entry(state.offset + 1, encode_entry(entry_pb2.Entry(term=1, batches=[change])))
        assert applier.wait_applied(state.offset + 1, 10)
        deadline = time.monotonic() + 10
        while adapter.state._pending is not None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        applier.stop()
    apply(state, change)
    assert pending_at_reset == [True] and adapter.state._pending is None and not applier.failed
    assert fingerprint(adapter.state) == fingerprint(state)
    assert adapter.state._topic_queues == state._topic_queues and adapter.state._unit_topics == state._unit_topics
