"""Sharding's directory (nameserver/state/shards/directory.py) and its writes, a set's move included
(nameserver/state/shards/moves.py): pure translations applied to real MetadataStates."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from nameserver.errors import ValidationError
from nameserver.pb import api_pb2, state_pb2
from nameserver.state import (
    MetadataState,
    Translation,
    delete_topic,
    expire_broker,
    keys,
    register_broker,
    register_topic,
    wipe_write_perm,
)
from nameserver.state import controller as ctl
from nameserver.state.shards import duty, moves
from nameserver.state.shards.directory import default_group
from nameserver.state.shards.merge import ReplicaBehind, merge_route
from raftlog.pb import entry_pb2

TIMEOUT = 120_000


def apply(state: MetadataState, tr: Translation) -> bool:
    """Apply a translation as its own entry (an empty one is not proposed: nothing to apply)."""
    if not tr.batch.records:
        return True
    return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0].applied


def reg(name: str, addr: str, bid: int = 0, topics: tuple[str, ...] = ("T1", "T2"),
        filters: tuple[str, ...] = ()) -> api_pb2.RegisterBrokerRequest:
    req = api_pb2.RegisterBrokerRequest(cluster_name="c1", broker_name=name, broker_addr=addr, broker_id=bid,
                                        filter_servers=list(filters))
    req.data_version.counter = 1
    for topic in topics:
        req.topics.add(topic_name=topic, read_queue_nums=4, write_queue_nums=4, perm=6)
    return req


def register(state: MetadataState, req: api_pb2.RegisterBrokerRequest) -> None:
    assert apply(state, register_broker(state, req, TIMEOUT))


# ---- the default assignment ------------------------------------------------------------------------

NAMES = [f"broker-{i}" for i in range(2000)]


def test_default_group_spreads_sets_and_adding_a_group_moves_only_sets_to_it() -> None:
    """Rendezvous hashing: each of 4 groups gets about a quarter, and with a 5th group a set either keeps
    its group or goes to the new one (so the hash never shuffles sets between the old groups)."""
    four = {name: default_group(name, 4) for name in NAMES}
    counts = Counter(four.values())
    assert sorted(counts) == [0, 1, 2, 3] and all(400 <= n <= 600 for n in counts.values()), counts
    five = {name: default_group(name, 5) for name in NAMES}
    moved = [name for name in NAMES if five[name] != four[name]]
    assert moved and all(five[name] == 4 for name in moved)
    assert all(default_group(name, 1) == 0 for name in NAMES[:10])
    with pytest.raises(ValueError, match="groups"):
        default_group("b", 0)


def test_default_group_is_the_same_in_every_process() -> None:
    """Not Python's salted str hash: another interpreter with another hash seed assigns alike."""
    code = ("from nameserver.state.shards.directory import default_group; "
            f"print([default_group(n, 3) for n in {NAMES[:200]!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONHASHSEED": "12345"}).stdout
    assert out.strip() == repr([default_group(n, 3) for n in NAMES[:200]])


# ---- the directory's writes --------------------------------------------------------------------------

def test_assign_set_writes_the_hash_group_once_and_keeps_sets_group0_already_holds() -> None:
    g0 = MetadataState()
    name = next(n for n in NAMES if default_group(n, 2) == 1)
    tr = moves.assign_set(g0, name, "c1", 2)
    assert [(r.key, r.op) for r in tr.batch.records] == [(keys.shard_key(name), entry_pb2.OP_PUT)]
    assert apply(g0, tr)
    assert g0.directory.group_of(name) == 1 and g0.directory.entry(name).cluster == "c1"
    assert moves.assign_set(g0, name, "c1", 2).empty  # assigned: nothing to write (idempotent)
    # a set registered while the cluster had one group stays in group 0 (no record needed to say so, but
    # its first assignment says it: the hash would have sent it to group 1)
    legacy = next(n for n in NAMES if default_group(n, 2) == 1 and n != name)
    assert g0.directory.group_of(legacy) == 0 and not g0.directory.assigned(legacy)
    register(g0, reg(legacy, "10.0.0.9:10911"))
    assert apply(g0, moves.assign_set(g0, legacy, "c1", 2)) and g0.directory.group_of(legacy) == 0
    # controller mode's record does not: every set's is group 0's (docs/scaling.md, "Controller mode with
    # groups"), and a set whose brokers took their ids first goes where its hash says
    ctl_only = next(n for n in NAMES if default_group(n, 2) == 1 and n not in (name, legacy))
    assert apply(g0, ctl.apply_broker_id(g0, "c1", ctl_only, 1, "10.0.0.8:30911;1"))
    assert apply(g0, moves.assign_set(g0, ctl_only, "c1", 2)) and g0.directory.group_of(ctl_only) == 1


