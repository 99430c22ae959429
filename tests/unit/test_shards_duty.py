"""The move duty (nameserver/state/shards/duty.py): a set moved between groups by a driver killed anywhere.

Groups are in-process MetadataStates, as in test_shards_merge.py. Brokers register while the move runs:
routed by group 0's directory (assigned first when new), translated in their set's group with group 0's
settings, guarded by its fences; one refused (its set moving, or fenced between translation and apply) is
sent again later, as a broker does. Some registrations are held on their way for longer (a core paused
between translating and proposing: they reach their group's log at any later time, after the move's drop
or a move back too), and some are routed by a stale directory (to the group the set was first given):
each must be refused there (the set's shard/ record changes at each step and is never absent again: a
tombstone, or a record naming the group again) and retried into the set's group. A driver is killed at
its n-th proposal in one of three ways: the proposal is lost, it applies but the driver never sees the
answer, or it applies later (before anything proposed to its group after it: a Raft log's order). A fresh
driver then resumes: from the directory alone when the move had begun (a new leader of group 0), else by
the operator's call sent again. At the end the set's records are in the target only and no registration
is lost: every address registered is in its set's group, and the routes equal those of one state fed the
same registrations. A set may also move with no records yet (its brokers not started): then a held first
registration has nothing of the set to fail on but the set's shard/ record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nameserver.errors import TooLargeError, ValidationError
from nameserver.pb import api_pb2, state_pb2
from nameserver.state import MetadataState, Translation, keys, quotas, register_broker
from nameserver.state.shards import duty, moves
from nameserver.state.shards.merge import merge_route
from nameserver.state.shards.router import AssignFirst, Moving, ToGroup, route
from raftlog.pb import entry_pb2

TIMEOUT = 120_000
MOVED, OTHER = "m", "o"  # the set moved; a set that stays in its group
TOPICS = ("T1", "T2")
LOST, APPLIED, LATE = "lost", "applied", "late"  # how a killed driver's proposal ends


class Killed(Exception):
    """The driver's process died."""


def reg(name: str, bid: int) -> api_pb2.RegisterBrokerRequest:
    req = api_pb2.RegisterBrokerRequest(cluster_name="c1", broker_name=name, broker_id=bid,
                                        broker_addr=f"10.{ord(name[0])}.0.{bid}:10911")
    req.data_version.counter = 1
    for topic in TOPICS:
        req.topics.add(topic_name=topic, read_queue_nums=4, write_queue_nums=4, perm=6)
    return req


@dataclass
class Late:
    """A proposal on its way to a group's log: applied before anything proposed to that group after it."""

    group: int
    translation: Translation
    request: api_pb2.RegisterBrokerRequest | None = None  # a broker's registration (None: a move's step)
    kind: str = ""  # a move's step: its kind
    held: bool = False  # not in that order: arrives only when released (flush(held=True)), at any later time


