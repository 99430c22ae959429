"""Exactly-once sessions by owner (nameserver/state/sessions.py), the state's quotas (quotas.py) and the
leader's registration budget (nameserver/core/budget.py): the pure parts."""

from __future__ import annotations

import threading
import time

import pytest

from nameserver.core.budget import TopicBudget, leading_parts
from nameserver.errors import TooLargeError
from nameserver.pb import state_pb2
from nameserver.state import MetadataState, Translation, keys, put_kv, quotas, translate
from nameserver.state.sessions import SessionQuota
from nameserver.state.shards import moves
from raftlog.pb import entry_pb2
from tests.cluster import register_request

QUOTA = SessionQuota(per_owner=3, max_sessions=8)


def apply(state: MetadataState, tr: Translation) -> entry_pb2.BatchResult:
    return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0]


def session_write(state: MetadataState, owner: str, cid: str, seq: int, quota: SessionQuota = QUOTA
                  ) -> Translation:
    """An exactly-once KV write of `owner`'s client `cid`, as the leader translates it."""
    tr = put_kv(state, "NS", f"{owner}-{cid}-{seq}", "v")
    translate.record_session(tr, state, f"{owner}.{cid}", owner, seq, b"reply", 0, quota)
    return tr


def write(state: MetadataState, owner: str, cid: str, seq: int, quota: SessionQuota = QUOTA) -> None:
    assert apply(state, session_write(state, owner, cid, seq, quota)).applied


def live(state: MetadataState) -> set[str]:
    return {sid for sid in state.session_book.ids() if not state.session_book.get(sid).evicted}  # type: ignore[union-attr]


def test_a_flood_of_one_owner_evicts_only_its_own_oldest_sessions() -> None:
    state = MetadataState()
    write(state, "admin", "idle", 1)
    for i in range(50):
        write(state, "broker", f"flood{i}", 1)
    assert "admin.idle" in live(state) and "broker.flood49" in live(state)
    assert state.session_book.live("broker") == QUOTA.per_owner
    assert state.session_book.evicted("broker") == QUOTA.per_owner  # tombstones are bounded as well
    admin = state.session("admin.idle")
    assert admin is not None and not admin[0].evicted and admin[0].reply == b"reply"


def test_an_evicted_session_leaves_a_tombstone_with_its_last_sequence() -> None:
    state = MetadataState()
    one = SessionQuota(per_owner=1, max_sessions=8)
    write(state, "broker", "a", 7, one)
    write(state, "broker", "b", 1, one)
    found = state.session("broker.a")
    assert found is not None
    stone = found[0]
    assert stone.evicted and stone.last_seq == 7 and stone.reply == b"" and stone.owner == "broker"
    # a new sequence opens it again, evicting the owner's then oldest
    write(state, "broker", "a", 8, one)
    assert live(state) == {"broker.a"}
    assert state.session_book.evicted("broker") == 1  # b's tombstone; a's own became live again


def test_past_max_sessions_a_new_owner_is_refused_and_nobody_is_evicted() -> None:
    state = MetadataState()
    for owner in "abc":
        for cid in "xyz":
            if len(live(state)) < QUOTA.max_sessions:
                write(state, owner, cid, 1)
    before = set(live(state))
    with pytest.raises(TooLargeError) as err:
        session_write(state, "d", "x", 1)
    assert err.value.field == "sessions.max_sessions"
    assert live(state) == before
    write(state, "a", "w", 1)  # an owner at its quota still opens one, in its own room
    assert state.session_book.live_total == QUOTA.max_sessions


def test_every_replica_and_a_restored_one_agree_on_sessions_and_the_next_eviction() -> None:
    leader, follower = MetadataState(), MetadataState()
    quota = SessionQuota(per_owner=3, max_sessions=100)
    for i in range(20):
        tr = session_write(leader, "abcd"[i % 4], f"c{i % 7}", i + 1, quota)
        apply(leader, tr)
        apply(follower, tr)
    assert leader.digest_hex == follower.digest_hex
    restored = MetadataState()
    restored.restore(leader.offset, [(k, v, ver, t) for k, (v, ver, t) in leader.kv.freeze().items()])
    for state in (follower, restored):
        assert set(state.session_book.ids()) == set(leader.session_book.ids())
        nxt = session_write(state, "a", "new", 1, quota)
        assert [(r.key, r.op) for r in nxt.batch.records] == [
            (r.key, r.op) for r in session_write(leader, "a", "new", 1, quota).batch.records]
        assert len(nxt.batch.records) == 3  # the KV write, owner a's oldest evicted, the new session


