"""Controller mode over its own remoting port on a real 3-node cluster: three stand-in brokers of one set
follow RocketMQ 5's ReplicasManager step by step (find the leader, take ids, register, heartbeat, elect,
report in-sync replicas); the master goes silent and the leader's scan elects an in-sync slave and tells
the brokers; the Raft leader is killed and the set's master, epochs and in-sync replicas survive it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

import grpc
import pytest

from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.validation import MAX_NAME_BYTES
from tests.cluster import ROOT, Cluster
from tests.fakebroker import FakeBroker
from tests.interop.remoting import call

pytestmark = pytest.mark.cluster

SET = "broker-ctl"
CLUSTER = "CtlCluster"
GET_METADATA, NEXT_ID, APPLY_ID, REGISTER, ELECT, ALTER, REPLICA_INFO, SYNC_STATE_DATA, CLEAN = (
    1005, 1012, 1013, 1003, 1002, 1001, 1004, 1006, 1011)
HEARTBEAT, NOTIFY_ROLE_CHANGED = 904, 1008
HEARTBEAT_TIMEOUT_MS = 1500


class Broker:
    """What a broker's ReplicasManager sends the controller, and the port it is notified on."""

    def __init__(self, name: str = SET) -> None:
        self.remote = FakeBroker(name, CLUSTER).start()
        self.addr = self.remote.addr
        self.id = 0
        self.beating = threading.Event()
        self.epoch = 0

    def leader(self, controllers: list[str]) -> str:
        for addr in controllers:
            r = call(addr, GET_METADATA)
            if r.code == 0 and r.ext("controllerLeaderAddress"):
                return r.ext("controllerLeaderAddress")
        raise AssertionError("no controller named a leader")

    def register(self, leader: str) -> tuple[int, str | None]:
        r = call(leader, NEXT_ID, {"clusterName": CLUSTER, "brokerName": SET})
        assert r.code == 0, r.remark
        self.id = int(r.ext("nextBrokerId"))
        r = call(leader, APPLY_ID, {"clusterName": CLUSTER, "brokerName": SET, "appliedBrokerId": str(self.id),
                                    "registerCheckCode": f"{self.addr};{time.time_ns()}"})
        assert r.code == 0, r.remark
        r = call(leader, REGISTER, {"clusterName": CLUSTER, "brokerName": SET, "brokerId": str(self.id),
                                    "brokerAddress": self.addr})
        assert r.code == 0, r.remark
        return self.id, r.ext("masterBrokerId")

    def heartbeat(self, controllers: list[str]) -> None:
        for addr in controllers:
            with contextlib.suppress(OSError, AssertionError):  # a controller that is down
                call(addr, HEARTBEAT, {"clusterName": CLUSTER, "brokerName": SET, "brokerAddr": self.addr,
                                       "brokerId": str(self.id), "epoch": str(self.epoch), "maxOffset": "1000",
                                       "confirmOffset": "1000", "heartbeatTimeoutMills": str(HEARTBEAT_TIMEOUT_MS),
                                       "electionPriority": "0"}, timeout=2)

    def start_beating(self, controllers: list[str]) -> threading.Thread:
        self.beating.set()

        def loop() -> None:
            while self.beating.is_set():
                self.heartbeat(controllers)
                time.sleep(0.2)

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return t

    def elect(self, leader: str) -> tuple[int, dict]:
        r = call(leader, ELECT, {"clusterName": CLUSTER, "brokerName": SET, "brokerId": str(self.id),
                                 "designateElect": "false"})
        return r.code, {"header": r.ext_fields, "body": json.loads(r.body) if r.body else None, "remark": r.remark}

    def notifications(self) -> list:
        return [r for r in self.remote.requests if r.code == NOTIFY_ROLE_CHANGED]


def grpc_stub(node) -> api_pb2_grpc.NameServerStub:
    return api_pb2_grpc.NameServerStub(grpc.insecure_channel(node.grpc_addr))