@dataclass
class Fleet:
    """G groups' states, the brokers registering into them, and one state fed the same registrations."""

    groups: int
    states: list[MetadataState] = field(default_factory=list)
    one: MetadataState = field(default_factory=MetadataState)
    late: list[Late] = field(default_factory=list)
    refused: list[api_pb2.RegisterBrokerRequest] = field(default_factory=list)  # retried later
    sent: list[str] = field(default_factory=list)  # every address a broker registered
    bids: dict[str, int] = field(default_factory=dict)
    copied_at: int = 0  # the target's offset where a copy last applied
    first: dict[str, int] = field(default_factory=dict)  # the group each set was first given

    def __post_init__(self) -> None:
        self.states = [MetadataState() for _ in range(self.groups)]

    def apply(self, group: int, tr: Translation) -> bool:
        state = self.states[group]
        return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0].applied

    def propose(self, group: int, tr: Translation) -> int:
        self.flush(group)
        self.apply(group, tr)
        return self.states[group].offset

    def flush(self, group: int | None = None, held: bool = False) -> None:
        """The proposals on their way to `group` (every group: None) reach its log and apply; the held ones
        too when `held`."""
        waiting = [item for item in self.late if (group is None or item.group == group) and (held or not item.held)]
        self.late = [item for item in self.late if item not in waiting]
        for item in waiting:
            applied = self.apply(item.group, item.translation)
            if applied and item.kind == duty.COPY:
                self.copied_at = self.states[item.group].offset
            if item.request is not None:
                self.accepted(item.request) if applied else self.refused.append(item.request)

    def accepted(self, req: api_pb2.RegisterBrokerRequest) -> None:
        tr = register_broker(self.one, req, TIMEOUT)
        assert self.one.apply_entry(self.one.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0].applied

    def new_broker(self, name: str, late: bool = False, held: bool = False, stale: bool = False) -> None:
        self.bids[name] = bid = self.bids.get(name, -1) + 1
        req = reg(name, bid)
        self.sent.append(req.broker_addr)
        self.register(req, late, held, stale)

    def register(self, req: api_pb2.RegisterBrokerRequest, late: bool = False, held: bool = False,
                 stale: bool = False) -> None:
        """As a group's core would: routed by group 0's directory, translated and guarded in the set's group,
        proposed (or, `late` or `held`, on its way). `stale`: routed by a worker whose directory replica
        still shows the fleet's start (the set in the group it was first given). Refused (the set moving or
        moved): kept to send again, routed afresh."""
        g0 = self.states[0]
        placed = route(req, g0.directory, self.groups) if not stale else ToGroup(self.first[req.broker_name])
        if isinstance(placed, AssignFirst):
            self.propose(0, moves.assign_set(g0, placed.broker_name, placed.cluster, self.groups))
            placed = route(req, g0.directory, self.groups)
        if isinstance(placed, Moving):
            self.refused.append(req)
            return
        assert isinstance(placed, ToGroup)
        state = self.states[placed.group]
        try:
            tr = moves.guard_set_writes(state, register_broker(state, req, TIMEOUT, g0), placed.group)
        except moves.SetMoving:
            self.refused.append(req)
            return
        if late or held:
            self.late.append(Late(placed.group, tr, req, held=held))
            return
        self.flush(placed.group)
        self.accepted(req) if self.apply(placed.group, tr) else self.refused.append(req)

    def retry(self) -> None:
        refused, self.refused = self.refused, []
        for req in refused:
            self.register(req)

    def settle(self) -> None:
        """Everything on its way applied, every refused registration sent again until taken."""
        for _ in range(10):
            self.flush(held=True)
            self.retry()
            if not self.refused and not self.late:
                return
        raise AssertionError(f"registrations still refused: {[r.broker_addr for r in self.refused]}")


class Driver:
    """duty.Executor over a Fleet. Before each read and proposal it runs the next event of the schedule
    (brokers registering, things on their way arriving); it dies at its `kill_at`-th proposal, `how`."""

    def __init__(self, fleet: Fleet, events: Iterator[Callable[[], None]], kill_at: int | None = None,
                 how: str = LOST) -> None:
        self.fleet, self.events, self.kill_at, self.how = fleet, events, kill_at, how
        self.proposals = 0
        self.deciding = ""  # the kind of the step last decided (the copy's offset is kept)

    def decider(self, decide: Callable[[Sequence[MetadataState]], duty.Decision]
                ) -> Callable[[Sequence[MetadataState]], duty.Decision]:
        def noted(states: Sequence[MetadataState]) -> duty.Decision:
            decided = decide(states)
            self.deciding = decided.kind if isinstance(decided, duty.Step) else ""
            return decided
        return noted

    @property
    def groups(self) -> int:
        return self.fleet.groups

    def _event(self) -> None:
        event = next(self.events, None)
        if event is not None:
            event()

    def read(self, group: int, at_least: int) -> MetadataState:
        self._event()
        state = self.fleet.states[group]
        assert state.offset >= at_least
        return state

    def propose(self, group: int, translation: Translation) -> int:
        self._event()
        assert not translation.empty
        moves.check_step(translation.batch)  # what a group core's Admin.ProposeStep takes, every step passes
        self.proposals += 1
        if self.proposals == self.kill_at:
            if self.how == LATE:
                self.fleet.late.append(Late(group, translation, kind=self.deciding))
            elif self.how == APPLIED:
                self._propose(group, translation)
            raise Killed
        return self._propose(group, translation)

    def _propose(self, group: int, translation: Translation) -> int:
        offset = self.fleet.propose(group, translation)
        if self.deciding == duty.COPY:
            self.fleet.copied_at = offset
        return offset


