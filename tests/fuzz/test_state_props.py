"""Pure-core properties, no sockets: the real servicers over an in-memory node, the state machine, snapshots.

- Random sequences of valid and invalid requests: every answer is documented (no exception escapes a
  servicer), refused requests write nothing, and the state they build is reproduced exactly by a
  replay of the log, by an in-memory restore and by a real LMDB snapshot restored midway then replayed.
- Requests of two tenants with disjoint names commute: any interleaving gives the same state.
- Arbitrary log entries (garbage keys, undecodable values, preconditions): apply never raises, and
  replay and restore agree with the original.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from nameserver.pb import api_pb2, state_pb2
from nameserver.state import MetadataState, keys
from raftlog.pb import entry_pb2
from tests.fuzz import protostrategies as ps
from tests.fuzz import seeds, statecheck
from tests.fuzz.inprocess import Servicer, methods, replay
from tests.fuzz.livecalls import REFUSALS, all_methods, check_status
from tests.fuzz.profile import fuzz_settings

C = grpc.StatusCode
IN_PROCESS = methods()
LIVE = all_methods()


def op_strategy(name: str) -> st.SearchStrategy[tuple[str, Any]]:
    _, streaming = IN_PROCESS[name]
    req = ps.chunk_streams() if streaming else ps.requests(IN_PROCESS[name][0].DESCRIPTOR)
    return req.map(lambda r: (name, r))


OPS = st.sampled_from(sorted(IN_PROCESS)).flatmap(op_strategy)


def run_checked(svc: Servicer, name: str, request: Message | list) -> grpc.StatusCode:
    """One call with the per-call properties of the live run."""
    node = svc.node
    entries, digest, applied = len(node.entries), node.state.digest_hex, node.state.offset
    out = svc.call(name, request)  # any exception other than an abort fails the test: it would be UNKNOWN
    parsed = None if isinstance(request, list) else request
    check_status(LIVE[name], parsed, out.code, out.details, applied, True)
    if out.code in REFUSALS - {C.FAILED_PRECONDITION}:
        assert len(node.entries) == entries, f"{name} refused ({out.code.name}: {out.details}) but wrote"
    if out.code == C.FAILED_PRECONDITION:
        assert node.state.digest_hex == digest, f"{name} refused but changed the state"
    if out.code == C.OK and getattr(out.reply, "records", None) == 0:
        assert node.state.digest_hex == digest, f"{name} reported no change but changed the state"
    assert not statecheck.oversized_keys(node.state), f"{name} stored a key no snapshot can hold"
    return out.code


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_each_method_over_a_seeded_state(name: str) -> None:
    """Many requests per method, each over the same small state (cheap: no sockets, no Raft)."""

    @fuzz_settings(100)
    @given(op_strategy(name))
    def fuzz(op: tuple[str, Any]) -> None:
        svc = Servicer()
        svc.node.state = replay(seeds.seed_entries())
        svc.node.entries = list(seeds.seed_entries())
        run_checked(svc, *op)
        assert replay(svc.node.entries).digest_hex == svc.node.state.digest_hex

    fuzz()


@fuzz_settings(40)
@given(st.lists(OPS, min_size=8, max_size=40), st.integers(0, 1 << 16))
def test_request_sequences_replay_and_restore(ops: list[tuple[str, Any]], split: int) -> None:
    svc = Servicer()
    for name, request in ops:
        run_checked(svc, name, request)
    state, entries = svc.node.state, svc.node.entries
    expected = statecheck.reads(state)
    assert statecheck.digest_matches_items(state)
    assert statecheck.reads(replay(entries)) == expected, "a replay of the log built another state"
    assert statecheck.reads(statecheck.restored_in_memory(state)) == expected
    # A node restarting from a snapshot taken midway, then replaying the rest of the log.
    k = split % (len(entries) + 1)
    restarted = statecheck.restored_from_lmdb(replay(entries[:k]))
    for offset, data in entries[k:]:
        restarted.apply_entry(offset, entry_pb2.Entry.FromString(data))
    assert statecheck.reads(restarted) == expected, f"snapshot at entry {k} then replay differs"


# ---- two tenants with disjoint names commute -----------------------------------------------------

def tenant_ops(t: int) -> st.SearchStrategy[tuple[str, Message]]:
    """Requests touching only tenant t's cluster, brokers, addresses, topics and KV namespace; some of
    them invalid on purpose (they must change nothing, whatever the interleaving)."""
    brokers = st.sampled_from([f"b{t}-{i}" for i in range(3)])
    addrs = st.sampled_from([f"10.{t}.0.{i}:10911" for i in range(3)])
    topics = st.sampled_from([f"T{t}-{i}" for i in range(4)])
    cluster = f"c{t}"
    topic_cfgs = st.lists(st.builds(api_pb2.TopicConfig, topic_name=topics, read_queue_nums=st.integers(0, 8),
                                    write_queue_nums=st.integers(0, 8), perm=st.sampled_from([2, 4, 6]),
                                    topic_sys_flag=st.integers(0, 3)), max_size=3, unique_by=lambda c: c.topic_name)
    register = st.builds(
        lambda name, addr, bid, tcs, counter, acting: api_pb2.RegisterBrokerRequest(
            cluster_name=cluster, broker_name=name, broker_addr=addr, broker_id=bid, topics=tcs,
            enable_acting_master=acting, data_version=state_pb2.DataVersion(counter=counter)),
        brokers, addrs, st.integers(0, 2), topic_cfgs, st.integers(0, 3), st.booleans())
    queue_datas = st.lists(st.builds(state_pb2.QueueData, broker_name=brokers, read_queue_nums=st.integers(0, 8),
                                     write_queue_nums=st.integers(0, 8), perm=st.sampled_from([4, 6])),
                           max_size=2, unique_by=lambda q: q.broker_name)
    kv_keys = st.sampled_from(["k1", "k2", "a/b"])
    return st.one_of(
        register.map(lambda r: ("RegisterBroker", r)),
        st.builds(lambda n, a, i: ("UnregisterBroker", api_pb2.UnregisterBrokerRequest(
            cluster_name=cluster, broker_name=n, broker_addr=a, broker_id=i)), brokers, addrs, st.integers(0, 2)),
        st.builds(lambda k, v: ("PutKv", api_pb2.PutKvRequest(namespace=f"ns{t}", key=k, value=v)),
                  kv_keys, st.sampled_from(["v1", "v2", ""])),
        kv_keys.map(lambda k: ("DeleteKv", api_pb2.DeleteKvRequest(namespace=f"ns{t}", key=k))),
        brokers.map(lambda n: ("WipeWritePerm", api_pb2.BrokerPermRequest(broker_name=n))),
        brokers.map(lambda n: ("AddWritePerm", api_pb2.BrokerPermRequest(broker_name=n))),
        st.builds(lambda tp, q: ("RegisterTopic", api_pb2.RegisterTopicRequest(topic=tp, queue_datas=q)),
                  topics, queue_datas),
        st.builds(lambda tp, c: ("DeleteTopic", api_pb2.DeleteTopicRequest(topic=tp, cluster_name=c)),
                  topics, st.sampled_from(["", cluster])),
        # Compare-and-set against whatever the binding's version is when the call runs (see run_tenant_op).
        st.builds(lambda tp, q: ("BindQueue", api_pb2.BindQueueRequest(topic=tp, queue_id=q, owner=f"o{t}")),
                  topics, st.integers(0, 2)),
        st.builds(lambda tp, q: ("ReleaseQueue", api_pb2.ReleaseQueueRequest(topic=tp, queue_id=q)),
                  topics, st.integers(0, 2)),
        st.sampled_from([  # invalid whatever the state
            ("RegisterBroker", api_pb2.RegisterBrokerRequest(cluster_name=cluster, broker_name=f"b{t}-0",
                                                             broker_addr="no-port")),
            ("PutKv", api_pb2.PutKvRequest(namespace="", key="k1")),
            ("RegisterTopic", api_pb2.RegisterTopicRequest(topic=f"T{t}-0", queue_datas=[
                state_pb2.QueueData(broker_name=f"b{t}-0", read_queue_nums=-1)])),
        ]),
    )


def run_tenant_op(svc: Servicer, name: str, request: Message) -> None:
    if name in ("BindQueue", "ReleaseQueue"):
        request.expected_version = svc.node.state.kv.version(keys.bind_key(request.topic, request.queue_id))
    run_checked(svc, name, request)


@fuzz_settings(40)
@given(st.lists(tenant_ops(0), max_size=15), st.lists(tenant_ops(1), max_size=15),
       st.lists(st.booleans(), min_size=30, max_size=30))
def test_disjoint_tenants_commute(a: list, b: list, order: list[bool]) -> None:
    sequential = Servicer()
    for name, req in a + b:
        run_tenant_op(sequential, name, _copy(req))
    interleaved = Servicer()
    ia, ib = iter(a), iter(b)
    for pick_a in order + [True] * len(a) + [False] * len(b):
        op = next(ia if pick_a else ib, None)
        if op is not None:
            run_tenant_op(interleaved, op[0], _copy(op[1]))
    assert interleaved.node.state.digest_hex == sequential.node.state.digest_hex
    assert statecheck.reads(interleaved.node.state, versions=False) == statecheck.reads(
        sequential.node.state, versions=False)


def _copy(msg: Message) -> Message:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


# ---- arbitrary log entries -------------------------------------------------------------------------

KEYS = st.one_of(
    st.sampled_from(["broker/b", "broker/", "live/10.0.0.1:1", "topic/T/b", "topic/T", "topic//b", "filter/x",
                     "kv/ns/k", "kv/ns", "bind/T/0", "bind/T/x", "bind/T/-1", "session/c", "member/m", "other"]),
    st.builds(lambda p, s: p + s, st.sampled_from(list(keys.PREFIX_TYPES)), st.text(max_size=12)))
VALUES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([
        state_pb2.BrokerData(cluster="c", broker_name="b", addrs=[state_pb2.BrokerAddr(broker_id=0, addr="a:1")]),
        state_pb2.QueueData(broker_name="b", read_queue_nums=4, write_queue_nums=4, perm=6, topic_sys_flag=3),
        state_pb2.BrokerLive(broker_addr="10.0.0.1:1", broker_name="b"),
        state_pb2.KvValue(value="v"), state_pb2.QueueBindingValue(owner="o", epoch=1),
        state_pb2.FilterServers(addrs=["f:1"]), state_pb2.ClientSession(last_seq=1),
    ]).map(lambda m: m.SerializeToString()))
RECORDS = st.builds(lambda k, v, op, t: entry_pb2.Record(key=k, value=v, op=op, type=t), KEYS, VALUES,
                    st.sampled_from([entry_pb2.OP_PUT, entry_pb2.OP_DELETE, 7]), st.integers(0, 12))
BATCHES = st.builds(
    lambda recs, pre: entry_pb2.Batch(records=recs, preconditions=pre),
    st.lists(RECORDS, max_size=5),
    st.lists(st.builds(lambda k, v: entry_pb2.Precondition(key=k, version=v), KEYS, st.integers(0, 4)),
             max_size=2))


@fuzz_settings(60)
@given(st.lists(st.lists(BATCHES, min_size=1, max_size=3), max_size=20))
def test_arbitrary_entries_apply_and_restore(entries: list[list[entry_pb2.Batch]]) -> None:
    state = MetadataState()
    lazy = MetadataState(lazy_routes=True)  # a worker replica's route index, indexed when read
    log = []
    for i, batches in enumerate(entries, start=1):
        entry = entry_pb2.Entry(batches=batches)
        state.apply_entry(i, entry)  # must not raise, whatever the records say
        lazy.apply_entry(i, entry)
        log.append((i, entry.SerializeToString()))
    expected = statecheck.reads(state)
    assert statecheck.digest_matches_items(state)
    assert statecheck.reads(lazy) == expected
    assert statecheck.reads(replay(log)) == expected
    assert statecheck.reads(statecheck.restored_in_memory(state)) == expected
    assert statecheck.reads(statecheck.restored_from_lmdb(state)) == expected