def nsctl(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "nameserver.cli.nsctl", *args], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def controller_stub(node) -> api_pb2_grpc.ControllerStub:
    return api_pb2_grpc.ControllerStub(grpc.insecure_channel(node.grpc_addr))


def replica_info(addr: str) -> tuple[int, dict, dict]:
    r = call(addr, REPLICA_INFO, {"brokerName": SET})
    return r.code, r.ext_fields, json.loads(r.body) if r.body else {}


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path), controller=True)
    c.start()
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop(wait=False)  # the nodes shut down while the next test starts


def test_a_broker_set_elects_fails_over_and_survives_a_raft_leader_kill(cluster) -> None:
    controllers = [n.controller_addr for n in cluster.nodes]
    leader_node = cluster.leader()
    follower = next(n for n in cluster.nodes if n is not leader_node)
    # A follower names the leader's controller port, as the broker's first step needs.
    meta = call(follower.controller_addr, GET_METADATA)
    assert meta.code == 0 and meta.ext("isLeader") == "false"
    assert meta.ext("controllerLeaderAddress") == leader_node.controller_addr
    assert sorted(meta.ext("peers").split(";")) == sorted(f"{n.raft_addr}:{n.controller_addr}" for n in cluster.nodes)

    brokers = [Broker() for _ in range(3)]
    try:
        # Registration goes through a follower's port too: the write is forwarded to the leader.
        for i, b in enumerate(brokers):
            assert b.leader(controllers) == leader_node.controller_addr
            bid, master = b.register(follower.controller_addr if i == 1 else leader_node.controller_addr)
            assert bid == i + 1 and master is None  # no master yet
            b.start_beating(controllers)
        time.sleep(0.5)
        code, first = brokers[0].elect(leader_node.controller_addr)
        assert code == 0 and first["header"]["masterBrokerId"] == "1" and first["header"]["masterEpoch"] == "1"
        assert first["body"]["syncStateSet"] == [1]
        assert {int(k): v for k, v in first["body"]["brokerMemberGroup"]["brokerAddrs"].items()} == \
            {b.id: b.addr for b in brokers}
        code, again = brokers[1].elect(leader_node.controller_addr)
        assert code == 2011 and again["header"]["masterBrokerId"] == "1"  # CONTROLLER_MASTER_STILL_EXIST
        # The master reports its slaves in sync, fenced by both epochs.
        body = json.dumps({"syncStateSet": [1, 2, 3], "syncStateSetEpoch": 1}).encode()
        r = call(follower.controller_addr, ALTER, {"brokerName": SET, "masterBrokerId": "1", "masterEpoch": "1"},
                 body)
        assert r.code == 0 and r.ext("newSyncStateSetEpoch") == "2", r.remark
        stale = call(leader_node.controller_addr, ALTER, {"brokerName": SET, "masterBrokerId": "1",
                                                          "masterEpoch": "1"}, body)
        assert stale.code == 2013  # the same set again: refused, nothing written
        fenced = call(leader_node.controller_addr, ALTER, {"brokerName": SET, "masterBrokerId": "1",
                                                           "masterEpoch": "1"},
                      json.dumps({"syncStateSet": [1, 2], "syncStateSetEpoch": 1}).encode())
        assert fenced.code == 2001, fenced.remark  # CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
        for n in cluster.nodes:
            code, header, ss = replica_info(n.controller_addr)
            assert (code, header["masterBrokerId"], header["masterEpoch"]) == (0, "1", "1")
            assert ss == {"syncStateSet": [1, 2, 3], "syncStateSetEpoch": 2}

        # The master goes silent: within its timeout plus a scan, an in-sync slave is master.
        silent_at = time.monotonic()
        brokers[0].beating.clear()

        def new_master() -> dict | None:
            code, header, ss = replica_info(leader_node.controller_addr)
            return header if code == 0 and header.get("masterBrokerId") in ("2", "3") else None

        header = cluster.wait_for("a new master", new_master, timeout=HEARTBEAT_TIMEOUT_MS / 1000 + 5)
        took = time.monotonic() - silent_at
        assert header["masterEpoch"] == "2" and took < HEARTBEAT_TIMEOUT_MS / 1000 + 2.5, took
        elected = int(header["masterBrokerId"])
        cluster.wait_for("notified slaves", lambda: all(b.notifications() for b in brokers[1:]), timeout=5)
        note = brokers[1].notifications()[-1]
        assert (note.ext("masterBrokerId"), note.ext("masterEpoch")) == (str(elected), "2")
        assert json.loads(note.body) == {"syncStateSet": [elected], "syncStateSetEpoch": 3}
        # every broker was told of the first master; the silent one is not told of the second
        assert [n.ext("masterEpoch") for n in brokers[0].notifications()] == ["1"]

        # Kill the Raft leader: the set's state is the same on the new leader, and nothing re-elects.
        cluster.kill(leader_node)
        survivors = [n for n in cluster.nodes if n is not leader_node]
        new_leader = cluster.wait_for("a new Raft leader", lambda: cluster.leader(), timeout=20)
        assert new_leader is not leader_node
        code, header, ss = replica_info(new_leader.controller_addr)
        assert (code, header["masterBrokerId"], header["masterEpoch"]) == (0, str(elected), "2")
        assert ss == {"syncStateSet": [elected], "syncStateSetEpoch": 3}
        cluster.wait_converged(survivors)
        # The whole picture, as mqadmin getSyncStateSet shows it.
        r = call(new_leader.controller_addr, SYNC_STATE_DATA, body=json.dumps([SET]).encode())
        info = json.loads(r.body)["replicasInfoTable"][SET]
        assert info["masterBrokerId"] == elected and [x["brokerId"] for x in info["inSyncReplicas"]] == [elected]
        assert {x["brokerId"]: x["alive"] for x in info["notInSyncReplicas"]} == \
            {i: i != 1 for i in (1, 2, 3) if i != elected}
        # An admin hands mastership to the other in-sync-capable slave once it is back in sync; a watch on
        # ctrl/ sees the election as one record, and nsctl shows the result.
        other = 5 - elected  # 2 <-> 3
        body = json.dumps({"syncStateSet": [elected, other], "syncStateSetEpoch": 3}).encode()
        r = call(new_leader.controller_addr, ALTER, {"brokerName": SET, "masterBrokerId": str(elected),
                                                     "masterEpoch": "2"}, body)
        assert r.code == 0, r.remark
        watch = grpc_stub(survivors[0]).Watch(api_pb2.WatchRequest(key_prefixes=["ctrl/"]), timeout=30)
        first = next(watch)
        assert first.initial_state and [e.key for e in first.events] == [f"ctrl/{SET}"]
        endpoints = ",".join(n.grpc_addr for n in survivors)
        out = nsctl("controller", "elect", SET, "--broker-id", str(other), "--endpoints", endpoints, "--json")
        assert out["code"] == 0 and out["set"]["master_id"] == other
        change = next(e for msg in watch if msg.events and not msg.initial_state for e in msg.events)
        watch.cancel()
        value = state_pb2.ControllerBrokerSet.FromString(change.value)
        assert (value.master_id, value.master_epoch, list(value.sync_state_set)) == (other, 3, [other])
        shown = nsctl("controller", "show", SET, "--endpoints", endpoints, "--json")["set"]
        assert (shown["master_id"], shown["master_epoch"]) == (other, 3)
        elected = other
        # Cleaning a live broker is refused; the silent old master can be cleaned.
        assert call(new_leader.controller_addr, CLEAN, {"clusterName": CLUSTER, "brokerName": SET,
                                                         "brokerControllerIdsToClean": str(elected)}).code == 2009
        r = call(survivors[0].controller_addr, CLEAN, {"clusterName": CLUSTER, "brokerName": SET,
                                                        "brokerControllerIdsToClean": "1"})
        assert r.code == 0, r.remark
        listed = controller_stub(survivors[1]).ListBrokerSets(api_pb2.ListBrokerSetsRequest(), timeout=10)
        [view] = listed.sets
        assert [x.broker_id for x in view.replicas] == sorted({2, 3}) and view.master_id == elected
        [row] = nsctl("controller", "list", "--endpoints", endpoints, "--json")["sets"]
        assert (row["broker_name"], row["master_id"], [r["broker_id"] for r in row["replicas"]]) == \
            (SET, elected, [2, 3])
    finally:
        for b in brokers:
            b.beating.clear()
            b.remote.stop()