def move(fleet: Fleet, order: duty.MoveOrder, events: Iterator[Callable[[], None]],
         kills: Sequence[tuple[int, str]]) -> None:
    """The operator's move, its driver killed as `kills` says (at its n-th proposal, how), each time
    resumed by a fresh driver: the directory's pending moves when the move had begun, else the operator's
    call sent again. Ends when a driver answers."""
    def ordered(states: Sequence[MetadataState]) -> duty.Decision:
        return duty.decide(states, order)

    first = True
    for kill_at, how in [*kills, (None, LOST)]:
        states = fleet.states
        begun = states[0].directory.moving_to(order.broker_name) is not None or \
            states[0].directory.group_of(order.broker_name) == order.target
        decider: Callable[[Sequence[MetadataState]], duty.Decision] = duty.decide
        if first or not begun:
            duty.validate_move(states, order.broker_name, order.target)
            decider = ordered
        else:  # a new leader of group 0: whatever the directory shows under way (empty: the move is done)
            assert duty.pending_moves(states) in ([order], [])
        first = False
        driver = Driver(fleet, events, kill_at, how)
        try:
            duty.run_move(driver.decider(decider), driver)
        except Killed:
            continue
        return


def check(fleet: Fleet, order: duty.MoveOrder) -> None:
    fleet.settle()
    states, name, target = fleet.states, order.broker_name, order.target
    assert duty.decide(states, order) == duty.Done(name, target)
    assert isinstance(duty.decide(states), duty.Idle)
    directory = states[0].directory
    assert directory.group_of(name) == target and directory.moving_to(name) is None
    entry = directory.entry(name)
    assert entry is not None and entry.since >= fleet.copied_at and entry.since > 0  # reads wait for its copy
    for group, state in enumerate(states):
        if group != target:
            assert not moves.set_keys(state, name), group
            # group k >= 1: a tombstone where the set was (refusing its writes), else no record
            assert group == 0 or moves.tombstoned(state, group, name) or keys.shard_key(name) not in state.kv, group
    held = sorted(addr for group, state in enumerate(states) for addr, live, _ in state.live_addrs()
                  if directory.group_of(live.broker_name) == group)
    assert held == fleet.one.registered_addrs() == sorted(fleet.sent)  # no registration lost
    assert sum(len(state.registered_addrs()) for state in states) == len(fleet.sent)  # nor left behind
    for topic in TOPICS:
        assert merge_route(states, topic).route == fleet.one.route(topic)


def fleet_of(groups: int, source: int, other: int, brokers: int = 2) -> Fleet:
    """Each set pinned to its group with `brokers` brokers registered (the moved set's on their way when
    it has none, so nothing of it is in its group yet)."""
    fleet = Fleet(groups)
    g0 = fleet.states[0]
    for name, group in ((MOVED, source), (OTHER, other)):
        assert fleet.apply(0, moves.pin_set(g0, name, group, groups))
        fleet.first[name] = group
    for _ in range(brokers):
        fleet.new_broker(MOVED)
        fleet.new_broker(OTHER)
    if not brokers:
        fleet.new_broker(MOVED, held=True)
    return fleet


def registering(fleet: Fleet) -> Iterator[Callable[[], None]]:
    """Before each of a driver's reads and proposals: a broker of each set registers (the moved set's on
    its way every other time, held every fourth, by a stale router every fourth), and the refused ones are
    sent again."""
    while True:
        yield lambda: fleet.new_broker(MOVED, late=len(fleet.sent) % 4 == 0, held=len(fleet.sent) % 8 == 2,
                                       stale=len(fleet.sent) % 8 == 6)
        yield lambda: fleet.new_broker(OTHER)
        yield fleet.retry


MOVES = 5  # a move's proposals when nothing is killed: begin, fence (none when the source is group 0), copy,
#            finish, drop


