"""Controller mode with several groups, in the pure layer (docs/scaling.md, "Controller mode with groups"):
every controller record (ctrl/<name>) is group 0's, whichever group holds the set's routes. A controller
write is no set's write (no guard, no precondition on the set's shard/ record, refused outside group 0), a
set's keys leave it out, a move never copies or drops it (nor finds it a leftover), and a set first claimed
through the controller is placed by its hash, not kept in group 0 by its ctrl/ record."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from nameserver.errors import ValidationError
from nameserver.pb import api_pb2
from nameserver.state import MetadataState, Translation, keys, register_broker
from nameserver.state import controller as ctl
from nameserver.state.shards import duty, moves
from nameserver.state.shards.directory import default_group
from raftlog.pb import entry_pb2

TIMEOUT = 120_000
GROUPS = 2
NAMES = [f"ctl-set-{i}" for i in range(64)]
IN_1 = next(n for n in NAMES if default_group(n, GROUPS) == 1)   # its hash places it in group 1
IN_0 = next(n for n in NAMES if default_group(n, GROUPS) == 0)


class Beats:
    """Every broker alive but `silent`, none ranked: what an election needs of a heartbeat table."""

    def __init__(self, silent: frozenset[int] = frozenset()) -> None:
        self.silent = silent

    def alive(self, broker_name: str, broker_id: int) -> bool:
        return broker_id not in self.silent

    def rank(self, broker_name: str, broker_id: int) -> tuple[int, int, int] | None:
        return None


def apply(state: MetadataState, tr: Translation) -> bool:
    if not tr.batch.records:
        return True
    return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0].applied


def reg(name: str, bid: int) -> api_pb2.RegisterBrokerRequest:
    req = api_pb2.RegisterBrokerRequest(cluster_name="c1", broker_name=name, broker_id=bid,
                                        broker_addr=f"10.0.0.{bid + 1}:10911")
    req.data_version.counter = 1
    req.topics.add(topic_name="T1", read_queue_nums=4, write_queue_nums=4, perm=6)
    return req


def claimed(g0: MetadataState, name: str, brokers: int = 2) -> None:
    """The set's brokers take ids and register with the controller (group 0's core), then a master is
    elected: its ctrl/ record in group 0."""
    for bid in range(1, brokers + 1):
        assert apply(g0, moves.guard_set_writes(g0, ctl.apply_broker_id(g0, "c1", name, bid, f"a{bid};1"), 0))
        assert apply(g0, moves.guard_set_writes(
            g0, ctl.register_broker(g0, name, bid, f"10.0.0.{bid + 1}:30911", Beats()), 0))
    elected = moves.guard_set_writes(g0, ctl.elect_master(g0, name, 1, False, Beats(), False), 0)
    assert apply(g0, elected)


def registered_in(states: Sequence[MetadataState], name: str) -> int:
    """The set's NameServer registration, placed as the router does (group 0 assigns it first)."""
    g0 = states[0]
    assert apply(g0, moves.assign_set(g0, name, "c1", GROUPS))
    group = g0.directory.group_of(name)
    for bid in (0, 1):
        state = states[group]
        assert apply(state, moves.guard_set_writes(state, register_broker(state, reg(name, bid), TIMEOUT), group))
    return group


class Groups:
    """run_move's executor over in-process states."""

    def __init__(self, states: list[MetadataState]) -> None:
        self.states = states

    @property
    def groups(self) -> int:
        return len(self.states)

    def read(self, group: int, at_least: int) -> MetadataState:
        return self.states[group]

    def propose(self, group: int, translation: Translation) -> int:
        moves.check_step(translation.batch)  # as Admin.ProposeStep checks a step for group k
        assert apply(self.states[group], translation)
        return self.states[group].offset


def ctrl_record(state: MetadataState, name: str) -> tuple[bytes | None, int]:
    key = keys.controller_key(name)
    return state.kv.get(key), state.kv.version(key)


def test_a_controller_write_names_no_set_and_is_taken_in_group0_wherever_the_set_is() -> None:
    g0, g1 = MetadataState(), MetadataState()
    assert apply(g0, moves.pin_set(g0, IN_1, 1, GROUPS))
    tr = ctl.apply_broker_id(g0, "c1", IN_1, 1, "a1;1")
    assert moves.sets_written(g0, tr) == set()
    # group 0's directory places the set in group 1: its NameServer writes there would be SetMoved, but its
    # controller record is group 0's own, taken with no precondition on the set's shard/ record
    guarded = moves.guard_set_writes(g0, tr, 0)
    assert not guarded.batch.preconditions or all(p.key != keys.shard_key(IN_1) for p in guarded.batch.preconditions)
    assert apply(g0, guarded)
    # while the set moves (its NameServer writes refused, retriable) an election still goes on
    assert apply(g0, moves.begin_move(g0, IN_1, 0, GROUPS))
    with pytest.raises(moves.SetMoving):
        moves.guard_set_writes(g0, register_broker(g0, reg(IN_1, 0), TIMEOUT), 0)
    assert apply(g0, moves.guard_set_writes(g0, ctl.register_broker(g0, IN_1, 1, "10.0.0.2:30911", Beats()), 0))
    assert apply(g0, moves.guard_set_writes(g0, ctl.elect_master(g0, IN_1, 1, False, Beats(), False), 0))
    # a group k >= 1 takes no controller record at all
    with pytest.raises(ValidationError) as err:
        moves.guard_set_writes(g1, ctl.apply_broker_id(g1, "c1", IN_1, 1, "a1;1"), 1)
    assert err.value.field == "broker_name" and "group 0's" in err.value.message


