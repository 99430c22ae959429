"""A sharded fleet answers routes as one group does (nameserver/state/shards/merge.py): a differential test.

The same requests go to one MetadataState and to G states, the latter placed by the router (a new set
assigned first by group 0, settings and KV in group 0, a registration translated in its set's group with
group 0's settings, every group's write guarded by its shard/ records), while sets move between groups one
step at a time. Some registrations are routed by a stale directory (to the group their set was assigned
first, wherever it is now): the group refuses them unless it holds the set. A request refused because its
set is moving (or moved) is sent again later, routed afresh, as a broker retries (the one state takes it
then). After every request and step, every topic's merged route (each variant a client can ask:
zone, order config, acting master), the cluster info and each set's member group equal the one state's,
and so do the writes' replies; once the moves end and the refused requests are retried, every address
registered in the one state is registered in its set's group: no registration lost.

Not covered, as docs/scaling.md says: an address re-registering under another broker set held by another
group (one group moves it at once; sharded, its old set keeps it until that group expires it). The fleet
here keeps each address in one set, as brokers do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nameserver.errors import ValidationError
from nameserver.pb import api_pb2, state_pb2
from nameserver.state import (
    ORDER_TOPIC_CONFIG,
    MetadataState,
    Translation,
    add_write_perm,
    delete_topic,
    expire_broker,
    put_kv,
    register_broker,
    register_topic,
    unregister_broker,
    update_settings,
    wipe_write_perm,
)
from nameserver.state import settings as replicated
from nameserver.state.shards import moves
from nameserver.state.shards.merge import merge_cluster_info, merge_member_group, merge_route
from nameserver.state.shards.router import AssignFirst, Moving, Split, ToGroup, route
from raftlog.pb import entry_pb2

TIMEOUT = 120_000
SETS = ["b0", "b1", "b2", "b3", "team/a", "b~5"]  # any text is a broker name (escaped in keys)
CLUSTER = {name: f"c{i % 2}" for i, name in enumerate(SETS)}
ZONE = {name: f"z{i % 3}" for i, name in enumerate(SETS)}
TOPICS = ["T0", "T1", "T2", "T3"]
VARIANTS = [("", False, False), ("z1", False, False), ("", True, True), ("z2", True, False)]  # zone, order, acting


def addr(name: str, bid: int) -> str:
    return f"10.0.{SETS.index(name)}.{bid}:10911"


def _apply(state: MetadataState, tr: Translation) -> bool:
    if not tr.batch.records:
        return True
    return state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0].applied


Request = (api_pb2.RegisterBrokerRequest | api_pb2.UnregisterBrokerRequest | api_pb2.BrokerPermRequest
           | api_pb2.RegisterTopicRequest | api_pb2.DeleteTopicRequest | api_pb2.PutKvRequest
           | api_pb2.UpdateSettingsRequest)
Writes = list[tuple[int, Translation]]


@dataclass
class Move:
    """A set's move under way: the steps done so far (moves.py's 1-6) and where the copy applied."""

    name: str
    source: int
    target: int
    done: int = 0
    since: int = 0


@dataclass
class Sharded:
    """G groups' states driven as the node would drive them: the router, then the group's translation,
    guarded by its fences (moves.guard_set_writes); sets moved one step at a time between requests."""

    groups: int
    states: list[MetadataState] = field(default_factory=list)
    moving: dict[str, Move] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)  # the group each set was assigned first

    def __post_init__(self) -> None:
        self.states = [MetadataState() for _ in range(self.groups)]

    @property
    def g0(self) -> MetadataState:
        return self.states[0]

    def place(self, request: Request) -> list[tuple[int, Message]]:
        """The groups the request goes to; SetMoving when the router refuses it (a set moving)."""
        placed = route(request, self.g0.directory, self.groups)
        if isinstance(placed, AssignFirst):
            assert _apply(self.g0, moves.assign_set(self.g0, placed.broker_name, placed.cluster, self.groups))
            self.first[placed.broker_name] = self.g0.directory.group_of(placed.broker_name)
            placed = route(request, self.g0.directory, self.groups)
        if isinstance(placed, Moving):
            raise moves.SetMoving(placed.broker_name, placed.target)
        if isinstance(placed, Split):
            return list(placed.parts)
        assert isinstance(placed, ToGroup)
        return [(placed.group, request)]

    def guarded(self, group: int, tr: Translation) -> tuple[int, Translation]:
        return group, moves.guard_set_writes(self.states[group], tr, group)

    def commit(self, writes: Writes) -> None:
        for group, tr in writes:
            assert _apply(self.states[group], tr)

    def start_move(self, name: str, target: int) -> None:
        source = self.g0.directory.group_of(name)
        if name not in self.moving and target != source and moves.set_keys(self.states[source], name):
            self.moving[name] = Move(name, source, target)
            self.step(name)

    def step(self, name: str) -> None:
        """The move's next step, checked idempotent (run again, it writes nothing)."""
        m, g0 = self.moving[name], self.g0
        source, target = self.states[m.source], self.states[m.target]
        group, step = [
            (0, lambda: moves.begin_move(g0, name, m.target, self.groups)),
            (m.source, lambda: moves.fence_set(source, name, m.source, m.target)),
            (m.target, lambda: moves.copy_set(source, target, m.target, name)),
            (0, lambda: moves.finish_move(g0, name, m.target, m.since)),
            (m.target, lambda: moves.open_set(target, g0, m.target, name)),
            (m.source, lambda: moves.drop_set(source, g0, m.source, name)),
        ][m.done]
        assert _apply(self.states[group], step()) and step().empty
        m.done += 1
        if m.done == 3:
            m.since = target.offset
        if m.done == 6:
            del self.moving[name]

    def registered(self) -> list[str]:
        """Every address registered in the group the directory names for its set."""
        directory = self.g0.directory
        return sorted(addr for group, state in enumerate(self.states) for addr, live, _ in state.live_addrs()
                      if directory.group_of(live.broker_name) == group)