@pytest.mark.parametrize("how", [LOST, APPLIED, LATE])
@pytest.mark.parametrize("kill_at", range(1, MOVES + 1))
@pytest.mark.parametrize(("source", "target"), [(1, 2), (0, 1), (2, 0)])
def test_a_driver_killed_at_any_proposal_is_resumed_and_the_move_completes(kill_at: int, how: str, source: int,
                                                                             target: int) -> None:
    fleet = fleet_of(3, source, other=target)
    order = duty.MoveOrder(MOVED, target)
    move(fleet, order, registering(fleet), [(kill_at, how)])
    check(fleet, order)


@pytest.mark.parametrize(("source", "target"), [(1, 2), (2, 0), (0, 1)])
def test_a_first_registration_held_through_the_move_is_refused_at_the_source_and_retried_into_the_target(
        source: int, target: int) -> None:
    """The set has no records when it moves: its held registration's only guard is the set's shard/
    record, which the drop leaves as a tombstone (deleted, it would read absent again, as when the
    registration was translated, and the registration would land where no read takes it)."""
    fleet = fleet_of(3, source, other=target, brokers=0)
    order = duty.MoveOrder(MOVED, target)
    move(fleet, order, iter(()), [])
    assert duty.decide(fleet.states, order) == duty.Done(MOVED, target)
    fleet.flush(source, held=True)  # reaches the source's log after the drop
    assert [r.broker_addr for r in fleet.refused] == fleet.sent and not moves.set_keys(fleet.states[source], MOVED)
    check(fleet, order)


@pytest.mark.parametrize("how", [LOST, APPLIED, LATE])
@pytest.mark.parametrize("kill_at", range(1, MOVES + 2))
def test_a_set_moved_back_is_opened_in_its_old_group_whatever_the_kill(kill_at: int, how: str) -> None:
    """Back into the group it left, the set's tombstone there is replaced once the move is finished (a
    sixth proposal): a driver killed at any of them is resumed, and registrations held since the set
    first left, routed by a stale directory or refused meanwhile end in that group."""
    fleet = fleet_of(3, 1, other=2)
    move(fleet, duty.MoveOrder(MOVED, 2), registering(fleet), [])
    order = duty.MoveOrder(MOVED, 1)
    move(fleet, order, registering(fleet), [(kill_at, how)])
    check(fleet, order)
    assert fleet.states[1].directory.entry(MOVED) == state_pb2.ShardSet(group=1)


def test_a_set_moved_back_before_its_drop_ran_is_opened_in_its_old_group() -> None:
    """The group it comes back to still holds its fence of the move out (that move's drop never ran): the
    fence is replaced as a tombstone would be, once the move back is finished."""
    fleet = fleet_of(3, 1, other=2)
    driver = Driver(fleet, registering(fleet), kill_at=MOVES, how=LOST)  # the drop is lost
    with pytest.raises(Killed):
        duty.run_move(lambda s: duty.decide(s, duty.MoveOrder(MOVED, 2)), driver)
    assert moves.set_keys(fleet.states[1], MOVED) and fleet.states[1].directory.moving_to(MOVED) == 2
    order = duty.MoveOrder(MOVED, 1)
    move(fleet, order, registering(fleet), [])
    check(fleet, order)
    assert fleet.states[1].directory.entry(MOVED) == state_pb2.ShardSet(group=1)


def test_every_step_of_a_move_is_killed_in_turn() -> None:
    """Each driver dies at its first proposal, its step applied unseen: every step is done by one driver
    and found done by the next."""
    fleet = fleet_of(2, 0, 1)
    order = duty.MoveOrder(MOVED, 1)
    move(fleet, order, registering(fleet), [(1, APPLIED)] * MOVES)
    check(fleet, order)


def test_registrations_of_a_moving_set_are_refused_then_retried_into_the_target() -> None:
    fleet = fleet_of(2, 1, 0)
    order = duty.MoveOrder(MOVED, 0)
    refused: list[int] = []

    def watch() -> Iterator[Callable[[], None]]:
        for event in registering(fleet):
            yield event
            refused.append(len(fleet.refused))

    move(fleet, order, watch(), [])
    assert max(refused) > 0  # some were refused while the set moved
    check(fleet, order)