def test_expiry_makes_tombstones_then_deletes_them() -> None:
    state = MetadataState()
    write(state, "a", "x", 3)
    tr = translate.expire_sessions(state, lambda sid: 10_000.0, 5_000)
    assert [r.op for r in tr.batch.records] == [entry_pb2.OP_PUT]
    apply(state, tr)
    found = state.session("a.x")
    assert found is not None and found[0].evicted and found[0].last_seq == 3
    tr = translate.expire_sessions(state, lambda sid: 10_000.0, 5_000)
    assert [r.op for r in tr.batch.records] == [entry_pb2.OP_DELETE]
    apply(state, tr)
    assert state.session("a.x") is None


# ---- quotas --------------------------------------------------------------------------------------

LIMITS = {quotas.QUEUE_DATAS: 10, quotas.BROKERS: 10, quotas.KV_KEYS: 4, quotas.KV_BYTES: 200,
          quotas.CONTROLLER_SETS: 10}


def test_a_write_that_would_cross_a_quota_is_refused_naming_it() -> None:
    state = MetadataState()
    for i in range(3):
        tr = put_kv(state, "NS", f"k{i}", "v")  # the namespace record counts once
        quotas.check(state.usage, state.kv, tr.batch, LIMITS)
        apply(state, tr)
    assert state.usage.totals[quotas.KV_KEYS] == 4
    with pytest.raises(TooLargeError) as err:
        quotas.check(state.usage, state.kv, put_kv(state, "NS", "k9", "v").batch, LIMITS)
    assert err.value.field == "limits.max_kv_keys"
    quotas.check(state.usage, state.kv, put_kv(state, "NS", "k0", "w").batch, LIMITS)  # a rewrite: no growth
    quotas.check(state.usage, state.kv, translate.delete_kv(state, "NS", "k0").batch, LIMITS)
    with pytest.raises(TooLargeError) as err:
        quotas.check(state.usage, state.kv, put_kv(state, "NS", "k0", "v" * 300).batch, LIMITS)
    assert err.value.field == "limits.max_kv_bytes"


def test_usage_follows_every_change_and_a_restore_rebuilds_it() -> None:
    state = MetadataState()
    for i in range(5):
        apply(state, put_kv(state, f"N{i % 2}", f"k{i}", "x" * i))
    apply(state, translate.delete_kv(state, "N0", "k0"))
    restored = MetadataState()
    restored.restore(state.offset, [(k, v, ver, t) for k, (v, ver, t) in state.kv.freeze().items()])
    assert restored.usage.totals == state.usage.totals
    assert state.usage.totals[quotas.KV_KEYS] == 4 + 2
    stored = sum(len(k) + len(v) for k, (v, _, _) in state.kv.freeze().items() if k.startswith(("kv/", "kvns/")))
    assert state.usage.totals[quotas.KV_BYTES] == stored


def test_queue_datas_count_per_broker_name() -> None:
    state = MetadataState()
    batch = entry_pb2.Batch()
    for topic in ("T1", "T2"):
        for broker in ("b1", "b2"):
            batch.records.add(type=keys.TOPIC_TYPE, op=entry_pb2.OP_PUT, key=keys.topic_key(topic, broker),
                              value=state_pb2.QueueData(broker_name=broker).SerializeToString())
    quotas.check(state.usage, state.kv, batch, LIMITS)
    with pytest.raises(TooLargeError, match="limits.max_queue_datas"):
        quotas.check(state.usage, state.kv, batch, {**LIMITS, quotas.QUEUE_DATAS: 3})