def test_a_set_s_keys_and_a_move_s_steps_leave_its_controller_record_out() -> None:
    g0 = MetadataState()
    claimed(g0, IN_0)
    register(g0, IN_0)
    assert keys.controller_key(IN_0) in g0.kv
    assert keys.controller_key(IN_0) not in moves.set_keys(g0, IN_0)
    assert moves.set_keys(g0, IN_0) == sorted([keys.broker_key(IN_0), keys.topic_key("T1", IN_0),
                                               keys.live_key("10.0.0.1:10911"), keys.live_key("10.0.0.2:10911")])
    step = entry_pb2.Batch(records=[entry_pb2.Record(type=keys.CONTROLLER_TYPE, op=entry_pb2.OP_PUT,
                                                     key=keys.controller_key(IN_0), value=b"")])
    with pytest.raises(ValidationError) as err:
        moves.check_step(step)
    assert err.value.field == "batch.records[0].key"


def register(g0: MetadataState, name: str) -> None:
    for bid in (0, 1):
        assert apply(g0, register_broker(g0, reg(name, bid), TIMEOUT))


def test_a_set_claimed_through_the_controller_first_is_placed_by_its_hash() -> None:
    """Brokers in controller mode take their ids before they register with the NameServer: the ctrl/
    record in group 0 does not keep the set there (its broker/ record would)."""
    states = [MetadataState(), MetadataState()]
    claimed(states[0], IN_1)
    with pytest.raises(ValidationError) as err:  # no routes anywhere yet: nothing of the set to move
        duty.validate_move(states, IN_1, 1)
    assert err.value.field == "broker_name"
    assert registered_in(states, IN_1) == 1
    assert states[1].broker_data(IN_1) is not None and states[0].broker_data(IN_1) is None
    assert keys.controller_key(IN_1) not in states[1].kv
    # nothing pending: the set's ctrl/ record in group 0 is no leftover of a move to group 1
    assert duty.pending_moves(states) == [] and duty.decide(states) == duty.Idle()
    assert duty.run_move(duty.decide, Groups(states)) == duty.Idle()
    assert ctrl_record(states[0], IN_1)[0] is not None


def test_a_set_moved_there_and_back_keeps_its_controller_record_in_group0_and_elects_after() -> None:
    states = [MetadataState(), MetadataState()]
    claimed(states[0], IN_1)
    assert registered_in(states, IN_1) == 1
    before = ctrl_record(states[0], IN_1)
    for target in (0, 1):
        order = duty.MoveOrder(IN_1, target)
        assert duty.run_move(lambda s, o=order: duty.decide(s, o), Groups(states)) == duty.Done(IN_1, target)
        assert states[target].broker_data(IN_1) is not None and states[1 - target].broker_data(IN_1) is None
        assert ctrl_record(states[0], IN_1) == before  # not copied, not dropped, not rewritten
        assert keys.controller_key(IN_1) not in states[1].kv
        assert duty.pending_moves(states) == []
    # the master reports broker 2 in sync, then goes silent: the scan's election (no broker named) is decided
    # and applied in group 0 as with one group, after both moves
    found = states[0].controller_set(IN_1)
    assert found is not None and (found[0].master_id, found[0].master_epoch) == (1, 1)
    g0 = states[0]
    synced = ctl.alter_sync_state_set(g0, IN_1, 1, 1, [1, 2], found[0].sync_state_set_epoch, Beats())
    assert synced.code == ctl.SUCCESS and apply(g0, moves.guard_set_writes(g0, synced, 0))
    assert ctl.needs_election(g0, Beats(frozenset({1}))) == [IN_1]
    again = ctl.elect_master(g0, IN_1, ctl.NO_BROKER, False, Beats(frozenset({1})), False)
    assert again.code == ctl.SUCCESS and apply(g0, moves.guard_set_writes(g0, again, 0))
    found = g0.controller_set(IN_1)
    assert found is not None and (found[0].master_id, found[0].master_epoch) == (2, 2)