# ---- random schedules: many kills, registrations and late arrivals interleaved --------------------------

events = st.lists(st.one_of(
    st.tuples(st.just("register"), st.sampled_from([MOVED, OTHER]), st.sampled_from(["", LATE, "held", "stale"])),
    st.tuples(st.just("retry")),
    st.tuples(st.just("arrive"), st.integers(0, 2), st.booleans()),  # a group's proposals on their way (held too)
), max_size=30)
kills = st.lists(st.tuples(st.integers(1, MOVES), st.sampled_from([LOST, APPLIED, LATE])), max_size=6)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.sampled_from([2, 3]), source=st.integers(0, 2), target=st.integers(0, 2),
       brokers=st.sampled_from([0, 2]), schedule=events, killed=kills,
       back=st.one_of(st.none(), st.tuples(events, kills)))
def test_a_move_under_any_schedule_of_kills_and_registrations_loses_nothing(
        groups: int, source: int, target: int, brokers: int, schedule: list[tuple[Any, ...]],
        killed: list[tuple[int, str]], back: tuple[list[tuple[Any, ...]], list[tuple[int, str]]] | None) -> None:
    """`back`: the set is then moved back to its source (the registrations held since the first move still
    on their way), under its own schedule."""
    source, target = source % groups, target % groups
    if source == target:
        target = (target + 1) % groups
    fleet = fleet_of(groups, source, (target + 1) % groups, brokers)

    def run(event: tuple[Any, ...]) -> Callable[[], None]:
        if event[0] == "register":
            return lambda: fleet.new_broker(event[1], late=event[2] == LATE, held=event[2] == "held",
                                            stale=event[2] == "stale")
        if event[0] == "retry":
            return fleet.retry
        return lambda: fleet.flush(event[1] % groups, held=event[2])

    order = duty.MoveOrder(MOVED, target)
    move(fleet, order, iter([run(e) for e in schedule]), killed)
    if back is not None:
        order = duty.MoveOrder(MOVED, source)
        move(fleet, order, iter([run(e) for e in back[0]]), back[1])
    check(fleet, order)


# ---- the decider's refusals and the driver's loop ---------------------------------------------------------

def test_a_move_is_refused_by_field_before_anything_is_written() -> None:
    fleet = fleet_of(3, 1, 2)
    states = fleet.states
    cases = [("", 2, "broker_name", "empty"), (MOVED, 3, "group", "not a group"),
             (MOVED, -1, "group", "not a group"), ("nobody", 2, "broker_name", "no broker set"),
             (MOVED, 1, "group", "in group 1 already")]
    for name, target, field_name, says in cases:
        with pytest.raises(ValidationError) as err:
            duty.validate_move(states, name, target)
        assert err.value.field == field_name and says in str(err.value), (name, target)
    assert fleet.apply(0, moves.begin_move(states[0], MOVED, 2, 3))
    with pytest.raises(ValidationError) as err:
        duty.validate_move(states, MOVED, 0)
    assert err.value.field == "group" and "already moving to group 2" in str(err.value)
    with pytest.raises(ValidationError) as err:  # a driver given another target refuses too
        duty.decide(states, duty.MoveOrder(MOVED, 0))
    assert err.value.field == "group"
    assert duty.validate_move(states, MOVED, 2) == duty.MoveOrder(MOVED, 2)  # under way: resumed


def test_a_finished_move_with_its_drop_pending_is_resumed_not_refused() -> None:
    fleet = fleet_of(2, 1, 0)
    order = duty.MoveOrder(MOVED, 0)
    driver = Driver(fleet, iter(()), kill_at=MOVES, how=LOST)  # begin, fence, copy, finish applied; drop lost
    with pytest.raises(Killed):
        duty.run_move(lambda s: duty.decide(s, order), driver)
    states = fleet.states
    assert states[0].directory.group_of(MOVED) == 0 and moves.set_keys(states[1], MOVED)
    assert duty.pending_moves(states) == [order]
    assert duty.validate_move(states, MOVED, 0) == order
    step = duty.decide(states)
    assert isinstance(step, duty.Step) and (step.kind, step.group) == (duty.DROP, 1)
    assert "drop of set 'm' (to group 0) in group 1" in str(step)