def test_a_flood_of_new_broker_names_is_refused_by_group0_directory_quota() -> None:
    """Sharded, a new set's directory record (shard/) is written in group 0 before its registration reaches
    its group: counted with the brokers, a flood of names stops at group 0's quota, not past it."""
    state = MetadataState()
    apply(state, translate.register_broker(state, register_request("c1", "b0", "10.0.0.1:10911", []), 60_000))
    for i in range(2):
        tr = moves.assign_set(state, f"new-{i}", "c1", 3)
        quotas.check(state.usage, state.kv, tr.batch, {**LIMITS, quotas.BROKERS: 3})
        apply(state, tr)
    assert state.usage.totals[quotas.BROKERS] == 3  # one address and two directory records
    with pytest.raises(TooLargeError) as err:
        quotas.check(state.usage, state.kv, moves.assign_set(state, "new-2", "c1", 3).batch,
                     {**LIMITS, quotas.BROKERS: 3})
    assert err.value.field == "limits.max_brokers"
    restored = MetadataState()
    restored.restore(state.offset, [(k, v, ver, t) for k, (v, ver, t) in state.kv.freeze().items()])
    assert restored.usage.totals == state.usage.totals


# ---- the registration budget -----------------------------------------------------------------------


def test_the_budget_queues_a_registration_behind_others_and_refuses_past_its_wait() -> None:
    budget = TopicBudget(100)
    got: list[int] = []

    def second() -> None:
        with budget.hold(50, 10.0):
            got.append(budget.held)

    with budget.hold(70, 1.0):
        with budget.hold(20, 1.0):  # fits beside
            assert budget.held == 90
        with pytest.raises(TooLargeError, match="limits.registration_topics_in_flight"), budget.hold(50, 0.05):
            pass
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(0.2)
        assert not got  # still waiting for room
    waiter.join(10)
    assert got == [50]  # ran once the first was done
    with budget.hold(500, 0.05):  # bigger than the budget: runs alone
        assert budget.held == 100
    assert budget.held == 0


def test_the_budget_refuses_a_waiter_whose_time_left_no_longer_covers_its_expected_cost() -> None:
    """Admitted with less time left than its write takes, a registration ended "outcome unknown" (and
    half written, in parts): the budget learns seconds per topic and refuses such a waiter by name."""
    budget = TopicBudget(100)
    with budget.hold(100, 1.0):
        time.sleep(0.2)  # 2 ms per topic
    assert 0.0015 < budget.seconds_per_topic < 0.01
    release = threading.Event()

    def holder() -> None:
        with budget.hold(100, 1.0):
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    try:
        time.sleep(0.05)
        start = time.monotonic()
        # 100 topics are expected to take 0.2 s: with 0.25 s left, waiting cannot leave it enough
        with pytest.raises(TooLargeError, match="could no longer finish"), budget.hold(100, 10.0, call_left=0.25):
            pass
        assert time.monotonic() - start < 0.1  # refused at once, not at its wait's end
        # with time to spare it waits its turn
        threading.Timer(0.1, release.set).start()
        with budget.hold(100, 10.0, call_left=5.0):
            assert budget.held == 100
    finally:
        release.set()
        t.join(5)


def test_an_owner_over_its_quota_is_brought_back_to_it() -> None:
    state = MetadataState()
    for cid in "abcde":  # concurrent translations can leave an owner over: here, a quota lowered since
        write(state, "o", cid, 1, SessionQuota(per_owner=10, max_sessions=100))
    tr = session_write(state, "o", "f", 1)
    assert sum(r.key.startswith(keys.SESSION_PREFIX) for r in tr.batch.records) == 3 + 1  # 3 evicted, f
    apply(state, tr)
    assert state.session_book.live("o") == QUOTA.per_owner


def test_a_big_registration_is_proposed_in_parts_that_each_apply_as_the_whole_would() -> None:
    state = MetadataState()
    req = register_request("C", "b1", "10.0.0.1:10911", [f"T{i}" for i in range(25)])
    whole = translate.register_broker(state, req, 30_000)
    lead, last = leading_parts(whole.batch, per_part=10)
    assert [len(p.records) for p in lead] == [10, 10]
    assert all(r.key.startswith(keys.TOPIC_PREFIX) for p in lead for r in p.records)
    assert {r.key for r in last.records} >= {keys.broker_key("b1"), keys.live_key("10.0.0.1:10911")}
    assert all(list(p.preconditions) == list(whole.batch.preconditions) for p in [*lead, last])
    parted = MetadataState()
    for part in [*lead, last]:
        assert parted.apply_entry(parted.offset + 1, entry_pb2.Entry(batches=[part]))[0].applied
    apply(state, whole)
    assert parted.route("T7") == state.route("T7") and parted.topic_count() == state.topic_count() == 25
    # a part refused (the broker changed under it) leaves a diff to translate again: only what is missing
    changed = MetadataState()
    assert changed.apply_entry(1, entry_pb2.Entry(batches=[lead[0]]))[0].applied
    again = translate.register_broker(changed, req, 30_000)
    assert len([r for r in again.batch.records if r.key.startswith(keys.TOPIC_PREFIX)]) == 15
    assert leading_parts(again.batch, per_part=100) == ([], again.batch)  # small: one entry


