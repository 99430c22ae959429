"""Controller mode with real Apache RocketMQ 5 brokers (RIP-44): our three nodes are the brokers' controller
(`controllerAddr`) as well as their nameserver. One broker set of three brokers in controller mode takes its
ids from us, elects a master and replicates (allAckInSyncStateSet: a send is acknowledged once every
in-sync replica has it); a real producer sends and a push consumer receives. The master is killed with
SIGKILL: we elect an in-sync slave within the heartbeat timeout plus a scan, the brokers take their new
roles, the route names the new master, and every acknowledged message is consumed.

The first test runs again against a sharded cluster ([sharding] groups = 2), the set's routes in group 1 and
its controller record in group 0.

The 5.x line only: controller mode does not exist in 4.9.x. All four tests run in `make interop` (a minute to
three each); `make test` walks the same protocol with stand-in brokers (tests/integration/test_controller.py)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2, shards_pb2_grpc, state_pb2
from tests.cluster import retry
from tests.controllerview import epoch_problems, masters_by_epoch, summary
from tests.integration.groupcontroller import controller_records
from tests.integration.groupcores import own_cluster_info
from tests.linearizability.checker import INF, Op, check
from tests.linearizability.porcupine import check_with_porcupine

from . import jars
from .conftest import Deployment, deploy
from .launcher import Broker
from .traffic import create_topic, produce, start_consumer

VERSION = jars.LINE_5
SET = "broker-c"
HEARTBEAT_TIMEOUT_MS = 4000  # the brokers' controllerHeartBeatTimeoutMills
SCAN_MS = 500                # our [controller] scan_interval_ms (tests/cluster.py)


def controller_settings(d: Deployment) -> dict[str, str]:
    assert d.ours is not None
    return controller_settings_for(";".join(n.controller_addr for n in d.ours.nodes))


def controller_settings_for(controller_addr: str) -> dict[str, str]:
    return {"enableControllerMode": "true", "controllerAddr": controller_addr,
            "allAckInSyncStateSet": "true",          # acknowledged = on every in-sync replica
            "controllerHeartBeatTimeoutMills": str(HEARTBEAT_TIMEOUT_MS), "brokerHeartbeatInterval": "500",
            "syncBrokerMetadataPeriod": "1000", "checkSyncStateSetPeriod": "1000",
            "syncControllerMetadataPeriod": "2000", "haSendHeartbeatInterval": "1000"}


def controller_deployment(root: str, **settings) -> Iterator[Deployment]:
    """Ours (controller ports on) and one broker set of three RocketMQ 5 brokers in controller mode, booted.
    `settings`: more of tests/cluster.py's (a sharded cluster's), and `before_brokers`, called with the
    deployment before any broker starts."""
    before_brokers = settings.pop("before_brokers", None)
    try:
        jars.ensure(VERSION)
    except RuntimeError as exc:
        pytest.fail(f"cannot fetch RocketMQ {VERSION}: {exc}")
    d = deploy(VERSION, root, brokers=False, controller=True, **settings)
    try:
        if before_brokers is not None:
            before_brokers(d)
        extra = controller_settings(d)
        d.brokers = {f"c{i}": d.rmq.broker(SET, d.namesrv, -1, extra=extra, wait=False, instance=f"c{i}")
                     for i in range(3)}
        for b in d.brokers.values():
            b.proc.wait_line(lambda ln: "boot success" in ln, timeout=180)
        yield d
    finally:
        d.stop()


@pytest.fixture
def ctl(tmp_path) -> Iterator[Deployment]:
    yield from controller_deployment(str(tmp_path))


SHARDED_GROUP = 1  # the set's routes are pinned there; its controller record is group 0's (docs/scaling.md)


def _pin_set(d: Deployment) -> None:
    assert d.ours is not None
    node = d.ours.nodes[0]
    retry(lambda: shards_pb2_grpc.ShardsStub(node._channel()).AssignShard(
        shards_pb2.ShardPlacement(broker_name=SET, group=SHARDED_GROUP), timeout=10), timeout=60)


@pytest.fixture
def ctl_sharded(tmp_path) -> Iterator[Deployment]:
    """As `ctl`, on a cluster of [sharding] groups = 2 (one worker a node), the set pinned to group 1."""
    yield from controller_deployment(str(tmp_path), worker_processes=1, groups=2, before_brokers=_pin_set)


def broker_set(d: Deployment) -> api_pb2.BrokerSetView | None:
    """The set as the cluster's state holds it (a linearizable read through whichever node answers)."""
    assert d.ours is not None
    for node in d.ours.nodes:
        if not node.alive:
            continue
        try:
            reply = api_pb2_grpc.ControllerStub(grpc.insecure_channel(node.grpc_addr)).GetReplicaInfo(
                api_pb2.BrokerSetRequest(broker_name=SET), timeout=5)
        except grpc.RpcError:
            continue
        return reply.set if reply.code == 0 else None
    return None


