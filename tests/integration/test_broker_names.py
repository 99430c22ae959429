"""Registration takes what the stock NameServer takes (issue 28): any cluster, broker and zone name, an
unbracketed IPv6 address, any heartbeat timeout (clamped, said in the remark). Every read answers with the
name as the broker sent it, also on a node restarted from a snapshot and the log after it.

One 3-node cluster: brokers register over the remoting port through the leader; a follower takes a
snapshot between the two halves of the registrations, is killed and started again, and is read.
"""

from __future__ import annotations

import json
import signal
import threading

import pytest
from fakebroker import FakeBroker

from nameserver.pb import api_pb2
from nameserver.validation import MAX_NAME_BYTES

pytestmark = pytest.mark.cluster

CLUSTER = "cluster ä@1"   # a space, a unicode letter and '@'
SHARED = "TShared"        # every broker registers it
# (broker name, broker address or None for the fake broker's own, extra header fields)
BEFORE_SNAPSHOT = [("broker@host", None, {}), ("broker a", None, {}), ("brökér-ü", None, {}),
                   ("team/a~b", None, {})]                       # '/' and '~': escaped in the keys
AFTER_SNAPSHOT = [
    ("log/~7E", None, {}),                                       # escaped too, read back from the log
    ("broker-v6", "fe80::1:10911", {"__ZONE_NAME": "zone é 1"}),  # brokerIP1=fe80::1, no brackets
    ("broker-hb", None, {"heartbeatTimeoutMillis": "500"}),      # below our range: clamped to 1000
]
TOO_LONG = "n" * (MAX_NAME_BYTES + 1)  # a cluster or broker name over our bound (stock has none)
NAMES = sorted(name for name, _, _ in BEFORE_SNAPSHOT + AFTER_SNAPSHOT)


def _read(node_addr: str, code: int, ext: dict[str, str]) -> dict:
    reader = FakeBroker(name="reader")  # a fresh connection (the node may have restarted)
    try:
        resp = reader.call(node_addr, code, ext)
    finally:
        reader.stop()
    assert resp is not None and resp.code == 0, (code, ext, resp and resp.remark)
    return json.loads(resp.body)


def own_topic(i: int) -> str:
    """A broker's own topic, named as a broker's own topic may be (stock stores it as sent). No space: these
    registrations are compressed, whose body separates a topic's fields with spaces (stock cannot read
    a space in a compressed topic name either)."""
    return f"T{i}@ü"


def _check_reads(node_addr: str) -> None:
    route = _read(node_addr, 105, {"topic": SHARED})
    assert sorted(bd["brokerName"] for bd in route["brokerDatas"]) == NAMES
    assert sorted(qd["brokerName"] for qd in route["queueDatas"]) == NAMES
    assert {bd["cluster"] for bd in route["brokerDatas"]} == {CLUSTER}
    v6 = next(bd for bd in route["brokerDatas"] if bd["brokerName"] == "broker-v6")
    assert list(v6["brokerAddrs"].values()) == ["fe80::1:10911"] and v6["zoneName"] == "zone é 1"
    for i, name in enumerate(NAMES):  # each broker's own topic: its route names it as sent
        own = _read(node_addr, 105, {"topic": own_topic(i)})
        assert [bd["brokerName"] for bd in own["brokerDatas"]] == [name]

    info = _read(node_addr, 106, {})
    assert sorted(info["brokerAddrTable"]) == NAMES
    assert {c: sorted(n) for c, n in info["clusterAddrTable"].items()} == {CLUSTER: NAMES}
    assert info["brokerAddrTable"]["team/a~b"]["brokerName"] == "team/a~b"

    topics = _read(node_addr, 224, {"cluster": CLUSTER})["topicList"]
    assert sorted(topics) == sorted([SHARED] + [own_topic(i) for i in range(len(NAMES))])
    group = _read(node_addr, 901, {"clusterName": CLUSTER, "brokerName": "team/a~b"})["brokerMemberGroup"]
    assert group["brokerName"] == "team/a~b" and len(group["brokerAddrs"]) == 1
    # names longer than we could store: held by no one, answered as stock answers a name it does not hold
    assert _read(node_addr, 224, {"cluster": TOO_LONG}) == {"topicList": []}
    group = _read(node_addr, 901, {"clusterName": CLUSTER, "brokerName": TOO_LONG})["brokerMemberGroup"]
    assert group == {"brokerAddrs": {}, "brokerName": TOO_LONG, "cluster": CLUSTER}
    group = _read(node_addr, 901, {"clusterName": TOO_LONG, "brokerName": "team/a~b"})["brokerMemberGroup"]
    assert group["cluster"] == TOO_LONG and len(group["brokerAddrs"]) == 1


def test_any_name_an_ipv6_address_and_a_short_timeout_register_and_survive_a_restart(make_cluster) -> None:
    c = make_cluster(remoting=True)
    leader = c.wait_ready()
    follower = c.followers()[0]
    brokers: list[FakeBroker] = []
    stop_beats = threading.Event()

    def register(batch: list[tuple[str, str | None, dict[str, str]]]) -> dict[str, str | None]:
        remarks = {}
        for name, addr, extra in batch:
            broker = FakeBroker(name=name, cluster=CLUSTER).start()
            brokers.append(broker)
            broker.addr = addr or broker.addr
            resp = broker.register(leader.remoting_addr, [SHARED, own_topic(NAMES.index(name))], extra=extra)
            assert resp.code == 0, (name, resp.remark)
            remarks[name] = resp.remark
        return remarks

    def beat(broker: FakeBroker) -> None:  # its timeout is a second: it stays only while it beats
        while not stop_beats.wait(0.2):
            broker.heartbeat(leader.remoting_addr)

    try:
        assert register(BEFORE_SNAPSHOT) == {name: None for name, _, _ in BEFORE_SNAPSHOT}
        c.wait_converged()
        snap = follower.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30)
        remarks = register(AFTER_SNAPSHOT)
        threading.Thread(target=beat, args=(brokers[-1],), daemon=True).start()
        assert remarks["log/~7E"] is None and remarks["broker-v6"] is None
        assert remarks["broker-hb"] == "heartbeatTimeoutMillis 500 is outside 1000..3600000: registered with 1000"

        # gRPC too: a name and a timeout the former checks refused are taken (the timeout clamped)
        grpc_reg = api_pb2.RegisterBrokerRequest(cluster_name="grpc cluster", broker_name="grpc/ü",
                                                 broker_addr="::1:10911", heartbeat_timeout_ms=3_600_001)
        assert leader.ns.RegisterBroker(grpc_reg, timeout=10).offset > 0
        c.wait_converged()
        info = leader.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
        assert info.broker_addr_table["grpc/ü"].addrs[0].addr == "::1:10911"
        leader.ns.UnregisterBroker(api_pb2.UnregisterBrokerRequest(
            cluster_name="grpc cluster", broker_name="grpc/ü", broker_addr="::1:10911"), timeout=10)
        c.wait_converged()
        _check_reads(follower.remoting_addr)

        # The follower restarts from its snapshot (the first half) and the log after it (the second half).
        c.kill(follower, signal.SIGKILL)
        c.start(follower)
        c.wait_converged()
        assert follower.status().snapshot_offset >= snap.offset > 0
        _check_reads(follower.remoting_addr)
        _check_reads(leader.remoting_addr)
    finally:
        stop_beats.set()
        for broker in brokers:
            broker.stop()