def registration(name: str, bid: int, counter: int, topics: dict[str, int], acting: bool | None,
                 filters: tuple[str, ...]) -> api_pb2.RegisterBrokerRequest:
    req = api_pb2.RegisterBrokerRequest(cluster_name=CLUSTER[name], broker_name=name, broker_addr=addr(name, bid),
                                        broker_id=bid, zone_name=ZONE[name], enable_acting_master=acting,
                                        filter_servers=list(filters))
    req.data_version.counter = counter
    for topic, perm in topics.items():
        req.topics.add(topic_name=topic, read_queue_nums=perm, write_queue_nums=perm, perm=perm)
    return req


class Fleet:
    """The one-group state and the sharded one, fed the same requests; every reply and route compared. A
    request the sharded fleet refuses (its set is moving) is kept and sent again later, as a broker retries:
    the one group then takes it at that time too."""

    def __init__(self, groups: int) -> None:
        self.one = MetadataState()
        self.sharded = Sharded(groups)
        self.deferred: list[tuple] = []  # type: ignore[type-arg]

    def register(self, req: api_pb2.RegisterBrokerRequest, stale: bool = False) -> None:
        """`stale`: routed by a worker whose directory replica still shows the set where it was first
        assigned (as any worker would route it, the first time)."""
        first = self.sharded.first.get(req.broker_name)
        [(group, _)] = self.sharded.place(req) if not stale or first is None else [(first, req)]
        states = self.sharded.states
        writes = [self.sharded.guarded(group, register_broker(states[group], req, TIMEOUT, states[0]))]
        one = register_broker(self.one, req, TIMEOUT)
        self.commit(one, writes)
        tr = writes[0][1]
        assert (tr.master_addr, tr.ha_server_addr, tr.order_topic_config, tr.conflict) == (
            one.master_addr, one.ha_server_addr, one.order_topic_config, one.conflict)

    def commit(self, one: Translation, writes: Writes) -> None:
        assert _apply(self.one, one)
        self.sharded.commit(writes)

    def unregister(self, name: str, bid: int) -> None:
        req = api_pb2.UnregisterBrokerRequest(broker_name=name, broker_addr=addr(name, bid), broker_id=bid)
        [(group, _)] = self.sharded.place(req)
        state = self.sharded.states[group]
        writes = [self.sharded.guarded(group, unregister_broker(state, CLUSTER[name], name, addr(name, bid), bid))]
        self.commit(unregister_broker(self.one, CLUSTER[name], name, addr(name, bid), bid), writes)

    def expire(self, name: str, bid: int) -> None:
        """The leader of the address's group expires it (at the version its scan saw)."""
        a = addr(name, bid)
        group = self.sharded.g0.directory.group_of(name)
        state = self.sharded.states[group]
        writes = [self.sharded.guarded(group, expire_broker(state, a, state.live_version(a)))]
        self.commit(expire_broker(self.one, a, self.one.live_version(a)), writes)

    def write_perm(self, name: str, wipe: bool) -> None:
        change = wipe_write_perm if wipe else add_write_perm
        [(group, _)] = self.sharded.place(api_pb2.BrokerPermRequest(broker_name=name))
        writes = [self.sharded.guarded(group, change(self.sharded.states[group], name))]
        one = change(self.one, name)
        self.commit(one, writes)
        assert writes[0][1].count == one.count

    def register_topic(self, topic: str, brokers: list[str], perm: int) -> None:
        """Every group's part is translated (and so checked) before any is written: all or nothing here.
        (The node cannot make parts in several groups atomic; docs/scaling.md says what it promises.)"""
        datas = [state_pb2.QueueData(broker_name=b, read_queue_nums=2, write_queue_nums=2, perm=perm) for b in brokers]
        parts = self.sharded.place(api_pb2.RegisterTopicRequest(topic=topic, queue_datas=datas))
        try:
            writes: Writes | None = [
                self.sharded.guarded(g, register_topic(self.sharded.states[g], topic, list(part.queue_datas)))  # type: ignore[attr-defined]
                for g, part in parts]
        except ValidationError:
            writes = None
        try:
            one: Translation | None = register_topic(self.one, topic, datas)
        except ValidationError:
            one = None
        assert (one is None) == (writes is None)
        if one is not None and writes is not None:
            self.commit(one, writes)

    def delete_topic(self, topic: str, cluster: str) -> None:
        writes = [self.sharded.guarded(g, delete_topic(self.sharded.states[g], topic, cluster))
                  for g, _ in self.sharded.place(api_pb2.DeleteTopicRequest(topic=topic, cluster_name=cluster))]
        self.commit(delete_topic(self.one, topic, cluster), writes)

    def group0_write(self, request: api_pb2.PutKvRequest | api_pb2.UpdateSettingsRequest,
                     translate: Callable[[MetadataState], Translation]) -> None:
        [(group, _)] = self.sharded.place(request)
        assert group == 0
        self.commit(translate(self.one), [self.sharded.guarded(0, translate(self.sharded.g0))])

    def run(self, op: tuple) -> None:  # type: ignore[type-arg]
        try:
            _run(self, op)
        except moves.SetMoving:  # SetMoved too: a stale route refused, retried as the broker would
            self.deferred.append(("register", *op[1:]) if op[0] == "stale" else op)

    def retry(self) -> None:
        deferred, self.deferred = self.deferred, []
        for op in deferred:
            self.run(op)

    def settle(self) -> None:
        """Every move finished and every refused request sent again: nothing is left refused."""
        _run(self, ("complete",))
        self.retry()
        assert not self.deferred
        self.check_routes()
        assert self.sharded.registered() == self.one.registered_addrs()  # no registration lost

    def check_routes(self) -> None:
        for topic in TOPICS:
            for zone, order, acting in VARIANTS:
                merged = merge_route(self.sharded.states, topic, zone, order, acting)
                assert merged.route == self.one.route(topic, zone, order, acting), (topic, zone, order, acting)
                assert merged.offsets == tuple(s.offset for s in self.sharded.states)
        info, offsets = merge_cluster_info(self.sharded.states)
        assert info == self.one.cluster_info() and offsets == merged.offsets
        for name in SETS:  # GetBrokerMemberGroup: by name only, the cluster echoed back
            group, offsets = merge_member_group(self.sharded.states, "any", name)
            assert group == self.one.broker_member_group("any", name) and offsets == merged.offsets, name