def wait_set(d: Deployment, what: str, pred, timeout: float) -> api_pb2.BrokerSetView:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = broker_set(d)
        if last is not None and pred(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"broker set {SET}: no {what} after {timeout}s; last seen:\n{last}\n{d.logs()[-4000:]}")


def by_address(d: Deployment, addr: str) -> Broker:
    return next(b for b in d.brokers.values() if b.addr == addr)


def route_master(d: Deployment, topic: str) -> set[str]:
    """The address each of our running nodes' routes gives as the set's master (brokerId 0)."""
    from .remoting import route

    assert d.ours is not None
    masters = set()
    for addr in [n.remoting_addr for n in d.ours.nodes if n.alive]:
        rt = route(addr, topic)
        bd = next((b for b in (rt or {}).get("brokerDatas", []) if b["brokerName"] == SET), None)
        masters.add((bd or {}).get("brokerAddrs", {}).get("0") or (bd or {}).get("brokerAddrs", {}).get(0, ""))
    return masters


@pytest.mark.interop  # about a minute of three broker JVMs; make test walks the protocol with stand-ins
def test_a_broker_set_elects_on_our_controller_replicates_and_fails_over(ctl: Deployment) -> None:
    elects_replicates_and_fails_over(ctl)


@pytest.mark.interop  # as above, beside a sharded cluster's 9 processes
def test_a_broker_set_in_group_1_of_a_sharded_cluster_elects_and_fails_over(ctl_sharded: Deployment) -> None:
    """Controller mode with groups (docs/scaling.md, "Controller mode with groups"): the same brokers against
    a cluster of 2 Raft groups a node, their set's routes in group 1 and its controller record in group 0."""
    d = ctl_sharded
    elects_replicates_and_fails_over(d)
    assert d.ours is not None
    for node in d.ours.nodes:
        assert SET in own_cluster_info(node, SHARDED_GROUP).broker_addr_table
        assert SET not in own_cluster_info(node, 0).broker_addr_table
        assert controller_records(node, 0) == [f"ctrl/{SET}"] and controller_records(node, SHARDED_GROUP) == []


def elects_replicates_and_fails_over(d: Deployment) -> None:
    """Three brokers in sync under a master we elected; a producer and a consumer; the master SIGKILLed: an
    in-sync slave elected within the heartbeat timeout and a scan, the route names it, no message lost."""
    view = wait_set(d, "master with all three brokers in sync",
                    lambda v: v.master_id and len(v.sync_state_set) == 3 and len(v.replicas) == 3, timeout=90)
    assert sorted(r.broker_id for r in view.replicas) == [1, 2, 3]  # ids we assigned, from 1
    master = by_address(d, view.master_address)
    topic, group = "CtlModeTopic", "ctl-mode-cg"
    create_topic(d, topic, brokers=(SET,))
    consumer = start_consumer(d, topic, group, "ctl1")
    try:
        consumer.wait_owning()
        before = produce(d, topic, 30, prefix="before")
        assert not before.failed and len(before.sent) == 30, before.failed
        consumer.wait_received(set(before.sent))

        killed_at = time.monotonic()
        master.proc.kill()
        after_view = wait_set(d, "new master", lambda v: v.master_id not in (0, view.master_id),
                              timeout=HEARTBEAT_TIMEOUT_MS / 1000 + 20)
        took = time.monotonic() - killed_at
        # elected from the in-sync replicas, with both epochs moved on
        assert after_view.master_id in view.sync_state_set
        assert after_view.master_epoch == view.master_epoch + 1
        assert list(after_view.sync_state_set) == [after_view.master_id]
        assert took < HEARTBEAT_TIMEOUT_MS / 1000 + SCAN_MS / 1000 + 3, took
        # The new master takes its role and registers with our nameservers as brokerId 0.
        new_master = by_address(d, after_view.master_address)
        deadline = time.monotonic() + 60
        while route_master(d, topic) != {new_master.addr} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert route_master(d, topic) == {new_master.addr}
        after = produce(d, topic, 30, prefix="after")
        assert not after.failed and len(after.sent) == 30, after.failed
        got = set(consumer.wait_received(set(before.sent) | set(after.sent), timeout=120))
        assert set(before.sent) | set(after.sent) <= got  # no acknowledged message lost
        print(f"controller failover: new master {after_view.master_id} elected {took:.1f} s after SIGKILL "
              f"(heartbeat timeout {HEARTBEAT_TIMEOUT_MS} ms, scan {SCAN_MS} ms)", flush=True)
    finally:
        consumer.proc.stop()


