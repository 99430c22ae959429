"""A broker set moved between Raft groups under load, with kills (issue 29 item 4; docs/scaling.md, "Sharding":
the move duty's executor, nameserver/groups/moveduty.py), on a real 3-node cluster with [sharding] groups = 2
and one worker per node, beside a one-group node fed the same registrations.

FakeBrokers of the moved set register (each a new address, one every few tenths of a second) and heartbeat
all along, through one node's remoting port (a node whose group 0 core is not the one killed: a core's death
takes its workers, and a broker whose connection closes is unregistered, as RocketMQ does). The set is
moved from group 0 to group 1 with `Shards.MoveShard` while group 0's core leader is SIGKILLed mid-move
(the moment it applies the begin), then back while group 1's core leader is (the moment it applies the
fence): the first call fails with its driver and group 0's new leader finishes the move on its own; the
second goes on with group 1's next leader (or fails and the duty runs it again). Each time the call sent
again says the set is there already. Afterwards every acknowledged registration is in the set's group and
only there, the other group holds nothing of the set but its tombstone, and the routes and the cluster info
equal the one-group node's. A move that cannot run in time is answered with the node's message, writing
nothing.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from nameserver.cli import nsctl
from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2, shards_pb2_grpc, state_pb2
from nameserver.remoting import codes
from nameserver.state import MetadataState, keys
from nameserver.state.shards import moves
from nameserver.state.shards.directory import default_group
from tests.cluster import Cluster, NodeProc, register_request, retry, running
from tests.fakebroker import FakeBroker
from tests.integration.groupcores import (
    group_core_channel,
    group_core_pids,
    group_leader,
    group_status,
    without_offsets,
)

GROUPS = 2
pytestmark = pytest.mark.slow  # two clusters of 10 processes and two moves with kills (about a minute here)
MOVED = next(f"moving-{i}" for i in range(40) if default_group(f"moving-{i}", GROUPS) == 0)
STAYS = next(f"stays-{i}" for i in range(40) if default_group(f"stays-{i}", GROUPS) == 1)
TOPICS = ["Shared", "OwnMoved"]
BROKERS = 24  # the moved set's brokers: ids 0..23, registered one after another during the moves


def group_state(node: NodeProc, group: int) -> MetadataState:
    """Group `group`'s whole state on `node`'s core of that group (Log.DumpState)."""
    with group_core_channel(node, group) as channel:
        chunks = list(api_pb2_grpc.LogStub(channel).DumpState(api_pb2.DumpStateRequest(), timeout=10))
    state = MetadataState()
    items = [(item.key, item.value, item.version, item.type) for chunk in chunks for item in chunk.items]
    state.restore(chunks[-1].apply_offset if chunks else 0, items)
    return state


def shards(node: NodeProc) -> shards_pb2_grpc.ShardsStub:
    return shards_pb2_grpc.ShardsStub(node._channel())


def directory_entry(node: NodeProc, name: str = MOVED) -> state_pb2.ShardSet | None:
    try:
        reply = shards(node).ListShards(shards_pb2.ListShardsRequest(broker_name=name), timeout=2)
    except grpc.RpcError:
        return None
    return reply.sets[0].set if reply.sets else None


class Load:
    """The moved set's brokers: each registers once (a new address in the set) then heartbeats, all through
    `node`'s remoting port; a refused registration (the set moving: SYSTEM_BUSY) is sent again, as a broker
    does. An acknowledged one is registered with the one-group node too."""

    def __init__(self, node: NodeProc, reference: NodeProc) -> None:
        self.node, self.reference = node, reference
        self.brokers = [FakeBroker(MOVED, cluster="MoveCluster").start() for _ in range(BROKERS)]
        self.acked: list[FakeBroker] = []
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="move-load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def _register(self, bid: int, broker: FakeBroker) -> bool:
        try:
            resp = broker.register(self.node.remoting_addr, TOPICS, broker_id=bid, timeout=5)
        except (OSError, TimeoutError, AssertionError):  # a connection closed by a node going down
            return False
        if resp is None or resp.code != codes.SUCCESS:
            self.refused += 1
            return False
        ref = broker.register(self.reference.remoting_addr, TOPICS, broker_id=bid, timeout=10)
        assert ref is not None and ref.code == codes.SUCCESS
        return True

    def _run(self) -> None:
        waiting = list(enumerate(self.brokers))
        while not self._stop.is_set():
            if waiting and self._register(*waiting[0]):
                self.acked.append(waiting.pop(0)[1])
            for broker in random.sample(self.acked, min(4, len(self.acked))):
                with contextlib.suppress(OSError, TimeoutError, AssertionError):
                    broker.heartbeat(self.node.remoting_addr)
            self._stop.wait(0.15)

    def wait_acked(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.acked) >= n, f"{len(self.acked)} of {n} registrations acknowledged"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def close(self) -> None:
        self.stop()
        for broker in self.brokers:
            broker.stop()


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Cluster]]:
    sharded = Cluster(str(tmp_path_factory.mktemp("moves")), size=3, worker_processes=1, groups=GROUPS,
                      remoting=True)
    reference = Cluster(str(tmp_path_factory.mktemp("moves-one")), size=1, worker_processes=1, remoting=True)
    with running(sharded, timeout=sharded.ready_timeout), running(reference, timeout=reference.ready_timeout):
        yield sharded, reference


class FenceWatch:
    """A watch of the set's shard/ record on `node`'s core of `group` (NameServer.Watch on its private socket):
    `fenced` is set the moment that core applies a record of the set moving (group 0: the directory's
    begin; group k: the source's fence), so a kill right then lands inside the move."""

    def __init__(self, node: NodeProc, group: int) -> None:
        self.channel = group_core_channel(node, group)
        self.stream = api_pb2_grpc.NameServerStub(self.channel).Watch(
            api_pb2.WatchRequest(key_prefixes=[keys.shard_key(MOVED)]), timeout=120)
        self.listed, self.fenced = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.listed.wait(30), "the watch did not list the current state"

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for response in self.stream:
                for event in response.events:
                    if not event.deleted and state_pb2.ShardSet.FromString(event.value).HasField("moving_to"):
                        self.fenced.set()
                        return
                if response.initial_state_done:
                    self.listed.set()

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


def _move_killing(sharded: Cluster, target: int, victim_group: int) -> tuple[NodeProc, bool]:
    """Ask the move through a node that is not killed and SIGKILL `victim_group`'s core leader the moment
    it applies the set's fence (group 0: the begin; group 1: the source's fence, before the copy and the
    drop): inside the move, whose driver or one of whose groups loses its leader. Returns the node whose
    core was killed and whether the call failed (it does when the driver died with it); the move's end is
    the caller's to wait for."""
    victim = sharded.wait_for(f"group {victim_group}'s leader", lambda: group_leader(sharded, victim_group),
                              timeout=60)
    asker = next(n for n in sharded.nodes if n is not victim and n.alive)
    sharded.wait_for("the asking node's worker serving the directory", lambda: directory_entry(asker), timeout=60)
    watch = FenceWatch(victim, victim_group)
    answers: list[object] = []

    def ask() -> None:
        try:
            answers.append(shards(asker).MoveShard(shards_pb2.ShardPlacement(broker_name=MOVED, group=target),
                                                   timeout=60))
        except grpc.RpcError as exc:
            answers.append(exc)

    caller = threading.Thread(target=ask)
    caller.start()
    try:
        assert watch.fenced.wait(30), f"the move did not begin: {answers}"
        if victim_group == 0:
            sharded.kill(victim)  # the node's core: group 0's, its group cores and its worker go with it
        else:
            [pid] = group_core_pids(victim)
            os.kill(pid, signal.SIGKILL)
    finally:
        watch.close()
    caller.join(timeout=90)
    assert answers, "MoveShard did not answer"
    return victim, isinstance(answers[0], grpc.RpcError)


def _sent_again_says_done(sharded: Cluster, target: int) -> None:
    """The operator's call sent again once the duty finished the move: refused, the set is there already."""
    asker = next(n for n in sharded.nodes if n.alive)
    with pytest.raises(grpc.RpcError) as err:
        retry(lambda: shards(asker).MoveShard(shards_pb2.ShardPlacement(broker_name=MOVED, group=target),
                                              timeout=30), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"group: set {MOVED!r} is in group {target} already"


def _moved_to(sharded: Cluster, target: int) -> bool:
    """On every live node: the directory names `target`, no move under way, the set's records in `target`
    only, the other group holding its tombstone alone (a record naming `target`, nothing else of the set)."""
    source = 1 - target
    for node in sharded.nodes:
        if not node.alive:
            continue
        try:
            held, left = group_state(node, target), group_state(node, source)
        except grpc.RpcError:
            return False
        g0 = held if target == 0 else left
        entry = g0.directory.entry(MOVED)
        if entry is None or entry.group != target or entry.HasField("moving_to"):
            return False
        if moves.set_keys(left, MOVED) or not moves.set_keys(held, MOVED):
            return False
        if source != 0 and left.directory.entry(MOVED) != state_pb2.ShardSet(group=target):
            return False
        if target != 0 and not moves.opened(held, target, MOVED):
            return False
    return True


def _addrs(state: MetadataState) -> dict[int, str]:
    data = state.broker_data(MOVED)
    return {a.broker_id: a.addr for a in data.addrs} if data is not None else {}


def _equal_to_reference(sharded: Cluster, reference: NodeProc) -> bool:
    for node in sharded.nodes:
        if not node.alive:
            continue
        try:
            for topic in [*TOPICS, "OwnStays"]:
                got = node.ns.GetRoute(api_pb2.GetRouteRequest(topic=topic), timeout=5).route
                want = reference.ns.GetRoute(api_pb2.GetRouteRequest(topic=topic), timeout=5).route
                if got != want:
                    return False
            info = node.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
        except grpc.RpcError:
            return False
        ref = reference.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
        without_offsets(info, ref)
        if info != ref:
            return False
    return True


def _nsctl(capsys: pytest.CaptureFixture[str], sharded: Cluster, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    endpoints = ",".join(n.grpc_addr for n in sharded.nodes if n.alive)
    code = nsctl.main(["--endpoints", endpoints, "--timeout", "30", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_set_moved_there_and_back_under_load_with_leaders_killed_loses_no_registration(
        clusters: tuple[Cluster, Cluster], capsys: pytest.CaptureFixture[str]) -> None:
    sharded, one = clusters
    reference = one.nodes[0]
    stays = FakeBroker(STAYS, cluster="MoveCluster").start()  # a set of group 1 that stays: routes merge both
    group0_leader = sharded.wait_for("group 0's leader", lambda: group_leader(sharded, 0), timeout=60)
    entry = next(n for n in sharded.nodes if n is not group0_leader)  # the brokers' node: not killed below
    load = Load(entry, reference)
    try:
        for node in (entry, reference):
            assert stays.register(node.remoting_addr, ["Shared", "OwnStays"], timeout=10).code == codes.SUCCESS
        load.start()
        load.wait_acked(3)
        sharded.wait_for("the set assigned to group 0", lambda: (e := directory_entry(entry)) is not None
                         and e.group == 0)

        killed, cut = _move_killing(sharded, 1, victim_group=0)
        assert killed is group0_leader and cut, "the kill did not cut the move short"
        # finished by group 0's new leader, which resumed it when elected (no call sent again)
        sharded.wait_for("the set in group 1 only, group 0 holding nothing of it", lambda: _moved_to(sharded, 1),
                         timeout=60, every=0.5)
        _sent_again_says_done(sharded, 1)
        code, out, err = _nsctl(capsys, sharded, "shard", "list", MOVED)  # the operator's view: its new group
        assert code == 0, err
        assert out.splitlines()[1].split()[:2] == [MOVED, "1"]
        load.wait_acked(10)
        sharded.start(killed)  # back, so the move back has every node
        sharded.wait_for("group 1 ready on every node", lambda: all(
            (st := group_status(n, 1)) is not None and st.ready for n in sharded.nodes), timeout=90)

        # group 1's leader dies between the fence and the drop, both its group's: the call's own run goes on
        # with the group's next leader, or fails and group 0's leader's duty runs the move again
        _move_killing(sharded, 0, victim_group=1)
        sharded.wait_for("the set back in group 0 only, group 1 holding its tombstone alone",
                         lambda: _moved_to(sharded, 0), timeout=90, every=0.5)
        _sent_again_says_done(sharded, 0)
        load.wait_acked(BROKERS, timeout=60)
        load.stop()

        def all_acked_present() -> bool:
            want = {bid: b.addr for bid, b in enumerate(load.brokers) if b in load.acked}
            return all(_addrs(group_state(n, 0)) == want and not _addrs(group_state(n, 1))
                       for n in sharded.nodes if n.alive)

        sharded.wait_for("every acknowledged registration in group 0, none in group 1", all_acked_present,
                         timeout=30, every=0.5)
        sharded.wait_for("routes and cluster info equal the one-group node's",
                         lambda: _equal_to_reference(sharded, reference), timeout=30, every=0.5)
    finally:
        load.close()
        stays.stop()


def test_nsctl_shard_assign_pins_and_move_refuses_bad_input_by_field(
        clusters: tuple[Cluster, Cluster], capsys: pytest.CaptureFixture[str]) -> None:
    sharded, _ = clusters

    def run(*args: str) -> tuple[int, str, str]:
        return _nsctl(capsys, sharded, *args)

    pinned = next(f"pinned-{i}" for i in range(40) if default_group(f"pinned-{i}", GROUPS) == 0)
    code, out, err = retry(lambda: run("shard", "assign", pinned, "1"), timeout=30)
    assert code == 0, err
    assert f"broker set {pinned} is now pinned to group 1" in out
    code, out, _ = run("shard", "assign", pinned, "1")
    assert code == 0 and "already pinned" in out
    code, _, err = run("shard", "assign", pinned, "0")
    assert code == 1 and err.startswith("error: INVALID_ARGUMENT: group: ") and "move it instead" in err
    code, _, err = run("shard", "move", "nobody-here", "1")
    assert (code, err) == (1, "error: INVALID_ARGUMENT: broker_name: no broker set 'nobody-here'\n")
    code, _, err = run("shard", "move", pinned, "5")
    assert code == 1 and "INVALID_ARGUMENT: group: 5 is not" in err
    code, out, err = run("shard", "list", pinned)
    assert code == 0 and out.splitlines()[1].split()[:2] == [pinned, "1"]


def test_a_move_that_cannot_run_in_time_says_so_and_writes_nothing(
        clusters: tuple[Cluster, Cluster], capsys: pytest.CaptureFixture[str]) -> None:
    """Every group 1 core stopped (SIGSTOP): a move to group 1 cannot read group 1, and `nsctl shard move`
    answers before its --timeout with the node's message (the move did not begin, nothing was written)
    rather than gRPC's bare deadline; once the cores go on, the set is where it was."""
    sharded, _ = clusters
    name = next(f"stuck-{i}" for i in range(40) if default_group(f"stuck-{i}", GROUPS) == 0)
    node = sharded.nodes[0] if sharded.nodes[0].alive else sharded.nodes[1]
    retry(lambda: node.ns.RegisterBroker(register_request("MoveCluster", name, "10.8.0.1:10911", ["T"]), timeout=10),
          timeout=30)
    stopped = [pid for n in sharded.nodes if n.alive for pid in group_core_pids(n)]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        capsys.readouterr()
        code = nsctl.main(["--endpoints", node.grpc_addr, "--timeout", "4", "shard", "move", name, "1"])
        _, err = capsys.readouterr()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert code == 1 and "DEADLINE_EXCEEDED" in err, err
    assert f"the move of set {name!r} to group 1 did not begin in this call" in err and "nothing was written" in err
    entry = directory_entry(node, name)
    assert entry is not None and entry.group == 0 and not entry.HasField("moving_to")
