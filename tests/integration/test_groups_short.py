"""Sharding's short check for `make test` (issue 29; docs/scaling.md, "Sharding"): one 3-node cluster with
[sharding] groups = 2 and one worker per node, beside a one-group node fed the same fleet, in a few seconds.
Registrations land in the group the directory names; every route and the cluster info (gRPC and remoting)
equal the one-group node's; `nsctl status` shows each node's group cores; a broker set moved from group 0 to
group 1 while registrations of it go on loses none. Then the guards of moves (a step that is no move's
refused by field; one move at a time; a target without room refused up front) and the offset vector (a
write's, a read waiting for it, the client's token), controller mode with groups (every ctrl/ record
group 0's: calls for a set of either group, a set moved keeping its record), and what each process lists and
exports of it (reflection, health, /metrics: the Controller service and its gauges group 0's core's alone;
the node's health every group's, Check and Watch alike). The long versions (kills,
metrics, a dead worker, moves with leaders killed, controller elections with the controller leader killed)
are the slow modules test_groups.py, test_group_moves.py and test_groups_controller.py.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from nameserver.api.auth import CONTROLLER_SERVICE
from nameserver.cli import nsctl
from nameserver.client import Client
from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2, shards_pb2_grpc, state_pb2
from nameserver.remoting import codes
from nameserver.state import keys
from nameserver.state.shards.directory import default_group
from raftlog.pb import entry_pb2
from tests.cluster import Cluster, NodeProc, register_request, retry, running
from tests.fakebroker import FakeBroker
from tests.integration.groupcontroller import (
    ControllerSet,
    controller_records,
    controller_service_of,
    held_in,
    leader_port,
    member_group,
)
from tests.integration.groupcores import (
    answers_equal,
    group_core_channel,
    group_core_pids,
    group_status,
    own_cluster_info,
    route_of,
)
from tests.integration.reflected import CORE_SERVICES, SHARDED_WORKER_SERVICES, listed_and_answering

GROUPS = 2
CLUSTER = "ShortCluster"


def _named(prefix: str, group: int) -> str:
    return next(f"{prefix}-{i}" for i in range(64) if default_group(f"{prefix}-{i}", GROUPS) == group)


REMOTING = {group: _named("short-r", group) for group in range(GROUPS)}  # FakeBrokers, one a group
GRPC = {group: _named("short-g", group) for group in range(GROUPS)}      # gRPC registrations, one a group
MOVED = _named("short-moved", 0)  # group 0's by its hash; moved to group 1 below
TOPICS = ["ShortShared", "ShortOwn"]
QUEUE_DATAS = 60  # [limits] max_queue_datas, each group's: the module's other sets hold 14 at most in either


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, NodeProc]]:
    sharded = Cluster(str(tmp_path_factory.mktemp("groups-short")), size=3, worker_processes=1, groups=GROUPS,
                      remoting=True, controller=True, metrics=True,
                      security={"limits": {"max_queue_datas": QUEUE_DATAS}})
    one = Cluster(str(tmp_path_factory.mktemp("groups-short-one")), size=1, remoting=True)
    one.start()  # started beside the sharded one (running() waits for each in turn)
    try:
        with running(sharded, timeout=sharded.ready_timeout):
            one.wait_ready()
            yield sharded, one.nodes[0]
    finally:
        one.stop()


def _register_grpc(node: NodeProc, name: str, addr: str, topics: list[str], broker_id: int = 0) -> None:
    request = register_request(CLUSTER, name, addr, topics, broker_id=broker_id)
    retry(lambda: node.ns.RegisterBroker(request, timeout=10), timeout=30)


@pytest.fixture(scope="module")
def fleet(clusters: tuple[Cluster, NodeProc]) -> Iterator[None]:
    """Each group's sets registered with both clusters: a FakeBroker (remoting) and a gRPC registration a
    group, and the set moved below (group 0's)."""
    sharded, reference = clusters
    brokers = [FakeBroker(name, cluster=CLUSTER).start() for name in REMOTING.values()]
    try:
        for broker in brokers:
            for node in (sharded.nodes[0], reference):
                resp = broker.register(node.remoting_addr, [*TOPICS, f"Own-{broker.name}"])
                assert resp.code == codes.SUCCESS, resp.remark
        for i, name in enumerate([*GRPC.values(), MOVED]):
            for node in (sharded.nodes[1], reference):
                _register_grpc(node, name, f"10.6.0.{i + 1}:10911", [*TOPICS, f"Own-{name}"])
        yield
    finally:
        for broker in brokers:
            broker.stop()


def _first_over_remoting(node: NodeProc, group: int) -> None:
    broker = FakeBroker(_named(f"short-first-{node.name}", group), cluster=CLUSTER).start()
    try:
        resp = broker.register(node.remoting_addr, ["ShortFirst"])
        assert resp.code == codes.SUCCESS, (node.name, group, resp.remark)
        assert broker.call(node.remoting_addr, codes.UNREGISTER_BROKER, broker.header(0)).code == codes.SUCCESS
    finally:
        broker.stop()


def _first_over_grpc(node: NodeProc, group: int) -> None:
    name, addr = _named(f"short-first-grpc-{node.name}", group), f"10.7.{node.name[1:]}.{group}:10911"
    reply = node.ns.RegisterBroker(register_request(CLUSTER, name, addr, ["ShortFirst"]), timeout=30)
    assert [bool(offset) for offset in reply.offsets] == [k == group for k in range(GROUPS)], (node.name, reply)
    node.ns.UnregisterBroker(api_pb2.UnregisterBrokerRequest(cluster_name=CLUSTER, broker_name=name,
                                                             broker_addr=addr), timeout=30)


def test_a_ready_node_takes_a_new_set_s_first_registration_at_once(clusters: tuple[Cluster, NodeProc]) -> None:
    """First in the module: right after the fixture saw every node ready. A new set's first registration on
    a node that does not lead group 0 is group 0's directory record (Admin.AssignSet), which that node's core
    forwards to the leader's public port, opened by the leader's workers once its node was ready: its
    channel, refused until then, reconnected up to a second later, and the registration was answered
    SYSTEM_BUSY (remoting) or UNAVAILABLE (gRPC) "Connection refused" meanwhile (3 cluster starts in 4 when
    registering at once; the unit guard is tests/unit/test_forwarder.py). The forward waits for its
    connection within the write's time instead: no retry here. Every node at once, half of them starting
    with remoting and half with gRPC; each set unregistered after (the module's other tests compare the
    fleet with the one-group node's)."""
    sharded, _ = clusters

    def each(i: int, node: NodeProc) -> None:
        calls = [_first_over_remoting, _first_over_grpc]
        for call in calls[i % 2:] + calls[:i % 2]:
            for group in range(GROUPS):
                call(node, group)

    with ThreadPoolExecutor(len(sharded.nodes)) as pool:
        for done in [pool.submit(each, i, node) for i, node in enumerate(sharded.nodes)]:
            done.result()


def _own_sets(node: NodeProc, group: int) -> list[str]:
    return sorted(own_cluster_info(node, group).broker_addr_table)


def test_registrations_land_in_the_group_the_directory_names(
        clusters: tuple[Cluster, NodeProc], fleet: None) -> None:
    sharded, _ = clusters
    expected = {group: sorted([REMOTING[group], GRPC[group]] + ([MOVED] if group == 0 else []))
                for group in range(GROUPS)}
    sharded.wait_for("each set in its group's own state on every node", lambda: all(
        _own_sets(node, group) == expected[group] for node in sharded.nodes for group in range(GROUPS)),
        timeout=20)


def _equal_to_reference(sharded: Cluster, reference: NodeProc, topics: list[str]) -> bool:
    return all(answers_equal(node, reference, topics) for node in sharded.nodes)


ALL_TOPICS = [*TOPICS, *(f"Own-{name}" for name in [*REMOTING.values(), *GRPC.values(), MOVED]), "NoSuchTopic"]


def test_merged_routes_equal_the_one_group_node_s(clusters: tuple[Cluster, NodeProc], fleet: None) -> None:
    sharded, reference = clusters
    sharded.wait_for("every route and the cluster info equal to the one-group node's",
                     lambda: _equal_to_reference(sharded, reference, ALL_TOPICS), timeout=20, every=0.3)
    shared = route_of(sharded.nodes[2], "ShortShared")
    assert shared is not None and len(shared.broker_datas) == 5  # both groups' sets in one answer


def test_nsctl_status_shows_each_group_core(clusters: tuple[Cluster, NodeProc],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    sharded, _ = clusters

    def every_group_led() -> list[dict] | None:
        capsys.readouterr()
        code = nsctl.main(["--endpoints", ",".join(n.grpc_addr for n in sharded.nodes), "--timeout", "5",
                           "--json", "status"])
        out = capsys.readouterr().out
        nodes = json.loads(out)["nodes"] if code == 0 else []
        if len(nodes) != 3 or not all(len(n["groups"]) == GROUPS and all(g["ready"] for g in n["groups"])
                                      for n in nodes):
            return None
        leaders = [sum(n["groups"][group]["role"] == "leader" for n in nodes) for group in range(GROUPS)]
        return nodes if leaders == [1] * GROUPS else None

    nodes = sharded.wait_for("nsctl status: both group cores of every node, one leader a group",
                             every_group_led, timeout=20, every=0.3)
    assert sorted(n["grpc_addr"] for n in nodes) == sorted(n.grpc_addr for n in sharded.nodes)


SENDERS = 3  # registering threads: a step of the move (one Raft write) is short, so they send back to back


class Registrations:
    """The moved set's new brokers registered over gRPC by SENDERS threads, back to back (each a new id and
    address), while the set moves; a refusal (UNAVAILABLE: the set is moving) is sent again, as a broker
    does. Each acknowledged one is registered with the one-group node too."""

    def __init__(self, node: NodeProc, reference: NodeProc) -> None:
        self.node, self.reference = node, reference
        self.acked: dict[int, str] = {}
        self.calls: list[tuple[float, float]] = []  # each registration's (start, end), monotonic
        self.refused = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(k,), name=f"short-registrations-{k}", daemon=True)
                        for k in range(SENDERS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _run(self, sender: int) -> None:
        bid = sender + 1
        while not self.stop.is_set():
            addr = f"10.6.1.{bid}:10911"
            request = register_request(CLUSTER, MOVED, addr, [*TOPICS, f"Own-{MOVED}"], broker_id=bid)
            start = time.monotonic()
            try:
                self.node.ns.RegisterBroker(request, timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                self.refused += 1
                self.stop.wait(0.01)
                continue
            finally:
                self.calls.append((start, time.monotonic()))
            _register_grpc(self.reference, MOVED, addr, [*TOPICS, f"Own-{MOVED}"], broker_id=bid)
            self.acked[bid] = addr
            bid += SENDERS


def test_a_set_moved_online_under_registrations_loses_none(
        clusters: tuple[Cluster, NodeProc], fleet: None) -> None:
    sharded, reference = clusters
    node = sharded.nodes[0]
    load = Registrations(node, reference)
    load.start()
    try:
        sharded.wait_for("a registration of the set before the move", lambda: len(load.acked) >= 2, timeout=20)
        before = len(load.acked)
        began = time.monotonic()
        reply = retry(lambda: shards_pb2_grpc.ShardsStub(node._channel()).MoveShard(
            shards_pb2.ShardPlacement(broker_name=MOVED, group=1), timeout=30), timeout=30)
        ended = time.monotonic()
        assert (reply.source, reply.set.group, reply.set.HasField("moving_to")) == (0, 1, False)
        sharded.wait_for("a registration of the set after the move", lambda: len(load.acked) >= before + 3,
                         timeout=20)
    finally:
        load.join()
    assert [call for call in load.calls if call[0] < ended and call[1] > began], "no registration during the move"
    want = {0: "10.6.0.3:10911", **load.acked}  # the fixture's registration (id 0) and every acknowledged one

    def all_in_group_1() -> bool:
        for n in sharded.nodes:
            held, left = own_cluster_info(n, 1).broker_addr_table, own_cluster_info(n, 0).broker_addr_table
            if MOVED in left or MOVED not in held or {a.broker_id: a.addr for a in held[MOVED].addrs} != want:
                return False
        return True

    sharded.wait_for("every acknowledged registration in group 1 on every node, none left in group 0",
                     all_in_group_1, timeout=20, every=0.3)
    sharded.wait_for("routes and the cluster info equal the one-group node's after the move",
                     lambda: _equal_to_reference(sharded, reference, ALL_TOPICS), timeout=20, every=0.3)


def test_a_step_that_is_no_move_s_is_refused_by_field_and_nothing_proposed(
        clusters: tuple[Cluster, NodeProc]) -> None:
    """Admin.ProposeStep (a move's step, the node's own call on a group core's private socket) with bytes
    that are no raftlog Batch, or a batch of records no move writes (a KV record, a record typed against its
    key): INVALID_ARGUMENT naming the field, nothing enters group 1's log, and the core keeps serving."""
    sharded, _ = clusters
    node = sharded.nodes[0]
    before = group_status(node, 1)
    assert before is not None and before.ready
    with group_core_channel(node, 1) as channel:
        admin = api_pb2_grpc.AdminStub(channel)
        kv = entry_pb2.Record(type=keys.KV_TYPE, key=keys.kv_key("ns", "k"), value=b"v")
        mistyped = entry_pb2.Record(type=keys.KV_TYPE, key=keys.shard_key("some-set"), value=b"")
        for junk, said in ((b"\xff\xff\xff", "batch: not a raftlog Batch"),  # a bad tag
                           (b"\x0a\x05\x0a\x03", "batch: not a raftlog Batch"),  # a record cut short
                           (b"", "batch: a step writes records"),
                           (entry_pb2.Batch(records=[kv]).SerializeToString(),
                            "batch.records[0].key: 'kv/ns/k' is not a record a move writes"),
                           (entry_pb2.Batch(records=[mistyped]).SerializeToString(),
                            f"batch.records[0].type: {keys.KV_TYPE} is not the type of 'shard/some-set'")):
            with pytest.raises(grpc.RpcError) as err:
                admin.ProposeStep(api_pb2.ProposeStepRequest(batch=junk), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert (err.value.details() or "").startswith(said), err.value.details()
        after = admin.Status(api_pb2.StatusRequest(), timeout=5)
    assert after.ready and after.end_offset == before.end_offset


def _move(node: NodeProc, name: str, group: int, timeout: float) -> shards_pb2.MoveShardReply:
    return shards_pb2_grpc.ShardsStub(node._channel()).MoveShard(
        shards_pb2.ShardPlacement(broker_name=name, group=group), timeout=timeout)


def test_moves_run_one_at_a_time_a_set_under_way_named(clusters: tuple[Cluster, NodeProc]) -> None:
    """Group 0's leader runs one move at a time (docs/scaling.md, "Moves one at a time"). With every group 1
    core stopped (SIGSTOP), a move of set A to group 1 holds the duty (it cannot read group 1): a move of A
    back to group 0 is refused at once naming the move under way (as Kafka refuses a new reassignment of
    partitions being reassigned); a move of another set B whose time runs out waiting is answered naming A,
    nothing written for B; one with time enough waits its turn and runs once A's is done (on a loaded
    machine A's or B's time may run out while group 1 comes back: a move that did not begin is sent again)."""
    sharded, _ = clusters
    first, second = _named("short-first", 0), _named("short-second", 0)
    for i, name in enumerate((first, second)):
        _register_grpc(sharded.nodes[0], name, f"10.6.2.{i + 1}:10911", ["ShortOneAtATime"])
    stopped = [pid for node in sharded.nodes for pid in group_core_pids(node)]
    answers: dict[str, shards_pb2.MoveShardReply | grpc.RpcError] = {}

    def move_in_background(name: str) -> threading.Thread:
        def run() -> None:
            try:
                answers[name] = _move(sharded.nodes[1], name, 1, 60)
            except grpc.RpcError as exc:
                answers[name] = exc
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        moving = move_in_background(first)
        said = ""
        for _ in range(5):  # a call of B that took the duty before A's call came holds it till its time is up
            with pytest.raises(grpc.RpcError) as err:
                _move(sharded.nodes[2], second, 1, 3)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value.details()
            said = err.value.details() or ""
            if "waited its turn" in said:
                break
        assert said.startswith(f"a move of set {first!r} to group 1 is running on group 0's leader; the move of "
                               f"set {second!r} to group 1 waited its turn"), said
        assert "nothing was written for it" in said
        with pytest.raises(grpc.RpcError) as err:  # A's call holds the duty now: refused at once
            _move(sharded.nodes[2], first, 0, 3)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert err.value.details() == f"group: a move of set {first!r} to group 1 is running: one move of a set at " \
                                      "a time; move it again once that one is done"
        waiting = move_in_background(second)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    moving.join(timeout=60)
    waiting.join(timeout=60)
    for name in (first, second):
        answer = answers[name]
        if isinstance(answer, grpc.RpcError):  # a loaded machine: its time ran out while group 1 came back
            said = answer.details() or ""
            assert answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED, said
            if "did not begin" in said:  # nothing written: sent again, as an operator would
                retry(lambda n=name: _move(sharded.nodes[1], n, 1, 30), timeout=60)
        sharded.wait_for(f"set {name} in group 1, no move under way", lambda n=name: (
            (e := _directory_entry(sharded.nodes[1], n)) is not None and e.group == 1
            and not e.HasField("moving_to")), timeout=60)


def _directory_entry(node: NodeProc, name: str) -> state_pb2.ShardSet | None:
    found = shards_pb2_grpc.ShardsStub(node._channel()).ListShards(
        shards_pb2.ListShardsRequest(broker_name=name), timeout=5).sets
    return found[0].set if found else None


def test_a_move_into_a_group_without_room_is_refused_naming_the_quota(clusters: tuple[Cluster, NodeProc]) -> None:
    """A move whose copy would take the target past a [limits] quota is refused before it begins
    (RESOURCE_EXHAUSTED naming the quota and the group), the set staying where it is; a move's own steps
    skip the quota check, so this is where the target's quota is kept."""
    sharded, _ = clusters
    filler, big = _named("short-filler", 1), _named("short-big", 0)
    _register_grpc(sharded.nodes[0], filler, "10.6.3.1:10911", [f"Fill-{i}" for i in range(40)])
    _register_grpc(sharded.nodes[0], big, "10.6.3.2:10911", [f"Big-{i}" for i in range(25)])
    with pytest.raises(grpc.RpcError) as err:
        retry(lambda: _move(sharded.nodes[1], big, 1, 30), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
    said = err.value.details() or ""
    assert said.startswith(f"limits.max_queue_datas: group 1 lacks room for set {big!r}: the write adds 25 to "), said
    assert said.endswith(f"held (limit {QUEUE_DATAS}); nothing was written (the move did not begin)"), said
    entry = _directory_entry(sharded.nodes[1], big)
    assert entry is not None and (entry.group, entry.HasField("moving_to")) == (0, False)
    assert sorted(qd.broker_name for qd in (route_of(sharded.nodes[2], "Big-0") or api_pb2.TopicRoute()).queue_datas
                  ) == [big]


def test_a_write_answers_its_offset_vector_and_a_read_waits_for_it(clusters: tuple[Cluster, NodeProc],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Read-your-writes across groups (docs/scaling.md, "Sharding": the offset vector): a registration of a
    group-1 set answers `offsets` [0, its offset in group 1]; a topic split over both groups answers each
    part's; a route read on another node with that vector as min_offsets sees the write, and answers each
    group's offset it read at; `nsctl --json` prints it. A one-group node answers no vector and refuses one of
    two entries by field."""
    sharded, reference = clusters
    name = _named("short-vector", 1)
    request = register_request(CLUSTER, name, "10.6.4.1:10911", ["ShortVector"])
    reply = retry(lambda: sharded.nodes[0].ns.RegisterBroker(request, timeout=10), timeout=30)
    assert len(reply.offsets) == GROUPS and reply.offsets[0] == 0 and reply.offsets[1] == reply.offset > 0
    read = sharded.nodes[2].ns.GetRoute(api_pb2.GetRouteRequest(topic="ShortVector", min_offsets=reply.offsets),
                                        timeout=10)
    assert name in [bd.broker_name for bd in read.route.broker_datas]
    assert len(read.offsets) == GROUPS and read.offsets[1] >= reply.offsets[1] and read.apply_offset == read.offsets[0]
    other = _named("short-vector", 0)
    _register_grpc(sharded.nodes[0], other, "10.6.4.2:10911", ["ShortVector"])
    split = api_pb2.RegisterTopicRequest(topic="ShortVectorSplit", queue_datas=[
        state_pb2.QueueData(broker_name=broker, read_queue_nums=1, write_queue_nums=1, perm=6)
        for broker in (other, name)])
    wrote = retry(lambda: sharded.nodes[1].ns.RegisterTopic(split, timeout=10), timeout=30)
    assert len(wrote.offsets) == GROUPS and all(wrote.offsets) and wrote.offset == wrote.offsets[0]
    info = sharded.nodes[0].ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(min_offsets=wrote.offsets), timeout=10)
    assert all(got >= want for got, want in zip(info.offsets, wrote.offsets, strict=True))

    capsys.readouterr()  # nsctl --json prints the vector a sharded cluster answers (a KV write: group 0's)
    assert nsctl.main(["--endpoints", sharded.nodes[0].grpc_addr, "--json", "kv", "put", "ns", "k", "v"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["offsets"] == [printed["offset"], 0]

    one = reference.ns.RegisterBroker(request, timeout=10)
    assert list(one.offsets) == []
    answered = reference.ns.GetRoute(api_pb2.GetRouteRequest(topic="ShortVector", min_offsets=[one.offset]),
                                     timeout=10)
    assert list(answered.offsets) == [] and answered.apply_offset >= one.offset
    with pytest.raises(grpc.RpcError) as refused:
        reference.ns.GetRoute(api_pb2.GetRouteRequest(topic="ShortVector", min_offsets=[0, 1]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "min_offsets: 2 entries: this cluster has 1 group (one entry a group)"


def test_the_client_s_read_your_writes_token_is_a_vector(clusters: tuple[Cluster, NodeProc]) -> None:
    """nameserver.client keeps one offset a group: after writes of a group-1 set whose offsets in group 1 are
    past group 0's whole log, its route read (any node) asks group 1 for them and group 0 for nothing more
    than it saw there, and is answered at once; a single token taken from those writes would wait for group
    0 to reach an offset of group 1's log (UNAVAILABLE until the deadline)."""
    sharded, _ = clusters
    name = _named("short-client", 1)
    with Client([n.grpc_addr for n in sharded.nodes], timeout=5) as client:
        for i in range(300):  # each a changed registration (its queues): an entry in group 1's log
            request = register_request(CLUSTER, name, "10.6.5.1:10911", ["ShortClient"], counter=i + 1, queues=i + 1)
            reply = client.register_broker(request)
            assert len(reply.offsets) == GROUPS and reply.offsets[0] == 0
            # node 0 may not hold group 1's write yet (an eventual read): wait for it, as the client would
            read = sharded.nodes[0].ns.GetRoute(
                api_pb2.GetRouteRequest(topic="ShortClient", min_offsets=list(reply.offsets)), timeout=5)
            if reply.offsets[1] > read.offsets[0] + 2:
                break
        else:
            raise AssertionError("group 1's log never got ahead of group 0's")
        for node in sharded.nodes:  # as many reads as endpoints (the client rotates over them)
            route = client.get_route("ShortClient", timeout=5)
            assert [bd.broker_name for bd in route.route.broker_datas] == [name], node.name
            assert route.offsets[1] >= reply.offsets[1]


def test_controller_mode_serves_sets_of_either_group_and_a_moved_set_keeps_its_record(
        clusters: tuple[Cluster, NodeProc]) -> None:
    """Controller mode with groups (docs/scaling.md, "Controller mode with groups"): a set whose routes the
    directory places in group 1 takes ids, registers, elects and is read over the controller port as one in
    group 0 does, its controller record in group 0 (group 1's core serves no Controller service and holds no
    ctrl/ record); GET_BROKER_MEMBER_GROUP answers each set's NameServer registrations from its group. The
    group-1 set is moved to group 0: its controller record is the same before and after, and an election
    (the master's in-sync report, then an admin's designated election) works after the move."""
    sharded, _ = clusters
    sets = {group: ControllerSet(_named("short-ctl", group), CLUSTER) for group in range(GROUPS)}
    try:
        leader = sharded.wait_for("a controller leader", lambda: leader_port(sharded))
        follower = next(n.controller_addr for n in sharded.nodes if n.controller_addr != leader)
        controllers = [n.controller_addr for n in sharded.nodes]
        for group, cs in sets.items():
            cs.claim([leader, follower])
            assert cs.ids == [1, 2]
            cs.heartbeat(controllers)
            code, header, remark = cs.elect(leader, 1)
            assert code == 0 and (header["masterBrokerId"], header["masterEpoch"]) == ("1", "1"), remark
            cs.register_routes(sharded.nodes[group], [f"Ctl-{cs.name}"])
        for group, cs in sets.items():
            sharded.wait_for(f"{cs.name}'s routes in group {group} alone on every node", lambda cs=cs, group=group: all(
                held_in(n, group, cs.name) and not held_in(n, 1 - group, cs.name) for n in sharded.nodes), timeout=20)
            for node in sharded.nodes:
                code, header, in_sync = cs.replica_info(node.controller_addr)
                assert (code, header["masterBrokerId"], header["masterEpoch"]) == (0, "1", "1")
                assert in_sync == {"syncStateSet": [1], "syncStateSetEpoch": 1}
                assert member_group(node, CLUSTER, cs.name) == {0: cs.addr(1), 2: cs.addr(2)}
        names = sorted(cs.name for cs in sets.values())
        for node in sharded.nodes:
            sharded.wait_for("both controller records in group 0", lambda node=node: controller_records(node, 0) == [
                keys.controller_key(name) for name in names], timeout=10)
            assert controller_records(node, 1) == []
            assert controller_service_of(node, 1) == grpc.StatusCode.UNIMPLEMENTED
        listed = api_pb2_grpc.ControllerStub(sharded.nodes[2]._channel()).ListBrokerSets(
            api_pb2.ListBrokerSetsRequest(), timeout=10)
        assert sorted(v.broker_name for v in listed.sets) == names

        moved = sets[1]
        before = [moved.replica_info(n.controller_addr) for n in sharded.nodes]
        reply = retry(lambda: _move(sharded.nodes[1], moved.name, 0, 30), timeout=30)
        assert (reply.source, reply.set.group) == (1, 0)
        sharded.wait_for("the moved set's routes in group 0 alone", lambda: all(
            held_in(n, 0, moved.name) and not held_in(n, 1, moved.name) for n in sharded.nodes), timeout=20)
        assert [moved.replica_info(n.controller_addr) for n in sharded.nodes] == before
        assert all(controller_records(n, 0) == [keys.controller_key(name) for name in names] for n in sharded.nodes)
        assert member_group(sharded.nodes[2], CLUSTER, moved.name) == {0: moved.addr(1), 2: moved.addr(2)}
        moved.heartbeat(controllers)  # broker 2 alive on the leader's table: the in-sync report needs it
        assert moved.report_in_sync(follower, 1, 1, [1, 2], 1) == 2
        code, header, remark = moved.elect(leader, 2, designate=True)
        assert code == 0 and (header["masterBrokerId"], header["masterEpoch"]) == ("2", "2"), remark
        for node in sharded.nodes:
            code, header, in_sync = moved.replica_info(node.controller_addr)
            assert (code, header["masterBrokerId"], header["masterEpoch"]) == (0, "2", "2")
            assert in_sync == {"syncStateSet": [2], "syncStateSetEpoch": 3}
    finally:
        for cs in sets.values():
            cs.stop()


def test_each_process_lists_what_it_serves_and_the_node_s_health_is_every_group_s(
        clusters: tuple[Cluster, NodeProc]) -> None:
    """Each process's reflection lists exactly the services it answers, each answering a call made from
    reflection alone: the cores' Log too, the workers' Shards too. A group k core serves no Controller (it
    answers UNIMPLEMENTED: the controller test above): its reflection lists none and its health knows none
    (NOT_FOUND), group 0's core's lists it, and so does the node (its workers pass controller calls to group
    0's core). The node's health, Check and Watch alike, is every group core's: SERVING for the node ("",
    NameServer), and the Controller service's is group 0's core's (group 1's NOT_FOUND does not make it
    NOT_SERVING)."""
    sharded, _ = clusters
    node = sharded.nodes[0]
    with group_core_channel(node, 0) as core0, group_core_channel(node, 1) as core1:
        assert listed_and_answering(core0) == CORE_SERVICES  # each listed service answers a call
        assert listed_and_answering(core1) == CORE_SERVICES - {CONTROLLER_SERVICE}
        health1 = health_pb2_grpc.HealthStub(core1)
        with pytest.raises(grpc.RpcError) as err:
            health1.Check(health_pb2.HealthCheckRequest(service=CONTROLLER_SERVICE), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        serving = health1.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert serving == health_pb2.HealthCheckResponse.SERVING
    assert listed_and_answering(node._channel()) == SHARDED_WORKER_SERVICES  # Shards too, answered by the workers
    health = health_pb2_grpc.HealthStub(node._channel())
    for service in ("", api_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name, CONTROLLER_SERVICE):
        ask = health_pb2.HealthCheckRequest(service=service)
        assert health.Check(ask, timeout=5).status == health_pb2.HealthCheckResponse.SERVING, service
        watch = health.Watch(ask, timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING, service
        watch.cancel()


def test_only_group_0_s_core_exports_controller_gauges(clusters: tuple[Cluster, NodeProc]) -> None:
    """The node's /metrics after the controller test above: the controller's series (its gauges per set, its
    quota) are group 0's core's alone; group 1's core, read in the same scrape, exports none (it serves no
    controller), its other quotas still shown."""
    sharded, _ = clusters

    def both_groups_read() -> list[tuple[str, dict[str, str]]] | None:
        text = urllib.request.urlopen(f"http://{sharded.nodes[0].metrics_addr}/metrics", timeout=10).read().decode()
        found = [s for family in text_string_to_metric_families(text) for s in family.samples]
        read = {s.labels["group"] for s in found if s.name == "nameserver_group_metrics_read" and s.value == 1}
        return [(s.name, s.labels) for s in found] if read == {"0", "1"} else None

    samples = sharded.wait_for("group 1's core's metrics in the node's scrape", both_groups_read, timeout=20)
    controller = [(name, labels) for name, labels in samples
                  if name.startswith("nameserver_controller_") or labels.get("quota") == "max_controller_sets"]
    assert any(name == "nameserver_controller_master_epoch" for name, _ in controller)  # the sets registered above
    assert {labels["group"] for _, labels in controller} == {"0"}, controller
    assert ("nameserver_quota_limit", {"group": "1", "quota": "max_brokers"}) in samples