class SetHistory:
    """What the real brokers and our scan did to the set, checked as a history: linearizable reads
    (GetReplicaInfo through random live nodes, each with the version of the record it read) recorded by
    reader threads, and every write the log holds for the set. The writes' callers are the brokers and the
    leader's own scan, whose call times we do not see: each write is an operation of unknown outcome that
    may take effect any time after the start, compare-and-set from the version before it in the log. So the
    checkers decide whether every read fits one order of those writes that respects real time (no stale
    read across the leader kill, no read of a version the log does not hold)."""

    def __init__(self, d: Deployment, readers: int = 2) -> None:
        assert d.ours is not None
        self.cluster = d.ours
        self.reads: list[Op] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(p,), daemon=True) for p in range(readers)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _read(self, p: int) -> None:
        rng = random.Random(p)
        while not self._stop.is_set():
            node = rng.choice([n for n in self.cluster.nodes if n.alive] or self.cluster.nodes)
            stub = api_pb2_grpc.ControllerStub(grpc.insecure_channel(node.grpc_addr))
            t0 = time.monotonic()
            try:
                reply = stub.GetReplicaInfo(api_pb2.BrokerSetRequest(broker_name=SET,
                                                                     consistency=api_pb2.LINEARIZABLE), timeout=2)
            except grpc.RpcError:
                with self._lock:
                    self.errors += 1  # no answer: a read has no effect, so it is left out
                time.sleep(0.05)
                continue
            t1 = time.monotonic()
            found = reply.HasField("set")
            with self._lock:
                self.reads.append(Op(p, SET, "read", t0, t1, "ok", owner=summary(reply.set) if found else "",
                                     version=reply.set_version, found=found))
            time.sleep(0.02)

    def writes(self, node) -> list[tuple[int, state_pb2.ControllerBrokerSet]]:
        """(version, record) of every write of the set, in log order, from a node's watch history."""
        stub = api_pb2_grpc.NameServerStub(grpc.insecure_channel(node.grpc_addr))
        end = node.status(timeout=5).apply_offset
        out = []
        for msg in stub.Watch(api_pb2.WatchRequest(key_prefixes=[f"ctrl/{SET}"], start_offset=1), timeout=60):
            for ev in msg.events:
                if ev.key == f"ctrl/{SET}" and not ev.deleted:
                    out.append((ev.version, state_pb2.ControllerBrokerSet.FromString(ev.value)))
            if not msg.events and msg.offset >= end:
                break
        return out

    def check(self, node) -> dict:
        writes = self.writes(node)
        ops = [Op(1000 + i, SET, "bind", 0.0, INF, "unknown", owner=summary(rec),
                  expected=writes[i - 1][0] if i else 0, version=version)
               for i, (version, rec) in enumerate(writes)]
        history = ops + self.reads
        # The control: the same history with one stale read added (after every other read, the value of
        # the first write that had a master) must be refused by both, or the check could not fail.
        last = max(self.reads, key=lambda op: op.complete)
        old = next(i for i, (_, rec) in enumerate(writes) if rec.master_id)
        stale = Op(99, SET, "read", last.complete + 1, last.complete + 2, "ok", owner=ops[old].owner,
                   version=writes[old][0], found=True)
        ours = [(r.key, r.detail) for r in check(history) if not r.ok]
        control = [r.ok for r in check([*history, stale])]
        theirs, theirs_control = check_with_porcupine([history, [*history, stale]], timeout_s=30)
        return {"writes": len(writes), "reads": len(self.reads), "read_errors": self.errors, "ours": ours or "ok",
                "porcupine": theirs, "stale_read_refused": (control == [False], theirs_control),
                "epoch_problems": epoch_problems(writes),
                "masters": {e: sorted(m) for e, m in masters_by_epoch(rec for _, rec in writes).items()}}