# ---- the operations hypothesis draws ------------------------------------------------------------------

names = st.sampled_from(SETS)
bids = st.sampled_from([0, 1, 2])
topic_perms = st.dictionaries(st.sampled_from(TOPICS), st.sampled_from([2, 4, 6]), max_size=3)
operations = st.one_of(
    st.tuples(st.sampled_from(["register", "stale"]), names, bids, st.integers(1, 3), topic_perms,
              st.sampled_from([None, False, True]), st.lists(st.sampled_from(["f1:1", "f2:1"]), max_size=2)),
    st.tuples(st.just("unregister"), names, bids),
    st.tuples(st.just("expire"), names, bids),
    st.tuples(st.just("perm"), names, st.booleans()),
    st.tuples(st.just("topic"), st.sampled_from(TOPICS), st.lists(names, min_size=1, max_size=3, unique=True),
              st.sampled_from([4, 6])),
    st.tuples(st.just("delete"), st.sampled_from(TOPICS), st.sampled_from(["", "c0", "c1"])),
    st.tuples(st.just("order"), st.sampled_from(TOPICS), st.sampled_from(["b0:4", "b1:8"])),
    st.tuples(st.just("setting"), st.booleans()),
    st.tuples(st.just("move"), names, st.integers(0, 2)),
    st.tuples(st.just("step"), st.integers(0, 5)),
    st.tuples(st.just("step"), st.integers(0, 5)),
    st.tuples(st.just("retry")),
    st.tuples(st.just("complete")),  # every move under way run to its end (checked after each step)
)