def test_bad_controller_requests_name_the_field_and_write_nothing(cluster) -> None:
    addr = cluster.leader().controller_addr
    before = cluster.leader().status()
    # any name a broker can register is taken (issue 28); only one no state key can hold is refused
    r = call(addr, APPLY_ID, {"clusterName": CLUSTER, "brokerName": "n" * (MAX_NAME_BYTES + 1), "appliedBrokerId": "1",
                              "registerCheckCode": "127.0.0.1:1;1"})
    assert r.code == 1 and "broker_name" in r.remark
    r = call(addr, APPLY_ID, {"clusterName": CLUSTER, "brokerName": SET, "appliedBrokerId": "0",
                              "registerCheckCode": "127.0.0.1:1;1"})
    assert r.code == 1 and "broker_id" in r.remark
    r = call(addr, ALTER, {"brokerName": SET, "masterBrokerId": "1", "masterEpoch": "1"}, b"{not json")
    assert r.code == 1 and "SyncStateSet" in r.remark
    r = call(addr, HEARTBEAT, {"clusterName": CLUSTER, "brokerName": SET, "brokerAddr": "127.0.0.1:1"})
    assert r.code == 2005 and r.remark == "Heart beat with empty brokerId"
    r = call(addr, 1007)  # GET_BROKER_EPOCH_CACHE is a broker's to answer
    assert r.code == 3
    assert call(addr, REPLICA_INFO, {"brokerName": SET}).code == 2008  # CONTROLLER_BROKER_METADATA_NOT_EXIST
    after = cluster.leader().status()
    assert after.apply_offset == before.apply_offset  # nothing entered the log
    assert not controller_stub(cluster.leader()).ListBrokerSets(api_pb2.ListBrokerSetsRequest(), timeout=10).sets