@pytest.mark.interop
def test_the_brokers_fail_over_while_our_raft_leader_is_killed_too(ctl: Deployment) -> None:
    """SIGKILL the master broker, and our Raft leader one second later, inside the heartbeat timeout: the
    surviving nodes still elect exactly one new master, the epoch moves by exactly one, the producer resumes
    and no acknowledged message is lost; the killed node comes back and converges."""
    d = ctl
    assert d.ours is not None
    view = wait_set(d, "master with all three brokers in sync",
                    lambda v: v.master_id and len(v.sync_state_set) == 3 and len(v.replicas) == 3, timeout=90)
    topic, group = "CtlModeLeaderKill", "ctl-mode-leader-kill"
    create_topic(d, topic, brokers=(SET,))
    consumer = start_consumer(d, topic, group, "ctl2")
    history = SetHistory(d)
    history.start()
    try:
        consumer.wait_owning()
        before = produce(d, topic, 30, prefix="lk-before")
        assert not before.failed, before.failed
        by_address(d, view.master_address).proc.kill()
        time.sleep(1.0)
        raft_leader = d.ours.leader()
        assert raft_leader is not None
        d.ours.kill(raft_leader)
        after_view = wait_set(d, "new master", lambda v: v.master_id not in (0, view.master_id),
                              timeout=HEARTBEAT_TIMEOUT_MS / 1000 + 30)
        assert after_view.master_id in view.sync_state_set
        assert after_view.master_epoch == view.master_epoch + 1  # one election, not two
        new_master = by_address(d, after_view.master_address)
        deadline = time.monotonic() + 60
        while route_master(d, topic) != {new_master.addr} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert route_master(d, topic) == {new_master.addr}
        after = produce(d, topic, 30, prefix="lk-after")
        # The stock client asks one nameserver of its list for the route; when it picks the one we killed,
        # that send fails with a connect error to it (the client's own behaviour, with any nameserver), and
        # the next sends go on. Nothing else may fail.
        dead = f"connect to {raft_leader.remoting_addr} failed"
        assert all(dead in f for f in after.failed) and len(after.failed) <= 2, (after.failed, dead)
        assert len(after.sent) + len(after.failed) == 30
        print(f"after the leader kill: {len(after.sent)} sent, failed: {after.failed}", flush=True)
        consumer.wait_received(set(before.sent) | set(after.sent), timeout=120)
        d.ours.start(raft_leader)
        d.ours.wait_converged(timeout=60)
        assert broker_set(d).master_epoch == after_view.master_epoch  # nothing re-elected meanwhile
        history.stop()
        survivor = next(n for n in d.ours.nodes if n is not raft_leader)  # its watch history is whole
        verdict = history.check(survivor)
        print(f"controller history across the leader kill: {verdict}", flush=True)
        assert verdict["ours"] == "ok", verdict
        assert verdict["porcupine"] in ("ok", "unknown"), verdict  # "unknown": its time ran out, no verdict
        assert verdict["stale_read_refused"] == (True, "illegal"), verdict
        assert verdict["epoch_problems"] == [], verdict  # along the log
        assert verdict["reads"] >= 50 and verdict["writes"] >= 4, verdict
    finally:
        history.stop()
        consumer.proc.stop()


def _mqadmin_lines(d: Deployment, *args: str) -> tuple[str, str]:
    r = d.rmq.mqadmin(*args, namesrv=d.namesrv)
    return r.stdout, r.stderr


def _sync_state(d: Deployment, addr: str) -> dict:
    """mqadmin getSyncStateSet, parsed: master id, epochs, {id: (in sync, alive)}."""
    out, err = _mqadmin_lines(d, "getSyncStateSet", "-a", addr, "-b", SET)
    fields = dict(line[1:].split("\t", 1) for line in out.splitlines() if line.startswith("#") and "\t" in line)
    replicas, addrs = {}, {}
    for line in out.splitlines():
        if "ReplicaIdentity" in line:
            rid = int(line.split("brokerId=")[1].split(",")[0])
            replicas[rid] = (line.startswith("InSyncReplica"), "alive=true" in line)
            addrs[rid] = line.split("brokerAddress='")[1].split("'")[0]
    assert fields, f"getSyncStateSet printed nothing:\n{out}\n{err[-2000:]}"
    return {"master": int(fields["MasterBrokerId"]), "epoch": int(fields["MasterEpoch"]),
            "set_epoch": int(fields["SyncStateSetEpoch"]), "replicas": replicas, "addrs": addrs}


def _refusal(out_err: tuple[str, str]) -> str:
    """The 'CODE: n  DESC: ...' line mqadmin prints for a controller's refusal ('' for none)."""
    text = out_err[0] + out_err[1]
    return next((line.split("MQBrokerException: ", 1)[1] for line in text.splitlines() if "CODE: " in line), "")