def _run(fleet: Fleet, op: tuple) -> None:  # type: ignore[type-arg]
    kind = op[0]
    if kind in ("register", "stale"):
        _, name, bid, counter, topics, acting, filters = op
        fleet.register(registration(name, bid, counter, topics, acting, tuple(filters)), stale=kind == "stale")
    elif kind == "unregister":
        fleet.unregister(op[1], op[2])
    elif kind == "expire":
        fleet.expire(op[1], op[2])
    elif kind == "perm":
        fleet.write_perm(op[1], op[2])
    elif kind == "topic":
        fleet.register_topic(op[1], op[2], op[3])
    elif kind == "delete":
        fleet.delete_topic(op[1], op[2])
    elif kind == "order":
        fleet.group0_write(api_pb2.PutKvRequest(namespace=ORDER_TOPIC_CONFIG, key=op[1], value=op[2]),
                           lambda s: put_kv(s, ORDER_TOPIC_CONFIG, op[1], op[2]))
    elif kind == "setting":
        values = {replicated.DELETE_TOPIC_WITH_BROKER_REGISTRATION: "true" if op[1] else "false"}
        fleet.group0_write(api_pb2.UpdateSettingsRequest(settings=values), lambda s: update_settings(s, values))
    elif kind == "move":
        fleet.sharded.start_move(op[1], op[2] % fleet.sharded.groups)
    elif kind == "step" and fleet.sharded.moving:
        fleet.sharded.step(sorted(fleet.sharded.moving)[op[1] % len(fleet.sharded.moving)])
    elif kind == "complete":
        while fleet.sharded.moving:
            fleet.sharded.step(next(iter(fleet.sharded.moving)))
            fleet.check_routes()
    elif kind == "retry":
        fleet.retry()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.sampled_from([2, 3]), ops=st.lists(operations, min_size=1, max_size=25))