def test_assign_set_is_refused_at_apply_when_group0_registered_the_set_meanwhile() -> None:
    g0 = MetadataState()
    name = next(n for n in NAMES if default_group(n, 2) == 1)
    tr = moves.assign_set(g0, name, "c1", 2)
    register(g0, reg(name, "10.0.0.1:10911"))  # lands between translation and apply
    assert not apply(g0, tr) and not g0.directory.assigned(name)


def test_pin_set_chooses_the_group_of_a_new_set_and_refuses_one_held_elsewhere() -> None:
    g0 = MetadataState()
    assert apply(g0, moves.pin_set(g0, "b1", 1, 3))
    found = g0.directory.entry("b1")
    assert (found.group, found.pinned) == (1, True)
    with pytest.raises(ValidationError) as err:
        moves.pin_set(g0, "b1", 2, 3)
    assert err.value.field == "group" and "move it" in str(err.value)
    with pytest.raises(ValidationError) as err:
        moves.pin_set(g0, "b2", 3, 3)
    assert err.value.field == "group"
    register(g0, reg("b3", "10.0.0.3:10911"))  # held by group 0, unassigned
    with pytest.raises(ValidationError):
        moves.pin_set(g0, "b3", 1, 3)
    assert apply(g0, moves.pin_set(g0, "b3", 0, 3)) and g0.directory.entry("b3").pinned


def test_the_directory_index_is_rebuilt_by_a_restore() -> None:
    g0 = MetadataState()
    for name in ("a", "b/c", "d~e"):
        assert apply(g0, moves.pin_set(g0, name, 1, 2))
    restored = MetadataState()
    restored.restore(g0.offset, list(g0.kv.items()))
    assert restored.directory.names() == ["a", "b/c", "d~e"] == g0.directory.names()
    assert all(restored.directory.group_of(n) == 1 for n in restored.directory.names())


# ---- a set's move, step by step -------------------------------------------------------------------------

SET = "broker-m"


def _fleet() -> list[MetadataState]:
    """Group 0 holds broker-z (and the directory, and SET's controller record: every set's is group 0's);
    group 1 holds SET (a master, a slave, filter servers), both serving topic T1."""
    g0, g1, g2 = MetadataState(), MetadataState(), MetadataState()
    assert apply(g0, moves.pin_set(g0, SET, 1, 3))
    register(g0, reg("broker-z", "10.0.0.26:10911", topics=("T1", "T3")))
    register(g1, reg(SET, "10.0.0.1:10911", filters=("f:1",)))
    register(g1, reg(SET, "10.0.0.2:10911", bid=1))
    assert apply(g0, ctl.apply_broker_id(g0, "c1", SET, 1, "10.0.0.1:30911;1"))
    return [g0, g1, g2]


def _records(state: MetadataState, name: str) -> dict[str, bytes]:
    return {key: state.kv.get(key) or b"" for key in moves.set_keys(state, name)}