class Recording:
    """An executor over a Fleet recording each read's floor."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.reads: list[tuple[int, int]] = []
        self.proposed: list[tuple[int, int]] = []

    @property
    def groups(self) -> int:
        return self.fleet.groups

    def read(self, group: int, at_least: int) -> MetadataState:
        self.reads.append((group, at_least))
        return self.fleet.states[group]

    def propose(self, group: int, translation: Translation) -> int:
        offset = self.fleet.propose(group, translation)
        self.proposed.append((group, offset))
        return offset


def test_the_driver_reads_each_group_at_or_after_its_last_proposal_there() -> None:
    """A replica that has not applied the step just proposed would show it undone: the driver asks each
    group's state at least at the offset its last proposal there was answered with."""
    fleet = fleet_of(2, 1, 0)
    execute = Recording(fleet)
    assert duty.run_move(lambda s: duty.decide(s, duty.MoveOrder(MOVED, 0)), execute) == duty.Done(MOVED, 0)
    assert len(execute.proposed) == MOVES
    floors: dict[int, int] = {}
    reads = iter(execute.reads)
    for group, offset in [(None, 0), *execute.proposed]:
        if group is not None:
            floors[group] = offset
        assert [next(reads) for _ in range(2)] == [(0, floors.get(0, 0)), (1, floors.get(1, 0))]


def test_a_decider_that_never_ends_stops_the_driver() -> None:
    fleet = fleet_of(2, 1, 0)
    step = duty.decide(fleet.states, duty.MoveOrder(MOVED, 0))
    assert isinstance(step, duty.Step)
    with pytest.raises(duty.MoveStalled):
        duty.run_move(lambda _states: step, Recording(fleet), max_steps=3)


def test_idle_when_nothing_moves() -> None:
    fleet = fleet_of(2, 1, 0)
    assert duty.pending_moves(fleet.states) == [] and duty.run_move(duty.decide, Recording(fleet)) == duty.Idle()


def test_a_new_leader_reads_the_other_groups_only_once_a_move_is_recorded() -> None:
    """moves_recorded: no set ever moved (no moving_to, no since) leaves nothing pending anywhere."""
    fleet = fleet_of(2, 1, 0)
    assert not duty.moves_recorded(fleet.states[0]) and duty.pending_moves(fleet.states) == []
    assert fleet.apply(0, moves.begin_move(fleet.states[0], MOVED, 0, 2))
    assert duty.moves_recorded(fleet.states[0])
    assert duty.run_move(lambda s: duty.decide(s, duty.MoveOrder(MOVED, 0)), Recording(fleet)) == duty.Done(MOVED, 0)
    assert duty.moves_recorded(fleet.states[0]) and fleet.states[0].directory.entry_since(MOVED) > 0


def test_a_move_is_refused_up_front_when_the_target_lacks_room() -> None:
    """check_room: the copy and the target's opening record (a shard/ record counts as a broker) against the
    target's quotas, before anything is written; a move under way, or to where the set is, is not checked."""
    fleet = fleet_of(2, source=0, other=1)  # group 1 holds 2 brokers; the moved set brings 2 and its record
    order = duty.MoveOrder(MOVED, 1)
    roomy = dict.fromkeys(quotas.QUOTAS, 1000)
    duty.check_room(fleet.states, order, roomy | {quotas.BROKERS: 5})
    with pytest.raises(TooLargeError) as refused:
        duty.check_room(fleet.states, order, roomy | {quotas.BROKERS: 4})
    assert (refused.value.field, refused.value.message) == (
        "limits.max_brokers", "group 1 lacks room for set 'm': the write adds 3 to 2 held (limit 4); nothing was "
        "written (the move did not begin)")
    duty.check_room(fleet.states, duty.MoveOrder(MOVED, 0), roomy | {quotas.BROKERS: 0})  # where it is
    assert fleet.apply(0, moves.begin_move(fleet.states[0], MOVED, 1, 2))
    duty.check_room(fleet.states, order, roomy | {quotas.BROKERS: 4})  # under way: finished whatever it holds