def test_a_sharded_fleet_answers_every_route_as_one_group_does(groups: int, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    fleet = Fleet(groups)
    for op in ops:
        fleet.run(op)
        fleet.check_routes()
    fleet.settle()


def test_a_whole_fleet_spreads_over_the_groups_and_still_answers_as_one() -> None:
    """Every set registered (master and slave, every topic): the sets land in more than one group (the
    differential is not one group's answer compared with itself), and moving every set one group on and
    back (each set then written in its group again) keeps every answer. Group 0's settings and
    order-topic config reach every group's registrations."""
    fleet = Fleet(3)
    fleet.group0_write(api_pb2.PutKvRequest(), lambda s: put_kv(s, ORDER_TOPIC_CONFIG, "T1", "b0:4"))
    fleet.group0_write(api_pb2.UpdateSettingsRequest(), lambda s: update_settings(
        s, {replicated.DELETE_TOPIC_WITH_BROKER_REGISTRATION: "true"}))
    for i, name in enumerate(SETS):
        topics = {t: 6 for t in TOPICS[i % 2:]}
        fleet.register(registration(name, 0, 1, topics, True, ("f1:1",)))  # replies carry the order config
        fleet.register(registration(name, 1, 1, topics, True, ()))
        fleet.register(registration(name, 0, 2, {"T1": 6}, True, ("f1:1",)))  # the setting drops the rest
    fleet.check_routes()
    held = [sum(1 for name in SETS if state.broker_data(name) is not None) for state in fleet.sharded.states]
    assert sum(held) == len(SETS) and sum(1 for n in held if n) >= 2, held
    for step in (1, 2):
        for name in SETS:
            fleet.sharded.start_move(name, (fleet.sharded.g0.directory.group_of(name) + step) % 3)
            fleet.settle()
    for name in SETS:  # back in the group each left: written there again (group k >= 1 opened, step 5)
        fleet.register(registration(name, 1, 2, {"T0": 6}, True, ()))
    fleet.check_routes()
    fleet.unregister("b0", 0)  # a master lost: the acting-master view, computed over the merged parts
    fleet.check_routes()


def test_a_registration_refused_while_its_set_moves_is_retried_and_not_lost() -> None:
    fleet = Fleet(2)
    fleet.run(("register", "b1", 0, 1, {"T0": 6, "T1": 6}, None, []))
    source = fleet.sharded.g0.directory.group_of("b1")
    fleet.sharded.start_move("b1", 1 - source)
    slave, topic = ("register", "b1", 1, 1, {"T0": 6}, None, []), ("topic", "T2", ["b1"], 6)
    deleted = ("delete", "T1", "")  # goes to every group: refused by the fence in the set's, not the router
    for step in range(3):  # each arrives after each step until the directory names the target
        for op in (slave, topic, deleted):
            fleet.run(op)
        assert fleet.deferred == [slave, topic, deleted] * (step + 1)  # refused: the set is moving
        fleet.check_routes()
        fleet.sharded.step("b1")
    fleet.run(slave)  # moved (its source not dropped yet): the target takes it
    assert len(fleet.deferred) == 9 and fleet.sharded.registered() == [addr("b1", 0), addr("b1", 1)]
    fleet.settle()
    assert merge_route(fleet.sharded.states, "T1").route is None
    assert fleet.sharded.registered() == [addr("b1", 0), addr("b1", 1)]
    assert [qd.broker_name for qd in merge_route(fleet.sharded.states, "T2").route.queue_datas] == ["b1"]


def test_a_registration_routed_by_a_stale_directory_is_refused_where_its_set_was_and_retried() -> None:
    """After a set moved out of a group (and after it moved back, until it is opened there), a worker whose
    directory replica lags still sends its registrations to that group: refused (SetMoved), retried, they
    land in the set's group, and every answer equals one group's."""
    fleet = Fleet(3)
    fleet.run(("register", "b1", 0, 1, {"T0": 6}, None, []))
    first = fleet.sharded.first["b1"]
    for target in ((first + 1) % 3, first):
        fleet.run(("move", "b1", target))
        for _ in range(5):  # through the finish (and the opening, coming back)
            fleet.run(("stale", "b1", 1, 2, {"T0": 6, "T1": 6}, None, []))
            fleet.run(("step", 0))
            fleet.check_routes()
        fleet.run(("stale", "b1", 1, 2, {"T0": 6, "T1": 6}, None, []))
        assert fleet.deferred and all(op[0] == "register" for op in fleet.deferred)
        fleet.settle()
        assert fleet.sharded.registered() == [addr("b1", 0), addr("b1", 1)]
    fleet.run(("stale", "b1", 1, 3, {"T2": 6}, None, []))  # back where it was first: taken there again
    assert not fleet.deferred
    fleet.check_routes()


@pytest.mark.parametrize("groups", [1, 2])
def test_merging_one_state_is_its_own_route(groups: int) -> None:
    fleet = Fleet(groups)
    fleet.register(registration("b0", 0, 1, {"T0": 6}, None, ()))
    fleet.check_routes()
    assert merge_route(fleet.sharded.states, "nope").route is None