def test_a_move_copies_every_record_and_no_read_loses_the_set_at_any_step() -> None:
    groups = _fleet()
    g0, g1, g2 = groups
    before = merge_route(groups, "T1").route
    assert [bd.broker_name for bd in before.broker_datas] == ["broker-m", "broker-z"]
    held = _records(g1, SET)
    assert len(held) == 6  # broker/, 2 topics, 2 live/, 1 filter/ (its ctrl/ record is group 0's)
    ctrl = g0.kv.get(keys.controller_key(SET))
    assert ctrl is not None

    def steps() -> list[tuple[MetadataState, Translation]]:
        return [(g0, moves.begin_move(g0, SET, 2, 3)), (g1, moves.fence_set(g1, SET, 1, 2)),
                (g2, moves.copy_set(g1, g2, 2, SET))]

    for state, tr in steps():
        assert not tr.empty and apply(state, tr)
        assert merge_route(groups, "T1").route == before
    assert _records(g2, SET) == held  # the copy is byte for byte the source's
    assert all(tr.empty for _, tr in steps())  # every step done: running them again writes nothing
    copied_at = g2.offset
    g2.apply_entry(g2.offset + 1, entry_pb2.Entry())  # the target moves on (its copy stays)
    done = moves.finish_move(g0, SET, 2, copied_at)
    assert apply(g0, done) and g0.directory.group_of(SET) == 2 and g0.directory.floor() == {2: copied_at}
    assert moves.finish_move(g0, SET, 2, copied_at).empty
    assert merge_route(groups, "T1").route == before
    assert apply(g1, moves.drop_set(g1, g0, 1, SET))
    assert not _records(g1, SET)  # records gone, the fence now a tombstone naming the set's group
    assert g1.directory.entry(SET) == state_pb2.ShardSet(group=2)
    assert moves.drop_set(g1, g0, 1, SET).empty
    assert merge_route(groups, "T1").route == before
    assert g0.kv.get(keys.controller_key(SET)) == ctrl and keys.controller_key(SET) not in g2.kv  # never moved


def test_a_read_waits_for_the_target_to_hold_the_copy_the_directory_names() -> None:
    """A worker whose group-0 replica has the move done but whose target replica has not applied the copy
    must not answer from it (nor from the source, which may have dropped the set): it waits."""
    groups = _fleet()
    g0, g1, g2 = groups
    lagging = MetadataState()  # the worker's replica of group 2, before the copy
    for state, tr in [(g0, moves.begin_move(g0, SET, 2, 3)), (g1, moves.fence_set(g1, SET, 1, 2)),
                      (g2, moves.copy_set(g1, g2, 2, SET))]:
        assert apply(state, tr)
    assert apply(g0, moves.finish_move(g0, SET, 2, g2.offset))
    with pytest.raises(ReplicaBehind) as behind:
        merge_route([g0, g1, lagging], "T1")
    assert behind.value.waits == {2: g2.offset}
    with pytest.raises(ReplicaBehind) as asked:  # the client's min-offset vector is a floor too
        merge_route(groups, "T1", min_offsets=(0, g1.offset + 5))
    assert asked.value.waits == {1: g1.offset + 5}


