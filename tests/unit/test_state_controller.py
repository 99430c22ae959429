"""Controller mode's decisions (nameserver/state/controller.py): Apache RocketMQ's controller semantics as
records, applied to a real MetadataState; every decision that changes a set is fenced by its version."""

from __future__ import annotations

import pytest

from nameserver.state import MetadataState
from nameserver.state import controller as ctl
from raftlog.pb import entry_pb2

BS = "broker-a"
ADDR = {1: "10.0.0.1:30911", 2: "10.0.0.2:30911", 3: "10.0.0.3:30911"}


class Beats:
    """A heartbeat table stand-in: who is alive, and each broker's (epoch, max offset, priority)."""

    def __init__(self, alive: set[int] | None = None, ranks: dict[int, tuple[int, int, int]] | None = None) -> None:
        self.up = set(alive or ())
        self.ranks = ranks or {}

    def alive(self, broker_name: str, broker_id: int) -> bool:
        return broker_name == BS and broker_id in self.up

    def rank(self, broker_name: str, broker_id: int) -> tuple[int, int, int] | None:
        return self.ranks.get(broker_id)


def apply(state: MetadataState, d: ctl.Decision) -> bool:
    if not d.batch.records:
        return True
    return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[d.batch]))[0].applied


def ok(state: MetadataState, d: ctl.Decision) -> ctl.Decision:
    assert d.code == ctl.SUCCESS, d.remark
    assert apply(state, d)
    return d


def check_code(i: int) -> str:
    return f"{ADDR[i]};1700000000{i}"


def registered(n: int = 3) -> MetadataState:
    """A set whose brokers 1..n took the ids offered to them, as real brokers do at first start."""
    s = MetadataState()
    for i in range(1, n + 1):
        assert ctl.next_broker_id(s, BS) == i
        ok(s, ctl.apply_broker_id(s, "c1", BS, i, check_code(i)))
    return s


def current(s: MetadataState):
    found = s.controller_set(BS)
    assert found is not None
    return found[0]


def test_broker_ids_are_offered_in_turn_and_a_taken_id_is_refused() -> None:
    s = MetadataState()
    refused = ctl.apply_broker_id(s, "c1", BS, 2, check_code(2))  # not the first id of an unknown set
    assert refused.code == ctl.BROKER_ID_INVALID and not refused.batch.records
    s = registered(2)
    bs = current(s)
    assert [(r.broker_id, r.address) for r in bs.replicas] == [(1, ADDR[1]), (2, ADDR[2])]
    assert bs.next_broker_id == 3 and bs.master_id == 0 and bs.master_epoch == 0
    again = ctl.apply_broker_id(s, "c1", BS, 2, check_code(2))  # the same broker retrying
    assert again.code == ctl.SUCCESS and not again.batch.records
    other = ctl.apply_broker_id(s, "c1", BS, 2, "10.0.0.9:30911;1")
    assert other.code == ctl.BROKER_ID_INVALID
    assert "Fail to apply brokerId: 2 in broker-set: broker-a" in other.remark


def test_the_first_election_elects_whoever_asks_first_then_the_master_stays() -> None:
    s = registered(3)
    live = Beats({1, 2, 3})
    d = ok(s, ctl.elect_master(s, BS, 2, False, live))
    assert d.elected and (d.after.master_id, d.after.master_epoch) == (2, 1)
    assert list(d.after.sync_state_set) == [2] and d.after.sync_state_set_epoch == 1
    still = ctl.elect_master(s, BS, 3, False, live)
    assert still.code == ctl.MASTER_STILL_EXIST and not still.batch.records and still.after.master_id == 2


def test_an_unregistered_set_or_broker() -> None:
    s = MetadataState()
    assert ctl.elect_master(s, BS, 1, False, Beats()).code == ctl.BROKER_NEED_TO_BE_REGISTERED
    assert ctl.register_broker(s, BS, 1, ADDR[1], Beats()).code == ctl.BROKER_NEED_TO_BE_REGISTERED
    assert ctl.replica_info(s, BS).code == ctl.BROKER_METADATA_NOT_EXIST
    s = registered(1)
    refused = ctl.register_broker(s, BS, 7, ADDR[1], Beats())
    assert refused.code == ctl.BROKER_NEED_TO_BE_REGISTERED and "BrokerId: 7" in refused.remark