def test_without_auth_the_one_anonymous_owner_may_hold_up_to_max_sessions() -> None:
    """Without [auth] every caller is the owner "": its quota is the node's, not one tenant's."""
    state = MetadataState()
    for i in range(QUOTA.max_sessions):
        write(state, "", f"c{i}", 1)
    assert state.session_book.live("") == QUOTA.max_sessions  # per_owner (3) would have evicted 5
    write(state, "", "one-more", 1)
    assert state.session_book.live("") == QUOTA.max_sessions and state.session_book.evicted("") == 1


def test_a_registration_s_parts_go_on_past_the_call_deadline_once_the_first_committed() -> None:
    """Stopping between parts left the first parts' topics with no broker to own them, for good."""
    from types import SimpleNamespace

    from nameserver.core.node import NameServerNode
    from raftlog.proposer import ProposalError

    proposed: list[int] = []

    def propose(part: entry_pb2.Batch, timeout: float) -> SimpleNamespace:
        assert timeout > 0
        time.sleep(0.1)
        proposed.append(len(proposed))
        return SimpleNamespace(result=SimpleNamespace(applied=True))

    node = SimpleNamespace(log=SimpleNamespace(propose=propose))
    parts = [entry_pb2.Batch() for _ in range(4)]
    now = time.monotonic()
    assert NameServerNode._propose_all(node, parts, now + 0.15, now + 5.0)  # type: ignore[arg-type]
    assert proposed == [0, 1, 2, 3]
    # the first part still needs the caller's time
    with pytest.raises(ProposalError, match="did not commit in time"):
        NameServerNode._propose_all(node, parts, time.monotonic() - 0.01, time.monotonic() + 5.0)  # type: ignore[arg-type]


def test_a_registration_whose_first_part_was_refused_is_not_proposed_again_after_its_caller_left() -> None:
    """A translation again after the first part was refused has nothing committed: the caller's cancel
    (rpc.in_time) still stops it; only parts after a committed one go on past it."""
    from types import SimpleNamespace

    from nameserver.api.rpc import CallCancelled
    from nameserver.core import budget
    from nameserver.core.node import NameServerNode

    batch = entry_pb2.Batch(records=[entry_pb2.Record(key=keys.topic_key(f"T{i}", "b"), value=b"q")
                                     for i in range(budget.PART_RECORDS * 2 + 1)])
    proposed: list[int] = []
    calls = {"over": False}

    def propose(part: entry_pb2.Batch, timeout: float) -> SimpleNamespace:
        proposed.append(len(part.records))
        calls["over"] = True  # the caller cancels while its first part is refused
        return SimpleNamespace(result=SimpleNamespace(applied=False))

    def wanted() -> None:
        if calls["over"]:
            raise CallCancelled("the caller cancelled the call before its write was proposed")

    node = SimpleNamespace(log=SimpleNamespace(is_leader=lambda: True, propose=propose),
                           guard=SimpleNamespace(optimistic=lambda fn: fn()),
                           _translate=lambda *_: (SimpleNamespace(batch=batch), 0, len(batch.records)),
                           _propose_all=lambda *a: NameServerNode._propose_all(node, *a))  # type: ignore[arg-type]
    with pytest.raises(CallCancelled):
        NameServerNode._write(node, None, time.monotonic() + 5, None, None, in_parts=True,  # type: ignore[arg-type]
                              finish_by=time.monotonic() + 10, wanted=wanted)
    assert proposed == [budget.PART_RECORDS]  # the refused first part, and nothing after the cancel