def test_no_in_sync_replica_left_then_unclean_elections_switched_on_through_the_log(cluster) -> None:
    controllers = [n.controller_addr for n in cluster.nodes]
    leader, follower = cluster.leader(), cluster.followers()[0]
    brokers = [Broker() for _ in range(2)]
    try:
        for b in brokers:
            b.register(leader.controller_addr)
            b.start_beating(controllers)
        assert brokers[0].elect(leader.controller_addr)[0] == 0  # master 1, alone in sync
        brokers[0].beating.clear()

        def masterless() -> dict | None:
            code, header, _ = replica_info(leader.controller_addr)
            return header if code == 0 and "masterBrokerId" not in header else None

        # the scan finds broker 1 silent, nobody else in sync: the set is recorded as having no master
        header = cluster.wait_for("the set without a master", masterless, timeout=HEARTBEAT_TIMEOUT_MS / 1000 + 5)
        assert header["masterEpoch"] == "2"
        code, refused = brokers[1].elect(leader.controller_addr)  # broker 2 is alive but was never in sync
        assert code == 2012, refused
        # An admin accepts the risk: the switch goes through the log, so every node decides alike.
        r = call(follower.controller_addr, 1009, body=b"enableElectUncleanMaster=true\n")
        assert r.code == 0, r.remark
        local = call(follower.controller_addr, 1009, body=b"scanNotActiveBrokerInterval=1\n")
        assert local.code == 1 and "scanNotActiveBrokerInterval" in local.remark
        for n in cluster.nodes:
            config = call(n.controller_addr, 1010).body.decode()
            assert "enableElectUncleanMaster=true" in config.splitlines(), config
        code, elected = brokers[1].elect(leader.controller_addr)
        assert code == 0 and elected["header"]["masterBrokerId"] == "2" and elected["header"]["masterEpoch"] == "3"
    finally:
        for b in brokers:
            b.beating.clear()
            b.remote.stop()