def test_register_updates_a_moved_address_only() -> None:
    s = registered(2)
    assert not ctl.register_broker(s, BS, 2, ADDR[2], Beats()).batch.records
    moved = ok(s, ctl.register_broker(s, BS, 2, "10.0.0.22:30911", Beats()))
    assert moved.batch.records and [r.address for r in current(s).replicas] == [ADDR[1], "10.0.0.22:30911"]


def _with_master(alive: set[int]) -> tuple[MetadataState, Beats]:
    s = registered(3)
    live = Beats(alive)
    ok(s, ctl.elect_master(s, BS, 1, False, Beats({1, 2, 3})))
    ok(s, ctl.alter_sync_state_set(s, BS, 1, 1, [1, 2, 3], 1, Beats({1, 2, 3})))
    return s, live


def test_alter_sync_state_set_is_fenced_by_both_epochs_in_rocketmqs_order() -> None:
    s, live = _with_master({1, 2, 3})
    bs = current(s)
    assert list(bs.sync_state_set) == [1, 2, 3] and bs.sync_state_set_epoch == 2
    cases = [
        ((1, 1, [1, 2, 3], 2), ctl.ALTER_SYNC_STATE_SET_FAILED, "equal with oldSyncStateSet"),
        ((2, 1, [1, 2], 2), ctl.INVALID_MASTER, "current leader is:{1}, not {2}"),
        ((1, 0, [1, 2], 2), ctl.FENCED_MASTER_EPOCH, "current master epoch is:{1}, not {0}"),
        ((1, 1, [1, 2], 1), ctl.FENCED_SYNC_STATE_SET_EPOCH, "current syncStateSet epoch is:{2}, not {1}"),
        ((1, 1, [1, 9], 2), ctl.INVALID_REPLICAS, "replicas {9} don't exist"),
        ((1, 1, [2, 3], 2), ctl.ALTER_SYNC_STATE_SET_FAILED, "don't contains origin leader {1}"),
    ]
    for (master, epoch, new, ss_epoch), code, remark in cases:
        d = ctl.alter_sync_state_set(s, BS, master, epoch, new, ss_epoch, live)
        assert (d.code, d.batch.records[:]) == (code, []), d.remark
        assert remark in d.remark
    dead = ctl.alter_sync_state_set(s, BS, 1, 1, [1, 2, 3, 3], 2, Beats({1, 2}))
    assert dead.code == ctl.ALTER_SYNC_STATE_SET_FAILED  # equal as a set: checked before liveness
    gone = ctl.alter_sync_state_set(s, BS, 1, 1, [1, 3], 2, Beats({1, 2}))
    assert gone.code == ctl.BROKER_NOT_ALIVE and "replicas {3} don't alive" in gone.remark
    shrink = ok(s, ctl.alter_sync_state_set(s, BS, 1, 1, [1, 2], 2, live))
    assert list(shrink.after.sync_state_set) == [1, 2] and shrink.after.sync_state_set_epoch == 3


def test_election_after_the_master_dies_takes_the_best_in_sync_replica() -> None:
    s, _ = _with_master({1, 2, 3})
    # 3 has the newest epoch; among equal epochs, the larger offset; then the lower priority number
    live = Beats({2, 3}, ranks={2: (1, 500, 0), 3: (1, 900, 0)})
    assert ctl.needs_election(s, live) == [BS]
    d = ok(s, ctl.elect_master(s, BS, ctl.NO_BROKER, False, live))
    assert (d.after.master_id, d.after.master_epoch, list(d.after.sync_state_set)) == (3, 2, [3])
    assert d.after.sync_state_set_epoch == 3 and ctl.needs_election(s, live) == []
    s, _ = _with_master({1, 2, 3})
    tie = Beats({2, 3}, ranks={2: (1, 900, 5), 3: (1, 900, 1)})
    assert ctl.elect_master(s, BS, ctl.NO_BROKER, False, tie).after.master_id == 3