def test_a_restore_counts_every_quota_as_the_changes_one_by_one_do() -> None:
    """Usage.rebuild (a restore: the topic/ keys counted by the restore's own loop, a malformed one too) gives
    the totals on_change gives per key."""
    values = {keys.topic_key(f"T{i}", f"b{i % 3}"): (b"q" * i, 1, keys.TOPIC_TYPE) for i in range(7)}
    values |= {f"{keys.LIVE_PREFIX}10.0.0.{i}:10911": (b"live", 1, keys.LIVE_TYPE) for i in range(3)}
    values |= {f"{keys.KV_PREFIX}ns/k{i}": (b"v" * i, 1, keys.KV_TYPE) for i in range(4)}
    values |= {f"{keys.KV_NAMESPACE_PREFIX}ns": (b"", 1, keys.KV_NAMESPACE_TYPE),
               f"{keys.CONTROLLER_PREFIX}b0": (b"c", 1, keys.CONTROLLER_TYPE), "member/n1": (b"m", 1, 0),
               f"{keys.TOPIC_PREFIX}no-broker-part": (b"q", 1, keys.TOPIC_TYPE)}
    one_by_one = quotas.Usage()
    for key, (value, _, rtype) in values.items():
        one_by_one.on_change(rtype, key, None, value)
    state = MetadataState()
    state.restore(1, [(key, value, version, rtype) for key, (value, version, rtype) in values.items()])
    rebuilt = state.usage
    assert rebuilt.totals == one_by_one.totals
    assert rebuilt.totals[quotas.QUEUE_DATAS] == 8 and rebuilt.totals[quotas.BROKERS] == 3
    assert rebuilt.totals[quotas.KV_KEYS] == 5 and rebuilt.totals[quotas.CONTROLLER_SETS] == 1


@pytest.mark.parametrize("lazy_routes", [False, True])
def test_the_totals_follow_records_added_rewritten_and_dropped_as_a_recount_gives(lazy_routes: bool) -> None:
    """The state's listener counts the totals only where they may move (a queue data rewritten moves none): after
    any mix of puts, rewrites and deletes of every counted kind, they are what counting the pairs held gives; a
    state that keeps no accounts (a worker's replica) counts nothing."""
    import random
    rng = random.Random(5)
    kinds = [(keys.TOPIC_TYPE, lambda i: keys.topic_key(f"T{i}", f"b{i % 2}")),
             (keys.LIVE_TYPE, lambda i: keys.live_key(f"10.0.0.{i}:10911")),
             (keys.KV_TYPE, lambda i: f"{keys.KV_PREFIX}ns/k{i}"),
             (keys.KV_NAMESPACE_TYPE, lambda i: f"{keys.KV_NAMESPACE_PREFIX}n{i}"),
             (keys.CONTROLLER_TYPE, lambda i: keys.controller_key(f"b{i}")),
             (keys.SHARD_TYPE, lambda i: keys.shard_key(f"b{i}"))]
    state = MetadataState(lazy_routes=lazy_routes)
    replica = MetadataState(accounting=False, lazy_routes=lazy_routes)
    for offset in range(1, 120):
        batch = entry_pb2.Batch()
        for _ in range(rng.randint(1, 6)):
            rtype, key_of = rng.choice(kinds)
            key = key_of(rng.randint(0, 4))
            if rng.random() < 0.3:
                batch.records.add(type=rtype, op=entry_pb2.OP_DELETE, key=key)
            else:
                value = state_pb2.QueueData(broker_name="b", read_queue_nums=rng.randint(1, 3)).SerializeToString() \
                    if rtype == keys.TOPIC_TYPE else b"v" * rng.randint(0, 3)
                batch.records.add(type=rtype, op=entry_pb2.OP_PUT, key=key, value=value)
        for s in (state, replica):
            s.apply_entry(offset, entry_pb2.Entry(batches=[batch]))
    recount = quotas.Usage()
    for key, value, _, rtype in state.kv.items():
        recount.on_change(rtype, key, None, value)
    assert state.usage.totals == recount.totals and recount.totals[quotas.QUEUE_DATAS] > 0
    assert replica.usage.totals == dict.fromkeys(quotas.QUOTAS, 0)