def controller_scenario(d: Deployment, controller: str, settings: dict[str, str]) -> dict:
    """The same steps against any controller (ours or Apache RocketMQ's): three brokers come up; mqadmin
    reads the set, hands mastership to a slave, tries an unknown broker, tries to clean live brokers, then
    cleans one that was killed. Returns what mqadmin showed, with broker ids relative to the first master."""
    d.brokers = {f"c{i}": d.rmq.broker(SET, d.namesrv, -1, extra=settings, wait=False, instance=f"c{i}")
                 for i in range(3)}
    for b in d.brokers.values():
        b.proc.wait_line(lambda ln: "boot success" in ln, timeout=180)
    a = controller.split(";")[0]
    deadline = time.monotonic() + 90
    while (first := _sync_state(d, a)) and len([r for r in first["replicas"].values() if r[0]]) < 3:
        assert time.monotonic() < deadline, first
        time.sleep(1)
    meta, _ = _mqadmin_lines(d, "getControllerMetaData", "-a", a)
    epochs, _ = _mqadmin_lines(d, "getBrokerEpoch", "-b", SET)  # asked of the brokers, found through the routes
    master = first["master"]
    assert len(first["replicas"]) == 3, first
    slave, other = sorted(set(first["replicas"]) - {master})
    elect_out = _mqadmin_lines(d, "electMaster", "-a", a, "-c", "InteropCluster", "-bn", SET, "-b", str(slave))
    time.sleep(3)  # the brokers take their roles; the new master reports its slaves in sync again
    after_elect = _sync_state(d, a)
    unknown = _refusal(_mqadmin_lines(d, "electMaster", "-a", a, "-c", "InteropCluster", "-bn", SET, "-b", "9"))
    clean = ("cleanBrokerMetadata", "-a", a, "-c", "InteropCluster", "-bn", SET)
    live_one = _refusal(_mqadmin_lines(d, *clean, "-b", str(other)))
    live_set = _refusal(_mqadmin_lines(d, *clean))
    next(b for b in d.brokers.values() if b.addr == first["addrs"][other]).proc.kill()
    deadline = time.monotonic() + 30
    while _sync_state(d, a)["replicas"][other][1]:
        assert time.monotonic() < deadline, "the killed broker still shows alive"
        time.sleep(1)
    cleaned = _mqadmin_lines(d, *clean, "-b", str(other))
    final = _sync_state(d, a)
    return {
        "leader_address_given": "#ControllerLeaderAddress" in meta and len(meta.split("#Peer:")) > 1,
        "broker_epochs": (epochs.count("#brokerAddr"), epochs.count("#Epoch: EpochEntry{epoch=1,")),
        "first": (len(first["replicas"]), first["epoch"], sorted(k for k, v in first["replicas"].items() if v[0])
                  == sorted(first["replicas"])),
        "elect": (after_elect["master"] == slave, after_elect["epoch"] - first["epoch"],
                  after_elect["set_epoch"] > first["set_epoch"], "CODE:" not in elect_out[0] + elect_out[1]),
        "elect_unknown": unknown, "clean_live_one": live_one.replace(f"{other}]", "<id>]"), "clean_live_set": live_set,
        "clean_dead": ("success" in cleaned[0], sorted(final["replicas"]) == sorted({master, slave})),
    }


@pytest.mark.interop
def test_mqadmin_controller_commands_answer_as_the_stock_controller(tmp_path) -> None:
    """mqadmin getControllerMetaData, getSyncStateSet, electMaster and cleanBrokerMetadata: the same steps on
    Apache RocketMQ's own controller (DLedger, with its stock NameServer) and on ours give the same answers."""
    jars.ensure(VERSION)
    results = {}
    stock = deploy(VERSION, str(tmp_path / "stock"), stock=True, brokers=False)
    try:
        _, addr = stock.rmq.controller()
        results["stock"] = controller_scenario(stock, addr, controller_settings_for(addr))
    finally:
        stock.stop()
    ours = deploy(VERSION, str(tmp_path / "ours"), brokers=False, controller=True)
    try:
        results["ours"] = controller_scenario(ours, ours.ours.nodes[0].controller_addr, controller_settings(ours))
    finally:
        ours.stop()
    print(results)
    assert results["ours"] == results["stock"]
    assert results["ours"]["elect_unknown"].startswith("CODE: 2012")
    assert results["ours"]["clean_live_set"].startswith("CODE: 2009")