def test_a_write_translated_before_the_fence_applies_is_refused_and_its_retry_finds_the_set_moving() -> None:
    """The source accepts nothing of the set once its fence is in its log, whatever its directory replica
    said when it translated: the fence's absence is a precondition of every write of the set."""
    g0, g1, _g2 = _fleet()
    late = moves.guard_set_writes(g1, register_broker(g1, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 1)
    assert apply(g0, moves.begin_move(g0, SET, 2, 3))
    assert apply(g1, moves.fence_set(g1, SET, 1, 2))
    assert not apply(g1, late)  # a no-op at apply: the copy cannot miss it
    with pytest.raises(moves.SetMoving) as moving:
        moves.guard_set_writes(g1, register_broker(g1, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 1)
    assert moving.value.target == 2
    assert not moves.guard_set_writes(g1, Translation(), 1).batch.preconditions  # nothing written: no guard


def test_every_write_touching_a_fenced_set_is_refused_whatever_its_request() -> None:
    """The guard reads the records a translation writes, not the request: a topic deleted or registered on
    several sets, a write permission change, an expiry, a live/-only change are all caught."""
    g0, g1, _g2 = _fleet()
    register(g1, reg("other", "10.0.0.7:10911"))
    live_only = reg(SET, "10.0.0.2:10911", bid=1)
    live_only.heartbeat_timeout_ms = 5_000  # changes only the address's live/ record
    assert [r.key for r in register_broker(g1, live_only, TIMEOUT).batch.records] == ["live/10.0.0.2:10911"]
    slave = "10.0.0.2:10911"
    writes = [delete_topic(g1, "T1"), wipe_write_perm(g1, SET), expire_broker(g1, slave, g1.live_version(slave)),
              register_broker(g1, live_only, TIMEOUT),
              register_topic(g1, "T9", [state_pb2.QueueData(broker_name=n, perm=6) for n in ("other", SET)])]
    assert all(moves.sets_written(g1, tr) >= {SET} for tr in writes)
    assert moves.sets_written(g1, wipe_write_perm(g1, "other")) == {"other"}
    gone = Translation(batch=entry_pb2.Batch(records=[  # an address's records alone name its set by its live/
        entry_pb2.Record(type=keys.FILTER_TYPE, op=entry_pb2.OP_DELETE, key=keys.filter_key(slave))]))
    assert moves.sets_written(g1, gone) == {SET}
    assert apply(g0, moves.begin_move(g0, SET, 2, 3)) and apply(g1, moves.fence_set(g1, SET, 1, 2))
    for tr in writes:
        with pytest.raises(moves.SetMoving):
            moves.guard_set_writes(g1, tr, 1)
    assert apply(g1, moves.guard_set_writes(g1, wipe_write_perm(g1, "other"), 1))


def test_move_steps_refuse_bad_input_by_field() -> None:
    g0, g1, _g2 = _fleet()
    cases = [(lambda: moves.begin_move(g0, SET, 3, 3), "group"), (lambda: moves.begin_move(g0, SET, 1, 3), "group"),
             (lambda: moves.begin_move(g0, "nobody", 2, 3), "broker_name"),
             (lambda: moves.finish_move(g0, SET, 2, 5), "broker_name"),
             (lambda: moves.drop_set(g1, g0, 1, SET), "broker_name")]
    for call, field in cases:
        with pytest.raises(ValidationError) as err:
            call()
        assert err.value.field == field
    assert apply(g0, moves.begin_move(g0, SET, 2, 3))
    with pytest.raises(ValidationError) as err:
        moves.begin_move(g0, SET, 0, 3)
    assert err.value.field == "group" and "already moving" in str(err.value)
    with pytest.raises(ValidationError) as err:
        moves.finish_move(g0, SET, 2, 0)
    assert err.value.field == "since"
    assert moves.begin_move(g0, SET, 2, 3).empty


def test_a_set_held_by_group0_before_sharding_moves_out_with_the_directory_record_as_its_fence() -> None:
    g0, g1 = MetadataState(), MetadataState()
    register(g0, reg("old", "10.0.0.5:10911"))
    assert apply(g0, moves.begin_move(g0, "old", 1, 2))
    assert moves.fence_set(g0, "old", 0, 1).empty  # group 0's fence is the directory record
    with pytest.raises(moves.SetMoving):
        moves.guard_set_writes(g0, register_broker(g0, reg("old", "10.0.0.6:10911", bid=1), TIMEOUT), 0)
    assert apply(g1, moves.copy_set(g0, g1, 1, "old"))
    assert apply(g0, moves.finish_move(g0, "old", 1, g1.offset))
    assert apply(g0, moves.drop_set(g0, g0, 0, "old"))
    assert not _records(g0, "old") and g0.directory.group_of("old") == 1  # the directory record stays
    route = merge_route([g0, g1], "T1").route
    assert [bd.broker_name for bd in route.broker_datas] == ["old"]



def _move(groups: list[MetadataState], name: str, target: int) -> None:
    """moves.py's six steps, each applied in its group."""
    g0 = groups[0]
    source = g0.directory.group_of(name)
    assert apply(g0, moves.begin_move(g0, name, target, len(groups)))
    assert apply(groups[source], moves.fence_set(groups[source], name, source, target))
    assert apply(groups[target], moves.copy_set(groups[source], groups[target], target, name))
    assert apply(g0, moves.finish_move(g0, name, target, max(groups[target].offset, 1)))
    assert apply(groups[target], moves.open_set(groups[target], g0, target, name))
    assert apply(groups[source], moves.drop_set(groups[source], g0, source, name))


def test_a_write_held_through_a_whole_move_is_a_no_op_when_it_reaches_the_source_after_the_drop() -> None:
    """The drop leaves a tombstone: the source's shard/ record is never absent again, so a write translated
    before the fence (its precondition: the record absent) fails whenever it reaches the log, and one
    translated after the drop (a router whose directory replica lags) is refused naming the set's group."""
    groups = _fleet()
    g0, g1, _g2 = groups
    assert apply(g0, moves.pin_set(g0, "new", 1, 3))  # a set with no records yet: its brokers not started
    first = moves.guard_set_writes(g1, register_broker(g1, reg("new", "10.0.0.9:10911"), TIMEOUT), 1)
    held = moves.guard_set_writes(g1, register_broker(g1, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 1)
    _move(groups, "new", 2)
    _move(groups, SET, 2)
    assert not apply(g1, first) and not _records(g1, "new")  # its only guard: the record the drop keeps
    assert not apply(g1, held) and not _records(g1, SET)  # nothing of either set where no read takes it
    with pytest.raises(moves.SetMoved) as moved:
        moves.guard_set_writes(g1, register_broker(g1, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 1)
    assert moved.value.target == 2 and "moved to group 2: retry" in str(moved.value)
    assert isinstance(moved.value, moves.SetMoving)  # refused as a moving set's writes are: retriable
    assert moves.drop_set(g1, g0, 1, SET).empty


def test_group0_refuses_writes_of_a_set_its_directory_places_in_another_group() -> None:
    """In group 0 the directory's record is the set's fence and tombstone: a set it held before sharding,
    moved out, is refused there like any set the directory places elsewhere."""
    g0, g1 = MetadataState(), MetadataState()
    register(g0, reg("old", "10.0.0.5:10911"))
    held = moves.guard_set_writes(g0, register_broker(g0, reg("old", "10.0.0.6:10911", bid=1), TIMEOUT), 0)
    _move([g0, g1], "old", 1)
    assert not apply(g0, held)
    with pytest.raises(moves.SetMoved) as moved:
        moves.guard_set_writes(g0, register_broker(g0, reg("old", "10.0.0.6:10911", bid=1), TIMEOUT), 0)
    assert moved.value.target == 1
    assert apply(g1, moves.guard_set_writes(g1, register_broker(g1, reg("old", "10.0.0.6:10911", bid=1), TIMEOUT), 1))


def test_a_set_moved_back_is_written_in_its_old_group_once_opened_but_a_write_from_before_it_left_is_not() -> None:
    """Moving back into a group holding the set's tombstone, the set's writes are refused there until the
    move is finished and the group opened (step 5: a record naming the group, at a new version), so
    nothing is written there that a copy run again would delete; a write translated before the set first
    left still fails. Each step is empty when run again."""
    groups = _fleet()
    g0, g1, g2 = groups
    stale = moves.guard_set_writes(g1, register_broker(g1, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 1)
    _move(groups, SET, 2)
    assert moves.open_set(g2, g0, 2, SET).empty  # the move opened group 2 (its record names it): done
    assert apply(g0, moves.begin_move(g0, SET, 1, 3)) and apply(g2, moves.fence_set(g2, SET, 2, 1))
    assert apply(g1, moves.copy_set(g2, g1, 1, SET))
    with pytest.raises(ValidationError) as err:
        moves.open_set(g1, g0, 1, SET)
    assert err.value.field == "broker_name"
    assert apply(g0, moves.finish_move(g0, SET, 1, g1.offset))
    with pytest.raises(moves.SetMoved) as moved:  # a router whose directory shows the move done: not yet
        moves.guard_set_writes(g1, register_broker(g1, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 1)
    assert moved.value.target == 2  # the tombstone's group: the router, asked again, sends it here
    assert apply(g1, moves.open_set(g1, g0, 1, SET)) and moves.open_set(g1, g0, 1, SET).empty
    assert apply(g2, moves.drop_set(g2, g0, 2, SET)) and moves.drop_set(g2, g0, 2, SET).empty
    assert g1.directory.entry(SET) == state_pb2.ShardSet(group=1)  # taken here again, at a new version
    assert g2.directory.entry(SET) == state_pb2.ShardSet(group=1)  # group 2's tombstone
    assert not apply(g1, stale)
    assert apply(g1, moves.guard_set_writes(g1, register_broker(g1, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 1))
    with pytest.raises(moves.SetMoved):
        moves.guard_set_writes(g2, register_broker(g2, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 2)
    route = merge_route(groups, "T1").route
    bd = next(bd for bd in route.broker_datas if bd.broker_name == SET)
    assert [a.addr for a in bd.addrs] == ["10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"]


# ---- a copy decided from a stale read (docs/scaling.md, "How the duty resumes") ----------------------------

def _as_read(state: MetadataState) -> MetadataState:
    """A replica's copy of `state` as it is now: what a driver read before the state moved on."""
    read = MetadataState()
    read.restore(state.offset, list(state.kv.items()))
    return read


def test_a_copy_decided_before_the_finish_is_a_no_op_when_it_applies_after_the_target_took_writes() -> None:
    """A copy decided, then held (or decided again by a driver that did not see the finish), reaching the
    target's log after the move finished and a broker registered there: its preconditions (the target's
    records and shard/ record at the versions read) fail, and the registration stays."""
    groups = _fleet()
    g0, g1, g2 = groups
    assert apply(g0, moves.begin_move(g0, SET, 2, 3)) and apply(g1, moves.fence_set(g1, SET, 1, 2))
    stale = moves.copy_set(g1, g2, 2, SET)
    assert apply(g2, moves.copy_set(g1, g2, 2, SET))
    assert apply(g0, moves.finish_move(g0, SET, 2, g2.offset))
    assert apply(g2, moves.open_set(g2, g0, 2, SET))
    assert g2.directory.entry(SET) == state_pb2.ShardSet(group=2)  # a first move opens its target too
    new = moves.guard_set_writes(g2, register_broker(g2, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 2)
    assert apply(g2, new)
    held = _records(g2, SET)
    assert not apply(g2, stale)
    assert _records(g2, SET) == held
    bd = next(bd for bd in merge_route(groups, "T1").route.broker_datas if bd.broker_name == SET)
    assert [a.addr for a in bd.addrs] == ["10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"]


def test_a_copy_into_a_group_that_opened_the_set_is_refused_by_field() -> None:
    """A driver whose read of group 0 is older than the finish (the set still moving) and whose read of the
    target is newer (opened, a new registration there) would copy the source's records over the target's
    and delete the new one: the copy is refused, nothing is written."""
    groups = _fleet()
    g0, g1, g2 = groups
    assert apply(g0, moves.begin_move(g0, SET, 2, 3)) and apply(g1, moves.fence_set(g1, SET, 1, 2))
    before_finish = _as_read(g0)
    assert apply(g2, moves.copy_set(g1, g2, 2, SET))
    assert apply(g0, moves.finish_move(g0, SET, 2, g2.offset)) and apply(g2, moves.open_set(g2, g0, 2, SET))
    assert apply(g2, moves.guard_set_writes(g2, register_broker(g2, reg(SET, "10.0.0.3:10911", bid=2), TIMEOUT), 2))
    with pytest.raises(ValidationError) as err:
        moves.copy_set(g1, g2, 2, SET)
    assert err.value.field == "group" and "holds set" in str(err.value)
    with pytest.raises(ValidationError) as err:  # the decider refuses alike: the step is decided again from fresh reads
        duty.decide([before_finish, g1, g2], duty.MoveOrder(SET, 2))
    assert err.value.field == "group"
    g0_moved_back = MetadataState()  # a copy into group 0 it holds as its own: the directory names 0, not moving
    assert apply(g0_moved_back, moves.pin_set(g0_moved_back, SET, 0, 3))
    with pytest.raises(ValidationError):
        moves.copy_set(g1, g0_moved_back, 0, SET)


def test_the_target_of_a_first_move_is_opened_and_a_resumed_leader_finds_it_unopened() -> None:
    """A target k >= 1 the set never held gets its record at step 5 as a move back does; a leader killed
    between the finish and the opening of a set with no records (nothing left to drop) resumes it."""
    g0, g1 = MetadataState(), MetadataState()
    assert apply(g0, moves.pin_set(g0, "empty", 0, 2))
    assert apply(g0, moves.begin_move(g0, "empty", 1, 2))
    assert moves.copy_set(g0, g1, 1, "empty").empty  # no records: nothing to copy
    assert apply(g0, moves.finish_move(g0, "empty", 1, 1))
    states = [g0, g1]
    assert duty.pending_moves(states) == [duty.MoveOrder("empty", 1)]
    step = duty.decide(states)
    assert isinstance(step, duty.Step) and (step.kind, step.group) == (duty.OPEN, 1)
    assert apply(g1, step.translation) and g1.directory.entry("empty") == state_pb2.ShardSet(group=1)
    assert duty.decide(states) == duty.Idle()
    assigned = MetadataState()  # a set assigned to group 1 at its first registration needs no opening
    assert apply(assigned, moves.pin_set(assigned, "fresh", 1, 2))
    assert duty.pending_moves([assigned, MetadataState()]) == []