def test_no_in_sync_replica_alive_records_no_master_unless_unclean() -> None:
    s, _ = _with_master({1, 2, 3})
    ok(s, ctl.alter_sync_state_set(s, BS, 1, 1, [1], 2, Beats({1, 2, 3})))  # 2 and 3 fell behind
    live = Beats({2})
    asked = ctl.elect_master(s, BS, 2, False, live)  # a broker asking for itself: refused, nothing written
    assert asked.code == ctl.ELECT_MASTER_FAILED and not asked.batch.records
    unclean = ctl.elect_master(s, BS, ctl.NO_BROKER, False, live, unclean=True)
    assert unclean.code == ctl.SUCCESS and unclean.after.master_id == 2
    d = ctl.elect_master(s, BS, ctl.NO_BROKER, False, live)
    assert d.code == ctl.MASTER_NOT_AVAILABLE and d.batch.records  # the scan records "no master"
    assert apply(s, d)
    assert (current(s).master_id, current(s).master_epoch) == (0, 2)
    assert list(current(s).sync_state_set) == [1]  # kept: 1 may come back, and it is the one in sync
    assert ctl.needs_election(s, live) == []  # nothing more to do until someone in sync is back
    back = ok(s, ctl.elect_master(s, BS, 1, False, Beats({1, 2})))
    assert (back.after.master_id, back.after.master_epoch) == (1, 3)


def test_a_designated_election_elects_that_broker_or_nobody() -> None:
    s, live = _with_master({1, 2, 3})
    d = ok(s, ctl.elect_master(s, BS, 2, True, live))
    assert d.after.master_id == 2 and d.after.master_epoch == 2
    out_of_sync = ctl.elect_master(s, BS, 3, True, live)  # 3 left the in-sync set at the election
    assert out_of_sync.code == ctl.ELECT_MASTER_FAILED


def test_clean_refuses_living_brokers_and_removes_the_set_when_emptied() -> None:
    s, live = _with_master({1, 2, 3})
    whole = ctl.clean_broker_data(s, BS, [], False, live)
    assert whole.code == ctl.INVALID_CLEAN_BROKER_METADATA and "still alive" in whole.remark
    one = ctl.clean_broker_data(s, BS, [3], False, live)
    assert one.code == ctl.INVALID_CLEAN_BROKER_METADATA and "[broker-a,  3]" in one.remark
    ok(s, ctl.clean_broker_data(s, BS, [3], False, Beats({1, 2})))
    assert [r.broker_id for r in current(s).replicas] == [1, 2] and list(current(s).sync_state_set) == [1, 2]
    ok(s, ctl.clean_broker_data(s, BS, [], True, live))
    assert s.controller_set(BS) is None
    assert ctl.clean_broker_data(s, BS, [], True, live).code == ctl.INVALID_CLEAN_BROKER_METADATA


@pytest.mark.parametrize("first", ["elect", "alter"])
def test_a_decision_on_a_stale_version_is_a_no_op(first: str) -> None:
    # Two decisions taken on the same state: the second one's precondition fails at apply time.
    s, live = _with_master({1, 2, 3})
    elect = ctl.elect_master(s, BS, 2, True, live)
    alter = ctl.alter_sync_state_set(s, BS, 1, 1, [1, 2], 2, live)
    a, b = (elect, alter) if first == "elect" else (alter, elect)
    assert apply(s, a) and not apply(s, b)


def test_each_decision_leaves_the_digest_deterministic() -> None:
    def run() -> str:
        s, live = _with_master({1, 2, 3})
        ok(s, ctl.elect_master(s, BS, ctl.NO_BROKER, False, Beats({2, 3}, {2: (1, 5, 0), 3: (1, 4, 0)})))
        return s.digest_hex

    assert run() == run()
